"""The one registry of attention variants: query-key map x scoring x head layout x config schema.

Two levels (docs/METHOD.md sections 1-2; the add-a-variant checklist is in docs/DESIGN.md):

- An **attention** (``GPTConfig.attention``) is one cell of the grid *query-key map x scoring*, built by
  :func:`register_qk_map`: every registered map (:data:`QK_MAPS`) combines with every scoring rule
  (:data:`~coupled_qk.layers.attention.SCORINGS`). Names: ``standard`` and ``differential`` without a map;
  ``<stem>`` and ``<stem>_differential`` for a map registered with that stem (``coupled`` and
  ``coupled_differential`` for the dynamics, ``uncoupled_mlp`` and ``uncoupled_mlp_differential`` for the
  query MLP). The scoring fixes the head layout (:attr:`Attention.head_group`: differential scoring pairs
  query/key sub-heads) and the map fixes the nested config schema (``GPTConfig.qk_map``, a dataclass
  that exists only for attentions with a map, so an option that would be ignored is an error).
- A **variant** (:data:`VARIANTS`) is a named spec used by ``compare``, ``bench``, ``mqar`` and ``demo``: an
  attention plus option overrides, e.g. ``coupled_leapfrog``. A spec is a name (``-`` and ``_``
  interchangeable, :data:`ALIASES` resolved) optionally followed by ``+field=value`` overrides, e.g.
  ``coupled+n_steps=3+dt_init=0.0``.

Adding a query-key map: a class in :mod:`coupled_qk.layers.qk_maps` (the interface is documented there)
and one :func:`register_qk_map` call with its options dataclass (a subclass of :class:`MapOptions`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from coupled_qk._checks import choice, coerce_fields, finite, nonneg_int, positive_int
from coupled_qk.layers.attention import SCORINGS
from coupled_qk.layers.forces import FORCES
from coupled_qk.layers.invertible import InvertibleQKCoupling
from coupled_qk.layers.qk_maps import QKDynamics, QueryMLP
from coupled_qk.ops.dynamics import INTEGRATORS

# ------------------------------------------------------------------------------------------------------
# nested configs of the query-key maps
# ------------------------------------------------------------------------------------------------------


class MapOptions:
    """Base class of the nested map configs (``GPTConfig.qk_map``).

    Subclasses are dataclasses whose fields are the keyword arguments of their map's constructor. On
    construction every field is converted to its declared type (``_checks.coerce_fields``: ``"False"`` ->
    ``False``) and :meth:`validate` checks ranges.

    Raises:
        ValueError: naming ``GPTConfig.qk_map.<field>``, the value and what was expected.
    """

    def __post_init__(self):
        coerce_fields(self, "GPTConfig.qk_map")
        self.validate()

    def validate(self) -> None:
        """Range checks of the converted fields (override in subclasses)."""


def _check_hidden_dt(opts) -> None:
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
        _check_hidden_dt(self)
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
        _check_hidden_dt(self)


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


FLAT_MAP_OPTIONS = {
    "integrator": "integrator",
    "n_steps": "n_steps",
    "dynamics_hidden": "hidden",
    "dt_init": "dt_init",
    "shared_across_heads": "shared_across_heads",
    "force": "force",
    "keys_per_query_head": "keys_per_query_head",
}
"""Flat spellings (config files, ``--set``, variant specs, old saved configs) -> nested ``qk_map`` field."""

LEGACY_DEFAULTS = dict(integrator="euler", n_steps=1, dynamics_hidden=None, dt_init=0.1, shared_across_heads=True,
                       force="mlp", keys_per_query_head=True)
"""Values that configs saved before the nested ``qk_map`` wrote for every attention (dropped on load where
the attention has no such option)."""

# ------------------------------------------------------------------------------------------------------
# the grid: query-key maps x scoring rules
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QKMapType:
    """A registered query-key map.

    Fields:
        name: registry key (``"dynamics"``, ``"query_mlp"``).
        stem: attention-name stem (``"coupled"`` gives ``coupled`` and ``coupled_differential``).
        module: the map class, built as ``module(d_head, n_heads, **dataclasses.asdict(options))``.
        options: its nested config, a :class:`MapOptions` dataclass.
    """

    name: str
    stem: str
    module: type
    options: type

    def option_names(self) -> list[str]:
        """Field names of the nested config."""
        return [f.name for f in dataclasses.fields(self.options)]


@dataclass(frozen=True)
class Attention:
    """One cell of the grid: an optional query-key map and a scoring rule.

    Fields: ``name`` (``GPTConfig.attention``), ``qk_map`` (a :class:`QKMapType` or ``None``), ``scoring``
    (``"standard"`` or ``"differential"``).
    """

    name: str
    qk_map: QKMapType | None
    scoring: str

    @property
    def head_group(self) -> int:
        """Query/key sub-heads per attention head: 2 for differential scoring (``n_heads`` and ``n_kv_heads``
        must be even), else 1."""
        return 2 if self.scoring == "differential" else 1

    def options(self, given=None, flat: dict | None = None) -> MapOptions | None:
        """The validated nested config from ``given`` (a :class:`MapOptions`, a dict or ``None`` for the
        defaults) and ``flat`` options (flat spelling -> value, see :data:`FLAT_MAP_OPTIONS`; they win).

        Raises:
            ValueError: naming the option and this attention, for options of an attention without a map, or
                options that its map does not have.
        """
        flat = dict(flat or {})
        if self.qk_map is None:
            if given is not None or flat:
                names = sorted(flat) or ["qk_map"]
                raise ValueError(
                    f"GPTConfig option(s) {names} do not apply to attention={self.name!r}: it has no query-key map "
                    f"(map options exist for {[a for a, s in ATTENTIONS.items() if s.qk_map is not None]})"
                )
            return None
        if isinstance(given, MapOptions):
            given = dataclasses.asdict(given)
        if given is not None and not isinstance(given, dict):
            raise ValueError(f"GPTConfig.qk_map={given!r} must be a dict of {self.qk_map.name} options or null")
        data = dict(given or {})
        valid = self.qk_map.option_names()
        for key, value in flat.items():
            data[FLAT_MAP_OPTIONS.get(key, key)] = value
        unknown = [k for k in data if k not in valid]
        if unknown:
            spelled = [next((f for f, n in FLAT_MAP_OPTIONS.items() if n == k and f in flat), k) for k in unknown]
            raise ValueError(
                f"GPTConfig option(s) {spelled} do not apply to attention={self.name!r}: its query-key map "
                f"{self.qk_map.name!r} has the options {valid}"
            )
        return self.qk_map.options(**data)

    def layer_kwargs(self, options: MapOptions | None) -> dict:
        """``qk_map`` (a factory ``(d_head, n_heads) -> module`` or ``None``) and ``scoring`` for
        :class:`~coupled_qk.layers.attention.CausalSelfAttention`."""
        factory = None
        if self.qk_map is not None:
            factory = functools.partial(_build_map, self.qk_map.module, dataclasses.asdict(options))
        return dict(qk_map=factory, scoring=self.scoring)


def _build_map(module: type, options: dict, d_head: int, n_heads: int):
    return module(d_head, n_heads, **options)


QK_MAPS: dict[str, QKMapType] = {}
"""Registered query-key maps by name."""

ATTENTIONS: dict[str, Attention] = {scoring: Attention(scoring, None, scoring) for scoring in SCORINGS}
"""Every attention of the grid by name (maps x scorings, plus the map-free ``standard``/``differential``)."""


def attention_name(stem: str, scoring: str) -> str:
    """The grid's name of a map stem with a scoring rule (``coupled`` + ``differential`` ->
    ``coupled_differential``)."""
    return stem if scoring == "standard" else f"{stem}_{scoring}"


def register_qk_map(name: str, stem: str, module: type, options: type) -> QKMapType:
    """Register a query-key map and add its attentions (one per scoring rule) to :data:`ATTENTIONS`.

    Args:
        name: map name (key of :data:`QK_MAPS`).
        stem: attention-name stem (see :func:`attention_name`).
        module: class following the interface of :mod:`coupled_qk.layers.qk_maps`.
        options: its nested config, a dataclass subclassing :class:`MapOptions`.

    Raises:
        ValueError: a name or stem already taken, or ``options`` not a :class:`MapOptions` dataclass.
    """
    if name in QK_MAPS:
        raise ValueError(f"query-key map {name!r} is already registered")
    if not (isinstance(options, type) and issubclass(options, MapOptions) and dataclasses.is_dataclass(options)):
        raise ValueError(f"options={options!r} must be a dataclass subclassing MapOptions")
    names = [attention_name(stem, s) for s in SCORINGS]
    taken = [n for n in names if n in ATTENTIONS]
    if taken:
        raise ValueError(f"map stem {stem!r} gives attention names {taken} that are already registered")
    entry = QKMapType(name, stem, module, options)
    QK_MAPS[name] = entry
    for scoring, attention in zip(SCORINGS, names):
        ATTENTIONS[attention] = Attention(attention, entry, scoring)
    return entry


register_qk_map("dynamics", "coupled", QKDynamics, DynamicsOptions)
register_qk_map("query_mlp", "uncoupled_mlp", QueryMLP, QueryMLPOptions)
register_qk_map("invertible", "invertible", InvertibleQKCoupling, InvertibleOptions)  # v2's coupling


def get_attention(name: str) -> Attention:
    """The registered :class:`Attention` called ``name``; ``ValueError`` listing the known names otherwise."""
    if name not in ATTENTIONS:
        raise ValueError(f"GPTConfig.attention={name!r} is unknown; expected one of {list(ATTENTIONS)}")
    return ATTENTIONS[name]


# ------------------------------------------------------------------------------------------------------
# named variants (specs for compare, bench, mqar, demo)
# ------------------------------------------------------------------------------------------------------

VARIANTS: dict[str, dict] = {
    "standard": dict(attention="standard"),
    "coupled": dict(attention="coupled", integrator="euler"),  # the paper's Euler integrator
    "coupled_leapfrog": dict(attention="coupled", integrator="leapfrog"),  # the paper's Hamiltonian one
    "coupled_symplectic_euler": dict(attention="coupled", integrator="symplectic_euler"),
    "uncoupled_mlp": dict(attention="uncoupled_mlp"),
    "differential": dict(attention="differential"),
    "coupled_differential": dict(attention="coupled_differential"),
    "invertible": dict(attention="invertible"),  # arXiv:2604.01683v2: standard scoring + invertible coupling
    "invertible_differential": dict(attention="invertible_differential"),  # v2's headline combination
}
"""Variant name -> ``GPTConfig`` overrides (flat spellings; see :func:`register_variant`)."""

MAIN_VARIANTS = [name for name in VARIANTS if name != "coupled_symplectic_euler"]
"""The paper's variants (v1 and v2) and baselines (the default set of ``bench`` and ``mqar``)."""

ALIASES = {"coupled_euler": "coupled", "leapfrog": "coupled_leapfrog", "diff": "differential"}


def register_variant(name: str, attention: str, **options) -> None:
    """Add a named variant: ``attention`` (a key of :data:`ATTENTIONS`) with map ``options``.

    Raises:
        ValueError: a taken name, an unknown attention or options that do not apply to it.
    """
    if name in VARIANTS or name in ALIASES:
        raise ValueError(f"variant {name!r} is already registered")
    get_attention(attention).options(None, options)  # validates
    VARIANTS[name] = dict(attention=attention, **options)


def canonical_name(spec: str) -> str:
    """The canonical spelling of a variant spec: aliases resolved, ``-`` written ``_`` in the name part."""
    head, sep, rest = spec.strip().partition("+")
    head = head.replace("-", "_")
    return ALIASES.get(head, head) + sep + rest


def variant_overrides(spec: str) -> dict:
    """``GPTConfig`` overrides of a variant spec (values converted to the fields' types).

    Raises:
        ValueError: an empty spec, an unknown name (listing the known ones), a ``+`` part without ``=``, an
            unknown field or a value of the wrong type.
    """
    from coupled_qk.models.config import parse_overrides  # same layer; config.py imports this module

    name, _, rest = canonical_name(spec).partition("+")
    if not name:
        raise ValueError(f"variant spec {spec!r} is empty")
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {spec!r}; expected one of {list(VARIANTS)}, optionally +field=value")
    return {**VARIANTS[name], **parse_overrides(rest.split("+") if rest else [], flag=f"variant {spec!r}")}


def variant_attention(spec: str) -> Attention:
    """The :class:`Attention` a variant spec selects."""
    return get_attention(variant_overrides(spec)["attention"])


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


