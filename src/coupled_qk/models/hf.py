"""Deprecated location: the Hugging Face models now live in :mod:`coupled_qk.hf` (kept for old imports)."""

from coupled_qk.hf.configuration import CoupledQKConfig
from coupled_qk.hf.modeling import CoupledQKForCausalLM, CoupledQKModel

__all__ = ["CoupledQKConfig", "CoupledQKForCausalLM", "CoupledQKModel"]
