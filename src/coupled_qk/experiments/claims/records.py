"""Run records of one claims protocol, indexed for the claim rules of :mod:`coupled_qk.experiments.claims.rules`.

:class:`Records` reads the committed per-run JSON records (:mod:`coupled_qk.experiments.claims.runs`), pairs
them by seed and says, through :class:`NotReady`, which runs a claim still waits for and how long they take.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from coupled_qk.experiments.claims.protocols import Protocol

PRIMARY = "test/perplexity"


def _duration(minutes: float, prefix: str = "") -> str:
    """``90 -> '1.5 hours'``, ``4 -> '4 minutes'`` (with ``prefix``, e.g. ``'CPU-'``, before the unit)."""
    return f"{minutes / 60:.1f} {prefix}hours" if minutes >= 60 else f"{max(1, round(minutes))} {prefix}minutes"


RECORD_FIELDS = {
    "protocol": "a name",
    "cell": "a name",
    "variant": "a name",
    "seed": "an integer >= 0",
    "final": "a dict of metrics",
}
"""The fields every run record has, and what each must hold (:func:`record_problem`)."""


def record_problem(rec, fields=tuple(RECORD_FIELDS)) -> str | None:
    """What makes ``rec`` (a parsed JSON value) not a run record, in a few words, or ``None`` when it is one:
    a dict with every field of ``fields`` (default: all of :data:`RECORD_FIELDS`; a reader names the ones it
    uses), each of its kind (names non-empty strings, the seed an integer >= 0 and not a bool, ``final`` a dict)."""
    if not isinstance(rec, dict):
        return f"it holds a {type(rec).__name__}, expected a dict"
    missing = [k for k in fields if k not in rec]
    if missing:
        return f"it lacks {missing}"
    for key in fields:
        expected, value = RECORD_FIELDS[key], rec[key]
        ok = (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if key == "seed"
            else isinstance(value, dict)
            if key == "final"
            else isinstance(value, str) and value != ""
        )
        if not ok:
            return f"{key}={value!r}, expected {expected}"
    return None


def read_record_file(path: Path, fields=tuple(RECORD_FIELDS), damaged: str = "skip") -> dict | None:
    """The run record in the file ``path``. ``fields``: the ones the caller reads (:func:`record_problem`).

    A file that cannot be read or is not JSON (damaged) is ``None`` with ``damaged="skip"`` (the runner: the
    run is trained again and its record replaced) and an error with ``damaged="raise"`` (the reports: a report
    built without the record would silently count that run as never made).

    Raises:
        ValueError: naming the file, for one that parses but is not a run record (:func:`record_problem`), and
            with ``damaged="raise"`` for a damaged one.
    """
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if damaged == "raise":
            raise ValueError(
                f"{path} is a damaged run record ({type(exc).__name__}: {exc}); a report without it "
                "would count that run as never made: restore the file (e.g. git checkout), or delete "
                "it and run the protocol without --report-only to train that run again"
            ) from None
        return None
    problem = record_problem(rec, fields)
    if problem:
        raise ValueError(
            f"{path} is not a run record ({problem}): restore or remove it; a study's records are the "
            "files <out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json"
        )
    return rec


class NotReady(Exception):
    """Raised inside a claim rule when the runs it needs are missing; the message is the reason."""


@dataclass
class Records:
    """The finished run records of one protocol, indexed by ``(cell, variant, seed)``."""

    protocol: Protocol
    by_key: dict
    min_seeds: int = 3
    partial: bool = False  # True: :meth:`need` accepts unfinished cells (provisional numbers)

    @classmethod
    def load(cls, out_dir: str | Path, protocol: Protocol, min_seeds: int | None = None) -> Records:
        """Read every ``<out_dir>/runs/<protocol>/**/seed*.json`` record; records of a cell with ``seeds_of`` are
        also indexed under that cell (more seeds of the same runs).

        Raises:
            ValueError: naming the file, for one that is damaged (not readable, not JSON) or parses but is not a
                run record (:func:`read_record_file`).
        """
        root = Path(out_dir) / "runs" / protocol.name
        by_key = {}
        for path in sorted(root.glob("*/*/seed*.json")) if root.is_dir() else []:
            rec = read_record_file(path, ("cell", "variant", "seed"), damaged="raise")
            if rec is not None:
                by_key[(rec["cell"], rec["variant"], rec["seed"])] = rec
        for (cell, variant, seed), rec in list(by_key.items()):  # extra seeds count as their base cell's
            base = protocol.cell(cell).seeds_of if protocol.has_cell(cell) else None
            if base is not None:
                by_key.setdefault((base, variant, seed), rec)
        seeds = min(len(c.seeds) for c in protocol.cells) if protocol.cells else 3
        # at least 2 seeds (an interval needs a spread), 3 where the protocol has them
        return cls(protocol, by_key, max(2, min(3, seeds)) if min_seeds is None else min_seeds)

    def values(self, cell: str, variant: str, metric: str = PRIMARY) -> dict[int, float]:
        """``{seed: value}`` of a final metric (or ``diagnostics/<name>``) over the finished runs."""
        out = {}
        for (c, v, s), rec in self.by_key.items():
            if c == cell and v == variant:
                src = rec.get("diagnostics", {}) if metric.startswith("diagnostics/") else rec["final"]
                value = src.get(metric.removeprefix("diagnostics/"))
                if isinstance(value, (int, float)) and math.isfinite(value):
                    out[s] = float(value)
        return out

    def need(self, *items) -> None:
        """Raise :class:`NotReady` naming what is missing unless every run of ``items`` has a record.

        An item is a cell name (all its variants) or a ``(cell, variant)`` pair (that variant's seeds only).
        """
        if self.partial:
            return
        missing, minutes = 0, 0.0
        total = 0
        wanted = [(i, None) if isinstance(i, str) else tuple(i) for i in items]
        cells = tuple(dict.fromkeys(name for name, _ in wanted))
        for name, only in dict.fromkeys(wanted):
            if not self.protocol.has_cell(name):
                raise NotReady(f"protocol {self.protocol.name!r} has no cell {name!r}")
            cell = self.protocol.cell(name)
            for v, s in cell.units():
                if only is not None and v != only:
                    continue
                total += 1
                if (name, v, s) not in self.by_key:
                    missing += 1
                    minutes += cell.est_cpu_minutes
        if missing:
            label = ", ".join(cells) if len(cells) <= 3 else f"{len(cells)} cells ({cells[0]} ... {cells[-1]})"
            done = self.runs(*cells)
            pace = ""
            if done:
                per_run = sum(r["wall_seconds"] for r in done) / len(done) / 60
                pace = (
                    f"; at the {per_run:.0f} minutes per run its finished runs took, about "
                    f"{_duration(missing * per_run)} in one process"
                )
            rest = f"the other {missing} take" if missing > 1 else "the other one takes"
            raise NotReady(
                f"in progress: {total - missing} of {total} runs of {label} finished; {rest} about "
                f"{_duration(minutes, 'CPU-')} on an idle core{pace}"
            )

    def pairs(self, a: tuple[str, str], b: tuple[str, str], metric: str = PRIMARY) -> tuple[list, list, list]:
        """Values of ``a = (cell, variant)`` and ``b`` on their common seeds (sorted): ``(seeds, va, vb)``."""
        va, vb = self.values(*a, metric), self.values(*b, metric)
        seeds = sorted(set(va) & set(vb))
        if len(seeds) < self.min_seeds:
            raise NotReady(f"{len(seeds)} paired seeds of {a} vs {b}; at least {self.min_seeds} needed")
        return seeds, [va[s] for s in seeds], [vb[s] for s in seeds]

    def runs(self, *cells: str) -> list[dict]:
        """Records of the given cells."""
        return [r for (c, _, _), r in self.by_key.items() if c in cells]


def same_tokenizer_runs(rec: Records) -> list:
    """``((cell, variant, seed), record)`` of the runs whose tokenizer is the ``wv-tiny`` cell's."""
    if not rec.protocol.has_cell("wv-tiny"):
        return []
    tok = rec.protocol.cell("wv-tiny").base.get("tokenizer")
    return [(k, r) for k, r in rec.by_key.items() if r["config"].get("tokenizer") == tok]
