"""Compatibility module: the variant registry now lives in :mod:`coupled_qk.models.registry` (maps, attentions,
named variants, plugins), :mod:`coupled_qk.models.options` (the options dataclasses) and
:mod:`coupled_qk.models.specs` (variant specs). Everything importable from here before still is.

``MAIN_VARIANTS`` and ``FLAT_MAP_OPTIONS`` are computed when read (module ``__getattr__``), so they include
variants and options registered after this module was imported; new code calls
:func:`~coupled_qk.models.registry.default_variants` and :func:`~coupled_qk.models.registry.flat_option_names`.
"""

from __future__ import annotations

from coupled_qk.models.options import DynamicsOptions, InvertibleOptions, MapOptions, QueryMLPOptions
from coupled_qk.models.registry import (
    ALIASES,
    ATTENTIONS,
    ENTRY_POINT_GROUP,
    LEGACY_DEFAULTS,
    QK_MAPS,
    VARIANTS,
    Attention,
    QKMapType,
    attention_name,
    attention_names,
    default_variants,
    flat_option_names,
    get_attention,
    isolated,
    load_plugins,
    map_option_types,
    register_qk_map,
    register_variant,
    variant_names,
)
from coupled_qk.models.specs import canonical_name, parse_variants, variant_attention, variant_overrides

__all__ = [
    "ALIASES",
    "ATTENTIONS",
    "ENTRY_POINT_GROUP",
    "LEGACY_DEFAULTS",
    "QK_MAPS",
    "VARIANTS",
    "Attention",
    "DynamicsOptions",
    "InvertibleOptions",
    "MapOptions",
    "QKMapType",
    "QueryMLPOptions",
    "attention_name",
    "attention_names",
    "canonical_name",
    "default_variants",
    "flat_option_names",
    "get_attention",
    "isolated",
    "load_plugins",
    "map_option_types",
    "parse_variants",
    "register_qk_map",
    "register_variant",
    "variant_attention",
    "variant_names",
    "variant_overrides",
]


def __getattr__(name: str):
    """``MAIN_VARIANTS`` (the default variant list) and ``FLAT_MAP_OPTIONS`` (flat spelling -> nested field),
    computed from the registry when read."""
    if name == "MAIN_VARIANTS":
        return default_variants()
    if name == "FLAT_MAP_OPTIONS":
        return flat_option_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
