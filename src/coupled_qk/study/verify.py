"""Re-train the run behind one committed record and compare it with the record (``study verify``, ``claims --verify``).

A record (``<out_dir>/runs/<study>/<cell>/<variant>/seed<k>.json``, :mod:`coupled_qk.study.records`) says what a run
computed. :func:`verify_record` rebuilds that run from its study's plan over the records beside it (so the learning
rate a grid chose is the one re-used), trains it in a fresh folder (``<run_root>/verify/...``; never the study's run
folder, so nothing of the study is reused) with a scratch record folder (so no identical record of another study is
reused either, and the scratch record is rebuilt on every verification), and compares the new record with the stored
one: the settings' fingerprint (recomputed from each record's stored ``config`` by the rule of the reuse decision,
:func:`~coupled_qk.study.records.fingerprint`: the string a record stores is that of the code that wrote it, and a
record made before the rule last changed is still the same run), tokens, steps, stop reason, best step, and every final
metric. The runs of the committed studies used one thread per process (``OMP_NUM_THREADS=1``); with the same thread
count, torch build and CPU the re-run repeats the floating-point operations in the same order, so its metrics equal the
record's (differences of 0 or float rounding); another thread count changes the order of reductions and, after
thousands of steps, the last digits of the losses. A verification interrupted or repeated resumes or reuses its own
scratch run folder (:func:`verify_record` says which).

Equality is promised only for the same code as well: each record stores the revision it was trained with
(``git_commit``, the checkout's ``HEAD``; uncommitted changes are not seen), and the comparison shows the record's
next to the re-run's. It is never part of the match; where the two differ (or one is unknown), a mismatch's verdict
says that the code changed since the record, since a deliberate change (of how weights are initialised, or of
rounding) also changes a re-run's metrics, and a chaotic training run amplifies a rounding difference to far more
than the tolerance (docs/results/claims/verify-mqar-coupled-reproduction.md). The first training loss both records'
curves store (the first logged step, at ``log_interval``) tells the two apart: equal (to :data:`FIRST_LOSS_AGREE`)
when the runs started from the same weights and data, so the final difference grew during training; different when
the initial weights, the data or the computation differ from the first step. Records written since the training loop
stores its provenance (:mod:`coupled_qk.training.provenance`) also hold the SHA-256 of the initial weights and the
hosts the run trained on (CPU or GPU model, torch build, thread count): where both records have them, the comparison
shows them, the checksum decides "the same start" exactly (the first loss is then not needed), and a mismatch on
another host says that bitwise equality was not promised there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from coupled_qk.study.records import fingerprint, record_path, record_problem

PRIMARY = ("test/loss", "valid/loss")
COMPARED = ("fingerprint", "tokens", "steps", "stop_reason")
FIRST_LOSS_AGREE = 1e-5
"""Largest relative difference at which the first stored training losses of two runs count as equal: runs from the
same initial weights and data agree to about 1e-7 there, whatever the code's rounding or the CPU; another
initialisation differs in the second or third digit (docs/results/claims/verify-mqar-coupled-reproduction.md)."""


def read_record(path: str | Path, name: str = "--verify") -> tuple[dict, Path]:
    """The record at ``path`` and the report folder it belongs to (``path``'s fifth parent); ``name`` is the
    argument that gave ``path``, for the messages (``claims --verify``, ``study verify RECORD``).

    Raises:
        ValueError: ``path`` is not a file, not JSON, lacks ``protocol``/``cell``/``variant``/``seed``, or does not
            sit at ``<out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json``.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{name}={str(path)!r} is a folder; expected one run record file inside it, such as "
            "docs/results/claims/runs/cpu-converged/cpu-converged-main/coupled/seed0.json"
        )
    if not path.is_file():
        raise ValueError(
            f"{name}={str(path)!r}: no such record file; expected a run record such as "
            "docs/results/claims/runs/cpu-converged/cpu-converged-main/coupled/seed0.json"
        )
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}={str(path)!r} is not a JSON run record ({exc})") from None
    problem = record_problem(rec)
    if problem:
        raise ValueError(f"{name}={str(path)!r} is not a run record: {problem}")
    out_dir = path.parents[4] if len(path.parents) > 4 else None
    if out_dir is None or record_path(out_dir, rec["protocol"], rec["cell"], rec["variant"], rec["seed"]) != path:
        raise ValueError(
            f"{name}={str(path)!r}: a record must stay where the study wrote it, "
            f"<out_dir>/runs/{rec['protocol']}/{rec['cell']}/<variant>/seed{rec['seed']}.json"
        )
    return rec, out_dir


def find_unit(study, cell_name: str, variant: str, seed: int, out_dir: Path):
    """The :class:`~coupled_qk.study.design.Unit` of the record's run in ``study``'s plan over the records in
    ``out_dir`` (:meth:`~coupled_qk.study.design.Study.read`).

    Raises:
        ValueError: the run is not in the plan (e.g. a verdict cell whose grid records are missing), naming the
            planned cells.
    """
    plan = study.read(out_dir, damaged="skip").plan
    for unit in plan.units():
        if unit.key == (cell_name, variant, seed):
            return unit
    raise ValueError(
        f"cell {cell_name!r} (variant {variant!r}, seed {seed}) is not in protocol {study.name!r} as planned from the "
        f"records in {out_dir} (planned cells: {[c.name for _, c in plan.cells]})"
    )


def settings_fingerprint(rec: dict) -> str | None:
    """The :func:`~coupled_qk.study.records.fingerprint` of a record's stored ``config`` (``None`` where it stores
    none), recomputed by today's rule: equal for two records exactly when the reuse decision takes one's run for the
    other's (:func:`~coupled_qk.study.records.same_run_problem`), whatever rule wrote their ``fingerprint`` strings."""
    config = rec.get("config")
    return fingerprint(config) if isinstance(config, dict) else None


def first_train_loss(stored: dict, new: dict) -> tuple[int, float, float, float] | None:
    """``(tokens, stored, new, new - stored)`` of the first training loss both records' compact curves store
    (``curve["train"][0]``, ``[tokens, loss]``), or ``None`` where either record stores none or the two first
    points lie at different token counts (then they are not comparable)."""
    points = []
    for rec in (stored, new):
        curve = rec.get("curve")
        train = curve.get("train") if isinstance(curve, dict) else None
        first = train[0] if isinstance(train, list) and train else None
        if not (isinstance(first, list) and len(first) == 2 and all(isinstance(x, (int, float)) for x in first)):
            return None
        points.append(first)
    (tokens, a), (tokens_new, b) = points
    return (tokens, a, b, b - a) if tokens == tokens_new else None


def last_host(rec: dict) -> dict | None:
    """The host a record's run last trained on (the last entry of its ``hosts``), or ``None`` for a record written
    before runs stored their hosts."""
    hosts = rec.get("hosts")
    return hosts[-1] if isinstance(hosts, list) and hosts and isinstance(hosts[-1], dict) else None


def host_text(about: dict | None) -> str:
    """One line for a :func:`~coupled_qk.training.provenance.host` dict: ``"<cpu or gpu>, torch <v>, <n>
    thread(s)"``; ``"unknown"`` for ``None``."""
    if about is None:
        return "unknown"
    threads = about.get("threads")
    return f"{about.get('gpu') or about.get('cpu', '?')}, torch {about.get('torch', '?')}, {threads} thread" + (
        "" if threads == 1 else "s"
    )


def compare(stored: dict, new: dict) -> dict:
    """Differences between two records of one run: ``{"fields": {name: (stored, new)}, "metrics": {name:
    (stored, new, new - stored)}, "primary": name, "delta": new - stored of the primary metric, "revision":
    (stored, new) git_commit, each ``None`` where unknown, "first_train": first_train_loss(...), "initial_weights":
    (stored, new) SHA-256 of the initial weights, "host": (stored, new) :func:`last_host`}``; the ``fingerprint``
    field holds both records' :func:`settings_fingerprint`. ``revision``, ``first_train``, ``initial_weights`` and
    ``host`` are context for the verdict (:func:`format_comparison`), never part of the match."""
    fields = {k: (stored.get(k), new.get(k)) for k in COMPARED}
    fields["fingerprint"] = (settings_fingerprint(stored), settings_fingerprint(new))
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
        "revision": (stored.get("git_commit"), new.get("git_commit")),
        "first_train": first_train_loss(stored, new),
        "initial_weights": (stored.get("initial_weights_sha256"), new.get("initial_weights_sha256")),
        "host": (last_host(stored), last_host(new)),
    }


def is_match(result: dict, tolerance: float) -> bool:
    """Whether :func:`compare`'s ``result`` is a reproduction: every compared field (all but ``best_step``) equal and
    ``|delta|`` of the primary metric at most ``tolerance`` nats. The code revisions and the first training losses
    are context only: they never decide the match (nor ``study verify``'s exit status)."""
    same_fields = all(a == b for name, (a, b) in result["fields"].items() if name != "best_step")
    return bool(same_fields and abs(result["delta"]) <= tolerance)


def verify_record(
    study,
    path: str | Path,
    run_root: str | Path,
    data_dir: str | Path,
    cache_root: str | Path,
    tolerance: float = 1e-4,
    threads: int = 1,
    name: str = "--verify",
) -> dict:
    """Re-train the run of the record at ``path`` (a record of ``study``) from scratch and compare (see the module
    docstring).

    Args:
        study: the :class:`~coupled_qk.study.design.Study` the record belongs to.
        path: a committed run record.
        run_root: the re-run trains in ``<run_root>/verify/<study>/<cell>/<variant>/seed<k>`` (resumed if a
            previous verification was interrupted, reused if one finished) and writes its record under
            ``<run_root>/verify/records`` (rebuilt every time).
        data_dir, cache_root: as for the study (real data; derived splits).
        tolerance: largest accepted ``|new - stored|`` of the primary metric (test loss, else validation loss),
            in nats; the fingerprint, tokens, steps and stop reason must be equal.
        threads: ``torch.set_num_threads`` for the re-run (the studies used 1).
        name: the argument that gave ``path``, for the messages (``"--verify"``, ``"RECORD"``).

    Returns:
        :func:`compare`'s dict plus ``"match"`` (bool), ``"tolerance"``, ``"record"`` (the new record's path) and
        ``"run_folder"`` (``"trained"``, or ``"reused"`` from an earlier verification).

    Raises:
        ValueError: as :func:`read_record` and :func:`find_unit`; a record of another study; ``tolerance`` negative
            or not finite.
    """
    from coupled_qk.study.run import Places, run_dir_of, run_unit
    from coupled_qk.training.run_folder import RunFolder

    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance={tolerance!r}: expected a finite number >= 0 (nats)")
    stored, out_dir = read_record(path, name)
    if stored["protocol"] != study.name:
        raise ValueError(f"{name}={str(path)!r} is a record of protocol {stored['protocol']!r}, not of {study.name!r}")
    unit = find_unit(study, stored["cell"], stored["variant"], stored["seed"], out_dir)
    scratch = Path(run_root) / "verify"
    places = Places(scratch / "records", scratch, Path(data_dir), Path(cache_root))
    new_path = record_path(places.out_dir, study.name, *unit.key)
    new_path.unlink(missing_ok=True)  # never compare with an earlier verification's record
    reused = RunFolder(run_dir_of(scratch, study.name, unit)).is_finished()
    torch.set_num_threads(threads)
    new = run_unit(study, unit, places, reuse_elsewhere=False)
    result = compare(stored, new)
    result.update(
        match=is_match(result, tolerance),
        tolerance=tolerance,
        record=str(new_path),
        run_folder="reused" if reused else "trained",
    )
    return result


def _short(commit) -> str:
    """A revision as ``git log --oneline`` shows it (7 hex digits), ``"unknown"`` for ``None``."""
    return commit[:7] if isinstance(commit, str) and commit else "unknown"


def other_code_note(result: dict) -> str | None:
    """The verdict's words on the code revisions of :func:`compare`'s ``result``: ``None`` where the record and the
    re-run name the same revision, else a sentence saying the re-run used other (or unknown) code and, where both
    records store a first training loss but not both a checksum of the initial weights, what the first loss's
    agreement says about where the difference comes from."""
    stored, new = result.get("revision", (None, None))
    if stored is not None and stored == new:
        return None
    note = (
        f"re-trained with other code ({_short(stored)} -> {_short(new)}): a difference may come from changes since "
        "the record (initialisation, rounding), not only from a fault"
        if stored is not None and new is not None
        else f"the code revision of the {'record' if stored is None else 're-run'} is unknown ({_short(stored)} -> "
        f"{_short(new)}): a difference may come from changes to the code (initialisation, rounding), not only from a "
        "fault"
    )
    first = result.get("first_train")
    if first is None or None not in result.get("initial_weights", (None, None)):
        return note
    tokens, a, _, d = first
    if abs(d) <= FIRST_LOSS_AGREE * max(abs(a), 1e-12):
        return note + (
            f"; the first stored training losses agree (at {tokens} tokens, {d:+.2g}): the same initial weights and "
            "data, so the difference grew during training (rounding, amplified)"
        )
    return note + (
        f"; the first stored training losses differ (at {tokens} tokens, {d:+.3g}): the runs differ from the start "
        "(initial weights, data or the computation; after a changed initialisation the re-run is a new draw, not a "
        "reproduction)"
    )


def other_host_note(result: dict) -> str | None:
    """The verdict's words on the hosts of :func:`compare`'s ``result``: a sentence where both records name the host
    they last trained on and the two differ, else ``None``."""
    stored, new = result.get("host", (None, None))
    if stored is None or new is None or stored == new:
        return None
    return (
        f"re-trained on another host (record: {host_text(stored)}; re-run: {host_text(new)}): another CPU, torch "
        "build or thread count may order floating-point reductions differently, so bitwise equality is not promised"
    )


def initial_weights_note(result: dict) -> str | None:
    """The verdict's words on the SHA-256 of the initial weights in :func:`compare`'s ``result``, where both records
    store one: the same start (the difference grew during training) or another start (a new draw, not a
    reproduction); ``None`` where either record stores none."""
    stored, new = result.get("initial_weights", (None, None))
    if stored is None or new is None:
        return None
    if stored == new:
        return (
            "the initial weights are bitwise the same (SHA-256): the runs started alike, so the difference arose "
            "during training (data order, rounding or a change to the training code)"
        )
    return (
        "the initial weights differ (SHA-256): the runs differ from the start, so the re-run is a new draw, not a "
        "reproduction (a change to initialisation or seeding)"
    )


def format_comparison(result: dict) -> str:
    """Plain-text table of :func:`verify_record`'s result (with the code revision of the record and of the re-run,
    the first training loss both store, and, where either record has them, the SHA-256 of the initial weights and
    the host) and its verdict line; on a mismatch, a line for each of: other or unknown code
    (:func:`other_code_note`), another host (:func:`other_host_note`), the initial weights' agreement
    (:func:`initial_weights_note`)."""
    lines = ["field / metric              stored                 re-run                 difference"]
    for name, (a, b) in result["fields"].items():
        lines.append(f"{name:27s} {a!s:22s} {b!s:22s} {'equal' if a == b else 'DIFFERENT'}")
    if "revision" in result:
        a, b = result["revision"]
        same = a is not None and a == b
        lines.append(f"{'code revision':27s} {_short(a):22s} {_short(b):22s} {'equal' if same else 'other code'}")
    for name, (a, b, d) in result["metrics"].items():
        lines.append(f"{name:27s} {a:<22.10g} {b:<22.10g} {d:+.3g}")
    if result.get("first_train") is not None:
        tokens, a, b, d = result["first_train"]
        lines.append(f"{'first train/loss':27s} {a:<22.10g} {b:<22.10g} {d:+.3g} (at {tokens} tokens)")
    a, b = result.get("initial_weights", (None, None))
    if a is not None or b is not None:
        same = "equal" if a == b else "unknown" if None in (a, b) else "DIFFERENT"
        lines.append(f"{'initial weights (sha256)':27s} {(a or 'unknown')[:12]:22s} {(b or 'unknown')[:12]:22s} {same}")
    a, b = result.get("host", (None, None))
    if a is not None or b is not None:
        if a == b:
            lines.append(f"{'host':27s} {host_text(a)} (equal)")
        else:
            lines.append(f"{'host (stored)':27s} {host_text(a)}")
            lines.append(f"{'host (re-run)':27s} {host_text(b)} ({'unknown' if None in (a, b) else 'other host'})")
    verdict = "MATCH" if result["match"] else "MISMATCH"
    lines.append(
        f"{verdict}: {result['primary']} differs by {result['delta']:+.3g} (tolerance {result['tolerance']:g}); "
        f"re-run record: {result['record']}"
    )
    if not result["match"]:
        notes = (other_code_note(result), other_host_note(result), initial_weights_note(result))
        lines.extend(note for note in notes if note)
    return "\n".join(lines)
