"""coupled-qk: coupled query-key dynamics attention (Gahtan & Bronstein, arXiv:2604.01683v1) for PyTorch."""

from coupled_qk import _hf_hook
from coupled_qk.layers.attention import ATTENTION_VARIANTS, CausalSelfAttention, KVCache
from coupled_qk.layers.dynamics import GradientForce, MLPForce, QKDynamics
from coupled_qk.models.config import PRESETS, GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.ops.dynamics import INTEGRATORS, integrate_qk

__version__ = "0.1.0"

_hf_hook.install()  # AutoConfig/AutoModelForCausalLM know "coupled_qk" once transformers is used (no import here)

__all__ = [
    "ATTENTION_VARIANTS",
    "INTEGRATORS",
    "PRESETS",
    "GPT",
    "CausalSelfAttention",
    "GPTConfig",
    "GradientForce",
    "KVCache",
    "MLPForce",
    "QKDynamics",
    "coupling_parameter_overhead",
    "integrate_qk",
]
