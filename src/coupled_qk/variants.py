"""Named attention variants shared by ``compare``, ``demo``, ``bench`` and ``mqar``.

A variant is a set of :class:`~coupled_qk.GPTConfig` overrides. Specs are a name from :data:`VARIANTS`
(``-`` and ``_`` are interchangeable; ``coupled_euler`` and ``leapfrog`` are aliases), optionally followed
by ``+field=value`` overrides, e.g. ``coupled+n_steps=3+dt_init=0.0``.
"""

from __future__ import annotations

from collections.abc import Sequence

VARIANTS: dict[str, dict] = {
    "standard": dict(attention="standard"),
    "coupled": dict(attention="coupled", integrator="euler"),  # the paper's Euler integrator
    "coupled_leapfrog": dict(attention="coupled", integrator="leapfrog"),  # the paper's Hamiltonian one
    "coupled_symplectic_euler": dict(attention="coupled", integrator="symplectic_euler"),
    "uncoupled_mlp": dict(attention="uncoupled_mlp"),
    "differential": dict(attention="differential"),
    "coupled_differential": dict(attention="coupled_differential"),
}
"""Variant name -> ``GPTConfig`` overrides."""

MAIN_VARIANTS = [name for name in VARIANTS if name != "coupled_symplectic_euler"]
"""The paper's variants and baselines (the default set of ``bench`` and ``mqar``)."""

ALIASES = {"coupled_euler": "coupled", "leapfrog": "coupled_leapfrog", "diff": "differential"}


def canonical_name(spec: str) -> str:
    """The canonical spelling of a variant spec: aliases resolved, ``-`` written ``_`` in the name part."""
    head, sep, rest = spec.strip().partition("+")
    head = head.replace("-", "_")
    return ALIASES.get(head, head) + sep + rest


def variant_overrides(spec: str) -> dict:
    """``GPTConfig`` overrides of a variant spec.

    Raises:
        ValueError: an empty spec, an unknown name (listing the known ones) or a ``+`` part without ``=``.
    """
    from coupled_qk.commands.options import parse_overrides

    name, _, rest = canonical_name(spec).partition("+")
    if not name:
        raise ValueError(f"variant spec {spec!r} is empty")
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {spec!r}; expected one of {list(VARIANTS)}, optionally +field=value")
    return {**VARIANTS[name], **parse_overrides(rest.split("+") if rest else [])}


def parse_variants(text: str | Sequence[str] | None, default: Sequence[str] = MAIN_VARIANTS) -> list[str]:
    """Canonical variant specs from ``"a,b"`` or a list, duplicates dropped; ``None`` or ``"all"`` -> ``default``.

    Raises:
        ValueError: an invalid spec (see :func:`variant_overrides`) or an empty selection.
    """
    if text is None or text == "all":
        return list(default)
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
        raise ValueError(f"variants={text!r} selects no variant; expected some of {list(VARIANTS)}")
    return out
