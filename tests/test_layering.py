"""Import direction: ops <- layers <- models <- data/training <- analysis/experiments/study/hf <- studies <-
commands/cli.

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
    "checks": 0,
    "allocator": 0,
    "files": 0,
    "devices": 0,
    "progress": 0,
    "extras": 0,
    "ops": 0,
    "layers": 1,
    "models": 2,
    "data": 3,
    "training": 3,
    "output_dir": 3,  # asks training.run_folder what a run folder is
    "analysis": 4,
    "experiments": 4,
    "study": 4,
    "hf": 4,
    "_hf_hook": 4,
    "studies": 5,
    "commands": 6,
    "cli": 6,
    "__main__": 6,
}


ROOT_LEVEL = 7
"""``from coupled_qk import name`` inside the package: the root re-exports every level, so no module imports it."""


def level_of(module: str) -> int:
    """Level of ``coupled_qk.<top>...``; a name of the package root (not a module) is :data:`ROOT_LEVEL`; an
    unknown top-level module fails (classify new packages here)."""
    top = module.split(".")[1]
    if not (SRC / top).is_dir() and not (SRC / f"{top}.py").is_file():
        return ROOT_LEVEL
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
    assert not back_edges, (
        "imports from a higher level (coupled_qk.<name> of a class or function is the package "
        "root: import it from the module that defines it):\n" + "\n".join(f"{a} -> {b}" for a, b in back_edges)
    )


def test_the_study_engine_never_imports_the_recipes():
    """``coupled_qk.study`` (the engine) names no study: it imports neither the recipes (``coupled_qk.studies``)
    nor the experiments built on it (``coupled_qk.experiments``), so a study is added without touching it."""
    found = []
    for module, path in sorted(source_modules().items()):
        if module == "coupled_qk.study" or module.startswith("coupled_qk.study."):
            found += [
                f"{module} -> {m}"
                for m in imported_modules(path, module)
                if m.startswith(("coupled_qk.studies", "coupled_qk.experiments"))
            ]
    assert not found, "the engine imports recipes or experiments:\n" + "\n".join(found)


def test_checker_sees_back_edges(tmp_path):
    """The checker itself: a function-level import from a higher level is found."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from coupled_qk.commands.options import add_model_options\n")
    imports = imported_modules(path, "coupled_qk.models.bad")
    assert imports == ["coupled_qk.commands.options"]
    assert level_of(imports[0]) > level_of("coupled_qk.models.bad")


def module_graph() -> dict[str, set[str]]:
    """Source module -> the source modules it imports (``from pkg import name`` counts as ``pkg.name`` when that
    is a module, else as ``pkg``)."""
    mods = source_modules()
    graph = {}
    for module, path in mods.items():
        edges = set()
        for target in imported_modules(path, module):
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]  # an imported name, not a module
            if target in mods and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); only components of more than one module, each sorted."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    """No two modules import each other, directly or through others (a package ``__init__`` re-exporting its
    own modules is a cycle too: import what you need from the module that defines it)."""
    cycles = strongly_connected_components(module_graph())
    assert not cycles, "import cycles (strongly connected components):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_sees_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected_components(graph) == [["a", "b", "c"]]


def private_imports(path: Path, module: str) -> list[str]:
    """``from coupled_qk.x import _name`` and ``coupled_qk.x._name`` attribute reads where ``x`` is not ``module``
    (a private name crossing a module boundary); private modules (``coupled_qk._hf_hook``) are fine."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    mods, imported = source_modules(), _imported_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coupled_qk") and node.module != module:
            out += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__") and f"{node.module}.{a.name}" not in mods
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            # Class._private / module._private reads on an imported coupled_qk name
            base = node.value
            if isinstance(base, ast.Name) and base.id in imported and base.id != "self":
                out.append(f"{base.id}.{node.attr}")
    return out


def _imported_names(tree: ast.AST) -> set[str]:
    """Names bound by ``from coupled_qk... import name`` in ``tree``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coupled_qk"):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_no_private_names_cross_module_boundaries():
    found = []
    for module, path in sorted(source_modules().items()):
        found += [f"{module}: {name}" for name in private_imports(path, module)]
    assert not found, "private names used outside their module (make them public or move the code):\n" + "\n".join(
        found
    )


def test_private_name_checker(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(
        "from coupled_qk.data.corpora import _join, load_corpus\nfrom coupled_qk.checks.values import choice\n"
        "from coupled_qk.models.config import GPTConfig\nx = GPTConfig._upgrade\n"
    )
    assert private_imports(path, "coupled_qk.data.hub") == ["coupled_qk.data.corpora._join", "GPTConfig._upgrade"]


MAX_FUNCTION_LINES = 100
"""The longest a function of ``src/`` may be, in lines of code after its docstring (issue 30 item 4: split long
functions at their natural seams; a docstring documenting arguments is never a reason to split)."""

LONG_FUNCTIONS_ALLOWED: dict[str, int] = {}
"""``"module::function"`` -> its current length, for a function that must stay longer (none today)."""


def function_lengths(path: Path) -> dict[str, int]:
    """``name -> lines of code`` (from the first statement after the docstring to the end) of every function and
    method in ``path``, nested ones included (``Class.method``, ``outer.inner``)."""
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                doc = (
                    isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)
                    and len(body) > 1
                )
                start = body[1].lineno if doc else child.lineno
                out[prefix + child.name] = child.end_lineno - start + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_function_is_longer_than_the_limit():
    too_long = []
    for module, path in sorted(source_modules().items()):
        for name, n in function_lengths(path).items():
            key = f"{module}::{name}"
            if n > max(MAX_FUNCTION_LINES, LONG_FUNCTIONS_ALLOWED.get(key, 0)):
                too_long.append(f"{key}: {n} lines")
    assert not too_long, (
        f"functions longer than {MAX_FUNCTION_LINES} lines of code (split them at their natural "
        "seams):\n" + "\n".join(too_long)
    )


def test_function_length_counts_code_after_the_docstring(tmp_path):
    path = tmp_path / "f.py"
    path.write_text(
        'def f():\n    """Doc\n    more."""\n    a = 1\n    return a\n\n\nclass C:\n    def m(self):\n'
        "        def inner():\n            pass\n        return inner\n"
    )
    assert function_lengths(path) == {"f": 2, "C.m": 4, "C.m.inner": 2}
