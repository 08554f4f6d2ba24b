"""Options of a query-key map (``GPTConfig.qk_map``): the base class :class:`MapOptions` and :func:`option`, the
one way to declare a configuration field with its valid values.

A map's options are a dataclass subclassing :class:`MapOptions` whose fields are the keyword arguments of the
map's constructor, each declared with :func:`option` (a ``bool`` needs only its type), e.g.
``gain: float = option(1.0, lo=0.0)`` (docs/DESIGN.md, "Adding an attention variant"). The registry
(:mod:`coupled_qk.models.registry`) reads the fields to generate everything else: the flat spellings that
``--set``, variant specs and ``GPTConfig(...)`` keywords accept, their types and the error messages. The
built-in maps' options live with their maps, in :mod:`coupled_qk.models.maps`. ``GPTConfig``, ``TrainConfig``
and the tasks' options declare their fields with :func:`option` too.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, overload

from coupled_qk.checks.assignment import CheckedAssignment
from coupled_qk.checks.values import FLOAT32_MAX, check_declared, coerce_fields, declared_flags

__all__ = ["DT_INIT", "HIDDEN", "MapOptions", "option"]

_T = TypeVar("_T")

Choices = Sequence[object] | Callable[[], Sequence[object]]
"""The allowed values of an :func:`option`: a tuple, or a callable returning them (evaluated at each check)."""


@overload
def option(
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    choices: Choices | None = None,
    free: str | None = None,
    default_factory: Callable[[], _T],
    **metadata: object,
) -> _T: ...


@overload
def option(
    default: _T,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    choices: Choices | None = None,
    free: str | None = None,
    **metadata: object,
) -> _T: ...


@declared_flags
def option(
    default: object = dataclasses.MISSING,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    choices: Choices | None = None,
    free: str | None = None,
    default_factory: object = dataclasses.MISSING,
    **metadata: object,
) -> object:
    """A dataclass field with its valid values declared once, in its metadata: what construction, assignment and
    every command-line surface check (:func:`coupled_qk.checks.values.check_declared`) and what the tests draw valid
    and invalid values from.

    A number declares a range (``lo``/``hi``), a fixed set declares ``choices``, text, dicts and nested configs
    declare ``free`` (a sentence saying what checks them); a ``bool`` field needs no declaration (its type is
    one). Examples: ``n_steps: int = option(1, lo=0)``, ``gain: float = option(1.0)`` (any finite number),
    ``force: str = option("mlp", choices=("mlp", "gradient"))``.

    Args:
        default, default_factory: as :func:`dataclasses.field`.
        lo, hi: bounds of a number field (``None``: unbounded on that side; a float field with neither bound
            is declared as any finite number).
        lo_open, hi_open: whether the bounds are excluded.
        choices: the allowed values (a tuple, or a callable returning them, evaluated at each check, e.g. a
            registry's names).
        free: for text, dict and nested fields, a sentence saying what checks the value.
        **metadata: further metadata (``help``, ``shown``).

    Returns:
        A :class:`dataclasses.Field` (typed, as :func:`dataclasses.field` is, as the field's value); numbers get
        ``metadata["range"] = (lo, hi)`` (with ``lo_open``, ``hi_open``), the others ``metadata["choices"]`` or
        ``metadata["free"]``.

    Raises:
        TypeError: a ``default_factory`` that is not callable (it failed only when an instance was made).
    """
    meta = dict(metadata)
    if choices is not None:
        meta["choices"] = choices
    elif free is not None:
        meta["free"] = free
    else:
        meta.update({"range": (lo, hi), "lo_open": lo_open, "hi_open": hi_open})
    if default_factory is not dataclasses.MISSING:
        if not callable(default_factory):
            raise TypeError(f"default_factory={default_factory!r} must be callable (it makes each instance's default)")
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class OptionsOwner(Protocol):
    """What :meth:`MapOptions.bind` keeps and re-checks: the ``GPTConfig`` holding the options."""

    qk_map: MapOptions | None

    def validate(self) -> None:
        """The owner's cross-field checks."""
        ...


class MapOptions(CheckedAssignment):
    """Base class of the nested map configs (``GPTConfig.qk_map``).

    Subclasses are dataclasses whose fields are the keyword arguments of their map's constructor, each declared
    with :func:`option` (the registry refuses an undeclared field at registration). On construction every
    field is converted to its declared type (``"False"`` -> ``False``, ``"2"`` -> ``2``), checked against the
    range or choices its :func:`option` declares, then :meth:`validate` runs the cross-field checks. Assigning a
    field later (``config.qk_map.n_steps = 2``) runs the same checks
    (:class:`~coupled_qk.checks.assignment.CheckedAssignment`); the rules that involve the rest of ``GPTConfig``
    (e.g. ``keys_per_query_head`` with ``n_kv_heads``) run again when a model is built from the config.

    Raises:
        ValueError: naming ``GPTConfig.qk_map.<field>``, the value and what was expected.
    """

    if TYPE_CHECKING:  # every subclass is a dataclass (dataclasses.fields and asdict take these options)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        coerce_fields(self, "GPTConfig.qk_map")
        self.recheck()

    def owner_name(self) -> str:
        """``"GPTConfig.qk_map"``: how errors name these options (``GPTConfig.qk_map.n_steps=-1 must be ...``),
        overriding :meth:`CheckedAssignment.owner_name <coupled_qk.checks.assignment.CheckedAssignment.owner_name>`'s
        class name."""
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

    def bind(self, owner: OptionsOwner) -> None:
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


HIDDEN: dict[str, Any] = dict(lo=1)
"""Declaration of a coupling network's width ``hidden`` (``None`` or >= 1): ``option(None, **HIDDEN)``."""
DT_INIT: dict[str, Any] = dict(lo=-FLOAT32_MAX, hi=FLOAT32_MAX)
"""Declaration of an initial step ``dt_init`` (any number a float32 parameter holds: 1e308 is finite in Python
but infinite in float32): ``option(0.1, **DT_INIT)``."""
