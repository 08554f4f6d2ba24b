"""The one registry of attention variants: query-key map x scoring rule, named variants, default lists.

This module is the library's extension point (docs/DESIGN.md, "Adding an attention variant"). Two levels
(docs/METHOD.md sections 1-2):

- An **attention** (``GPTConfig.attention``) is one cell of the grid *query-key map x scoring*, built by
  :func:`register_qk_map` and :func:`register_scoring`: every registered map (:data:`QK_MAPS`) combines with
  every registered scoring rule (:data:`SCORING_RULES`: the built-in ``standard`` and ``differential``, plus
  any added :class:`~coupled_qk.layers.scoring.ScoringRule`). Names: the rule's name without a map
  (``standard``, ``differential``); ``<stem>`` (standard scoring) and ``<stem>_<rule>`` for a map registered
  with that stem (``coupled`` and ``coupled_differential`` for the dynamics). The scoring fixes the head layout
  (:attr:`Attention.head_group`) and the map fixes the nested config schema (``GPTConfig.qk_map``, a
  :class:`~coupled_qk.models.options.MapOptions` dataclass that exists only for attentions with a map, so an
  option that would be ignored is an error).
- A **variant** (:data:`VARIANTS`) is a named spec used by ``compare``, ``bench``, ``mqar``, ``claims
  --variants`` and ``demo``: an attention plus option overrides, e.g. ``coupled_leapfrog``. Every attention is
  also a variant of its own name. :func:`default_variants` is the default set of ``bench`` and ``mqar``,
  computed when asked, so a variant registered later (by a plugin) is in it.

Everything else is generated from the registry when asked: the flat option spellings that ``--set``, variant
specs (``name+field=value``) and ``GPTConfig(...)`` keywords accept (:func:`flat_option_names`, the fields of
every registered options dataclass), their types (:func:`map_option_types`) and the lists in help texts.

The query-key maps, the paper's included, are drop-ins: each module of :mod:`coupled_qk.models.maps` holds a
map, its options and a ``register()`` function (``dynamics``, ``query_mlp``, ``invertible``). Third-party
packages register through the entry-point group :data:`ENTRY_POINT_GROUP` (``coupled_qk.variants``, the
convention of pytest and lm-eval plugins): each entry point names a function that makes the registrations (or a
module whose import makes them). Both are read lazily, the first time the registry is queried
(:func:`load_plugins`), never at ``import coupled_qk``: read the tables (:data:`ATTENTIONS`, ...) through the
functions here, which load them first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from coupled_qk.checks.values import declared_flags, field_types
from coupled_qk.layers.attention import SCORINGS
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.models.contracts import check_map, check_name, check_scoring, same_definition
from coupled_qk.models.options import MapOptions

ENTRY_POINT_GROUP = "coupled_qk.variants"
"""Python entry-point group read by :func:`load_plugins` (``[project.entry-points."coupled_qk.variants"]``)."""

UNKNOWN_HINT = (
    f"an attention or variant of another package exists only where that package is installed "
    f"(it registers through the entry-point group {ENTRY_POINT_GROUP!r}, docs/DESIGN.md)"
)
"""The end of the error for an unknown attention or variant name: where plugin names come from."""

LEGACY_DEFAULTS = dict(
    integrator="euler",
    n_steps=1,
    dynamics_hidden=None,
    dt_init=0.1,
    shared_across_heads=True,
    force="mlp",
    keys_per_query_head=True,
)
"""Values that configs saved before the nested ``qk_map`` wrote for every attention (dropped on load where
the attention has no such option)."""


DEFAULT_ORDER = (
    "standard",
    "coupled",
    "coupled_leapfrog",
    "uncoupled_mlp",
    "differential",
    "coupled_differential",
    "invertible",
    "invertible_differential",
)
"""The order of the paper's variants (v1 and v2) and baselines in :func:`default_variants` (the order of the
``bench`` and ``mqar`` reports); every other variant in the default set follows them, in registration order."""


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
        module: ``None`` for standard scoring (computed by the layer), else a
            :class:`~coupled_qk.layers.scoring.ScoringRule` subclass built as ``module(d_head, n_heads,
            layer_idx)`` (:class:`~coupled_qk.layers.differential.DifferentialScoring` for ``differential``).
        head_group: query/key sub-heads per head (2 for differential scoring, else 1).
    """

    name: str
    module: type | None
    head_group: int = 1


@dataclass(frozen=True)
class Attention:
    """One cell of the grid: an optional query-key map and a scoring rule.

    Fields: ``name`` (``GPTConfig.attention``), ``qk_map`` (a :class:`QKMapType` or ``None``), ``scoring``
    (a key of :data:`SCORING_RULES`: ``"standard"``, ``"differential"`` or an added rule's name).
    """

    name: str
    qk_map: QKMapType | None
    scoring: str

    @property
    def head_group(self) -> int:
        """Query/key sub-heads per attention head: 2 for differential scoring (``n_heads`` and ``n_kv_heads``
        must be even), else 1 (the scoring rule's :attr:`ScoringType.head_group`)."""
        return SCORING_RULES[self.scoring].head_group

    def options(
        self, given: MapOptions | dict[str, object] | None = None, flat: dict | None = None
    ) -> MapOptions | None:
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
        name, :data:`~coupled_qk.layers.attention.SCORINGS`, or an added rule's class) for
        :class:`~coupled_qk.layers.attention.CausalSelfAttention`.

        Raises:
            ValueError: ``options`` is ``None`` for an attention with a query-key map (it used to fail inside
                ``dataclasses.asdict`` with a ``TypeError`` naming neither).
        """
        factory = None
        if self.qk_map is not None:
            if options is None:
                raise ValueError(
                    f"layer_kwargs: attention={self.name!r} has the query-key map {self.qk_map.name!r}, so options "
                    f"must be its {self.qk_map.options.__name__}; got None"
                )
            factory = functools.partial(build_map, self.qk_map.module, dataclasses.asdict(options))
        builtin = SCORINGS.get(self.scoring, False) is SCORING_RULES[self.scoring].module
        return dict(qk_map=factory, scoring=self.scoring if builtin else SCORING_RULES[self.scoring].module)


def build_map(module: type, options: dict[str, object], d_head: int, n_heads: int) -> QKMap:
    """``module(d_head, n_heads, **options)``: a query-key map of one layer (a picklable factory part)."""
    return module(d_head, n_heads, **options)


QK_MAPS: dict[str, QKMapType] = {}
"""Registered query-key maps by name."""

SCORING_RULES: dict[str, ScoringType] = {
    name: ScoringType(name, rule, 1 if rule is None else rule.head_group) for name, rule in SCORINGS.items()
}
"""Registered scoring rules by name: the built-in :data:`~coupled_qk.layers.attention.SCORINGS` first
(``standard``, ``differential``)."""

ATTENTIONS: dict[str, Attention] = {scoring: Attention(scoring, None, scoring) for scoring in SCORINGS}
"""Every attention of the grid by name (maps x scorings, plus the map-free ``standard``/``differential``)."""

VARIANTS: dict[str, dict] = {scoring: dict(attention=scoring) for scoring in SCORINGS}
"""Variant name -> ``GPTConfig`` overrides (flat spellings; see
:func:`~coupled_qk.models.registry.register_variant`)."""

ALIASES = {"coupled_euler": "coupled", "leapfrog": "coupled_leapfrog", "diff": "differential"}
"""Other spellings of variant names."""

DEFAULTS: list[str] = list(SCORINGS)
"""The default variant set, in registration order (read it with ``registry.default_variants()``, which lists
the paper's variants first, in :data:`~coupled_qk.models.registry.DEFAULT_ORDER`)."""


class PluginError(RuntimeError):
    """An entry point of :data:`ENTRY_POINT_GROUP` (or a drop-in module) failed to load or to register: the
    environment is at fault, not the call that first queried the registry (the command line reports it in one
    line)."""


_plugins: dict = {"loaded": False, "names": ()}  # group read?; entry points registered so far


def _drop_in_maps() -> list[tuple[str, str]]:
    """``(name, "module:register")`` of every module of :mod:`coupled_qk.models.maps` (the in-package drop-ins)."""
    import pkgutil

    from coupled_qk.models import maps

    return [(m.name, f"{maps.__name__}.{m.name}:register") for m in pkgutil.iter_modules(maps.__path__)]


@declared_flags
def load_plugins(reload: bool = False) -> list[str]:
    """Load the drop-in maps of :mod:`coupled_qk.models.maps` and the third-party registrations of the
    entry-point group :data:`ENTRY_POINT_GROUP` (once).

    Each entry point (and each drop-in module's ``register``) is loaded; when it names a callable, the callable
    is called with no argument (it makes its :func:`register_qk_map` / :func:`register_variant` calls); a
    module makes them on import. Every
    function of this module that lists or looks up variants calls this first, so plugins load lazily, the first
    time the registry is queried. ``reload=True`` reads the group again (after ``sys.path`` changed); an entry
    point registered before is not loaded twice.

    Returns:
        The names of the entry points loaded by this call (empty when they were loaded before).

    Raises:
        PluginError: (a ``RuntimeError``) an entry point that fails to load or to register, naming it, the error
            and the distribution that declares it (raised after every other entry point has been loaded).
    """
    if _plugins["loaded"] and not reload:
        return []
    _plugins["loaded"] = True  # before loading: a plugin's own registry calls must not load again
    from importlib.metadata import EntryPoint, entry_points

    loaded, failed = [], []
    drop_ins = [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in _drop_in_maps()]
    for ep in drop_ins + sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.value in _plugins["names"]:
            continue
        _plugins["names"] += (ep.value,)
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as exc:  # the others still load (a broken drop-in must not hide the built-in maps)
            failed.append((ep, exc))
            continue
        loaded.append(ep.name)
    if failed:
        first, error = failed[0]
        dist = getattr(getattr(first, "dist", None), "name", None)
        where = f" (declared by the installed distribution {dist!r}: fix or uninstall it)" if dist else ""
        raise PluginError(
            f"the {ENTRY_POINT_GROUP!r} entry point {first.name} = {first.value!r} failed to register: "
            f"{type(error).__name__}: {error}{where}"
        ) from error
    return loaded


def attention_name(stem: str, scoring: str) -> str:
    """The grid's name of a map stem with a scoring rule (``coupled`` + ``differential`` ->
    ``coupled_differential``)."""
    return stem if scoring == "standard" else f"{stem}_{scoring}"


def _register_map(name: str, stem: str, module: type, options: type) -> QKMapType:
    check_name("name", name)
    check_name("stem", stem)
    existing = QK_MAPS.get(name)
    # the same classes again (a notebook cell run again, importlib.reload): replaced, the attentions build the new ones
    rerun = (
        existing is not None
        and existing.stem == stem
        and same_definition(module, existing.module)
        and same_definition(options, existing.options)
    )
    if existing is not None and not rerun:
        raise ValueError(
            f"query-key map {name!r} is already registered (stem {existing.stem!r}, "
            f"{existing.module.__module__}.{existing.module.__qualname__}); choose another name"
        )
    names = [attention_name(stem, s) for s in SCORING_RULES]
    taken = [] if rerun else [n for n in names if n in ATTENTIONS or n in VARIANTS or n in ALIASES]
    if taken:
        raise ValueError(f"map stem {stem!r} gives attention names {taken} that are already registered")
    check_map(module, options)
    entry = QKMapType(name, stem, module, options)
    QK_MAPS[name] = entry
    for scoring, attention in zip(SCORING_RULES, names):
        ATTENTIONS[attention] = Attention(attention, entry, scoring)
    return entry


def register_qk_map(
    name: str, stem: str, module: type, options: type, in_defaults: bool | Sequence[str] = True
) -> QKMapType:
    """Register a query-key map: its attentions (one per scoring rule) and a variant of each attention's name.

    This one call is all a new map needs (docs/DESIGN.md): from then on ``GPTConfig(attention=stem)``, every
    command, the default variant lists, the variant-spec parser, ``--set`` (each field of ``options`` is a flat
    spelling), ``bench``, ``mqar``, ``claims --variants``, the diagnostics and the Hugging Face classes know it.

    Args:
        name: map name (key of :data:`QK_MAPS`).
        stem: attention-name stem (see :func:`attention_name`).
        module: a :class:`~coupled_qk.layers.qk_maps.QKMap` subclass built as ``module(d_head, n_heads, **options)``.
        options: its nested config, a dataclass subclassing :class:`MapOptions` whose fields are ``module``'s
            keyword arguments.
        in_defaults: which of its variants join :func:`default_variants`: ``True`` (with the built-in scoring
            rules, ``standard`` and ``differential``), ``False`` (none) or the scoring rules whose attention
            joins (e.g. ``("standard",)``). With every other registered scoring rule the map gives an attention
            and a variant outside the defaults.

    Raises:
        ValueError: a name or stem already taken (registering the same classes again, e.g. a notebook cell run
            again, replaces the map and keeps its place in the default list), a name or stem that is not an
            identifier, ``module`` not a :class:`~coupled_qk.layers.qk_maps.QKMap` subclass with its own
            ``forward`` (or with a ``start_at_identity`` that is not a method taking no argument: the optional
            method :func:`coupled_qk.hf.retrofit` needs), ``options`` not a :class:`MapOptions` dataclass whose fields
            all have defaults, are not
            ``GPTConfig`` fields and are accepted by ``module``'s constructor
            (:func:`coupled_qk.models.contracts.check_map`), or ``in_defaults`` not a bool or a list of
            registered scoring rules.
    """
    load_plugins()  # names taken by plugins are checked too
    if isinstance(in_defaults, str) or not (isinstance(in_defaults, bool) or isinstance(in_defaults, Sequence)):
        raise ValueError(
            f"in_defaults={in_defaults!r} must be True, False or a list of scoring rules (e.g. ['standard'])"
        )
    scorings = SCORINGS if in_defaults is True else () if in_defaults is False else tuple(in_defaults)
    unknown = [s for s in scorings if s not in SCORING_RULES]
    if unknown:
        raise ValueError(
            f"in_defaults={in_defaults!r}: unknown scoring rule(s) {unknown}; expected one of {list(SCORING_RULES)}"
        )
    entry = _register_map(name, stem, module, options)
    for scoring in SCORING_RULES:
        attention = attention_name(stem, scoring)
        VARIANTS[attention] = dict(attention=attention)
        if scoring in scorings and attention not in DEFAULTS:
            DEFAULTS.append(attention)
    return entry


@declared_flags
def register_scoring(name: str, module: type, in_defaults: bool = True) -> ScoringType:
    """Register a scoring rule: its attentions (alone and with every registered query-key map) and a variant of
    each attention's name.

    This one call is all a new scoring rule needs (docs/DESIGN.md), as :func:`register_qk_map` is for a map: from
    then on ``GPTConfig(attention=name)``, ``GPTConfig(attention="<map stem>_<name>")`` (e.g. ``coupled_<name>``),
    every command, the variant-spec parser, ``bench``, ``mqar``, ``claims --variants``, the diagnostics and the
    Hugging Face classes know it. A map registered later combines with it too.

    Args:
        name: the rule's name: the map-free attention's name and the suffix of the others
            (``<stem>_<name>``); a Python identifier.
        module: a :class:`~coupled_qk.layers.scoring.ScoringRule` subclass (``head_group`` 1), built per layer
            as ``module(d_head, n_heads, layer_idx)``.
        in_defaults: whether the map-free attention ``name`` joins :func:`default_variants` (its combinations
            with maps never do: name them in ``--variants``).

    Raises:
        ValueError: a name already taken (by a rule, an attention, a variant or an alias; registering the same
            class again, e.g. a notebook cell run again, replaces the rule), a name that is not an identifier, or
            ``module`` not a :class:`ScoringRule` subclass with ``head_group`` 1, its own ``forward`` and a
            constructor taking ``(d_head, n_heads, layer_idx)`` (:func:`coupled_qk.models.contracts.check_scoring`).
    """
    load_plugins()
    check_name("name", name)
    check_scoring(module)
    existing = SCORING_RULES.get(name)
    if existing is not None and existing.module is not None and same_definition(module, existing.module):
        SCORING_RULES[name] = ScoringType(name, module, 1)  # the attentions read the rule's class from here
        return SCORING_RULES[name]
    names = [name] + [attention_name(m.stem, name) for m in QK_MAPS.values()]
    taken = [n for n in names if n in SCORING_RULES or n in ATTENTIONS or n in VARIANTS or n in ALIASES]
    if taken:
        raise ValueError(f"scoring rule {name!r} gives attention names {taken} that are already registered")
    rule = SCORING_RULES[name] = ScoringType(name, module, 1)
    for entry, attention in zip([None, *QK_MAPS.values()], names):
        ATTENTIONS[attention] = Attention(attention, entry, name)
        VARIANTS[attention] = dict(attention=attention)
    if in_defaults:
        DEFAULTS.append(name)
    return rule


@declared_flags
def register_variant(name: str, attention: str, *, in_defaults: bool = True, **options: object) -> None:
    """Add a named variant: ``attention`` (a key of :data:`ATTENTIONS`) with map ``options`` (flat spellings).

    Args:
        name: the variant's name (``-`` is read as ``_`` in specs).
        attention: a registered attention.
        in_defaults: whether the variant joins :func:`default_variants` (the default set of ``bench`` and
            ``mqar``).
        **options: map options, e.g. ``integrator="leapfrog"``.

    The variant named after an attention (registered with it) may be given again to spell some of that
    attention's defaults, keeping its place in the default set: the dynamics' ``register()`` writes
    ``coupled`` as ``integrator="euler"``, the paper's integrator.

    Raises:
        ValueError: a name that is not an identifier, a taken name (registering the same variant again, e.g. a
            notebook cell run again, does nothing), an unknown attention, options that do not apply to it, or
            options of an attention's own variant that are not its defaults.
    """
    load_plugins()
    check_name("name", name)
    if VARIANTS.get(name) == dict(attention=attention, **options):
        return
    validated = get_attention(attention).options(None, options)
    own = name == attention and VARIANTS.get(name) == dict(attention=name)
    if own and validated != get_attention(attention).options(None, {}):
        raise ValueError(
            f"variant {name!r} is attention {name!r} itself: its settings may only spell the defaults; got "
            f"{options} (register another name for other settings)"
        )
    if not own and (name in VARIANTS or name in ALIASES):
        raise ValueError(
            f"variant {name!r} is already registered (as {VARIANTS.get(name, ALIASES.get(name))!r}); "
            f"choose another name"
        )
    VARIANTS[name] = dict(attention=attention, **options)
    if in_defaults and name not in DEFAULTS:
        DEFAULTS.append(name)


def get_attention(name: str) -> Attention:
    """The registered :class:`Attention` called ``name``; ``ValueError`` listing the known names otherwise."""
    load_plugins()
    if name not in ATTENTIONS:
        if isinstance(name, str) and "+" in name:
            head, _, rest = name.partition("+")
            hint = (
                f"; a variant spec (NAME+field=value) is read by --variants only: give the attention and its "
                f"options separately (attention={head!r} plus {rest!r}; on the command line --attention {head} "
                f"--set {rest.replace('+', ' --set ')})"
            )
        elif isinstance(name, str) and name in VARIANTS:  # a named variant: an attention plus its settings
            settings = {k: v for k, v in VARIANTS[name].items() if k != "attention"}
            flags = " ".join(f"--set {k}={v}" for k, v in settings.items())
            hint = (
                f"; {name!r} is a named variant (attention={VARIANTS[name]['attention']!r} with {settings}), "
                f"which --variants reads; give its attention and settings (on the command line --attention "
                f"{VARIANTS[name]['attention']} {flags})"
            )
        else:
            hint = f"; {UNKNOWN_HINT}"
        raise ValueError(f"GPTConfig.attention={name!r} is unknown; expected one of {list(ATTENTIONS)}{hint}")
    return ATTENTIONS[name]


def attention_names() -> list[str]:
    """Every registered attention name (plugins loaded), in registration order."""
    load_plugins()
    return list(ATTENTIONS)


def variant_names() -> list[str]:
    """Every registered variant name (plugins loaded), in registration order."""
    load_plugins()
    return list(VARIANTS)


def default_variants() -> list[str]:
    """The default variant set of ``bench`` and ``mqar`` (the paper's variants, v1 and v2, and baselines, in
    :data:`DEFAULT_ORDER`, then every registered variant that asked to be in it, in registration order),
    computed now: a variant registered later is included."""
    load_plugins()
    rank = {name: i for i, name in enumerate(DEFAULT_ORDER)}
    return sorted(DEFAULTS, key=lambda name: rank.get(name, len(rank)))


def flat_option_names() -> dict[str, str]:
    """Flat spelling -> nested ``qk_map`` field, for every option of every registered map (plus
    :data:`OPTION_ALIASES`). These are the names ``GPTConfig(...)`` keywords, config dicts, ``--set`` and
    variant specs accept besides the ``GPTConfig`` fields."""
    load_plugins()
    out = {}
    for entry in QK_MAPS.values():
        out.update({n: n for n in entry.option_names()})
    out.update({flat: nested for flat, nested in OPTION_ALIASES.items() if nested in out})
    return out


def map_option_types() -> dict[str, object]:
    """Flat spelling -> declared type of every map option (from the options dataclasses). A name that two maps
    declare with different types maps to ``str``: its value is converted by the options dataclass of the
    attention it ends up in."""
    flat = flat_option_names()
    types: dict[str, object] = {}
    for entry in QK_MAPS.values():
        for nested, annotation in field_types(entry.options).items():
            for spelling in (s for s, n in flat.items() if n == nested):
                types[spelling] = annotation if types.get(spelling, annotation) == annotation else str
    return types


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Undo, on exit, every registration made inside (for tests and notebooks). Inside, the first registry query
    reads the entry-point group again (a distribution put on ``sys.path`` inside is found); on exit, its
    registrations are undone too."""
    live: tuple[dict, ...] = (QK_MAPS, SCORING_RULES, ATTENTIONS, VARIANTS, ALIASES, _plugins)
    saved = [dict(d) for d in live]
    defaults = list(DEFAULTS)
    _plugins["loaded"] = False
    try:
        yield
    finally:
        for current, old in zip(live, saved):
            current.clear()
            current.update(old)
        DEFAULTS[:] = defaults
