"""coupled-qk: coupled query-key dynamics attention (Gahtan & Bronstein, arXiv:2604.01683v1) for PyTorch."""

from coupled_qk.layers.attention import ATTENTION_VARIANTS, CausalSelfAttention, KVCache
from coupled_qk.layers.dynamics import GradientForce, MLPForce, QKDynamics
from coupled_qk.models.config import PRESETS, GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.ops.dynamics import INTEGRATORS, integrate_qk

__version__ = "0.1.0"


def __getattr__(name: str):
    """Lazy exports that would otherwise import the data and training layers with the package."""
    if name in ("load_run", "LoadedRun"):
        from coupled_qk.training import pretrained

        return getattr(pretrained, name)
    raise AttributeError(f"module 'coupled_qk' has no attribute {name!r}")

__all__ = [
    "ATTENTION_VARIANTS",
    "INTEGRATORS",
    "PRESETS",
    "GPT",
    "CausalSelfAttention",
    "GPTConfig",
    "GradientForce",
    "KVCache",
    "LoadedRun",
    "MLPForce",
    "QKDynamics",
    "coupling_parameter_overhead",
    "integrate_qk",
    "load_run",
]
