"""Hugging Face ``transformers`` integration (optional extra: ``pip install "coupled-qk[hf]"``).

- :class:`CoupledQKConfig`, :class:`CoupledQKModel`, :class:`CoupledQKForCausalLM`: native ``transformers``
  models, registered with ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` by ``import coupled_qk``.
  Generation uses the ``transformers`` cache classes (``DynamicCache``), padding via ``attention_mask``.
- :func:`export_run`: a training run (or checkpoint) -> a ``save_pretrained`` folder with the tokenizer
  (``coupled-qk export RUN_DIR HF_DIR``).

Names are imported lazily, so importing this package is cheap until one of them is used.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "CoupledQKConfig": "configuration",
    "CoupledQKModel": "modeling",
    "CoupledQKForCausalLM": "modeling",
    "CoupledQKPreTrainedModel": "modeling",
    "export_run": "export",
    "register": "registration",
    "retrofit": "retrofit",  # hf/retrofit.py (coupling inserted into existing transformers models)
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # also wins over a submodule of the same name bound by the import system
    return value
