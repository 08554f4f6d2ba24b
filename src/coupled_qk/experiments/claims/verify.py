"""Re-train the run behind one committed claims record and compare it with the record (``claims --verify``).

A record (``<out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json``, :mod:`coupled_qk.experiments.claims.runs`)
says what a run computed. :func:`verify_record` rebuilds that run from the protocol's definition (for a converged
design, from its plan over the records beside it, so the learning rate the grid chose is the one re-used),
trains it from scratch in a fresh folder (``<run_root>/verify/...``; never the study's run folder, so nothing
finished is reused) with a scratch record folder (so no identical record of another protocol is reused either),
and compares the new record with the stored one: the settings' fingerprint, tokens, steps, stop reason, best
step, and every final metric. The runs of the committed studies used one thread per process
(``OMP_NUM_THREADS=1``); with the same thread count, torch build and CPU the re-run repeats the floating-point
operations in the same order, so its metrics equal the record's (differences of 0 or float rounding); another
thread count changes the order of reductions and, after thousands of steps, the last digits of the losses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from coupled_qk.experiments.claims.records import record_problem
from coupled_qk.experiments.claims.runs import execute, record_path

PRIMARY = ("test/loss", "valid/loss")
COMPARED = ("fingerprint", "tokens", "steps", "stop_reason")


def read_record(path: str | Path) -> tuple[dict, Path]:
    """The record at ``path`` and the report folder it belongs to (``path``'s fifth parent).

    Raises:
        ValueError: ``path`` is not a file, not JSON, lacks ``protocol``/``cell``/``variant``/``seed``, or does not
            sit at ``<out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json``.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"--verify={str(path)!r} is a folder; expected one run record file inside it, such as "
            "docs/results/claims/runs/cpu-converged/cpu-converged-main/coupled/seed0.json"
        )
    if not path.is_file():
        raise ValueError(
            f"--verify={str(path)!r}: no such record file; expected a run record such as "
            "docs/results/claims/runs/cpu-converged/cpu-converged-main/coupled/seed0.json"
        )
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--verify={str(path)!r} is not a JSON run record ({exc})") from None
    problem = record_problem(rec)
    if problem:
        raise ValueError(f"--verify={str(path)!r} is not a run record: {problem}")
    out_dir = path.parents[4] if len(path.parents) > 4 else None
    if out_dir is None or record_path(out_dir, rec["protocol"], rec["cell"], rec["variant"], rec["seed"]) != path:
        raise ValueError(
            f"--verify={str(path)!r}: a record must stay where the study wrote it, "
            f"<out_dir>/runs/{rec['protocol']}/{rec['cell']}/<variant>/seed{rec['seed']}.json"
        )
    return rec, out_dir


def find_cell(protocol: str, cell_name: str, out_dir: Path):
    """The :class:`~coupled_qk.experiments.claims.protocols.Cell` called ``cell_name`` of ``protocol``: from
    the protocol's list, or for a converged design from its plan over the records in ``out_dir``.

    Raises:
        ValueError: unknown protocol, or no such cell (e.g. a verdict cell whose grid records are missing).
    """
    from coupled_qk.experiments.claims.converged import DESIGNS, plan
    from coupled_qk.experiments.claims.converged_study import load_records
    from coupled_qk.experiments.claims.protocols import get_protocol

    if protocol in DESIGNS:
        cells = [c for _, c in plan(DESIGNS[protocol], load_records(out_dir, DESIGNS[protocol])).cells]
    else:
        cells = list(get_protocol(protocol).cells)
    for cell in cells:
        if cell.name == cell_name:
            return cell
    raise ValueError(
        f"cell {cell_name!r} is not in protocol {protocol!r} as planned from the records in {out_dir} "
        f"(planned cells: {[c.name for c in cells]})"
    )


def compare(stored: dict, new: dict) -> dict:
    """Differences between two records of one run: ``{"fields": {name: (stored, new)}, "metrics": {name:
    (stored, new, new - stored)}, "primary": name, "delta": new - stored of the primary metric}``."""
    fields = {k: (stored.get(k), new.get(k)) for k in COMPARED}
    fields["best_step"] = ((stored.get("best") or {}).get("step"), (new.get("best") or {}).get("step"))
    metrics = {}
    for k, a in stored["final"].items():
        b = new["final"].get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            metrics[k] = (a, b, b - a)
    primary = next((k for k in PRIMARY if k in metrics), next(iter(metrics), None))
    return {
        "fields": fields,
        "metrics": metrics,
        "primary": primary,
        "delta": metrics[primary][2] if primary else math.nan,
    }


def verify_record(
    path: str | Path,
    run_root: str | Path,
    data_dir: str | Path,
    cache_root: str | Path,
    tolerance: float = 1e-4,
    threads: int = 1,
) -> dict:
    """Re-train the run of the record at ``path`` from scratch and compare (see the module docstring).

    Args:
        path: a committed run record.
        run_root: the re-run trains in ``<run_root>/verify/<protocol>/<cell>/<variant>/seed<k>`` (resumed if a
            previous verification was interrupted) and writes its record under ``<run_root>/verify/records``.
        data_dir, cache_root: as for the study (real data; derived splits).
        tolerance: largest accepted ``|new - stored|`` of the primary metric (test loss, else validation loss),
            in nats; the fingerprint, tokens, steps and stop reason must be equal.
        threads: ``torch.set_num_threads`` for the re-run (the studies used 1).

    Returns:
        :func:`compare`'s dict plus ``"match"`` (bool), ``"tolerance"`` and ``"record"`` (the new record's path).

    Raises:
        ValueError: as :func:`read_record` and :func:`find_cell`; ``tolerance`` negative or not finite.
    """
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance={tolerance!r}: expected a finite number >= 0 (nats)")
    stored, out_dir = read_record(path)
    cell = find_cell(stored["protocol"], stored["cell"], out_dir)
    scratch = Path(run_root) / "verify"
    torch.set_num_threads(threads)
    new = execute(
        cell,
        stored["variant"],
        stored["seed"],
        stored["protocol"],
        scratch / "records",
        scratch,
        Path(data_dir),
        Path(cache_root),
    )
    result = compare(stored, new)
    same_fields = all(a == b for name, (a, b) in result["fields"].items() if name != "best_step")
    result.update(
        match=bool(same_fields and abs(result["delta"]) <= tolerance),
        tolerance=tolerance,
        record=str(
            record_path(scratch / "records", stored["protocol"], stored["cell"], stored["variant"], stored["seed"])
        ),
    )
    return result


def format_comparison(result: dict) -> str:
    """Plain-text table of :func:`verify_record`'s result and its verdict line."""
    lines = ["field / metric              stored                 re-run                 difference"]
    for name, (a, b) in result["fields"].items():
        lines.append(f"{name:27s} {a!s:22s} {b!s:22s} {'equal' if a == b else 'DIFFERENT'}")
    for name, (a, b, d) in result["metrics"].items():
        lines.append(f"{name:27s} {a:<22.10g} {b:<22.10g} {d:+.3g}")
    verdict = "MATCH" if result["match"] else "MISMATCH"
    lines.append(
        f"{verdict}: {result['primary']} differs by {result['delta']:+.3g} (tolerance {result['tolerance']:g}); "
        f"re-run record: {result['record']}"
    )
    return "\n".join(lines)
