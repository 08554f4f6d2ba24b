"""Registration of the coupled-qk classes with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM``."""

from __future__ import annotations

import functools

from coupled_qk.hf.hints import run_folder_hint
from coupled_qk.progress import library_bars_follow_policy


def _with_run_folder_hint(auto_config) -> None:
    """Wrap ``AutoConfig.from_pretrained`` (which ``AutoModel*.from_pretrained`` call first) so that its error for
    a coupled-qk run folder ("Unrecognized model in RUN. Should have a `model_type` key ...") carries the
    ``coupled-qk export`` hint. Only that failing call changes; idempotent."""
    original = auto_config.from_pretrained.__func__
    if getattr(original, "_coupled_qk_hint", False):
        return

    @functools.wraps(original)
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        try:
            return original(cls, pretrained_model_name_or_path, *args, **kwargs)
        except (ValueError, OSError) as exc:
            hint = run_folder_hint(pretrained_model_name_or_path)
            if hint is None:
                raise
            raise type(exc)(f"{exc} {hint}") from exc

    from_pretrained._coupled_qk_hint = True
    auto_config.from_pretrained = classmethod(from_pretrained)


def register_config() -> None:
    """``AutoConfig``: ``model_type = "coupled_qk"`` -> :class:`CoupledQKConfig` (idempotent), the
    ``coupled-qk export`` hint on loading a training run folder (:func:`run_folder_hint`), and ``transformers``'
    progress bars following coupled-qk's policy (:func:`~coupled_qk.progress.library_bars_follow_policy`)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from coupled_qk.hf.configuration import CoupledQKConfig

    AutoConfig.register("coupled_qk", CoupledQKConfig, exist_ok=True)
    _with_run_folder_hint(AutoConfig)
    library_bars_follow_policy()  # transformers' bars: on terminals only, as coupled-qk's own


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
