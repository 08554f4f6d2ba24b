"""Execute the runs of a claims protocol and keep one small, committed result record per run.

A run ``(cell, variant, seed)`` trains in ``<run_root>/<cell>/<variant>/seed<k>`` (never committed) and writes
its record to ``<out_dir>/runs/<protocol>/<cell>/<variant>/seed<k>.json`` (committed): settings and their fingerprint,
parameter count, tokens, seconds, final metrics, a compact loss curve and, for language models, the
attention diagnostics of the final checkpoint (``docs/METHOD.md`` section 7). A record whose fingerprint
matches the protocol's settings is reused without training, also one made by another protocol for the same
cell (copied, with ``reused_from``); an unfinished run folder is resumed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import time
from pathlib import Path

from coupled_qk.experiments.claims.heldout import document_split, heldout_corpus, wikitext2_eval
from coupled_qk.experiments.claims.protocols import Cell
from coupled_qk.experiments.claims.records import read_record_file
from coupled_qk.experiments.runner import PlannedRun, setting_differences
from coupled_qk.experiments.runner import execute as execute_plan
from coupled_qk.io import write_text_atomic
from coupled_qk.models.specs import variant_overrides
from coupled_qk.training.config import RESULT_NEUTRAL_FIELDS, TrainConfig

RECORD_VERSION = 1


def variant_tag(spec: str) -> str:
    """Folder-safe name of a variant spec: ``coupled+n_steps=2`` -> ``coupled__n_steps-2``."""
    return spec.replace("+", "__").replace("=", "-")


def record_path(out_dir: str | Path, protocol: str, cell: str, variant: str, seed: int) -> Path:
    """Where the record of one run lives: ``<out_dir>/runs/<protocol>/<cell>/<variant tag>/seed<k>.json``."""
    return Path(out_dir) / "runs" / protocol / cell / variant_tag(variant) / f"seed{seed}.json"


def train_config(cell: Cell, variant: str, seed: int, run_dir: Path, data_dir: Path | None) -> TrainConfig:
    """The :class:`TrainConfig` of one run of ``cell``.

    For ``lm`` cells: the cell's base with the variant's model overrides; ``data_dir`` is the folder holding
    the held-out wiki-vital split for ``heldout`` cells. For ``mqar`` cells: the MQAR sweep's configuration
    (:func:`coupled_qk.experiments.mqar.sweep.run_config`) of the cell's point, with this seed.
    """
    if cell.mqar is not None:
        from coupled_qk.experiments.mqar.presets import get_preset
        from coupled_qk.experiments.mqar.sweep import run_config

        preset = get_preset(cell.mqar["preset"])
        diff = {d.name: d for d in preset.difficulties}[cell.mqar["difficulty"]]
        cfg = run_config(preset, diff, variant, cell.mqar["d_model"], cell.mqar["lr"], run_dir)
        extra = {"max_steps": cell.mqar["max_steps"]} if "max_steps" in cell.mqar else {}
        return dataclasses.replace(cfg, seed=seed, out_dir=str(run_dir), **extra)
    base = {**cell.base, **cell.variant_base.get(variant, {})}
    model = {**base.pop("model", {}), **variant_overrides(variant)}
    return TrainConfig(
        **base,
        model=model,
        seed=seed,
        out_dir=str(run_dir),
        data_dir=str(data_dir) if data_dir else None,
        tensorboard=False,
        progress=False,
    )


def settings_of(cfg: TrainConfig) -> dict:
    """The settings that change results (``TrainConfig`` minus ``RESULT_NEUTRAL_FIELDS``), as stored in records."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RESULT_NEUTRAL_FIELDS}


def fingerprint(cfg: TrainConfig) -> str:
    """sha256 (16 hex digits) of :func:`settings_of`, for reading records at a glance."""
    return hashlib.sha256(json.dumps(settings_of(cfg), sort_keys=True).encode()).hexdigest()[:16]


def load_record(path: Path, planned: TrainConfig | None = None) -> dict | None:
    """The record at ``path`` if it exists, parses and (when ``planned`` is given) was made with the same
    settings (:func:`coupled_qk.experiments.runner.setting_differences` of its stored config) and, where it
    records one, in the precision ``planned`` trains in here (``--dtype auto`` depends on the machine); else None.

    Raises:
        ValueError: the file parses but is not a run record
        (:func:`~coupled_qk.experiments.claims.records.record_problem`).
    """
    if not path.is_file():
        return None
    rec = read_record_file(path, ())  # a dict: its stored config decides
    if rec is None:
        return None
    if planned is not None and _differences(rec.get("config", {}), planned):
        return None
    if planned is not None and rec.get("precision") is not None:  # trained in another precision: trained again
        from coupled_qk.training.distributed import planned_precision

        if rec["precision"] != planned_precision(planned.device, planned.dtype, planned.compile):
            return None
    return rec


def same_run_elsewhere(
    out_dir: str | Path, protocol: str, cell: str, variant: str, seed: int, planned: TrainConfig
) -> dict | None:
    """The finished record of the same run made by another protocol, as a record of ``protocol``, or None.

    "The same run" means the same cell, variant and seed and equal result-changing settings
    (:func:`load_record`), e.g. the MQAR cells that ``cpu`` and ``cpu-short`` share; a record still waiting for
    its WikiText-2 evaluation is not taken. The copy names the protocol that trained it in ``reused_from``.
    """
    for other in sorted((Path(out_dir) / "runs").glob(f"*/{cell}/{variant_tag(variant)}/seed{seed}.json")):
        name = other.parts[-4]
        rec = None if name == protocol else load_record(other, planned)
        if rec is not None and not rec.get("wt2_pending"):
            return {**rec, "protocol": protocol, "reused_from": rec.get("reused_from", name)}
    return None


def _differences(saved: dict, planned: TrainConfig) -> dict:
    """:func:`setting_differences`, except that a field the record predates (absent from it) counts as equal
    when the planned value is the field's default: a new ``TrainConfig`` option does not void old records."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {
        k: v for k, v in setting_differences(saved, planned).items() if not (k not in saved and v[1] == defaults.get(k))
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def compact_curve(records: list[dict], max_points: int = 64) -> dict:
    """Loss curves of a run's ``metrics.jsonl`` records: ``{"valid": [[tokens, loss], ...], "train": [...]}``.

    ``valid`` keeps every evaluation (``valid/loss``, or ``valid/accuracy`` for MQAR as ``accuracy``); ``train``
    keeps at most ``max_points`` evenly spaced logged training losses.
    """
    valid = [[r["tokens"], r["valid/loss"]] for r in records if "valid/loss" in r]
    acc = [[r["tokens"], r["valid/accuracy"]] for r in records if "valid/accuracy" in r]
    train = [[r["tokens"], r["train/loss"]] for r in records if "train/loss" in r]
    if len(train) > max_points:
        stride = len(train) / max_points
        train = [train[min(len(train) - 1, round((i + 1) * stride) - 1)] for i in range(max_points)]
    out = {"valid": valid, "train": train}
    if acc:
        out["accuracy"] = acc
    return out


def _diagnostics(run_dir: Path, corpus_dir: Path | None, cfg: TrainConfig) -> dict:
    """Layer-averaged attention diagnostics of the final checkpoint (``docs/METHOD.md`` section 7) on the first
    (up to) 8 non-overlapping windows of (up to) 128 tokens of the held-out validation split."""
    import torch

    from coupled_qk.analysis.capture import analyze_model
    from coupled_qk.data.corpora import load_corpus
    from coupled_qk.training.run_folder import RunFolder, open_run

    run = open_run(RunFolder(run_dir).best_checkpoint() or run_dir, "claims", text=True)  # the final checkpoint
    model, _ = run.load_model("cpu")
    tokenizer = run.tokenizer()
    text = load_corpus(cfg.corpus, corpus_dir, seed=int(cfg.task_options.get("split_seed", 0))).split("valid")
    ids = tokenizer.encode(text[:200_000])
    seq_len = min(128, model.config.block_size, len(ids))
    n = min(8, len(ids) // seq_len)
    windows = torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)
    res = analyze_model(model, windows, threads=1)
    out = {k: v for k, v in res["mean"].items() if isinstance(v, (int, float))}
    return {**out, "windows": n, "window_tokens": seq_len}


def execute(
    cell: Cell,
    variant: str,
    seed: int,
    protocol: str,
    out_dir: Path,
    run_root: Path,
    data_dir: Path,
    cache_root: Path,
    defer_wt2: bool = False,
    runtime=None,
) -> dict | None:
    """Reuse or produce the record of one run (see the module docstring) and return it.

    ``data_dir`` is the real data folder (WikiText-2, PubMed ...); ``cache_root`` holds derived data (the
    held-out wiki-vital split). Writes the record atomically. ``defer_wt2`` leaves the (slow) WikiText-2
    evaluation of held-out cells for :func:`complete_wt2` and marks the record ``"wt2_pending": true``.

    ``runtime``: the :class:`~coupled_qk.training.distributed.Runtime` of a study launched by ``torchrun``
    (every rank calls this with the same arguments). The cell's ``batch_size`` is then the global batch, split
    evenly over the ranks (the training loop draws the same global batches at any world size, so the record
    and its fingerprint are those of the one-process run); rank 0 alone prepares data and writes the record,
    and the other ranks return ``None`` after training.

    Raises:
        ValueError: under ``torchrun``, a global batch that the number of processes does not divide.
    """
    world, rank = (runtime.world, runtime.rank) if runtime is not None else (1, 0)
    run_dir = Path(run_root) / protocol / cell.name / variant_tag(variant) / f"seed{seed}"
    # heldout_corpus and document_split write into cache_root
    corpus_dir = Path(cache_root) if (cell.heldout or cell.split) else Path(data_dir)
    cfg = train_config(cell, variant, seed, run_dir, corpus_dir if cell.mqar is None else None)
    if world > 1 and cfg.batch_size % world:
        raise ValueError(
            f"batch_size={cfg.batch_size} of cell {cell.name!r} is the global batch and must be divisible "
            f"by the {world} processes of torchrun (use a divisor of it for --nproc_per_node)"
        )
    path = record_path(out_dir, protocol, cell.name, variant, seed)
    rec = load_record(path, cfg)
    if rec is None and (rec := same_run_elsewhere(out_dir, protocol, cell.name, variant, seed, cfg)) is not None:
        if rank == 0:
            print(
                f"== {cell.name} {variant} seed {seed}: reusing the identical run of protocol {rec['reused_from']}",
                flush=True,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(rec, indent=1, default=str))
    if rec is not None:
        if (
            rec.get("wt2_pending") and not defer_wt2 and rank == 0
        ):  # trained with --defer-wt2 earlier: evaluate now if possible
            if run_dir.is_dir():
                return complete_wt2(path, data_dir, run_dir)
            print(
                f"claims: {path} waits for its WikiText-2 evaluation, but its run folder {run_dir} is not on "
                "this machine; reported without it",
                flush=True,
            )
        return rec
    if path.is_file() and rank == 0:
        print(f"claims: {path} was made with other settings; running again", flush=True)
    if rank == 0:
        if cell.heldout:
            heldout_corpus(data_dir, cache_root)
        if cell.split:
            document_split(data_dir, cache_root, cell.base["corpus"], **cell.split)
    if world > 1:
        from coupled_qk.training.distributed import barrier

        barrier(runtime)  # the derived data exists before any rank reads it
    from coupled_qk.training.run_folder import RunFolder

    t0 = time.perf_counter()
    # the shared runner reuses a finished run folder (same settings), resumes an unfinished one, or trains
    ranked = dataclasses.replace(cfg, batch_size=cfg.batch_size // world) if world > 1 else cfg
    (outcome,) = execute_plan(
        [PlannedRun(ranked, f"{cell.name} {variant} seed {seed}", {"cell": cell.name})], announce=rank == 0
    )
    if rank != 0:
        return None
    results = outcome.results
    final = dict(results["final"])
    if cell.heldout and not defer_wt2:
        final.update(wikitext2_eval(run_dir, data_dir))
    diagnostics = _diagnostics(run_dir, corpus_dir, cfg) if cfg.task == "lm" else {}
    rec = {
        "version": RECORD_VERSION,
        "protocol": protocol,
        "cell": cell.name,
        "variant": variant,
        "seed": seed,
        "fingerprint": fingerprint(cfg),
        "config": settings_of(cfg),
        "params": results["params"],
        "tokens": results["tokens"],
        "steps": results["steps"],
        "train_seconds": results["train_seconds"],
        "wall_seconds": time.perf_counter() - t0,
        "stop_reason": results["stop_reason"],
        "final": final,
        "precision": results.get("precision"),
        "diagnostics": diagnostics,
        "curve": compact_curve(RunFolder(run_dir).read_metrics()),
        "data": results.get("data"),
        "epochs": results.get("epochs"),
        "best": results.get("best"),
        "final_from": results.get("final_from"),
        "wt2_pending": bool(cell.heldout and defer_wt2),
        "run_dir": str(run_dir),
        "git_commit": _git_commit(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(rec, indent=1, default=str))
    return rec


def run_protocol(
    protocol,
    out_dir: str | Path,
    run_root: str | Path,
    data_dir: str | Path,
    cache_root: str | Path,
    cells: list[str] | None = None,
    shard: tuple[int, int] = (0, 1),
    defer_wt2: bool = False,
) -> list[dict]:
    """Execute (or reuse) every run of ``protocol`` in order and return their records.

    Args:
        protocol: a :class:`~coupled_qk.experiments.claims.protocols.Protocol`.
        out_dir: report folder; records go to ``<out_dir>/runs``.
        run_root: folder of the run folders (checkpoints, metrics; not committed).
        data_dir: real data folder; cache_root: folder for derived data.
        cells: only these cells (default: all), in the protocol's order.
        shard: ``(i, n)``: this process executes every n-th run starting at i (runs in parallel processes).
        defer_wt2: train every run first, then add the WikiText-2 evaluations (:func:`complete_wt2`).

    Raises:
        ValueError: an unknown cell name, a bad shard, or a protocol that is defined but not runnable here.
    """
    if not protocol.runnable:
        raise ValueError(f"protocol {protocol.name!r} is defined but not runnable here (see its notes)")
    i, n = shard
    if not (isinstance(n, int) and n >= 1 and isinstance(i, int) and 0 <= i < n):
        raise ValueError(f"shard={shard!r} must be (i, n) with 0 <= i < n")
    names = [c.name for c in protocol.cells]
    for name in cells or []:
        if name not in names:
            raise ValueError(f"cell {name!r} is not in protocol {protocol.name!r}; expected some of {names}")
    chosen = [c for c in protocol.cells if not cells or c.name in cells]
    units = [(c, v, s) for c in chosen for v, s in c.units()]
    records = []
    for k, (cell, variant, seed) in enumerate(units):
        if k % n != i:
            continue
        print(f"== claims {protocol.name}: {cell.name} {variant} seed {seed} ({k + 1}/{len(units)})", flush=True)
        records.append(
            execute(
                cell,
                variant,
                seed,
                protocol.name,
                Path(out_dir),
                Path(run_root),
                Path(data_dir),
                Path(cache_root),
                defer_wt2=defer_wt2,
            )
        )
    if defer_wt2:
        for rec in records:
            complete_wt2(record_path(out_dir, protocol.name, rec["cell"], rec["variant"], rec["seed"]), data_dir)
    return records


def plan_lines(protocol, out_dir: str | Path, cells: list[str] | None = None) -> list[str]:
    """One line per run of ``protocol`` (in execution order): its cell, variant, seed and whether a record with
    the same result-changing settings exists (``done``, also when another protocol made the identical run),
    exists with other settings (``stale``: it would be trained again) or is missing (``to run``). Trains and
    writes nothing (``claims --plan``)."""
    chosen = [c for c in protocol.cells if not cells or c.name in cells]
    lines, counts = [], {"done": 0, "stale": 0, "to run": 0}
    for cell in chosen:
        for variant, seed in cell.units():
            cfg = train_config(cell, variant, seed, Path("run"), None if cell.mqar is not None else Path("data"))
            path = record_path(out_dir, protocol.name, cell.name, variant, seed)
            if (
                load_record(path, cfg) is not None
                or same_run_elsewhere(out_dir, protocol.name, cell.name, variant, seed, cfg) is not None
            ):
                status = "done"
            else:
                status = "stale" if path.is_file() else "to run"
            counts[status] += 1
            lines.append(f"  {cell.name} {variant} seed {seed} ({status})")
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    return [f"protocol {protocol.name}: {sum(counts.values())} runs ({summary})", *lines]


def complete_wt2(path: str | Path, data_dir: str | Path, run_dir: str | Path | None = None) -> dict:
    """Add the WikiText-2 evaluation to a record written with ``defer_wt2`` and rewrite it atomically.

    ``run_dir`` is the run folder to evaluate (default: the one the record names; it must still exist).
    Returns the record (unchanged if nothing is pending). Raises ``FileNotFoundError`` if the run folder is gone.
    """
    path = Path(path)
    rec = json.loads(path.read_text())
    if not rec.get("wt2_pending"):
        return rec
    print(f"== claims: WikiText-2 evaluation of {rec['cell']} {rec['variant']} seed {rec['seed']}", flush=True)
    rec["final"].update(wikitext2_eval(rec["run_dir"] if run_dir is None else run_dir, data_dir))
    rec["wt2_pending"] = False
    write_text_atomic(path, json.dumps(rec, indent=1, default=str))
    return rec
