"""Optional dependencies (the package's pip extras), checked before a command does any work.

A command that needs an extra calls :func:`require_extra` first, so a missing package is one line naming the extra
to install (the CLI reports :class:`MissingExtra` as it reports a bad value, exit 2), not a traceback after the
training it would have summarised.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names it and the pip extra that installs it."""


def require_extra(modules: Sequence[str], extra: str, purpose: str) -> None:
    """Import each of ``modules`` (e.g. ``("scipy",)``), or fail naming the ones missing.

    Args:
        modules: importable module names.
        extra: the ``coupled-qk`` extra that installs them (``pip install 'coupled-qk[<extra>]'``).
        purpose: what needs them, for the message (e.g. ``"mqar --seeds"``).

    Raises:
        MissingExtra: naming ``purpose``, the missing modules and the extra.
    """
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtra(
            f"{purpose} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install 'coupled-qk[{extra}]' (or pip install -e \".[{extra}]\" in a checkout)"
        )


class LazyModule:
    """A module imported on its first attribute access, through :func:`require_extra`: a module of the package that
    needs an extra only in some of its functions (``st = LazyModule("scipy.stats", "claims", "...")``, then
    ``st.t.ppf(...)``) imports without it, so listing or parsing what it defines needs no extra, and the first use
    without it is :class:`MissingExtra` (one line on the command line), not an ``ImportError`` at import time.

    Args:
        name: the module's import path (e.g. ``"scipy.stats"``); its top-level package is what ``require_extra``
            checks. extra, purpose: as :func:`require_extra`'s.
    """

    def __init__(self, name: str, extra: str, purpose: str) -> None:
        self._spec = (name, extra, purpose)
        self._module = None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # the proxy's own fields before __init__ set them (copy, pickle)
            raise AttributeError(attr)
        if self._module is None:
            name, extra, purpose = self._spec
            require_extra((name.split(".")[0],), extra, purpose)
            self._module = importlib.import_module(name)
        return getattr(self._module, attr)
