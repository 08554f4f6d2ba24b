"""coupled-qk: coupled query-key dynamics attention (Gahtan & Bronstein, arXiv:2604.01683v1) for PyTorch."""

from coupled_qk import _hf_hook
from coupled_qk.layers.attention import AttentionRecord, CausalSelfAttention
from coupled_qk.layers.differential import DifferentialScoring
from coupled_qk.layers.forces import GradientForce, MLPForce
from coupled_qk.layers.kv_cache import KVCache, StaticKVCache
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.layers.scoring import ScoringRule, scaled_dot_product
from coupled_qk.models.config import PRESETS, GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.models.maps.dynamics import DynamicsOptions, QKDynamics
from coupled_qk.models.maps.invertible import InvertibleOptions, InvertibleQKCoupling
from coupled_qk.models.maps.query_mlp import QueryMLP, QueryMLPOptions
from coupled_qk.models.options import MapOptions, option
from coupled_qk.models.registry import register_qk_map, register_scoring, register_variant
from coupled_qk.ops.dynamics import INTEGRATORS, integrate_qk

__version__ = "0.1.0"

_hf_hook.install()  # AutoConfig/AutoModelForCausalLM know "coupled_qk" once transformers is used (no import here)


def __getattr__(name: str):
    """Lazy exports: ``ATTENTION_VARIANTS`` (the registered attention names, computed when read), ``ATTENTIONS``
    and ``VARIANTS`` (the registry's tables, read after the drop-in maps and plugins are loaded), and those that
    would otherwise import the data and training layers with the package."""
    if name in ("ATTENTION_VARIANTS", "ATTENTIONS", "VARIANTS"):
        from coupled_qk.models import registry

        names = registry.attention_names()  # loads the drop-in maps and the plugins
        return tuple(names) if name == "ATTENTION_VARIANTS" else getattr(registry, name)
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
    "DifferentialScoring",
    "DynamicsOptions",
    "GPTConfig",
    "GradientForce",
    "InvertibleOptions",
    "InvertibleQKCoupling",
    "KVCache",
    "StaticKVCache",
    "LoadedRun",
    "MLPForce",
    "MapOptions",
    "QKDynamics",
    "QKMap",
    "QueryMLP",
    "QueryMLPOptions",
    "ScoringRule",
    "coupling_parameter_overhead",
    "integrate_qk",
    "load_run",
    "option",
    "register_qk_map",
    "register_scoring",
    "register_variant",
    "scaled_dot_product",
]
