"""Hugging Face ``transformers`` integration (optional extra: ``pip install "coupled-qk[hf]"``).

- :class:`CoupledQKConfig`, :class:`CoupledQKModel`, :class:`CoupledQKForCausalLM`: native ``transformers``
  models, registered with ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` by ``import coupled_qk``.
  Generation uses the ``transformers`` cache classes (``DynamicCache``, ``StaticCache``), padding via
  ``attention_mask``; ``Trainer`` (gradient accumulation, activation checkpointing), ``resize_token_embeddings``
  and LoRA through ``peft`` work as for any causal LM (``tests/hf/test_hf_contract.py``).
- :func:`export_run`: a training run (or checkpoint) -> a ``save_pretrained`` folder with the tokenizer
  (``coupled-qk export RUN_DIR HF_DIR``).
- :func:`retrofit`, :func:`load_retrofitted`, :func:`restore_retrofit`: insert coupled query-key dynamics (or any
  registered map with ``start_at_identity()``) into an existing ``transformers`` causal LM (``hf/retrofit.py``,
  ``hf/retrofit_maps.py``, ``hf/retrofit_load.py``).

``retrofit`` is imported eagerly (its module needs only torch): the function shares its name with its
submodule, and a lazy import would let ``import coupled_qk.hf.retrofit`` bind the *module* as
``coupled_qk.hf.retrofit`` first, so that ``coupled_qk.hf.retrofit(model)`` fails with "'module' object is
not callable". The other names are imported lazily, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib

from coupled_qk.hf.retrofit import retrofit as retrofit
from coupled_qk.hf.retrofit_load import load_retrofitted as load_retrofitted
from coupled_qk.hf.retrofit_load import restore_retrofit as restore_retrofit

_LAZY = {
    "CoupledQKConfig": "configuration",
    "CoupledQKModel": "modeling",
    "CoupledQKForCausalLM": "modeling",
    "CoupledQKPreTrainedModel": "modeling",
    "export_run": "export",
    "register": "registration",
}

__all__ = sorted([*_LAZY, "load_retrofitted", "restore_retrofit", "retrofit"])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
