"""coupled-qk: coupled query-key dynamics attention (Gahtan & Bronstein, arXiv:2604.01683v1) for PyTorch."""

from coupled_qk import _hf_hook
from coupled_qk.layers.attention import AttentionRecord, CausalSelfAttention, KVCache
from coupled_qk.layers.forces import GradientForce, MLPForce
from coupled_qk.layers.kv_cache import StaticKVCache
from coupled_qk.layers.qk_maps import QKDynamics, QKMap, QueryMLP
from coupled_qk.layers.scoring import ScoringRule, scaled_dot_product
from coupled_qk.models.config import PRESETS, GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.models.options import MapOptions
from coupled_qk.models.registry import ATTENTIONS, VARIANTS, register_qk_map, register_scoring, register_variant
from coupled_qk.ops.dynamics import INTEGRATORS, integrate_qk

__version__ = "0.1.0"

_hf_hook.install()  # AutoConfig/AutoModelForCausalLM know "coupled_qk" once transformers is used (no import here)


def __getattr__(name: str):
    """Lazy exports: ``ATTENTION_VARIANTS`` (the registered attention names, computed when read, plugins
    included) and those that would otherwise import the data and training layers with the package."""
    if name == "ATTENTION_VARIANTS":
        from coupled_qk.models.registry import attention_names

        return tuple(attention_names())
    if name in ("load_run", "LoadedRun"):
        from coupled_qk.training import pretrained

        return getattr(pretrained, name)
    raise AttributeError(f"module 'coupled_qk' has no attribute {name!r}")


__all__ = [
    "ATTENTIONS",
    "ATTENTION_VARIANTS",
    "INTEGRATORS",
    "PRESETS",
    "VARIANTS",
    "GPT",
    "AttentionRecord",
    "CausalSelfAttention",
    "GPTConfig",
    "GradientForce",
    "KVCache",
    "StaticKVCache",
    "LoadedRun",
    "MLPForce",
    "MapOptions",
    "QKDynamics",
    "QKMap",
    "QueryMLP",
    "ScoringRule",
    "coupling_parameter_overhead",
    "integrate_qk",
    "load_run",
    "register_qk_map",
    "register_scoring",
    "register_variant",
    "scaled_dot_product",
]
