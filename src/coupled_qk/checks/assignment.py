"""Assignment after construction checked like construction, for the validated config dataclasses.

:class:`CheckedAssignment` is the base of ``GPTConfig``/``TrainConfig`` (through ``JSONConfig``) and of the map
options (``MapOptions``, ``GPTConfig.qk_map``): ``config.dt_init = "fast"`` or ``config.qk_map.n_steps = -1``
is refused at the assignment, naming the field, as the constructor refuses it (docs/RELIABILITY.md,
"Configuration"), instead of surfacing later inside a layer or, worse, being saved with a run.
"""

from __future__ import annotations

import functools

from coupled_qk.checks.values import coerce, field_types


class CheckedAssignment:
    """Mixin for dataclasses: after ``__post_init__`` has run, assigning a field converts the value to the
    field's declared type (:func:`coupled_qk.checks.values.coerce`), updates the fields derived from it (:meth:`follow`)
    and runs :meth:`recheck`; on an error the old values are restored and the error (``ValueError`` naming
    ``<owner>.<field>``) propagates. An unknown attribute is an
    ``AttributeError`` (a typo never creates a silent new attribute). Reads are untouched, so hot paths that read
    a config cost nothing more. Names starting with ``_`` are private state, set freely.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        post = cls.__dict__.get("__post_init__")
        if post is not None:  # assignments made while constructing are not re-checked one by one

            @functools.wraps(post)
            def post_init(self, *args, **kw):
                object.__setattr__(self, "_checking", True)
                try:
                    post(self, *args, **kw)
                finally:
                    object.__setattr__(self, "_checking", False)
                object.__setattr__(self, "_constructed", True)

            cls.__post_init__ = post_init

    def owner_name(self) -> str:
        """How errors name this object (``GPTConfig``, ``GPTConfig.qk_map``)."""
        return type(self).__name__

    def recheck(self, name: str | None = None) -> None:
        """The checks an assignment of field ``name`` re-runs (default: ``validate()``); raise ``ValueError``
        naming the field."""
        self.validate()

    def __setattr__(self, name: str, value) -> None:
        state = self.__dict__
        if name.startswith("_") or not state.get("_constructed") or state.get("_checking"):
            object.__setattr__(self, name, value)
            return
        owner = self.owner_name()
        types = field_types(type(self))
        if name not in types:
            raise AttributeError(f"{owner} has no field {name!r}; fields: {sorted(types)}")
        value = coerce(f"{owner}.{name}", value, types[name])
        before = {field: state[field] for field in types}
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_checking", True)
        try:
            self.follow(name, before)
            self.recheck(name)
        except BaseException:
            for field, old in before.items():  # the assigned field and any that followed it
                object.__setattr__(self, field, old)
            raise
        finally:
            object.__setattr__(self, "_checking", False)

    def follow(self, name: str, before: dict) -> None:
        """Update the fields derived from ``name`` after it was assigned (``before``: every field's value before the
        assignment); nothing here. ``GPTConfig`` moves a derived size that still held its derived value (``d_head``
        after ``d_model``), so that no field is left stale."""
