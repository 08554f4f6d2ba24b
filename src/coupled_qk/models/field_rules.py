"""``GPTConfig`` fields that only some settings read, refused at a non-default value where they are not read.

Each entry of :data:`READ_WHEN` declares, for one field, the settings under which the model reads it (the code
that reads it: ``models/gpt.py`` and ``layers/attention.py``). A value other than the field's default in any
other setting would be silently ignored (docs/RELIABILITY.md: asking for something must never silently do
something else), so :func:`unread_field_problem` names it and ``GPTConfig`` refuses it in one line.

Saved configs (a checkpoint's ``model_config.json``, a Hugging Face ``config.json``) written before this rule
must keep loading: inside :func:`loading_saved` the same finding is a ``UserWarning`` instead of an error.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Protocol

from coupled_qk.models.registry import get_attention


@dataclass(frozen=True)
class ReadWhen:
    """When a ``GPTConfig`` field is read.

    Attributes:
        when: ``config -> bool``: whether the model reads the field with this config.
        otherwise: ``config -> str``: the setting in which it is not, as the error shows it after "is not read
            with".
        used_for: what the field is for, as the error ends.
        default: ``config -> value``: the field's default for this config (the value that is never refused).
    """

    when: Callable
    otherwise: Callable
    used_for: str
    default: Callable


class _NamesAttention(Protocol):
    """A config (or the settings of one) naming its attention."""

    attention: str


def _has_map(config: _NamesAttention) -> bool:
    return get_attention(config.attention).qk_map is not None


READ_WHEN: dict[str, ReadWhen] = {
    "rope_base": ReadWhen(
        lambda c: c.position == "rope",
        lambda c: f"position={c.position!r} (learned absolute position embeddings, no rotary positions)",
        "the rotary position tables, position='rope'",
        lambda c: 10000.0,
    ),
    "map_position": ReadWhen(
        _has_map,
        lambda c: f"attention={c.attention!r} (it has no query-key map)",
        "where an attention's query-key map acts relative to RoPE (e.g. attention='coupled')",
        lambda c: "pre_rope",
    ),
    "d_ff": ReadWhen(
        lambda c: c.use_mlp,
        lambda c: "use_mlp=False (attention-only blocks, no feed-forward sub-layer)",
        "the feed-forward width, use_mlp=True",
        lambda c: 4 * c.d_model,
    ),
    "qk_map.keys_per_query_head": ReadWhen(
        lambda c: c.n_kv_heads is not None and c.n_kv_heads < c.n_heads,
        lambda c: (
            f"n_kv_heads={c.n_kv_heads} = n_heads={c.n_heads} (no grouped-query attention: each query "
            "head already has its own key head, so the evolved keys are the same either way)"
        ),
        "grouped-query attention, n_kv_heads < n_heads (one evolved key per key/value head)",
        lambda c: True,
    ),
}
"""Field -> when the model reads it. A field not listed here is read by every config. A dotted name is an option
of the query-key map (``GPTConfig.qk_map``), checked only for maps that have it."""

MISSING = object()
""":func:`field_value` of a dotted name whose map has no such option."""


def field_value(config: object, name: str) -> object:
    """``config``'s value of field ``name`` (``"qk_map.keys_per_query_head"`` reads the map option; ``config``
    and ``qk_map`` may be objects or dicts), or :data:`MISSING` where there is no such field."""
    value = config
    for part in name.split("."):
        if value is None:
            return MISSING
        value = value.get(part, MISSING) if isinstance(value, dict) else getattr(value, part, MISSING)
        if value is MISSING:
            return MISSING
    return value


_saved: contextvars.ContextVar[str | None] = contextvars.ContextVar("coupled_qk_saved_config", default=None)


@contextlib.contextmanager
def loading_saved(where: str) -> Iterator[None]:
    """Inside this block a config field that would not be read warns (naming ``where``) instead of raising: a
    saved config is read back as it was trained."""
    token = _saved.set(str(where))
    try:
        yield
    finally:
        _saved.reset(token)


def unread_field_problem(config: object, fields: Collection[str] | None = None) -> str | None:
    """The one-line message for the first field of :data:`READ_WHEN` (of ``fields``, default all) that
    ``config`` gives at a non-default value where the model does not read it; ``None`` if there is none."""
    for name, rule in READ_WHEN.items():
        if fields is not None and name not in fields:
            continue
        value = field_value(config, name)
        if value is MISSING or value == rule.default(config) or rule.when(config):
            continue
        return (
            f"GPTConfig.{name}={value!r} is not read with {rule.otherwise(config)}: {name} is for "
            f"{rule.used_for}; leave it at its default ({rule.default(config)!r})"
        )
    return None


def check_unread_fields(config: object, fields: Collection[str] | None = None) -> None:
    """Raise ``ValueError`` with :func:`unread_field_problem`'s message, or inside :func:`loading_saved` warn
    (``UserWarning``, once per field) and keep the config as saved."""
    problem = unread_field_problem(config, fields)
    if problem is not None:
        refuse_unless_saved(problem)


def refuse_unless_saved(problem: str) -> None:
    """A setting that would have no effect: ``ValueError(problem)``, or inside :func:`loading_saved` (a config read
    back as it was saved) a ``UserWarning`` naming where it was read, the value kept."""
    where = _saved.get()
    if where is None:
        raise ValueError(problem)
    warnings.warn(
        f"{where}: {problem} (a saved config; loaded as saved, the value has no effect)", UserWarning, stacklevel=4
    )
