"""Which installed package registered an attention, recorded in the configs that name it.

A model config saved with an attention that a plugin registered (a map or a scoring rule from another package,
through the entry-point group ``coupled_qk.variants``) records that package under :data:`KEY`
(``model_config.json`` of a run and of each checkpoint, ``config.json`` of a Hugging Face export), so that
loading it where the plugin is not installed names what to install instead of only "unknown attention".
Built-in attentions record nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

KEY = "registered_by"
"""The key of a saved config holding its attention's registering packages: a list of ``{"attention", "module",
"distribution"}`` (``distribution`` ``None`` for a module that no installed distribution provides)."""

OPTION_HINT = (
    "an option of another package's attention exists only where that package is installed (it registers "
    "through the entry-point group 'coupled_qk.variants', docs/DESIGN.md)"
)
"""The end of the error for an unknown ``--set`` option: where plugin options come from."""


def providers(attention: str) -> list[dict]:
    """The packages outside ``coupled_qk`` whose classes make ``attention`` (its query-key map's class and its
    scoring rule's), each ``{"attention", "module", "distribution"}``; ``[]`` for a built-in or unknown one."""
    from coupled_qk.models.registry import ATTENTIONS, SCORING_RULES

    spec = ATTENTIONS.get(attention)
    if spec is None:
        return []
    classes = [spec.qk_map.module if spec.qk_map else None, SCORING_RULES[spec.scoring].module]
    modules = [c.__module__ for c in classes if c is not None and c.__module__.split(".")[0] != "coupled_qk"]
    return [{"attention": attention, "module": m, "distribution": _distribution(m)} for m in dict.fromkeys(modules)]


def _distribution(module: str) -> str | None:
    """The installed distribution providing ``module``: the one declaring a ``coupled_qk.variants`` entry point
    in its top-level package, else the one ``importlib.metadata.packages_distributions`` names; ``None``."""
    from importlib.metadata import entry_points, packages_distributions

    from coupled_qk.models.registry import ENTRY_POINT_GROUP

    top = module.split(".")[0]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if ep.value.split(":")[0].split(".")[0] == top and dist is not None:
            return dist.name
    found = packages_distributions().get(top)
    return found[0] if found else None


class SavedConfig(Protocol):
    """A config that :func:`saved_dict` writes (:class:`~coupled_qk.models.config.JSONConfig`)."""

    def to_dict(self) -> dict[str, Any]:
        """All fields, JSON-serialisable."""
        ...


def saved_dict(config: SavedConfig) -> dict[str, Any]:
    """What a config file holds: ``config.to_dict()``, plus :data:`KEY` when ``config`` has an ``attention`` that
    a plugin registered (:func:`providers`)."""
    data = config.to_dict()
    found = providers(data["attention"]) if isinstance(data.get("attention"), str) else []
    return {**data, KEY: found} if found else data


def hint(recorded: object) -> str:
    """``"; the config records attention 'x' as registered by module 'm' (distribution 'd'): install it ..."``
    for a :data:`KEY` value (``""`` when it is not a list of such records)."""
    items = [r for r in recorded if isinstance(r, dict) and "module" in r] if isinstance(recorded, list) else []
    if not items:
        return ""
    named = ", ".join(
        f"module {r['module']!r}" + (f" (distribution {r['distribution']!r})" if r.get("distribution") else "")
        for r in items
    )
    return (
        f"; the config records attention {items[0].get('attention')!r} as registered by {named}: install that "
        "package where this config is loaded"
    )


@contextlib.contextmanager
def naming_providers(source: object) -> Iterator[None]:
    """Re-raise a ``ValueError`` of the block with :func:`hint` added, from ``source``: a saved config's
    :data:`KEY` value, or the path of a JSON config file holding it (read only on an error)."""
    try:
        yield
    except ValueError as exc:
        recorded = source
        if isinstance(source, (str, Path)):
            try:
                recorded = json.loads(Path(source).read_text(encoding="utf-8")).get(KEY)
            except (OSError, ValueError, AttributeError):
                recorded = None
        extra = hint(recorded)
        if not extra or extra in str(exc):
            raise
        raise ValueError(f"{exc}{extra}") from None
