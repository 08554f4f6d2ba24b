"""Variant specs: ``name[+field=value...]`` strings naming a registered variant plus typed overrides.

A spec is a variant name (:func:`~coupled_qk.models.registry.variant_names`; ``-`` and ``_`` interchangeable,
:data:`~coupled_qk.models.registry.ALIASES` resolved) optionally followed by ``+field=value`` overrides of any
``GPTConfig`` field or map option, e.g. ``coupled+n_steps=3+dt_init=0.0``. Used by ``compare``, ``bench``,
``mqar``, ``demo`` and ``claims --variants``.
"""

from __future__ import annotations

from collections.abc import Sequence

from coupled_qk.models.config import parse_overrides
from coupled_qk.models.registry import (
    ALIASES,
    UNKNOWN_HINT,
    VARIANTS,
    Attention,
    default_variants,
    flat_option_names,
    get_attention,
    variant_names,
)

__all__ = ["canonical_name", "parse_variants", "variant_attention", "variant_overrides"]


def canonical_name(spec: str) -> str:
    """The canonical spelling of a variant spec: aliases resolved, ``-`` written ``_`` in the name part."""
    head, sep, rest = spec.strip().partition("+")
    head = head.replace("-", "_")
    return ALIASES.get(head, head) + sep + rest


def variant_overrides(spec: str) -> dict:
    """``GPTConfig`` overrides of a variant spec (values converted to the fields' types).

    Raises:
        ValueError: an empty spec, an unknown name (listing the known ones), a ``+`` part without ``=``, an
            unknown field or a value of the wrong type; map options its attention does not have or out of their
            range (the options dataclass's ``validate``), naming the spec, so that a study refuses a bad spec
            before it trains anything.
    """
    name, _, rest = canonical_name(spec).partition("+")
    if not name:
        raise ValueError(f"variant spec {spec!r} is empty")
    known = variant_names()  # loads plugins
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {spec!r}; expected one of {known}, optionally +field=value; "
                         f"{UNKNOWN_HINT}")
    overrides = {**VARIANTS[name], **parse_overrides(rest.split("+") if rest else [], flag=f"variant {spec!r}")}
    flat = flat_option_names()
    try:
        get_attention(overrides["attention"]).options(None, {k: v for k, v in overrides.items() if k in flat})
    except ValueError as exc:
        raise ValueError(f"variant {spec!r}: {exc}") from None
    return overrides


def variant_attention(spec: str) -> Attention:
    """The :class:`~coupled_qk.models.registry.Attention` a variant spec selects."""
    return get_attention(variant_overrides(spec)["attention"])


def parse_variants(text: str | Sequence[str] | None, default: Sequence[str] | None = None) -> list[str]:
    """Canonical variant specs from ``"a,b"`` or a list, duplicates dropped; ``None`` or ``"all"`` ->
    ``default`` (``None``: :func:`~coupled_qk.models.registry.default_variants`, computed now).

    Raises:
        ValueError: an invalid spec (see :func:`variant_overrides`) or an empty selection.
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
    return out
