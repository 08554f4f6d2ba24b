"""Which query-key map :func:`coupled_qk.hf.retrofit.retrofit` inserts, into which layers, and the checks of both.

Any registered map (:data:`coupled_qk.models.registry.QK_MAPS`, plugins included) can be retrofitted when its class
implements the optional method ``start_at_identity()`` (:mod:`coupled_qk.layers.qk_maps`): retrofit builds the
map, calls the method, then verifies numerically (float64 random queries and keys of a few shapes, through the
map's own ``forward``) that the map returns its inputs exactly, so that the retrofitted model starts at the
pretrained model's function. A map without the method, or one that the method does not make the identity, is
refused naming the map. The built-in coupled dynamics (``qk_map="dynamics"``) take retrofit's own keywords
(``integrator``, ``n_steps``, ``dt_init``, ...) and start at the identity when ``dt_init == 0`` (the default).
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
from collections.abc import Sequence

import torch
import torch.nn as nn

from coupled_qk.models.contracts import IDENTITY_METHOD, SHIFT_ATTRIBUTE

DYNAMICS = "dynamics"
DYNAMICS_DEFAULTS = dict(integrator="euler", n_steps=1, dt_init=0.0, hidden=None, force="mlp", shared_across_heads=True)
"""retrofit's keywords that are options of the built-in dynamics, with their defaults."""
OPTION_NAMES = (*DYNAMICS_DEFAULTS, "gqa", "position", "freeze_base", "qk_map", "map_options", "layers")
"""Every option retrofit records in ``config.coupled_qk_retrofit`` (older folders hold only the first eight)."""
_PROBE_SHAPES = ((1, 1), (2, 5), (3, 2))  # (batch, tokens) of the float64 identity check


def map_spec(qk_map: object, map_options: object, dynamics: dict) -> tuple[object, dict, bool]:
    """``(registry entry, constructor keyword arguments, start at the identity?)`` of the map to insert.

    Args:
        qk_map: a registered map name (:data:`~coupled_qk.models.registry.QK_MAPS`).
        map_options: the options of a map other than ``"dynamics"`` (fields of its options dataclass; ``None``:
            its defaults).
        dynamics: retrofit's dynamics keywords (:data:`DYNAMICS_DEFAULTS` keys).

    Raises:
        ValueError: an unknown map; ``map_options`` given for the dynamics, or dynamics keywords changed for
            another map; ``map_options`` not a mapping of the map's options or holding a value they refuse; a map
            other than the dynamics without ``start_at_identity`` (naming the map and what to add).
    """
    from coupled_qk.models.registry import QK_MAPS, load_plugins

    load_plugins()
    if not isinstance(qk_map, str) or qk_map not in QK_MAPS:
        raise ValueError(f"qk_map={qk_map!r} is unknown; expected one of {list(QK_MAPS)} (a registered query-key map)")
    entry = QK_MAPS[qk_map]
    fields = entry.option_names()
    if qk_map == DYNAMICS:
        if map_options:
            raise ValueError(
                f"map_options={map_options!r} is for maps other than qk_map='dynamics'; give the "
                f"dynamics' options as retrofit's keywords ({', '.join(DYNAMICS_DEFAULTS)})"
            )
        return entry, dict(dynamics), dynamics["dt_init"] == 0.0
    changed = {k: v for k, v in dynamics.items() if v != DYNAMICS_DEFAULTS[k]}
    if changed:
        raise ValueError(
            f"retrofit(qk_map={qk_map!r}): {changed} are options of qk_map='dynamics' only; give "
            f"{qk_map}'s options as map_options (fields {fields})"
        )
    if map_options is not None and not isinstance(map_options, dict):
        raise ValueError(f"map_options={map_options!r} must be a dict of {qk_map}'s options (fields {fields}) or None")
    unknown = sorted(set(map_options or {}) - set(fields))
    if unknown:
        raise ValueError(
            f"map_options={map_options!r}: unknown option(s) {unknown} of qk_map={qk_map!r}; expected "
            f"fields of {entry.options.__name__}: {fields}"
        )
    try:
        opts = entry.options(**(map_options or {}))
    except ValueError as exc:
        raise ValueError(f"map_options={map_options!r} of qk_map={qk_map!r}: {exc}") from None
    if not callable(getattr(entry.module, IDENTITY_METHOD, None)):
        raise ValueError(
            f"retrofit(qk_map={qk_map!r}): {entry.module.__name__} has no {IDENTITY_METHOD}() method, so nothing says "
            f"how to make it start as the identity (the pretrained model's function); add to the class a method "
            f"'def {IDENTITY_METHOD}(self) -> None' that sets its parameters so that map(q, k) returns (q, k) exactly "
            f"(e.g. a step size dt = 0; see coupled_qk.layers.qk_maps)"
        )
    return entry, {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}, True


def check_shared_keys(entry, gqa: str, group_size: int) -> None:
    """Refuse ``gqa="shared"`` for a map whose query update is not a shift (``entry.module.query_update_is_shift``
    false) when keys are shared by ``group_size > 1`` query heads.

    The shared rule runs the map on (group-mean query, key) and gives every query head the mean query's shift
    (:mod:`coupled_qk.hf.retrofit`); for a map whose query update depends on the query (``q + dt g(q)``,
    ``q exp(s(k)) + t(k)``) each head would get ``q_h + D(mean q)``, not the map applied to ``q_h``.

    Raises:
        ValueError: naming the map, its class, the option ``gqa`` and what to use instead.
    """
    if gqa != "shared" or group_size == 1 or getattr(entry.module, SHIFT_ATTRIBUTE, False):
        return
    cls = entry.module.__name__
    raise ValueError(
        f"retrofit(qk_map={entry.name!r}, gqa='shared'): {cls}.{SHIFT_ATTRIBUTE} is False (its query update depends "
        f"on the query), but gqa='shared' runs the map on each group's mean query and gives all {group_size} query "
        f"heads of the group that mean query's displacement, which is not {cls} applied to each query head; use "
        f"gqa='expand' (one key per query head), or set {SHIFT_ATTRIBUTE} = True on a map whose query update is a "
        f"shift that does not depend on the query (see coupled_qk.layers.qk_maps)"
    )


def build_map(entry, kwargs: dict, identity: bool, d_head: int, n_heads: int, ref: torch.Tensor) -> nn.Module:
    """``entry.module(d_head, n_heads, **kwargs)`` built on the CPU, made the identity (``identity``: its
    ``start_at_identity()``, then :func:`verify_identity`), moved to ``ref``'s device and dtype.

    Raises:
        ValueError: an option the map refuses, or a map that is not the identity after ``start_at_identity()``.
    """
    qk_map = entry.module(d_head, n_heads, **kwargs)
    if identity:
        getattr(qk_map, IDENTITY_METHOD)()
        verify_identity(qk_map, entry.name, d_head, n_heads)
    return qk_map.to(device=ref.device, dtype=ref.dtype)


def verify_identity(qk_map: nn.Module, name: str, d_head: int, n_heads: int) -> None:
    """``ValueError`` naming the map ``name`` unless ``qk_map`` returns float64 random ``q, k`` of shapes
    ``(B, n_heads, T, d_head)`` (a few ``B, T``) exactly, bit for bit. Checks a float64 CPU copy in eval mode; the
    global random state is not used."""
    probe = copy.deepcopy(qk_map).to(device="cpu", dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(0)
    cls = type(qk_map).__name__
    for b, t in _PROBE_SHAPES:
        q, k = (torch.randn(b, n_heads, t, d_head, generator=g, dtype=torch.float64) for _ in range(2))
        try:
            with torch.no_grad():
                q2, k2 = probe(q.clone(), k.clone())
        except Exception as exc:
            raise ValueError(
                f"retrofit(qk_map={name!r}): {cls} failed on float64 q, k of shape {tuple(q.shape)} "
                f"after {IDENTITY_METHOD}(): {type(exc).__name__}: {exc}"
            ) from None
        if not (q2.shape == q.shape and k2.shape == k.shape and torch.equal(q2, q) and torch.equal(k2, k)):
            moved = (
                max(float((q2 - q).abs().max()), float((k2 - k).abs().max()))
                if q2.shape == q.shape and k2.shape == k.shape
                else "a shape change"
            )
            raise ValueError(
                f"retrofit(qk_map={name!r}): {cls}.{IDENTITY_METHOD}() does not make the map the identity: on float64 "
                f"q, k of shape {tuple(q.shape)} it changed them (by up to {moved}), so the retrofitted model would "
                f"not start at the pretrained function; {IDENTITY_METHOD}() must set the parameters so that "
                f"map(q, k) returns (q, k) exactly"
            )


def check_layers(layers: object, n_layers: int) -> list[int]:
    """The sorted layer indices to retrofit: every one of the ``n_layers`` attention layers for ``None``.

    Raises:
        ValueError: naming ``layers``: not a list of ints, empty, with duplicates or an index outside
            ``0 .. n_layers - 1``.
    """
    if layers is None:
        return list(range(n_layers))
    expected = (
        f"a list of distinct layer indices from 0 to {n_layers - 1} (the model's {n_layers} attention "
        f"layers), or None for every layer"
    )
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise ValueError(f"layers={layers!r} must be {expected}")
    if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in layers):
        raise ValueError(f"layers={layers!r}: every entry must be an integer; expected {expected}")
    chosen = [int(i) for i in layers]
    if not chosen:
        raise ValueError(f"layers={layers!r} selects no layer; expected {expected}")
    outside = [i for i in chosen if not 0 <= i < n_layers]
    if outside:
        raise ValueError(f"layers={layers!r}: {outside} out of range; expected {expected}")
    twice = sorted({i for i in chosen if chosen.count(i) > 1})
    if twice:
        raise ValueError(f"layers={layers!r}: {twice} given more than once; expected {expected}")
    return sorted(chosen)
