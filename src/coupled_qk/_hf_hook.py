"""Register the coupled-qk models with the ``transformers`` Auto classes without importing ``transformers``.

``import coupled_qk`` calls :func:`install`. If ``transformers``' Auto modules are already imported, the
models are registered at once; otherwise an import hook registers ``CoupledQKConfig`` right after
``transformers.models.auto.configuration_auto`` is executed and the models right after
``transformers.models.auto.modeling_auto``, i.e. the first time the user touches ``AutoConfig`` /
``AutoModelForCausalLM``. ``import coupled_qk`` therefore never imports ``transformers`` (an optional extra,
``pip install "coupled-qk[hf]"``) and costs nothing when it is not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"


def _register(what: str) -> None:
    try:
        from coupled_qk.hf import registration

        registration.register_config() if what == "config" else registration.register_models()
    except Exception as exc:  # never break the user's import of transformers
        warnings.warn(
            f"coupled_qk could not register its models with transformers ({exc!r}); "
            "call coupled_qk.hf.register() after importing transformers",
            stacklevel=2,
        )


class _Loader(importlib.abc.Loader):
    """Wraps the real loader of a hooked module; runs the registration once the module is executed."""

    def __init__(self, loader, what: str):
        self._loader, self._what = loader, what

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register(self._what)

    def __getattr__(self, name):  # get_source, get_code, ... for tools that inspect the loader
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the hooked modules with the other finders and wraps their loaders."""

    targets = {_CONFIG_AUTO: "config", _MODEL_AUTO: "models"}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self.targets[fullname])
                return spec
        return None


def install() -> None:
    """Register now if ``transformers``' Auto modules are loaded, else hook their import (idempotent)."""
    if importlib.util.find_spec("transformers") is None:
        return
    if _MODEL_AUTO in sys.modules:
        _register("models")
    elif _CONFIG_AUTO in sys.modules:
        _register("config")
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
