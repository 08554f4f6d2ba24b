"""The tables of the attention grid and their entry types (query-key map x scoring rule), which
:mod:`coupled_qk.models.registry` fills and queries.

- :class:`QKMapType`, :class:`ScoringType`: a registered query-key map and scoring rule; :class:`Attention`:
  one cell of the grid (an optional map and a scoring rule), which validates its map options and gives the
  attention layer its keyword arguments.
- :data:`QK_MAPS`, :data:`SCORING_RULES`, :data:`ATTENTIONS`, :data:`VARIANTS`, :data:`ALIASES` and
  :data:`DEFAULTS`: the live tables (module-level, mutated in place by the registry's ``register_*`` calls and
  restored by its ``isolated()``). Read them through the registry, which loads plugins first.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from coupled_qk.layers.scoring import SCORINGS
from coupled_qk.models.options import MapOptions

OPTION_ALIASES = {"dynamics_hidden": "hidden"}
"""Flat spellings that differ from the nested field name (config files and ``--set`` of earlier versions)."""


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
class ScoringType:
    """A registered scoring rule.

    Fields:
        name: registry key and attention-name suffix (``"standard"``, ``"differential"``, a plugin's name).
        module: ``None`` for the built-in rules (code in :mod:`coupled_qk.layers.attention`), else a
            :class:`~coupled_qk.layers.attention.ScoringRule` subclass built as ``module(d_head, n_heads,
            layer_idx)``.
        head_group: query/key sub-heads per head (2 for differential scoring, else 1).
    """

    name: str
    module: type | None
    head_group: int = 1


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
        must be even), else 1 (the scoring rule's :attr:`ScoringType.head_group`)."""
        return SCORING_RULES[self.scoring].head_group

    def options(self, given=None, flat: dict | None = None) -> MapOptions | None:
        """The validated nested config from ``given`` (a :class:`MapOptions`, a dict or ``None`` for the
        defaults) and ``flat`` options (flat spelling -> value, see
        :func:`~coupled_qk.models.registry.flat_option_names`). One option given twice with different values (a
        flat spelling and ``given``, or two spellings: ``dynamics_hidden`` and ``hidden``) is refused; a change of
        an existing config folds its flat options into ``given`` first (:meth:`GPTConfig.replace`).

        Raises:
            ValueError: naming the option and this attention, for options of an attention without a map, or
                options that its map does not have; or from the options dataclass (a value of the wrong type
                or out of range, naming ``GPTConfig.qk_map.<field>``).
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
        spelled_as: dict[str, str] = {}
        for key, value in flat.items():  # one option given twice (two spellings, or flat and in qk_map) is refused
            name = OPTION_ALIASES.get(key, key)
            if name in data and data[name] != value:
                first = spelled_as.get(name, f"qk_map.{name}")
                raise ValueError(
                    f"GPTConfig: the map option {name!r} is given twice with different values: {first}="
                    f"{data[name]!r} and {key}={value!r}; give it once"
                )
            data[name] = value
            spelled_as[name] = key
        unknown = [k for k in data if k not in valid]
        if unknown:
            spelled = [next((f for f, n in OPTION_ALIASES.items() if n == k and f in flat), k) for k in unknown]
            raise ValueError(
                f"GPTConfig option(s) {spelled} do not apply to attention={self.name!r}: its query-key map "
                f"{self.qk_map.name!r} has the options {valid}"
            )
        return self.qk_map.options(**data)

    def layer_kwargs(self, options: MapOptions | None) -> dict:
        """``qk_map`` (a factory ``(d_head, n_heads) -> module`` or ``None``) and ``scoring`` (a built-in rule's
        name or an added rule's class) for :class:`~coupled_qk.layers.attention.CausalSelfAttention`."""
        factory = None
        if self.qk_map is not None:
            factory = functools.partial(build_map, self.qk_map.module, dataclasses.asdict(options))
        rule = SCORING_RULES[self.scoring]
        return dict(qk_map=factory, scoring=self.scoring if rule.module is None else rule.module)


def build_map(module: type, options: dict, d_head: int, n_heads: int):
    """``module(d_head, n_heads, **options)``: a query-key map of one layer (a picklable factory part)."""
    return module(d_head, n_heads, **options)


QK_MAPS: dict[str, QKMapType] = {}
"""Registered query-key maps by name."""

SCORING_RULES: dict[str, ScoringType] = {
    "standard": ScoringType("standard", None, 1),
    "differential": ScoringType("differential", None, 2),
}
"""Registered scoring rules by name: the built-in :data:`~coupled_qk.layers.attention.SCORINGS` first."""
assert tuple(SCORING_RULES) == SCORINGS

ATTENTIONS: dict[str, Attention] = {scoring: Attention(scoring, None, scoring) for scoring in SCORINGS}
"""Every attention of the grid by name (maps x scorings, plus the map-free ``standard``/``differential``)."""

VARIANTS: dict[str, dict] = {}
"""Variant name -> ``GPTConfig`` overrides (flat spellings; see
:func:`~coupled_qk.models.registry.register_variant`)."""

ALIASES = {"coupled_euler": "coupled", "leapfrog": "coupled_leapfrog", "diff": "differential"}
"""Other spellings of variant names."""

DEFAULTS: list[str] = []
"""The default variant set, in registration order (read it with ``registry.default_variants()``)."""
