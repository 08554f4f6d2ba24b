"""The options dataclasses of the built-in query-key maps (``GPTConfig.qk_map``) and their base class.

A map's options are a dataclass subclassing :class:`MapOptions` whose fields are the keyword arguments of the
map's constructor (docs/DESIGN.md, "Adding an attention variant"). The registry
(:mod:`coupled_qk.models.registry`) reads the fields to generate everything else: the flat spellings that
``--set``, variant specs and ``GPTConfig(...)`` keywords accept, their types and the error messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from coupled_qk._checks import choice, coerce_fields, finite, nonneg_int, positive_int
from coupled_qk.layers.forces import FORCES
from coupled_qk.ops.dynamics import INTEGRATORS

__all__ = ["DynamicsOptions", "InvertibleOptions", "MapOptions", "QueryMLPOptions"]


class MapOptions:
    """Base class of the nested map configs (``GPTConfig.qk_map``).

    Subclasses are dataclasses whose fields are the keyword arguments of their map's constructor. On
    construction every field is converted to its declared type (``_checks.coerce_fields``: ``"False"`` ->
    ``False``, ``"2"`` -> ``2``) and :meth:`validate` checks ranges.

    Raises:
        ValueError: naming ``GPTConfig.qk_map.<field>``, the value and what was expected.
    """

    def __post_init__(self):
        coerce_fields(self, "GPTConfig.qk_map")
        self.validate()

    def validate(self) -> None:
        """Range checks of the converted fields (override in subclasses; raise ``ValueError`` naming
        ``GPTConfig.qk_map.<field>``)."""

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the options, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]


def check_hidden_dt(opts: MapOptions) -> None:
    """Range checks shared by the coupling networks' options: ``hidden`` (``None`` or > 0) and a finite
    ``dt_init``.

    Raises:
        ValueError: naming ``GPTConfig.qk_map.hidden`` or ``GPTConfig.qk_map.dt_init``.
    """
    if opts.hidden is not None:
        positive_int("GPTConfig.qk_map.hidden", opts.hidden)
    finite("GPTConfig.qk_map.dt_init", opts.dt_init)


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

    integrator: str = "euler"
    n_steps: int = 1
    hidden: int | None = None
    dt_init: float = 0.1
    shared_across_heads: bool = True
    force: str = "mlp"
    keys_per_query_head: bool = True

    def validate(self) -> None:
        choice("GPTConfig.qk_map.integrator", self.integrator, INTEGRATORS)
        nonneg_int("GPTConfig.qk_map.n_steps", self.n_steps)
        check_hidden_dt(self)
        choice("GPTConfig.qk_map.force", self.force, FORCES)
        if not self.keys_per_query_head and not self.shared_across_heads:
            raise ValueError(
                "GPTConfig.qk_map.keys_per_query_head=False needs shared_across_heads=True (the force acts on the "
                "group-mean query, so one network serves all heads); got shared_across_heads=False"
            )


@dataclass
class QueryMLPOptions(MapOptions):
    """Options of :class:`~coupled_qk.layers.qk_maps.QueryMLP` (docs/METHOD.md section 2): ``hidden``,
    ``dt_init`` and ``shared_across_heads`` as in :class:`DynamicsOptions`."""

    hidden: int | None = None
    dt_init: float = 0.1
    shared_across_heads: bool = True

    def validate(self) -> None:
        check_hidden_dt(self)


@dataclass
class InvertibleOptions(MapOptions):
    """Options of :class:`~coupled_qk.layers.invertible.InvertibleQKCoupling` (arXiv:2604.01683v2; docs/METHOD.md
    section 1): ``hidden`` (conditioner width, ``None`` = ``5 d_head // 8``), ``n_alternations`` (>= 1),
    ``scale_max`` (bound of each log-scale, > 0), ``shared_across_heads``."""

    hidden: int | None = None
    n_alternations: int = 1
    scale_max: float = 1.0
    shared_across_heads: bool = True

    def validate(self) -> None:
        if self.hidden is not None:
            positive_int("GPTConfig.qk_map.hidden", self.hidden)
        positive_int("GPTConfig.qk_map.n_alternations", self.n_alternations)
        finite("GPTConfig.qk_map.scale_max", self.scale_max, lo=0.0, lo_open=True)
