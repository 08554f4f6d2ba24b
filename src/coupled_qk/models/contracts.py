"""The checks a registration runs on what it is given (names, classes, options), so that a mistake fails at the
``register_*`` call that made it, naming it, instead of later, when a model is built or an option is spelled.

:func:`~coupled_qk.models.registry.register_qk_map`, :func:`~coupled_qk.models.registry.register_scoring` and
:func:`~coupled_qk.models.registry.register_variant` call these (docs/DESIGN.md, "Adding an attention variant").
"""

from __future__ import annotations

import dataclasses
import inspect

import torch.nn as nn

from coupled_qk.checks.values import coercible, declaration_problems, field_types
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.layers.scoring import ScoringRule
from coupled_qk.models.options import MapOptions

RESERVED_OPTION_NAMES: set[str] = set()
"""Names a map option may not have: the fields (and old field names) of ``GPTConfig``, which
:mod:`coupled_qk.models.config` adds here when it is imported. A flat spelling (``--set dropout=0.1``,
``GPTConfig(dropout=0.1)``) always sets the ``GPTConfig`` field, so a map option of that name could never be set."""


def check_name(what: str, name: object) -> None:
    """``ValueError`` unless ``name`` is a Python identifier (``what`` names the argument, e.g. ``"stem"``).

    Attention and variant names are read back from ``--attention``, ``--variants`` specs (split at ``,`` and
    ``+``, with ``-`` read as ``_``), run folders and saved configs: only identifiers survive every one of them.
    """
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(
            f"{what}={name!r} must be a Python identifier (letters, digits and '_', not starting with "
            f"a digit; e.g. 'my_map'): attention and variant names are read back from --attention, "
            f"--variants specs (split at ',' and '+', '-' read as '_') and saved configs"
        )


def _check_signature(cls: type, positional: list[str], keywords: list[str]) -> None:
    """``ValueError`` unless ``cls(*positional, **keywords)`` binds (the way the layer builds it)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a signature Python cannot read (a C type): nothing to check
        return
    try:
        signature.bind(*positional, **dict.fromkeys(keywords))
    except TypeError as exc:
        call = ", ".join(positional + [f"{k}=..." for k in keywords])
        raise ValueError(
            f"{cls.__name__}{signature} cannot be built as {cls.__name__}({call}), the way every layer builds it: {exc}"
        ) from None


def _check_forward(cls: type[nn.Module], base: type[nn.Module], signature: str) -> None:
    if cls.forward is base.forward:
        raise ValueError(
            f"{cls.__name__} must define forward{signature} (it inherits {base.__name__}.forward, "
            f"which raises NotImplementedError)"
        )


IDENTITY_METHOD = "start_at_identity"
"""The optional method of a query-key map that makes it the exact identity (:mod:`coupled_qk.layers.qk_maps`);
:func:`coupled_qk.hf.retrofit` needs it."""


def _check_identity_method(module: type) -> None:
    """``ValueError`` unless ``module``'s optional :data:`IDENTITY_METHOD` is absent or a method taking no
    argument (it is called as ``map.start_at_identity()``)."""
    method = getattr(module, IDENTITY_METHOD, None)
    if method is None:
        return
    if not inspect.isfunction(method):
        raise ValueError(
            f"{module.__name__}.{IDENTITY_METHOD} = {method!r} must be a method taking no argument "
            f"(called as map.{IDENTITY_METHOD}() to make the map the identity)"
        )
    try:
        inspect.signature(method).bind(None)
    except TypeError as exc:
        raise ValueError(
            f"{module.__name__}.{IDENTITY_METHOD}{inspect.signature(method)} must take no argument "
            f"besides self (called as map.{IDENTITY_METHOD}()): {exc}"
        ) from None


SHIFT_ATTRIBUTE = "query_update_is_shift"
"""The class attribute of a query-key map saying its query update is a shift independent of the query
(:mod:`coupled_qk.layers.qk_maps`); :func:`coupled_qk.hf.retrofit` with ``gqa="shared"`` needs it ``True``."""


def _check_bool_attributes(module: type) -> None:
    """``ValueError`` unless ``module``'s class attributes ``keys_per_query_head`` and :data:`SHIFT_ATTRIBUTE` are
    bools (a string ``"False"`` would read as true)."""
    for attr in ("keys_per_query_head", SHIFT_ATTRIBUTE):
        value = getattr(module, attr)
        if not isinstance(value, bool):
            raise ValueError(
                f"{module.__name__}.{attr} = {value!r} must be a bool (True or False); see "
                f"coupled_qk.layers.qk_maps for what it declares"
            )


def check_map(module: object, options: object) -> None:
    """The contract of :func:`~coupled_qk.models.registry.register_qk_map`'s ``module`` and ``options``.

    Raises:
        ValueError: ``module`` not a :class:`~coupled_qk.layers.qk_maps.QKMap` subclass or without its own
            ``forward``, with a ``start_at_identity`` that is not a method taking no argument, or with
            ``keys_per_query_head`` or ``query_update_is_shift`` not a bool; ``options`` not a
            :class:`MapOptions` dataclass, a field without a default (a model is
            built from the defaults), a field of a type that values cannot be converted to
            (:func:`coupled_qk.checks.values.coercible`: a ``tuple`` would take ``--set`` strings unchecked), a field
            whose valid values are not declared with :func:`~coupled_qk.models.options.option` (a ``bool`` needs
            only its type), a field named like a ``GPTConfig`` field (:data:`RESERVED_OPTION_NAMES`), or fields
            that ``module(d_head, n_heads, **options)`` does not accept.
    """
    if not (isinstance(options, type) and issubclass(options, MapOptions) and dataclasses.is_dataclass(options)):
        raise ValueError(f"options={options!r} must be a dataclass subclassing MapOptions")
    if not (isinstance(module, type) and issubclass(module, QKMap)):
        raise ValueError(f"module={module!r} must be a QKMap subclass (coupled_qk.QKMap)")
    _check_forward(module, QKMap, "(q, k) -> (q', k')")
    _check_identity_method(module)
    _check_bool_attributes(module)
    fields = dataclasses.fields(options)
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if required:
        raise ValueError(
            f"options {options.__name__}: field(s) {required} need a default (a model is built from the "
            f"options' defaults when none is given)"
        )
    try:
        annotations = field_types(options)
    except Exception as exc:  # NameError of a string annotation, ...
        raise ValueError(f"options {options.__name__}: its field annotations cannot be resolved: {exc}") from None
    unchecked = {n: getattr(a, "__name__", str(a)) for n, a in annotations.items() if not coercible(a)}
    if unchecked:
        raise ValueError(
            f"options {options.__name__}: field type(s) {unchecked} cannot be read from --set, variant "
            f"specs or config files; use bool, int, float, str, Literal['a', 'b'], dict, list or "
            f"'X | None' of those"
        )
    _check_declarations(options)
    reserved = sorted(f.name for f in fields if f.name in RESERVED_OPTION_NAMES)
    if reserved:
        raise ValueError(
            f"options {options.__name__}: field(s) {reserved} are GPTConfig fields, so --set and "
            f"GPTConfig(...) keywords of that name set the GPTConfig field, never the map's option; "
            f"rename them"
        )
    _check_signature(module, ["d_head", "n_heads"], [f.name for f in fields])


def _check_declarations(options: type) -> None:
    """``ValueError`` naming every field of ``options`` whose valid values are not declared (what construction,
    ``--set`` and the tests check them against: :func:`coupled_qk.checks.values.declaration_problems`)."""
    problems = declaration_problems(options)
    if problems:
        raise ValueError(
            f"options {options.__name__}: declare each field's valid values with coupled_qk.option (e.g. "
            f'\'gain: float = option(1.0, lo=0.0)\', \'mode: str = option("a", choices=("a", "b"))\'; a bool '
            f"needs only its type): " + "; ".join(problems)
        )


def check_scoring(module: object) -> None:
    """The contract of :func:`~coupled_qk.models.registry.register_scoring`'s ``module``.

    Raises:
        ValueError: ``module`` not a :class:`~coupled_qk.layers.scoring.ScoringRule` subclass, without its own
            ``forward``, with ``head_group`` other than 1, or not buildable as ``module(d_head, n_heads,
            layer_idx)``.
    """
    if not (isinstance(module, type) and issubclass(module, ScoringRule)):
        raise ValueError(f"module={module!r} must be a ScoringRule subclass (coupled_qk.ScoringRule)")
    if module.head_group != 1:
        raise ValueError(f"{module.__name__}.head_group={module.head_group}: added scoring rules must use 1")
    _check_forward(module, ScoringRule, "(q, k, v, eager, dropout_p, mask) -> (y, probabilities)")
    _check_signature(module, ["d_head", "n_heads", "layer_idx"], [])


def same_definition(a: type, b: type) -> bool:
    """Whether ``a`` and ``b`` are one class or two runs of one definition (same module and qualified name: a
    notebook cell run again, ``importlib.reload``)."""
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    )
