"""The generated blocks of ``README.md``, ``docs/*.md`` and ``benchmarks/README.md``: what each holds, and the command
that rewrites them.

A page holds a generated block between two HTML comments, so GitHub shows only its text::

    <!-- BEGIN generated: NAME -->
    ...
    <!-- END generated: NAME -->

and a copy of a committed claims report (``docs/results/claims/NAME-readme.md``, written by ``coupled-qk claims``)
between ``<!-- claims:NAME -->`` and ``<!-- /claims:NAME -->``. A report is copied as written, its links relative to
the repository root (a converged headline links its full report), so a block with links belongs in ``README.md``.
The text between the markers is exactly what :func:`expected_block` returns for that name; a test compares every
block of every page with it, so prose is never parsed for facts: what can drift is generated.

Rewrite the blocks in place (from the repository root)::

    python -m coupled_qk.commands.docs_blocks            # rewrite stale blocks, list the pages changed
    python -m coupled_qk.commands.docs_blocks --check    # exit 1 and name the stale blocks

The registry's tables (``docs/DESIGN.md``'s ``attentions``, ``variants``, ``presets`` and the front page's
``variants-table``) cover the query-key maps that DESIGN.md documents (:func:`design_maps`), so a drop-in map added
to :mod:`coupled_qk.models.maps` leaves every page current; rewriting the pages documents every map of the package
first (:func:`coupled_qk.models.catalog.write_docs`). This module leaves blocks it does not know untouched.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from coupled_qk.files import write_text_atomic
from coupled_qk.models import catalog

BLOCK = re.compile(r"(<!-- BEGIN generated: ([\w:-]+) -->\n)(.*?)(<!-- END generated: \2 -->)", re.S)
"""A generated block: group 2 is its name, group 3 its text (ending in a newline, or empty)."""

CLAIMS_BLOCK = re.compile(r"(<!-- claims:([\w-]+) -->\n)(.*?)\n?(<!-- /claims:\2 -->)", re.S)
"""A copy of ``docs/results/claims/<name>-readme.md`` (its text without the final newline)."""

CLAIMS_DIR = Path("docs") / "results" / "claims"
VERDICT_PROTOCOLS = ("cpu", "cpu-short")
"""The first-epoch protocols whose null verdicts the ``verdict-readings`` table reads."""

SOURCES = {
    "dynamics": "[Gahtan & Bronstein v1](https://arxiv.org/abs/2604.01683v1)",
    "query_mlp": "the paper's matched-capacity ablation (v1)",
    "invertible": "[Gahtan & Bronstein v2](https://arxiv.org/abs/2604.01683v2)",
    "standard": "[Vaswani et al. 2017](https://arxiv.org/abs/1706.03762)",
    "differential": "[Ye et al. 2024](https://arxiv.org/abs/2410.05258)",
}
"""Where each built-in query-key map and scoring rule comes from (a registered name missing here shows its class)."""


TRACKED_RESULT = Path("benchmarks") / "results" / "tracked" / "tracked-tiny-cpu.json"
"""The committed output of ``python benchmarks/ab.py --tracked`` that the ``speed-tracked`` block shows."""


def pages(root: Path) -> list[Path]:
    """The pages whose blocks are kept: ``README.md``, ``docs/*.md`` and ``benchmarks/README.md`` under ``root``
    (each that exists)."""
    found = [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "benchmarks" / "README.md"]
    return [page for page in found if page.is_file()]


DESIGN = Path("docs") / "DESIGN.md"
"""The page whose ``attentions`` table says which query-key maps the pages document."""


def design_maps(root: Path) -> list[str]:
    """The query-key maps ``docs/DESIGN.md`` under ``root`` documents (:func:`coupled_qk.models.catalog.
    documented_maps`); every map of the package when there is no such page."""
    page = root / DESIGN
    return catalog.documented_maps(page.read_text()) if page.is_file() else catalog.package_maps()


def _source(attention) -> str:
    parts = []
    if attention.qk_map is not None:
        m = attention.qk_map
        parts.append(SOURCES.get(m.name, f"`{m.module.__module__}.{m.module.__qualname__}`"))
    if attention.scoring != "standard" or attention.qk_map is None:
        parts.append(SOURCES.get(attention.scoring, f"scoring rule `{attention.scoring}`"))
    return " + ".join(parts)


def variants_table(root: Path) -> str:
    """The named variants of the maps DESIGN.md documents (:func:`design_maps`; not third-party plugins), in the
    order of its ``variants`` table: each one's attention (query-key map x scoring rule), the options it sets,
    its extra parameters over ``standard`` at the ``60m`` preset (exact, counted on the meta device) and where it
    comes from."""
    from coupled_qk.models import registry
    from coupled_qk.models.config import GPTConfig
    from coupled_qk.models.gpt import coupling_parameter_overhead

    rows = [
        "| variant | query-key map | scoring | options | extra parameters at `60m` | from |",
        "|---|---|---|---|---:|---|",
    ]
    for name in catalog.variant_names(catalog.attention_names(design_maps(root))):
        spec = registry.VARIANTS[name]
        attention = registry.ATTENTIONS[spec["attention"]]
        m = attention.qk_map
        options = ", ".join(f"`{k}={v}`" for k, v in spec.items() if k != "attention") or "-"
        extra = coupling_parameter_overhead(GPTConfig.from_preset("60m", **spec))
        rows.append(
            f"| `{name}` | {f'`{m.module.__name__}`' if m else '-'} | {attention.scoring} | {options} | "
            f"{extra['extra']:,} ({extra['overhead_percent']:+.2f}%) | {_source(attention)} |"
        )
    return "\n".join(rows) + "\n"


def verdict_readings(root: Path) -> str:
    """The null verdicts of the first-epoch claims reports, read as excluded or inconclusive with their power
    (:func:`coupled_qk.study.power.verdict_readings_table` over :data:`VERDICT_PROTOCOLS`)."""
    from coupled_qk.study.power import verdict_readings_table

    reports = {p: json.loads((root / CLAIMS_DIR / f"{p}.json").read_text()) for p in VERDICT_PROTOCOLS}
    return verdict_readings_table(reports) + "\n"


def demo_quick(root: Path) -> str:
    """One sentence: the budget of ``coupled-qk demo --quick`` (``commands.demo.QUICK_DEFAULTS``)."""
    from coupled_qk.commands.demo import QUICK_DEFAULTS, QUICK_EVAL_WINDOWS

    return (
        f"Budget: {QUICK_DEFAULTS['max_tokens']:,} training tokens per variant and a final evaluation on the first "
        f"{QUICK_EVAL_WINDOWS} windows of WikiText-2 valid and test only (the windows each validation during training "
        "reads, so the final point of the loss plot scores the same text as its curve); output in "
        f"`./{QUICK_DEFAULTS['out_dir']}`.\n"
    )


def claims_protocols(root: Path) -> str:
    """The studies ``coupled-qk claims --protocol`` (``coupled-qk study``) takes, in
    :func:`coupled_qk.studies.studies` order, each with its description: a study of fixed cells runs inside the
    first epoch, one whose plan depends on its records (a learning-rate grid) trains to a plateau."""
    from coupled_qk.studies import studies

    rows = ["| protocol | regime | what it runs |", "|---|---|---|"]
    for name, study in studies().items():
        regime = "first epoch" if study.static else "tuned, annealed"
        rows.append(f"| `{name}` | {regime} | {study.description} |")
    return "\n".join(rows) + "\n"


def corpora(root: Path) -> str:
    """The corpus names ``--corpus`` knows (``coupled_qk.data.corpora.KNOWN_CORPORA``)."""
    from coupled_qk.data.corpora import KNOWN_CORPORA

    names = ", ".join(f"`{name}`" for name in KNOWN_CORPORA)
    return f"The names `--corpus` knows: {names}. Any other value is a path, or `hf:NAME[:CONFIG]`.\n"


def commands(root: Path) -> str:
    """The sub-commands of ``coupled-qk`` with their help lines (``coupled_qk.cli.COMMANDS``)."""
    from coupled_qk.cli import COMMANDS

    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| `coupled-qk {name}` | {text} |" for name, text in COMMANDS.items()]
    return "\n".join(rows) + "\n"


def _design_table(name: str) -> Callable[[Path], str]:
    """The generator of ``docs/DESIGN.md``'s block ``name`` (:func:`coupled_qk.models.catalog.tables`)."""
    return lambda root: catalog.tables(design_maps(root))[name]


def benchmark_module(root: Path, name: str) -> ModuleType:
    """The module ``benchmarks/<name>.py`` of the repository at ``root``, imported with ``benchmarks/`` on
    ``sys.path`` while it loads (its sibling imports; the scripts there are not part of the package).

    Raises:
        FileNotFoundError: ``root`` has no ``benchmarks/<name>.py``.
    """
    folder = root / "benchmarks"
    if not (folder / f"{name}.py").is_file():
        raise FileNotFoundError(f"{folder / name}.py does not exist: the docs blocks need the repository's benchmarks")
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def speed_tracked(root: Path) -> str:
    """The tracked cells' speed against ``standard`` (:data:`TRACKED_RESULT`, written by ``python benchmarks/ab.py
    --tracked --out-dir benchmarks/results/tracked``): the revision, date, command, load and machine line it was
    measured with, and that revision's ratio table (``ratio_table`` of ``benchmarks/ab_measure.py`` under
    ``root``, :func:`benchmark_module`: the revision A/B is a benchmark tool, not part of the library).

    Raises:
        FileNotFoundError: the result does not exist (naming it and the command that writes it).
    """
    from coupled_qk.experiments.bench.machine import machine_line

    path = root / TRACKED_RESULT
    if not path.is_file():
        raise FileNotFoundError(
            f"the block speed-tracked shows {path}, which does not exist: write it with `python benchmarks/ab.py "
            f"--tracked --out-dir {TRACKED_RESULT.parent.as_posix()} --overwrite`"
        )
    report = benchmark_module(root, "ab_measure")
    result = json.loads(path.read_text())
    new, s, (load0, load1) = result["revisions"]["new"], result["settings"], result["load"]
    lines = [
        f"Measured at {new['label']} (`{new['commit']}`) on {result['date']} by `{result['reproduce']}` "
        f"(`{TRACKED_RESULT.as_posix()}`): preset {s['preset']}, {s['repeats']} repeats interleaved with "
        f"{result['revisions']['old']['label']}, {s['threads']} thread, clock {s['clock']} "
        f"({report.CLOCK_TEXT[s['clock']]}); "
        f"1-minute load {load0:.1f} before, {load1:.1f} after.",
        "",
        machine_line(result["machine"]),
        "",
        *report.ratio_table(result, result["rows"], "new"),
    ]
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "attentions": _design_table("attentions"),
    "variants": _design_table("variants"),
    "presets": _design_table("presets"),
    "variants-table": variants_table,
    "verdict-readings": verdict_readings,
    "demo-quick": demo_quick,
    "claims-protocols": claims_protocols,
    "corpora": corpora,
    "commands": commands,
    "speed-tracked": speed_tracked,
}
"""Block name -> function of the repository root giving the block's text."""


def expected_block(kind: str, name: str, root: Path) -> str | None:
    """The text a block must hold: ``kind`` is ``"generated"`` or ``"claims"``; ``None`` for a generated block
    this module does not know.

    Raises:
        FileNotFoundError: a claims block whose report ``docs/results/claims/<name>-readme.md`` does not exist,
            naming the block, the file and how to write it.
    """
    if kind == "claims":
        report = root / CLAIMS_DIR / f"{name}-readme.md"
        if not report.is_file():
            raise FileNotFoundError(
                f"the block <!-- claims:{name} --> copies {report}, which does not exist: write it with "
                f"`coupled-qk claims --protocol {name} --report-only`, or remove the block"
            )
        return report.read_text().strip()
    generator = GENERATORS.get(name)
    return None if generator is None else generator(root)


def blocks(text: str) -> list[tuple[str, str, str]]:
    """``(kind, name, text)`` of every block of a page, in order (``kind``: ``"generated"`` or ``"claims"``)."""
    found = [(m.start(), "generated", m.group(2), m.group(3)) for m in BLOCK.finditer(text)]
    found += [(m.start(), "claims", m.group(2), m.group(3)) for m in CLAIMS_BLOCK.finditer(text)]
    return [(kind, name, body) for _, kind, name, body in sorted(found)]


def render(kind: str, name: str, text: str) -> str:
    """A block with its markers: ``kind`` ``"generated"`` (``text`` ends in a newline) or ``"claims"``."""
    if kind == "claims":
        return f"<!-- claims:{name} -->\n{text}\n<!-- /claims:{name} -->"
    return f"<!-- BEGIN generated: {name} -->\n{text}<!-- END generated: {name} -->"


def regenerate(text: str, root: Path) -> str:
    """``text`` with every known block replaced by its expected text (unknown blocks unchanged)."""

    def fill(kind: str):
        def sub(m: re.Match) -> str:
            want = expected_block(kind, m.group(2), root)
            return m.group(0) if want is None else render(kind, m.group(2), want)

        return sub

    text = BLOCK.sub(fill("generated"), text)
    return CLAIMS_BLOCK.sub(fill("claims"), text)


def stale_blocks(root: Path) -> list[str]:
    """``"page: name"`` of every known block whose text differs from what it must hold."""
    out = []
    for page in pages(root):
        for kind, name, body in blocks(page.read_text()):
            want = expected_block(kind, name, root)
            if want is not None and body != want:
                out.append(f"{page.relative_to(root)}: {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the stale blocks of the pages under ``--root`` (default: the current folder), every map of the
    package documented (a drop-in map gets its rows), or with ``--check`` only name them; exit 1 when ``--check``
    finds one."""
    parser = argparse.ArgumentParser(prog="python -m coupled_qk.commands.docs_blocks", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    parser.add_argument("--check", action="store_true", help="name stale blocks and exit 1; change nothing")
    args = parser.parse_args(argv)
    if not (args.root / "README.md").is_file():
        parser.error(f"--root {args.root}: no README.md there (give the repository root)")
    stale = stale_blocks(args.root)
    if args.check:
        print("\n".join(f"stale: {s}" for s in stale) or "every generated block is up to date")
        return 1 if stale else 0
    if (args.root / DESIGN).is_file() and catalog.write_docs(args.root / DESIGN):  # the maps documented first
        print(f"rewrote {DESIGN}")
    for page in pages(args.root):
        text = page.read_text()
        new = regenerate(text, args.root)
        if new != text:
            write_text_atomic(page, new)
            print(f"rewrote {page.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
