"""The options dataclasses of the built-in query-key maps (``GPTConfig.qk_map``) and their base class.

A map's options are a dataclass subclassing :class:`MapOptions` whose fields are the keyword arguments of the
map's constructor (docs/DESIGN.md, "Adding an attention variant"). The registry
(:mod:`coupled_qk.models.registry`) reads the fields to generate everything else: the flat spellings that
``--set``, variant specs and ``GPTConfig(...)`` keywords accept, their types and the error messages.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

from coupled_qk._assignment import CheckedAssignment
from coupled_qk._checks import FLOAT32_MAX, check_declared, coerce_fields, declare
from coupled_qk.layers.forces import FORCES
from coupled_qk.ops.dynamics import INTEGRATORS

__all__ = ["DynamicsOptions", "InvertibleOptions", "MapOptions", "QueryMLPOptions"]


class MapOptions(CheckedAssignment):
    """Base class of the nested map configs (``GPTConfig.qk_map``).

    Subclasses are dataclasses whose fields are the keyword arguments of their map's constructor. On
    construction every field is converted to its declared type (``_checks.coerce_fields``: ``"False"`` ->
    ``False``, ``"2"`` -> ``2``), checked against the range or choices declared once in its field metadata
    (``_checks.declare``; ``_checks.check_declared``), then :meth:`validate` runs the cross-field checks.
    Assigning a field later (``config.qk_map.n_steps = 2``) runs the same checks
    (:class:`~coupled_qk._assignment.CheckedAssignment`); the rules that involve the rest of ``GPTConfig``
    (e.g. ``keys_per_query_head`` with ``n_kv_heads``) run again when a model is built from the config.
    Every field must be declared (``tests/reliability/test_field_declarations.py`` introspects every
    registered map's options).

    Raises:
        ValueError: naming ``GPTConfig.qk_map.<field>``, the value and what was expected.
    """

    def __post_init__(self):
        coerce_fields(self, "GPTConfig.qk_map")
        self.recheck()

    def owner_name(self) -> str:
        return "GPTConfig.qk_map"

    def recheck(self, name: str | None = None) -> None:
        """The declared ranges and choices of every field, then :meth:`validate`, then (after construction) the
        checks of the ``GPTConfig`` that holds these options (:meth:`bind`), if it still does."""
        check_declared(self, "GPTConfig.qk_map")
        self.validate()
        ref = self.__dict__.get("_owner")
        owner = ref() if ref is not None else None
        if owner is not None and owner.qk_map is self:
            owner.validate()

    def bind(self, owner) -> None:
        """Remember the ``GPTConfig`` that holds these options (weakly), so that assigning an option re-runs its
        cross-field rules (``GPTConfig.validate`` calls this)."""
        object.__setattr__(self, "_owner", weakref.ref(owner))

    def __getstate__(self) -> dict:
        """Pickled without the weak reference to the owning config (``GPTConfig`` binds it again)."""
        return {k: v for k, v in self.__dict__.items() if k != "_owner"}

    def validate(self) -> None:
        """Cross-field checks of the converted, range-checked fields (override in subclasses; raise
        ``ValueError`` naming ``GPTConfig.qk_map.<field>``)."""

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the options, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]


HIDDEN = dict(lo=1)
"""Declaration of a coupling network's width ``hidden`` (``None`` or >= 1)."""
DT_INIT = dict(lo=-FLOAT32_MAX, hi=FLOAT32_MAX)
"""Declaration of an initial step ``dt_init`` (any number a float32 parameter holds: 1e308 is finite in Python
but infinite in float32)."""


@dataclass
class DynamicsOptions(MapOptions):
    """Options of :class:`~coupled_qk.layers.qk_maps.QKDynamics` (docs/METHOD.md sections 1 and 4).

    Fields: ``integrator`` (``euler``, ``leapfrog``, ``symplectic_euler``), ``n_steps`` (>= 0), ``hidden``
    (coupling-network width, ``None`` = ``d_head``), ``dt_init`` (finite initial step), ``shared_across_heads``
    (one network for all heads), ``force`` (``mlp`` or ``gradient``), ``keys_per_query_head`` (``True``, the
    paper: one evolved key per query head; ``False``, beyond the paper: one evolved key per key/value head under
    grouped-query attention, so the KV cache is as small as standard attention's; needs
    ``shared_across_heads``; docs/METHOD.md section 1.1). Set the nested field, e.g.
    ``GPTConfig(attention="coupled", n_kv_heads=2, qk_map={"keys_per_query_head": False})``.
    """

    integrator: str = declare("euler", choices=INTEGRATORS)
    n_steps: int = declare(1, lo=0)
    hidden: int | None = declare(None, **HIDDEN)
    dt_init: float = declare(0.1, **DT_INIT)
    shared_across_heads: bool = True
    force: str = declare("mlp", choices=FORCES)
    keys_per_query_head: bool = True

    def validate(self) -> None:
        if not self.keys_per_query_head and not self.shared_across_heads:
            raise ValueError(
                "GPTConfig.qk_map.keys_per_query_head=False needs shared_across_heads=True (the force acts on the "
                "group-mean query, so one network serves all heads); got shared_across_heads=False"
            )


@dataclass
class QueryMLPOptions(MapOptions):
    """Options of :class:`~coupled_qk.layers.qk_maps.QueryMLP` (docs/METHOD.md section 2): ``hidden``,
    ``dt_init`` and ``shared_across_heads`` as in :class:`DynamicsOptions`."""

    hidden: int | None = declare(None, **HIDDEN)
    dt_init: float = declare(0.1, **DT_INIT)
    shared_across_heads: bool = True


@dataclass
class InvertibleOptions(MapOptions):
    """Options of :class:`~coupled_qk.layers.invertible.InvertibleQKCoupling` (arXiv:2604.01683v2; docs/METHOD.md
    section 1): ``hidden`` (conditioner width, ``None`` = ``5 d_head // 8``), ``n_alternations`` (>= 1),
    ``scale_max`` (bound of each log-scale, > 0), ``shared_across_heads``."""

    hidden: int | None = declare(None, **HIDDEN)
    n_alternations: int = declare(1, lo=1)
    scale_max: float = declare(1.0, lo=0.0, lo_open=True)
    shared_across_heads: bool = True
