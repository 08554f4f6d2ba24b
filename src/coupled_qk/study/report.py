"""The one report of a study: built from its records alone (a pure function of them, so a changed number changes
the verdict it feeds), written as JSON, markdown, the README's block and figures through the command's claim of
the report folder (:class:`~coupled_qk.output_dir.OutputDir`).

A study's :attr:`~coupled_qk.study.design.Study.layout` says how its claims are shown:
:class:`~coupled_qk.study.verdict_report.VerdictReport` (one verdict row per claim with the tables beside it) or
:class:`~coupled_qk.study.stage_report.StageReport` (claims with their interim status and power, per stage). Both
read the records through :meth:`~coupled_qk.study.design.Study.read`, and both name the record files that were
not counted (``left_out``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coupled_qk.output_dir import OutputDir
from coupled_qk.study import stats
from coupled_qk.study.claims import Evidence, NotReady
from coupled_qk.study.design import Reading, Study


def fmt(x, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, or ``"-"`` for ``None`` and non-finite floats (report tables)."""
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def paper_in_ci(row: dict) -> str:
    """``"yes (V)"`` / ``"no (V)"`` for a measured row with a paper value ``V`` in our units, else ``"-"``."""
    if "paper_effect_in_ci" not in row:
        return "-"
    return f"{'yes' if row['paper_effect_in_ci'] else 'no'} ({fmt(row['paper_effect'], 1)})"


def round_floats(obj, digits: int = 4):
    """``obj`` with every float rounded to ``digits`` (non-finite ones as strings) and the ``differences``
    entries dropped, for the JSON report and the details lines."""
    if isinstance(obj, float):
        return round(obj, digits) if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): round_floats(v, digits) for k, v in obj.items() if k != "differences"}
    if isinstance(obj, list):
        return [round_floats(v, digits) for v in obj]
    return obj


def paired(ev: Evidence, a, b) -> dict:
    """Paired % change of arm ``b`` vs ``a`` in held-out test perplexity, with both mean perplexities, or
    ``{"status": "not run (reason)"}`` while runs are missing."""
    try:
        ev.need(a, b)
        _, va, vb = ev.pairs(a, b)
    except NotReady as exc:
        return {"status": f"not run ({exc})"}
    r = stats.paired_difference(va, vb, relative=True)
    return {
        **{k: r[k] for k in ("mean", "low", "high", "n", "p")},
        "status": "measured",
        "a_ppl": sum(va) / len(va),
        "b_ppl": sum(vb) / len(vb),
    }


def study_notes(study: Study, notes_file: str | Path | None) -> list[str]:
    """The study's own notes and those of its section in ``notes_file`` (``docs/results/STUDIES.md``: a
    ``## <name>`` heading, then one ``- `` item per note, continued on indented lines); the file's notes hold what
    the source may not (dates, machines, measured throughputs, the pre-registration's wording)."""
    out = list(study.notes)
    if notes_file is None or not Path(notes_file).is_file():
        return out
    text = Path(notes_file).read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(study.name)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        return out
    items, current = [], None
    for line in match.group(1).splitlines():
        if line.startswith("- "):
            current = [line[2:].strip()]
            items.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line.strip())
        elif not line.strip() and current is not None:
            current = None
    return out + [" ".join(parts) for parts in items]


@dataclass
class ReportContext:
    """What a layout builds a report from.

    Attributes:
        study: the study; reading: its records as its plan reads them; out_dir: the report folder.
        evidence: the claim tests' view of the counted records.
        studies: ``name -> Reading`` of another study under the same folder (pooled trends, claims across studies).
        inputs: files named on the command line that claim tests read (``glue_json``).
        notes: the study's notes (:func:`study_notes`).
    """

    study: Study
    reading: Reading
    out_dir: Path
    evidence: Evidence
    studies: Callable[[str], tuple[Study, Reading]]
    inputs: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def min_seeds(study: Study, reading: Reading) -> int:
    """The fewest paired seeds a claim reads: the study's, else 2 (an interval needs a spread), 3 where every
    planned cell has 3 seeds."""
    if study.min_seeds is not None:
        return study.min_seeds
    cells = [c for _, c in reading.plan.cells]
    seeds = min(len(c.seeds) for c in cells) if cells else 3
    return max(2, min(3, seeds))


def context(
    study: Study,
    out_dir: str | Path,
    studies: Callable[[str], Study],
    inputs: dict | None = None,
    notes_file: str | Path | None = None,
) -> ReportContext:
    """Read ``study``'s records under ``out_dir`` (:meth:`~coupled_qk.study.design.Study.read`) into a
    :class:`ReportContext`; ``studies(name)`` gives another study (for arms and pooled tables that read its
    records from the same folder).

    Raises:
        ValueError: a damaged file or one that is not a run record (naming it).
    """
    out_dir = Path(out_dir)
    reading = study.read(out_dir)
    cache: dict = {study.name: (study, reading)}

    def other(name: str) -> tuple[Study, Reading]:
        if name not in cache:
            s = studies(name)
            cache[name] = (s, s.read(out_dir))
        return cache[name]

    def evidence_of(name: str) -> Evidence:
        s, r = other(name)
        return Evidence(s.name, r.plan, r.by_key(), min_seeds(s, r), studies=evidence_of, inputs=inputs or {})

    ev = Evidence(
        study.name,
        reading.plan,
        reading.by_key(),
        min_seeds(study, reading),
        studies=evidence_of,
        inputs=inputs or {},
    )
    return ReportContext(study, reading, out_dir, ev, other, dict(inputs or {}), study_notes(study, notes_file))


def build_report(
    study: Study,
    out_dir: str | Path,
    studies: Callable[[str], Study],
    inputs: dict | None = None,
    notes_file: str | Path | None = None,
) -> dict:
    """The report of ``study`` from the records under ``out_dir`` (a JSON-serialisable dict; see its layout),
    with ``left_out`` naming every record file not counted, when there is one (:func:`report_of` its
    :func:`context`)."""
    return report_of(context(study, out_dir, studies, inputs, notes_file))


def report_of(ctx: ReportContext) -> dict:
    """The report of a :class:`ReportContext` (see :func:`build_report`)."""
    report = ctx.study.layout.build(ctx)
    if ctx.reading.left_out:
        report["left_out"] = [{"file": str(x.path), "reason": x.reason} for x in ctx.reading.left_out]
    return report


def left_out_lines(report: dict) -> list[str]:
    """The markdown section naming the record files the report did not count (none: no section)."""
    if not report.get("left_out"):
        return []
    lines = [
        "",
        "## Records left out",
        "",
        "Record files under the study's folder that this report does not count, and why (a record counts when it "
        "sits at its path, is a run of the plan with the plan's settings and holds every metric read here):",
        "",
    ]
    return lines + [f"- `{x['file']}`: {x['reason']}" for x in report["left_out"]]


@dataclass(frozen=True)
class Commands:
    """The commands a report names: ``run`` trains what is missing and writes the report, ``report`` rebuilds it
    from the records, ``rebuild`` says the latter after the former (``"add `--report-only`"``)."""

    run: str
    report: str
    rebuild: str


def format_markdown(study: Study, report: dict, commands: Commands) -> str:
    """The report as markdown (the study's layout, then the records left out)."""
    text = study.layout.markdown(report, commands)
    extra = left_out_lines(report)
    return text + ("\n".join(extra) + "\n" if extra else "")


def report_dir(out_dir: str | Path, name: str, studies, overwrite: bool = False) -> OutputDir:
    """Claim the report folder before any training: it may hold the reports of every study in ``studies``
    (``<name>.json``, ``.md``, ``-readme.md``), ``verify-*.md``, a ``README.md``, ``STUDIES.md``, ``figures/`` and
    ``runs/`` (the run records); this study's report files are regenerated by every invocation (the documented
    resume path), anything else there (another command's results) is refused.

    Raises:
        ValueError: the folder is a file, not writable, or holds other files (naming ``--out-dir``).
    """
    mine = (f"{name}.json", f"{name}.md", f"{name}-readme.md", f"figures/{name}-*.png")
    reports = [f"{n}{suffix}" for n in sorted({*studies, name}) for suffix in (".json", ".md", "-readme.md")]
    return OutputDir(
        out_dir,
        "--out-dir",
        overwrite=overwrite,
        what="a claims report",
        layout=(*reports, "verify-*.md", "README.md", "STUDIES.md", "figures/", "runs/"),
        rewrite=mine,
    )


def write_report(
    study: Study,
    report: dict,
    out: OutputDir,
    commands: Commands,
    figures: bool = True,
    ctx: ReportContext | None = None,
) -> list[Path]:
    """Write ``<name>.json``, ``<name>.md``, ``<name>-readme.md`` and (``figures``) the layout's PNGs into the
    claimed folder ``out``, each atomically; return the paths written. ``ctx`` (the report's context) feeds
    figures drawn from the records."""
    name = study.name
    files = {
        f"{name}.json": study.layout.json_text(report),
        f"{name}.md": format_markdown(study, report, commands),
        f"{name}-readme.md": study.layout.readme(report, commands),
    }
    for f in files:
        out.claim(f, check_only=True)
    paths = [out.write_text(f, text) for f, text in files.items()]
    if figures:
        for fname, draw in study.layout.figures(report, ctx).items():
            paths.append(out.write_with(Path("figures") / fname, draw))
    return paths
