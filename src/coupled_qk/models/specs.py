"""Variant specs: ``name[+field=value...]`` strings naming a registered variant plus typed overrides.

A spec is a variant name (:func:`~coupled_qk.models.registry.variant_names`; ``-`` and ``_`` interchangeable,
:data:`~coupled_qk.models.registry.ALIASES` resolved) optionally followed by ``+field=value`` overrides of any
``GPTConfig`` field or map option, e.g. ``coupled+n_steps=3+dt_init=0.0``. Used by ``compare``, ``bench``,
``mqar``, ``demo`` and ``claims --variants``.

Two rules keep a study's labels honest: an override may not contradict the setting that defines a named variant
(``coupled_leapfrog+integrator=euler`` is refused: write ``coupled+integrator=euler``; a variant named after its
attention, such as ``coupled``, is defined by the attention alone), and two specs of one selection that resolve
to the same model (``coupled`` and ``coupled+n_steps=1``, ``coupled_leapfrog`` and ``coupled+integrator=leapfrog``,
``n_steps=2`` and ``n_steps=2.0``) are refused as duplicates (:func:`check_distinct`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from coupled_qk.checks.values import coerce, field_types
from coupled_qk.models.config import GPTConfig, parse_overrides
from coupled_qk.models.registry import (
    ALIASES,
    ATTENTIONS,
    OPTION_ALIASES,
    UNKNOWN_HINT,
    VARIANTS,
    Attention,
    default_variants,
    flat_option_names,
    get_attention,
    variant_names,
)

__all__ = [
    "canonical_name",
    "check_distinct",
    "parse_variants",
    "variant_attention",
    "variant_identity",
    "variant_overrides",
]


def canonical_name(spec: str) -> str:
    """The canonical spelling of a variant spec: aliases resolved, ``-`` written ``_`` in the name part."""
    head, sep, rest = spec.strip().partition("+")
    head = head.replace("-", "_")
    return ALIASES.get(head, head) + sep + rest


def variant_overrides(spec: str) -> dict:
    """``GPTConfig`` overrides of a variant spec (values converted to the fields' types).

    Raises:
        ValueError: an empty spec, an unknown name (listing the known ones), a ``+`` part without ``=``, an
            unknown field or a value of the wrong type; an override contradicting a setting that defines the
            named variant (naming the spec to write instead); map options its attention does not have or out of
            their range (the options dataclass's ``validate``), naming the spec, so that a study refuses a bad
            spec before it trains anything.
    """
    name, _, rest = canonical_name(spec).partition("+")
    if not name:
        raise ValueError(f"variant spec {spec!r} is empty")
    known = variant_names()  # loads plugins
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {spec!r}; expected one of {known}, optionally +field=value; {UNKNOWN_HINT}")
    items = rest.split("+") if rest else []
    given = parse_overrides(items, flag=f"variant {spec!r}")
    given = _typed_map_options(spec, given.get("attention", VARIANTS[name]["attention"]), given)
    _refuse_contradictions(spec, name, given, items)
    overrides = {**VARIANTS[name], **given}
    flat = flat_option_names()
    try:
        get_attention(overrides["attention"]).options(None, {k: v for k, v in overrides.items() if k in flat})
    except ValueError as exc:
        raise ValueError(f"variant {spec!r}: {exc}") from None
    return overrides


def _typed_map_options(spec: str, attention: str, given: dict) -> dict:
    """``given`` with its map options converted to the types that ``attention``'s map declares. A flat option
    that two registered maps declare with different types (a plugin's ``n_steps: float`` beside the dynamics'
    ``int``) is parsed as a string (:func:`~coupled_qk.models.registry.map_option_types`); without this,
    ``coupled_two+n_steps=2`` would compare ``'2'`` with the variant's ``2``."""
    entry = ATTENTIONS.get(attention)
    if entry is None or entry.qk_map is None:
        return given  # refused later, naming the spec
    types, flat = field_types(entry.qk_map.options), flat_option_names()
    return {
        k: coerce(f"variant {spec!r} {k}", v, types[flat[k]]) if isinstance(v, str) and flat.get(k) in types else v
        for k, v in given.items()
    }


def _defining(name: str) -> dict:
    """The settings that define the variant ``name`` (flat spellings resolved): only the attention for a variant
    named after its attention (``coupled``: its other entries are defaults an override may change), every entry
    for the others (``coupled_leapfrog`` is ``integrator=leapfrog``)."""
    spec = VARIANTS[name]
    if name in ATTENTIONS:
        return {"attention": spec["attention"]}
    return {OPTION_ALIASES.get(k, k): v for k, v in spec.items()}


def _refuse_contradictions(spec: str, name: str, given: dict, items: list[str]) -> None:
    """``ValueError`` when an override of ``spec`` sets a defining setting of ``name`` to another value (the
    spec would train one model under another's label), naming the spec to write instead."""
    defining = _defining(name)
    clash = {
        k: v
        for k, v in given.items()
        if OPTION_ALIASES.get(k, k) in defining and defining[OPTION_ALIASES.get(k, k)] != v
    }
    if not clash:
        return
    attention = given.get("attention", defining["attention"])
    kept = [item.strip() for item in items if item.partition("=")[0].strip().replace("-", "_") != "attention"]
    instead = "+".join([attention, *kept])
    key, value = next(iter(clash.items()))
    raise ValueError(
        f"variant {spec!r}: {key}={value!r} contradicts {name!r}, which is defined by "
        f"{key}={defining[OPTION_ALIASES.get(key, key)]!r}; write {instead!r} instead"
    )


def variant_identity(spec: str, preset: str | None = None, model: dict | None = None) -> dict:
    """What a variant spec trains, for telling equivalent specs apart: the resolved model configuration.

    Args:
        spec: a variant spec.
        preset, model: the study's base model (a ``GPTConfig`` preset name and its overrides, as in a
            ``TrainConfig``). With a preset the identity is the whole resolved :class:`GPTConfig` as a dict
            (``standard+n_layer=4`` is ``standard`` under a preset of 4 layers); without one (or when the base
            does not build: its own error is reported where the run is configured) it is the spec's attention,
            its map options with their defaults filled in, and its other overrides.

    Raises:
        ValueError: an invalid spec (see :func:`variant_overrides`).
    """
    overrides = variant_overrides(spec)
    if preset is not None:
        try:
            return GPTConfig.from_preset(preset, **{**(model or {}), **overrides}).to_dict()
        except (TypeError, ValueError):
            pass
    flat = flat_option_names()
    options = get_attention(overrides["attention"]).options(None, {k: v for k, v in overrides.items() if k in flat})
    return {
        **{k: v for k, v in overrides.items() if k not in flat},
        "qk_map": None if options is None else dataclasses.asdict(options),
    }


def check_distinct(
    specs: Sequence[str], preset: str | None = None, model: dict | None = None, where: str = "--variants"
) -> None:
    """Refuse two specs of one selection that resolve to the same model (:func:`variant_identity`): they would
    train and report the same model twice under two labels.

    Raises:
        ValueError: naming ``where`` and both specs.
    """
    seen: dict[str, str] = {}
    for spec in specs:
        key = json.dumps(variant_identity(spec, preset, model), sort_keys=True, default=str)
        if key in seen:
            raise ValueError(
                f"{where}: {seen[key]!r} and {spec!r} are the same model (an override equal to the "
                "variant's default, or another name of the same setting); list one of them"
            )
        seen[key] = spec


def variant_attention(spec: str) -> Attention:
    """The :class:`~coupled_qk.models.registry.Attention` a variant spec selects."""
    return get_attention(variant_overrides(spec)["attention"])


def parse_variants(text: str | Sequence[str] | None, default: Sequence[str] | None = None) -> list[str]:
    """Canonical variant specs from ``"a,b"`` or a list, a spec written twice kept once; ``None`` or ``"all"``
    -> ``default`` (``None``: :func:`~coupled_qk.models.registry.default_variants`, computed now).

    Raises:
        ValueError: an invalid spec (see :func:`variant_overrides`), two different specs of the same model
            (:func:`check_distinct`) or an empty selection.
    """
    if text is None or text == "all":
        return list(default_variants() if default is None else default)
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        if not item.strip():
            continue
        name = canonical_name(item)
        variant_overrides(name)  # validates
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"variants={text!r} selects no variant; expected some of {variant_names()}")
    check_distinct(out)
    return out
