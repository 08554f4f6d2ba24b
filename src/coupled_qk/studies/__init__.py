"""The studies: recipes for the study engine (:mod:`coupled_qk.study`), data only (cells, stages, arms, claim
bindings, layouts).

- :mod:`.first_epoch`: ``smoke``, ``cpu-short``, ``cpu``, ``gpu-paper`` (every run stopped inside its first epoch,
  one learning rate for every variant);
- :mod:`.converged`: ``cpu-converged``, ``cpu-converged-pubmed``, ``cpu-converged-small``, ``gpu-60m`` and the toy
  instances ``toy-converged``, ``toy-gpu-60m`` (tuned learning rates, annealed to a horizon the plateau rule set;
  pre-registered).

:func:`studies` finds every module of this package that defines ``STUDIES`` (a tuple of
:class:`~coupled_qk.study.design.Study`) and the third-party studies declared in the entry-point group
:data:`ENTRY_POINT_GROUP`, so adding a study is one new file here or one entry point elsewhere; the command line's
choices are generated from them. What a study's report says beside its numbers that is a date, a machine or a
measured throughput lives in ``docs/results/STUDIES.md``.
"""

from __future__ import annotations

import importlib
import pkgutil

ENTRY_POINT_GROUP = "coupled_qk.studies"
"""Python entry-point group of third-party studies: each names a :class:`~coupled_qk.study.design.Study`, a tuple
of them, or a callable returning either (``[project.entry-points."coupled_qk.studies"]``)."""

_cache: dict = {}


def _as_studies(obj, where: str) -> tuple:
    from coupled_qk.study.design import Study

    if callable(obj) and not isinstance(obj, Study):
        obj = obj()
    items = (obj,) if isinstance(obj, Study) else tuple(obj)
    for item in items:
        if not isinstance(item, Study):
            raise TypeError(f"{where} holds {item!r}; expected coupled_qk.study.design.Study objects")
    return items


def studies(reload: bool = False) -> dict:
    """``{name: Study}`` of the built-in studies (by their module's ``ORDER``, then name) and those of installed
    distributions.

    Raises:
        RuntimeError: an entry point that fails to load or holds something other than studies, naming it.
        ValueError: two studies with one name.
    """
    if _cache and not reload:
        return dict(_cache)
    from importlib.metadata import entry_points

    found: list = []
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    for module in sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__)):
        if hasattr(module, "STUDIES"):
            found += [(f"{module.__name__}.STUDIES", s) for s in _as_studies(module.STUDIES, module.__name__)]
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            found += [(f"entry point {ep.name}", s) for s in _as_studies(ep.load(), f"entry point {ep.name}")]
        except Exception as exc:
            raise RuntimeError(
                f"the {ENTRY_POINT_GROUP!r} entry point {ep.name} = {ep.value!r} failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    out: dict = {}
    for where, study in found:
        if study.name in out:
            raise ValueError(f"two studies are called {study.name!r} (the second from {where})")
        out[study.name] = study
    _cache.clear()
    _cache.update(out)
    return dict(out)


def get_study(name: str):
    """The study called ``name``; ``ValueError`` listing the known ones (closest first) otherwise."""
    from coupled_qk.checks.values import choice

    known = studies()
    choice("protocol", name, known)
    return known[name]
