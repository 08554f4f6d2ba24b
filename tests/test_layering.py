"""Import direction: ops <- layers <- models <- data/training/hf <- analysis/experiments <- commands/cli.

Every ``import`` statement of every source file (also those inside functions) is read with ``ast``; a module
may import only from its own level or a lower one. The package root (``coupled_qk/__init__.py``) is the public
API and may import anything except the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import coupled_qk

SRC = Path(coupled_qk.__file__).parent

LEVELS = {
    "_checks": 0, "io": 0, "outputs": 0, "devices": 0, "tensor_checks": 0, "progress": 0, "ops": 0,
    "layers": 1,
    "models": 2,
    "data": 3, "training": 3,
    "analysis": 4, "experiments": 4, "hf": 4, "_hf_hook": 4,
    "commands": 5, "cli": 5, "__main__": 5,
}


def level_of(module: str) -> int:
    """Level of ``coupled_qk.<top>...``; an unknown top-level name fails (classify new packages here)."""
    top = module.split(".")[1]
    assert top in LEVELS, f"coupled_qk.{top} has no level in tests/test_layering.py: add it to LEVELS"
    return LEVELS[top]


def imported_modules(path: Path, module: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the package
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append(name)
            out += [f"{name}.{a.name}" for a in node.names if name == "coupled_qk"]  # from coupled_qk import x
    return [m for m in out if m.startswith("coupled_qk.")]


def source_modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def test_imports_flow_one_way():
    back_edges = []
    for module, path in sorted(source_modules().items()):
        imports = imported_modules(path, module)
        if module == "coupled_qk":
            back_edges += [(module, m) for m in imports if level_of(m) >= LEVELS["commands"]]
            continue
        own = level_of(module)
        back_edges += [(module, m) for m in imports if level_of(m) > own]
    assert not back_edges, "imports from a higher level:\n" + "\n".join(f"{a} -> {b}" for a, b in back_edges)


def test_checker_sees_back_edges(tmp_path):
    """The checker itself: a function-level import from a higher level is found."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from coupled_qk.commands.options import parse_seeds\n")
    imports = imported_modules(path, "coupled_qk.models.bad")
    assert imports == ["coupled_qk.commands.options"]
    assert level_of(imports[0]) > level_of("coupled_qk.models.bad")
