"""Hugging Face ``transformers`` integration (optional extra: ``pip install "coupled-qk[hf]"``).

- :func:`retrofit`, :func:`load_retrofitted`: insert coupled query-key dynamics into an existing
  ``transformers`` causal LM (``hf/retrofit.py``).

``retrofit`` is imported eagerly (its module needs only torch): the function shares its name with its
submodule, and a lazy import would let ``import coupled_qk.hf.retrofit`` bind the *module* as
``coupled_qk.hf.retrofit`` first, so that ``coupled_qk.hf.retrofit(model)`` fails with "'module' object is
not callable".
"""

from __future__ import annotations

from coupled_qk.hf.retrofit import load_retrofitted, retrofit

__all__ = ["load_retrofitted", "retrofit"]
