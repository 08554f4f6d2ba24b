"""Every public function, class and method of ``coupled_qk`` has a docstring of its own (the project standard:
shapes, dtypes, units, errors raised, source).

Generated, not hand-listed: every module of the package is imported (``pkgutil.walk_packages``) and every public
name it defines is read, so a new undocumented name fails here. The raw ``__doc__`` is read, never
``inspect.getdoc`` (which hands an override its base method's docstring), and the signature ``@dataclass`` writes
into an undocumented class does not count.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import textwrap
import types

import coupled_qk


def has_own_doc(obj) -> bool:
    """Whether ``obj`` (a function or class) has a non-blank docstring written for it: its own ``__doc__``, not one
    inherited, and not the ``Name(field: type = ...)`` signature ``dataclasses.dataclass`` puts in its place."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not (doc or "").strip():
        return False
    if inspect.isclass(obj) and "__dataclass_fields__" in vars(obj):
        try:
            generated = obj.__name__ + str(inspect.signature(obj)).replace(" -> None", "")
        except (TypeError, ValueError):  # no signature: the docstring cannot be the generated one
            return True
        return doc != generated
    return True


def undocumented(module: types.ModuleType) -> list[str]:
    """``module.name`` or ``module.Class.method`` of each public function, class and method (plain, static or class
    method, or property) that ``module`` defines without a docstring of its own; names imported from elsewhere are
    checked where they are defined. A function made at import time (``positive_int_arg = _arg(...)``) counts as
    defined here."""
    out = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if obj.__module__ != module.__name__:
            continue
        if not has_own_doc(obj):
            out.append(f"{module.__name__}.{name}")
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, property):  # its getter's docstring, or one given as property(doc=...)
                    if not (member.__doc__ or "").strip():
                        out.append(f"{module.__name__}.{name}.{attr}")
                    continue
                func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if inspect.isfunction(func) and not has_own_doc(func):
                    out.append(f"{module.__name__}.{name}.{attr}")
    return out


def test_every_public_name_has_a_docstring():
    modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(coupled_qk.__path__, "coupled_qk.")]
    assert len(modules) > 100, f"walked only {len(modules)} modules of coupled_qk"
    missing = [name for module in modules for name in undocumented(module)]
    assert not missing, (
        f"{len(missing)} public functions, classes or methods without a docstring (say what it takes and returns: "
        "shapes, dtypes, units, errors raised, source):\n" + "\n".join(missing)
    )


FAKE_MODULE = '''
import dataclasses
from os.path import join  # imported: checked where it is defined, not here

def documented():
    """Doc."""

def bare():
    pass

def blank():
    """   """

def _private():
    pass

made = lambda: None  # a function made at import time (as the argparse types are)

class Base:
    """Doc."""

    def method(self):
        pass

    @staticmethod
    def static():
        pass

    @classmethod
    def klass(cls):
        pass

    def ok(self):
        """Doc."""

    def _private(self):
        pass

    @property
    def prop(self):
        pass

    @property
    def documented_prop(self):
        """Doc."""

    given = property(lambda self: 0, doc="Doc.")

class Child(Base):
    """Doc."""

    def ok(self):  # an override: the base's docstring is not this one's
        pass

class Bare:
    pass

@dataclasses.dataclass
class Data:
    x: int = 0

@dataclasses.dataclass
class DocumentedData:
    """Doc."""

    x: int = 0
'''


def test_checker_sees_every_kind_of_missing_docstring(monkeypatch):
    """The checker itself, on a module written here: each kind of undocumented public name is found (functions,
    one made at import time, classes, dataclasses, plain/static/class methods, properties, an override of a
    documented method), and documented, private and imported names are not."""
    module = types.ModuleType("fake_module")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # where @dataclass resolves the annotations
    exec(textwrap.dedent(FAKE_MODULE), module.__dict__)
    assert undocumented(module) == [
        "fake_module.bare",
        "fake_module.blank",
        "fake_module.made",
        "fake_module.Base.method",
        "fake_module.Base.static",
        "fake_module.Base.klass",
        "fake_module.Base.prop",
        "fake_module.Child.ok",
        "fake_module.Bare",
        "fake_module.Data",
    ]
