"""Registration of the coupled-qk classes with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM``."""

from __future__ import annotations


def register_config() -> None:
    """``AutoConfig``: ``model_type = "coupled_qk"`` -> :class:`CoupledQKConfig` (idempotent)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from coupled_qk.hf.configuration import CoupledQKConfig

    AutoConfig.register("coupled_qk", CoupledQKConfig, exist_ok=True)


def register_models() -> None:
    """``AutoModel`` -> :class:`CoupledQKModel`, ``AutoModelForCausalLM`` -> :class:`CoupledQKForCausalLM`
    (and the config; idempotent)."""
    from transformers.models.auto.modeling_auto import AutoModel, AutoModelForCausalLM

    from coupled_qk.hf.configuration import CoupledQKConfig
    from coupled_qk.hf.modeling import CoupledQKForCausalLM, CoupledQKModel

    register_config()
    AutoModel.register(CoupledQKConfig, CoupledQKModel, exist_ok=True)
    AutoModelForCausalLM.register(CoupledQKConfig, CoupledQKForCausalLM, exist_ok=True)


def register() -> None:
    """Register every coupled-qk class with the ``transformers`` Auto classes (``import coupled_qk`` already
    does this lazily; call it only if the automatic registration warned)."""
    register_models()
