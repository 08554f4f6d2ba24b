"""``GPTConfig``: one validated dataclass describing a model (presets: docs/METHOD.md section 4, our choice),
and :func:`parse_overrides`, the typed parser of ``FIELD=VALUE`` overrides."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from coupled_qk.checks.assignment import CheckedAssignment
from coupled_qk.checks.values import (
    MAX_VOCAB,
    check_declared,
    coerce,
    coerce_fields,
    field_types,
    loads_json,
    parse_assignments,
    positive_int,
    unknown_names_error,
)
from coupled_qk.layers.attention import MAP_POSITIONS
from coupled_qk.models.contracts import RESERVED_OPTION_NAMES
from coupled_qk.models.field_rules import READ_WHEN, check_unread_fields, loading_saved
from coupled_qk.models.options import MapOptions, option
from coupled_qk.models.provenance import OPTION_HINT, naming_providers, saved_dict
from coupled_qk.models.registry import (
    LEGACY_DEFAULTS,
    OPTION_ALIASES,
    attention_names,
    flat_option_names,
    get_attention,
    map_option_types,
)

PRESETS: dict[str, dict] = {
    # trains on 2 CPU cores in minutes (with a small trained byte-level BPE vocabulary)
    "tiny": dict(vocab_size=8192, block_size=128, n_layer=4, d_model=128, n_heads=4),
    # paper scale (our choice of shapes, GPT-2 BPE vocabulary, context 512)
    "60m": dict(vocab_size=50257, block_size=512, n_layer=12, d_model=512, n_heads=8),
    "150m": dict(vocab_size=50257, block_size=512, n_layer=16, d_model=768, n_heads=12),
    "350m": dict(vocab_size=50257, block_size=512, n_layer=24, d_model=1024, n_heads=16),
}


RENAMED_FIELDS: dict[str, str] = {"dynamics_position": "map_position"}
"""Old :class:`GPTConfig` field names -> their current names. Configs saved under an old name (a checkpoint's
``model_config.json``, a run's ``config.json`` model overrides, a Hugging Face ``config.json``) still load:
:func:`rename_fields` moves the value to the new name with a ``DeprecationWarning``."""


def rename_fields(data: dict, where: str = "GPTConfig") -> dict:
    """``data`` (GPTConfig fields or overrides) with every old field name of :data:`RENAMED_FIELDS` moved to its
    current name, warning once per name (``DeprecationWarning``); ``data`` itself is not changed.

    Raises:
        ValueError: an old name and its new name given with different values.
    """
    if not any(old in data for old in RENAMED_FIELDS):
        return data
    out = dict(data)
    for old, new in RENAMED_FIELDS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out and out[new] != value:
            raise ValueError(
                f"{where}: {old}={value!r} (the old name of {new}) and {new}={out[new]!r} disagree; give only {new}"
            )
        out[new] = value
        warnings.warn(
            f"{where}: the field {old!r} is now called {new!r}; read {old}={value!r} as {new}={value!r} "
            f"(save the config again to store the new name)",
            DeprecationWarning,
            stacklevel=3,
        )
    return out


_C = TypeVar("_C", bound="JSONConfig")


class JSONConfig(CheckedAssignment):
    """Dict/JSON round trip for validated config dataclasses; unknown fields fail loudly.

    Assignment after construction is checked like construction (:class:`coupled_qk.checks.assignment.CheckedAssignment`:
    the value converted to the field's declared type, ``validate()`` run again, the old value restored on an
    error).
    """

    if TYPE_CHECKING:  # every subclass is a dataclass (GPTConfig, TrainConfig)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_dict(self) -> dict:
        """All fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def extra_names(cls) -> tuple[str, ...]:
        """Names accepted by :meth:`from_dict` besides the fields (none here; ``GPTConfig``: the flat map
        options)."""
        return ()

    @classmethod
    def from_dict(cls: type[_C], data: dict[str, Any]) -> _C:
        """Build from a dict; unknown keys raise ``ValueError`` listing them and the valid fields."""
        if not isinstance(data, dict):
            raise ValueError(f"a {cls.__name__} must be given as a dict of fields; got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)} | set(cls.extra_names())
        unknown = set(data) - names
        if unknown:
            raise unknown_names_error(f"{cls.__name__} field(s)", unknown, names)
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Write the config as JSON."""
        from coupled_qk.files import write_text_atomic

        write_text_atomic(path, json.dumps(saved_dict(self), indent=2, sort_keys=True))  # a plugin's package too

    @classmethod
    def load(cls: type[_C], path: str | Path) -> _C:
        """Read a config written by :meth:`save`.

        Raises:
            FileNotFoundError: naming the path if it is missing.
            ValueError: naming the path, for a folder, a file that is not UTF-8 JSON holding an object, or a field
                of the object that the config refuses (unknown, or a value outside its declaration).
        """
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"config file {path} is a folder; expected a JSON file")
        if path.exists() and not path.is_file():
            raise ValueError(f"config file {path} is not a regular file; expected a JSON file")
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        try:
            data = loads_json(path.read_text(encoding="utf-8"), f"config file {path}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"config file {path} is not valid JSON ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); expected a JSON file"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a JSON object; got {type(data).__name__}")
        data = cls.upgrade(data, path)
        try:
            return cls.from_dict(data)
        except ValueError as exc:  # a field's value or name: said with the file it came from
            raise ValueError(f"config file {path}: {exc}") from None

    @classmethod
    def upgrade(cls, data: dict, path: str | Path) -> dict:
        """Rewrite a dict read by :meth:`load` from an older format (identity here)."""
        return data


DERIVED = {
    "n_kv_heads": lambda c: c["n_heads"],
    "d_head": lambda c: c["d_model"] // c["n_heads"],
    "d_ff": lambda c: 4 * c["d_model"],
}
""":class:`GPTConfig` fields derived from others when not given (``None``), as ``{field: fields -> value}``; they
follow an assignment of the fields they derive from (:meth:`GPTConfig.follow`)."""


@dataclass
class GPTConfig(JSONConfig):
    """Configuration of :class:`coupled_qk.GPT` (docs/METHOD.md sections 1, 2 and 4).

    Fields:
        vocab_size: number of token ids.
        vocab_pad_multiple: round the rows of the token embedding and the tied output head up to a multiple
            of this (``padded_vocab_size``; default 1: no padding). 64 turns GPT-2's 50,257 into 50,304, so the
            output head's matmul gets tensor-core friendly shapes on GPUs (nanoGPT's choice).
            The extra rows start at zero and are never used: the model's logits keep ``vocab_size`` columns
            (padded ids are never scored nor sampled), and ids ``>= vocab_size`` are rejected as before.
            Checkpoints of a padded model hold ``padded_vocab_size`` rows and need the same setting to load.
        block_size: context length in tokens (longest sequence the model accepts).
        n_layer, d_model, n_heads: depth, width, query heads.
        n_kv_heads: key/value heads for grouped-query attention (default ``n_heads``).
        d_head: head width (default ``d_model // n_heads``).
        d_ff: feed-forward hidden width (default ``4 d_model``); ``use_mlp=False`` drops the feed-forward
            sub-layer (attention-only blocks, as in Zoology's MQAR models).
        attention: a registered attention (:func:`coupled_qk.models.registry.attention_names`: query-key map x
            scoring, e.g. ``standard``, ``coupled``, ``differential``, ``coupled_differential``).
        qk_map: the nested options of the attention's query-key map (the options dataclass registered with the
            map, e.g. ``DynamicsOptions`` for ``coupled*``; a dict is converted; ``None`` gives the defaults). It
            exists only for attentions with a map: ``None`` otherwise.
        position: ``"rope"`` or ``"learned"`` (absolute embeddings, GPT-2 style).
        map_position: where the query-key map acts relative to RoPE: ``"pre_rope"`` (default: on the raw
            projections, RoPE on the mapped pair) or ``"post_rope"`` (on the rotated pair). The same name as
            :class:`~coupled_qk.layers.attention.CausalSelfAttention`'s argument; saved configs holding the old
            name ``dynamics_position`` still load (:data:`RENAMED_FIELDS`, with a ``DeprecationWarning``).
        rope_base: RoPE frequency base (> 0).
        dropout: dropout on attention probabilities and residual branches, in ``[0, 1)``.
        attn_impl: ``"sdpa"`` or ``"eager"``.

    Flat spellings (keyword arguments, dict keys, ``--set``, variant specs): every option of every registered
    map (:func:`coupled_qk.models.registry.flat_option_names`: ``integrator``, ``n_steps``, ``dt_init``, ...,
    ``dynamics_hidden`` -> ``qk_map.hidden``, and a plugin map's own fields) is routed into ``qk_map``; they are
    not attributes; ``None`` means not given. Every field is converted to its declared type (``use_mlp="False"``
    is ``False``).

    Raises:
        ValueError: naming the offending field: unknown names, values of the wrong type, non-positive sizes,
            non-finite or out-of-range numbers, heads that do not divide, map options for an attention that
            has no such option, or unknown fields (:meth:`from_dict`).
    """

    vocab_size: int = option(8192, lo=1, hi=MAX_VOCAB)
    vocab_pad_multiple: int = option(1, lo=1)
    block_size: int = option(128, lo=1)
    n_layer: int = option(4, lo=1)
    d_model: int = option(128, lo=1)
    n_heads: int = option(4, lo=1)
    n_kv_heads: int | None = option(None, lo=1)
    d_head: int | None = option(None, lo=1)
    d_ff: int | None = option(None, lo=1)
    use_mlp: bool = True
    attention: str = option("standard", choices=attention_names)
    qk_map: MapOptions | None = option(None, free="the attention's map options dataclass (MapOptions)")
    position: str = option("rope", choices=("rope", "learned"))
    map_position: str = option("pre_rope", choices=MAP_POSITIONS)
    rope_base: float = option(10000.0, lo=0.0, lo_open=True)
    dropout: float = option(0.0, lo=0.0, hi=1.0, hi_open=True)
    attn_impl: str = option("sdpa", choices=("sdpa", "eager"))

    @classmethod
    def extra_names(cls) -> tuple[str, ...]:
        """The flat map-option spellings (:func:`~coupled_qk.models.registry.flat_option_names`) and the old
        field names of :data:`RENAMED_FIELDS` (read under their new names)."""
        return tuple(flat_option_names()) + tuple(RENAMED_FIELDS)

    def __post_init__(self) -> None:
        coerce_fields(self)
        flat = self.__dict__.pop("flat_map_options", {})  # set by the wrapped __init__ below
        spec = get_attention(self.attention)
        self.qk_map = spec.options(self.qk_map, {k: v for k, v in flat.items() if v is not None})
        positive_int("GPTConfig.d_model", self.d_model)
        positive_int("GPTConfig.n_heads", self.n_heads)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "change one of them or set d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        self.validate()
        check_unread_fields(self, ("d_ff",))  # at construction only: assigning d_model later moves its default

    def validate(self) -> None:
        """Check every field against its declaration in the field metadata (``checks.values.check_declared``), then
        the cross-field rules; raise ``ValueError`` naming the first offending field."""
        check_declared(self)
        if isinstance(self.qk_map, MapOptions):
            self.qk_map.bind(self)  # assigning a map option re-runs these checks
        spec = get_attention(self.attention)
        n_kv_heads, d_head = self.n_kv_heads, self.d_head
        assert n_kv_heads is not None and d_head is not None, "derived by __post_init__ and follow(), never None"
        if self.n_heads % n_kv_heads:
            raise ValueError(f"GPTConfig.n_kv_heads={n_kv_heads} must divide n_heads={self.n_heads}")
        if self.position == "rope" and d_head % 2:
            raise ValueError(f"GPTConfig.d_head={d_head} must be even with position='rope'")
        group = spec.head_group
        if self.n_heads % group or n_kv_heads % group:
            raise ValueError(
                f"GPTConfig.attention={self.attention!r} needs n_heads and n_kv_heads divisible by {group} "
                f"(even: pairs of sub-heads); got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        if self.map_position == "post_rope" and self.position != "rope":
            raise ValueError("GPTConfig.map_position='post_rope' needs position='rope'")
        check_unread_fields(self, ("rope_base", "map_position", "qk_map.keys_per_query_head"))  # field_rules.py

    def follow(self, name: str, before: dict) -> None:
        """After ``name`` was assigned, a derived field that held the value derived from the fields before it
        (:data:`DERIVED`: ``n_kv_heads = n_heads``, ``d_head = d_model // n_heads``, ``d_ff = 4 d_model``) is
        derived again, as the constructor derives it; one set to another value stays, and one assigned ``None`` is
        derived (``config.d_ff = None`` is ``4 d_model``; it used to stay ``None``, and ``n_kv_heads = None`` or
        ``d_head = None`` failed with a ``TypeError`` inside :meth:`validate`). Assigning ``attention``
        gives ``qk_map`` the new attention's options (kept where its map is the same, the defaults otherwise,
        ``None`` without a map). Before, ``config.d_model = 64`` left ``d_head`` and ``d_ff`` at the old width's,
        ``config.n_heads = 4`` left ``n_kv_heads = 2`` (grouped-query attention nobody asked for), and
        ``config.attention = "standard"`` kept the coupled map's options.

        Raises:
            ValueError: ``d_head`` would follow but ``d_model`` is not divisible by ``n_heads``.
        """
        now = {field: getattr(self, field) for field in before}
        sizes = ("d_model", "n_heads")
        if any(isinstance(now[f], bool) or not isinstance(now[f], int) or now[f] < 1 for f in sizes):
            return  # nothing derives from a refused size: recheck names it
        for field, derive in DERIVED.items():
            again = field == name and now[name] is None  # assigned None: derived, as the constructor derives it
            if not again and (field == name or before[field] != derive(before)):
                continue
            if field == "d_head" and now["d_model"] % now["n_heads"]:
                raise ValueError(
                    f"GPTConfig.{name}={now[name]!r}: d_model={now['d_model']} is not divisible by "
                    f"n_heads={now['n_heads']}; change one of them or set d_head explicitly"
                )
            object.__setattr__(self, field, derive(now))
        if name == "attention":
            old_map, new_map = get_attention(before["attention"]).qk_map, get_attention(self.attention).qk_map
            kept = before["qk_map"] if old_map is new_map else None
            object.__setattr__(self, "qk_map", get_attention(self.attention).options(kept, {}))

    def recheck(self, name: str | None = None) -> None:
        """:meth:`validate`; assigning ``d_ff`` also checks that the model reads it (``use_mlp``), which
        :meth:`validate` cannot do for every assignment (after ``d_model`` changes, a derived ``d_ff`` no longer
        equals ``4 d_model`` without anyone having set it)."""
        self.validate()
        if name == "d_ff":
            check_unread_fields(self, ("d_ff",))

    def __setstate__(self, state: dict) -> None:
        """Unpickled or deep-copied: the map options are bound to this copy (:meth:`MapOptions.bind`)."""
        self.__dict__.update(state)
        if isinstance(self.qk_map, MapOptions):
            self.qk_map.bind(self)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and output head: ``vocab_size`` rounded up to ``vocab_pad_multiple``."""
        m = self.vocab_pad_multiple
        return -(-self.vocab_size // m) * m

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with ``changes`` (fields or flat map options); a derived size that holds its derived value
        (:data:`DERIVED`) is derived again from the changed fields. Changing ``attention`` to one with another
        query-key map drops the old map options (the new map starts from its defaults), and a field that the new
        settings do not read (:data:`~coupled_qk.models.field_rules.READ_WHEN`, e.g. ``map_position`` after
        ``attention="standard"``) returns to its default unless ``changes`` gives it.

        Raises:
            ValueError: as the constructor.
        """
        changes = rename_fields(changes, "GPTConfig.replace")
        data = self.to_dict()
        for field, derive in DERIVED.items():  # a derived size follows what it derives from (see follow)
            if field not in changes and data[field] == derive(data):
                data[field] = None
        new = changes.get("attention", self.attention)
        if get_attention(new).qk_map != get_attention(self.attention).qk_map:
            data["qk_map"] = None
        data.update(changes)
        fold_flat_options(data, set(changes) if "qk_map" not in changes else set())
        settings = types.SimpleNamespace(**data)  # the new settings, read as attributes
        for name, rule in READ_WHEN.items():
            top, _, option = name.partition(".")
            if name in changes or top in changes or option in changes or rule.when(settings):
                continue
            if not option:
                data[name] = None if name == "d_ff" else rule.default(settings)
            elif isinstance(data.get(top), dict) and option in data[top]:
                data[top] = {**data[top], option: rule.default(settings)}
        return type(self).from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> GPTConfig:
        """Read a config written by :meth:`save`; a field that its settings do not read, at a non-default
        value (saved before such values were refused), warns instead of failing (``models/field_rules.py``)."""
        with loading_saved(f"config file {path}"), naming_providers(path):  # an unknown attention: what to install
            return super().load(path)

    @classmethod
    def upgrade(cls, data: dict, path: str | Path) -> dict:
        """Configs saved before ``qk_map`` existed held every dynamics option flat (and ``extra``): route them
        into ``qk_map`` and drop those that the saved attention never used when they hold the old default."""
        data = dict(data)
        data.pop("registered_by", None)  # models.provenance.KEY: the attention's package, for error messages
        if "extra" in data:
            extra = data.pop("extra")
            if extra:
                raise ValueError(f"config file {path}: the field 'extra' is no longer supported; got {extra!r}")
        attention = data.get("attention", "standard")
        try:
            spec = get_attention(attention)
        except ValueError as exc:
            raise ValueError(f"config file {path}: {exc}") from None
        valid = set(spec.qk_map.option_names()) if spec.qk_map else set()
        for key, value in LEGACY_DEFAULTS.items():
            if key in data and OPTION_ALIASES.get(key, key) not in valid and data[key] == value:
                del data[key]
        return data

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A preset (``tiny``, ``60m``, ``150m``, ``350m``) with field overrides.

        Raises:
            ValueError: unknown preset name or unknown override field.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


def fold_flat_options(data: dict[str, Any], names: Iterable[str]) -> None:
    """Move the flat map options ``names`` of ``data`` (GPTConfig fields) into its ``qk_map`` dict, in place, when
    it holds one: a change of an existing config (``replace(n_steps=3)``, an assigned flat option), not one option
    given twice, which ``GPTConfig`` refuses."""
    flat = flat_option_names()
    if not isinstance(data.get("qk_map"), dict):
        return
    for name in [n for n in names if n in flat and n in data]:
        data["qk_map"] = {**data["qk_map"], flat[name]: data.pop(name)}


def _accept_flat_map_options(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap the dataclass ``__init__`` of :class:`GPTConfig` so that it also takes the flat map options of every
    registered map (generated from the registry at each call, so a map registered later is included) and the old
    field names of :data:`RENAMED_FIELDS` (every dict, file and keyword becoming a ``GPTConfig`` passes here);
    any other unknown keyword is still the dataclass's ``TypeError``."""
    fields = {f.name for f in dataclasses.fields(GPTConfig)}

    @functools.wraps(init)
    def __init__(self: GPTConfig, *args: object, **kwargs: object) -> None:
        kwargs = rename_fields(kwargs)
        names = flat_option_names() if set(kwargs) - fields else {}
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k not in fields and k in names}
        self.__dict__["flat_map_options"] = flat  # read and removed by __post_init__
        init(self, *args, **kwargs)

    return __init__


# the dataclass's generated __init__, wrapped once the class exists
GPTConfig.__init__ = _accept_flat_map_options(GPTConfig.__init__)  # type: ignore[method-assign]
# a map option may not be named like a field: its flat spelling would set the field (models/contracts.py)
RESERVED_OPTION_NAMES.update([f.name for f in dataclasses.fields(GPTConfig)], RENAMED_FIELDS, OPTION_ALIASES)


def parse_overrides(items: Sequence[str], target: type = GPTConfig, flag: str = "--set") -> dict:
    """Typed ``FIELD=VALUE`` overrides: ``["n_layer=6", "use_mlp=False"] -> {"n_layer": 6, "use_mlp": False}``.

    Each value is converted to the declared type of the field of the dataclass ``target`` (see
    :func:`coupled_qk.checks.values.coerce`); for :class:`GPTConfig` the flat map options of every registered map
    (``integrator``, ``n_steps``, a plugin map's fields, ...) take the types declared by their options
    dataclass (:func:`~coupled_qk.models.registry.map_option_types`). ``-`` in a name reads as ``_``.

    Raises:
        ValueError: naming ``flag``, for an item without ``=``, an unknown field (listing the valid ones) or a
            value that does not convert.
    """
    types = dict(field_types(target))
    if target is GPTConfig:
        types.update(map_option_types())
        types["qk_map"] = dict | None
    out = {}
    for key, value in parse_assignments(items, flag).items():
        if key not in types:
            error = unknown_names_error(f"{target.__name__} field", [key], types)
            raise ValueError(f"{flag} {key}={value}: {error}" + (f"; {OPTION_HINT}" if target is GPTConfig else ""))
        out[key] = coerce(f"{flag} {key}", value, types[key])
    return out
