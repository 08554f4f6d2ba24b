"""Revision A/B benchmark: the same cells measured for two revisions of the code, interleaved in one run
(``python benchmarks/ab.py --against REV`` and ``--tracked``; ``benchmarks/README.md``, section "Revision A/B").

Anchor: asv's ``asv continuous`` (airspeed velocity, as numpy and scipy use it), which benchmarks two commits and
flags what got slower beyond the noise. Here the two revisions run side by side on the same machine in the same
minutes: one worker process per revision (:mod:`ab_worker`, ``PYTHONPATH`` at each
revision's ``src``), and the driver alternates their repeats (old then new on even repeats, new then old on odd
ones), so a busy phase of a shared machine hits both revisions alike. Within a repeat each worker times every
cell once per variant, variants rotated.

Per cell (:data:`CELLS`: a train step, eager and compiled greedy decoding at batch 1 and 8) and variant, for each
repeat ``i`` and the chosen clock (:data:`ab_worker.CLOCKS`; ``step`` by default):

- ``ratio_rev[i] = time(variant) / time(standard)`` within one revision and repeat (adjacent calls);
- ``change[i] = ratio_new[i] / ratio_old[i]`` for a variant, and ``time_new[i] / time_old[i]`` for ``standard``
  itself (a change that slows every variant alike leaves the ratios unchanged; ``standard``'s own row sees it).

Reported: the median of each with its distribution-free 95% interval (:func:`coupled_qk.study.stats.
median_ci`). A cell is flagged **slower** when the interval of ``change`` lies above ``1 + threshold``, **faster**
when it lies below ``1 - threshold``; with too few repeats for a 95% interval (fewer than 6) nothing is flagged.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ab_worker
import torch

import coupled_qk
from coupled_qk.experiments.bench.machine import machine_info, machine_line
from coupled_qk.study.stats import median_ci

BASELINE = "standard"

THRESHOLD = 0.03
"""Default flagging threshold: a change is reported when its 95% interval lies beyond ``1 +- THRESHOLD``."""

CELLS = ("train-b8", "decode-eager-b1", "decode-eager-b8", "decode-compiled-b1", "decode-compiled-b8")
"""The A/B cells: a training step (forward, backward, AdamW) of 8 sequences, and greedy cached decoding with
``GPT.generate`` eagerly and with ``compile=True`` at batch 1 and 8."""

PROMPT, NEW_TOKENS, TRAIN_SEQ = 16, 100, 128
"""Decoding cells: a 16-token prompt and 100 new tokens (fewer when ``block_size`` is shorter); the train cell's
sequence length (at most ``block_size``)."""


def cell_spec(name: str, block_size: int) -> dict:
    """The worker's spec of cell ``name`` (one of :data:`CELLS`, or ``train-b<B>`` / ``decode-<eager|compiled>-b<B>``
    for another batch size) for a model of context ``block_size``.

    Raises:
        ValueError: an unknown cell name, or a context too short for it (naming both).
    """
    m = re.fullmatch(r"(train|decode-eager|decode-compiled)-b([1-9][0-9]*)", name)
    if not m:
        raise ValueError(f"unknown cell {name!r}; expected one of {', '.join(CELLS)} (or another batch size: -b<B>)")
    batch = int(m.group(2))
    if m.group(1) == "train":
        return dict(name=name, kind="train", batch=batch, seq=min(TRAIN_SEQ, block_size))
    if block_size < PROMPT + 2:
        raise ValueError(f"cell {name}: block_size={block_size} is shorter than a {PROMPT}-token prompt plus 2 tokens")
    new = min(NEW_TOKENS, block_size - PROMPT)
    return dict(
        name=name, kind="decode", compiled=m.group(1).endswith("compiled"), batch=batch, prompt=PROMPT, new_tokens=new
    )


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode:
        raise ValueError(f"git {' '.join(args)} in {repo} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def source_revision(src: Path) -> dict:
    """The revision of the checkout that holds ``src``: ``{"src", "commit", "dirty", "label"}`` (``label`` = short
    hash, ``+changes`` when tracked files differ from it).

    Raises:
        ValueError: ``src`` is not inside a git checkout.
    """
    commit = _git(src, "rev-parse", "HEAD")
    dirty = bool(_git(src, "status", "--porcelain", "--untracked-files=no"))
    return dict(src=str(src), commit=commit, dirty=dirty, label=commit[:7] + ("+changes" if dirty else ""))


def this_source() -> Path:
    """The ``src`` folder this process imports ``coupled_qk`` from (the "new" side of an A/B run).

    Raises:
        ValueError: the package is not imported from a git checkout (an installed copy has no revision).
    """
    src = Path(coupled_qk.__file__).resolve().parents[1]
    try:
        _git(src, "rev-parse", "HEAD")
    except ValueError:
        raise ValueError(
            f"the revision A/B needs coupled_qk imported from a git checkout; it is imported from {src} "
            "(install the repository with pip install -e . or set PYTHONPATH to its src)"
        ) from None
    return src


@contextlib.contextmanager
def checkout(repo: Path, rev: str, option: str = "--against"):
    """A temporary detached worktree of ``rev`` (``git worktree add --detach``), removed afterwards; yields its
    ``src`` folder.

    Raises:
        ValueError: ``rev`` is not a revision of ``repo`` (naming ``option``, the value and the repository), or the
            revision has no ``src/coupled_qk``.
    """
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ValueError:
        raise ValueError(f"{option}={rev!r} is not a revision of the repository at {repo}") from None
    with tempfile.TemporaryDirectory(prefix="coupled-qk-ab-") as tmp:
        tree = Path(tmp) / commit[:12]
        _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            if not (tree / "src" / "coupled_qk").is_dir():
                raise ValueError(f"{option}={rev!r} ({commit[:7]}) has no src/coupled_qk to benchmark")
            yield tree / "src"
        finally:
            _git(repo, "worktree", "remove", "--force", str(tree))


class Side:
    """One revision's worker process (:mod:`.ab_worker`), started with ``PYTHONPATH=src``."""

    def __init__(self, src: Path, threads: int):
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen(
            [sys.executable, ab_worker.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(src),
        )

    def ask(self, request: dict) -> dict:
        """Send one command, return the answer.

        Raises:
            RuntimeError: the worker failed (its error) or exited.
        """
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark worker exited (code {self.proc.wait()}); see its error above")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"the benchmark worker failed: {answer.get('error')}")
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(json.dumps(dict(op="quit")) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(sources: dict, settings: dict, log=None) -> dict:
    """Time the cells x variants of ``settings`` for the revisions in ``sources`` (``{"old": src, "new": src}``),
    repeats alternated between the two workers (see the module docstring).

    Args:
        settings: ``{"preset", "base": {GPTConfig field: value}, "variants": {name: GPTConfig overrides (flat
            spellings)}, "cells": [cell_spec], "repeats", "threads", "seed"}``; ``variants`` holds ``standard``.

    Returns:
        ``{"settings", "machine", "revisions": {side: source_revision + worker info}, "times": {side: {clock: {cell:
        {variant: [seconds per repeat]}}}}, "load": [1-minute load before, after], "date", "elapsed_s"}``.

    Raises:
        ValueError: no ``standard`` variant or ``repeats < 1``. RuntimeError: a worker failed.
    """
    if BASELINE not in settings["variants"]:
        raise ValueError(f"variants must include {BASELINE!r}, the baseline of every ratio; got {settings['variants']}")
    if settings["repeats"] < 1:
        raise ValueError(f"repeats={settings['repeats']} must be >= 1")
    log = log or (lambda *a, **k: None)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    revisions = {side: source_revision(Path(src)) for side, src in sources.items()}
    workers, times = {}, {side: {clock: {} for clock in ab_worker.CLOCKS} for side in sources}
    try:
        return _alternate(sources, settings, revisions, workers, times, log) | dict(
            load=[load0, os.getloadavg()[0]], elapsed_s=time.perf_counter() - t0
        )
    except BaseException:  # an error or an interrupt: the workers hold nothing worth waiting for
        for worker in workers.values():
            worker.proc.kill()
        raise
    finally:
        for worker in workers.values():
            worker.close()


def _alternate(sources, settings, revisions, workers, times, log) -> dict:
    """:func:`measure`'s work: start and set up the workers, then the alternating repeats."""
    for side, src in sources.items():
        workers[side] = Side(Path(src), settings["threads"])
        log(f"  {side} ({revisions[side]['label']}): building and warming up (compiled cells compile now)")
        info = workers[side].ask(dict(op="setup", **settings))
        revisions[side].update({k: info[k] for k in ("torch", "threads", "package", "unsupported")})
    sides = list(workers)
    for i in range(settings["repeats"]):
        for side in sides if i % 2 == 0 else sides[::-1]:
            answer = workers[side].ask(dict(op="repeat", index=i))
            for clock in ab_worker.CLOCKS:
                for cell, row in answer[clock].items():
                    for v, seconds in row.items():
                        times[side][clock].setdefault(cell, {}).setdefault(v, []).append(seconds)
        log(f"  repeat {i + 1}/{settings['repeats']} done")
    torch.set_num_threads(settings["threads"])  # the machine line shows the workers' thread count
    machine = machine_info(torch.device("cpu"))
    machine["allocator"] = "glibc defaults in the workers (GPT.generate as a library user calls it)"
    return dict(
        settings=settings,
        machine=machine,
        revisions=revisions,
        times=times,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


def run_ab(against: str, settings: dict, log=None, accept: bool = False) -> dict:
    """:func:`measure` of this checkout's source (``new``) against revision ``against`` (``old``, checked out into
    a temporary worktree of this checkout's repository). ``accept``: the ratios are to be recorded under this
    checkout's commit, so it must have no uncommitted changes (checked before anything is measured).

    Raises:
        ValueError: ``against`` is not a revision of the repository, ``coupled_qk`` is not imported from a git
            checkout, or ``accept`` with uncommitted changes. RuntimeError: a worker failed.
    """
    src = this_source()
    if accept and source_revision(src)["dirty"]:
        raise ValueError(
            f"--accept records the ratios under this checkout's commit, but {src.parent} has uncommitted changes to "
            "tracked files; commit them first"
        )
    with checkout(src.parent, against) as old:
        result = measure({"old": old, "new": src}, settings, log)
    result["revisions"]["old"]["src"] = f"{against} (temporary worktree)"
    return result


def ratios(times: dict, variant: str) -> list[float] | None:
    """Per-repeat ``time(variant) / time(standard)`` of one revision's cell (``None`` when either is missing)."""
    if variant not in times or BASELINE not in times:
        return None
    return [a / b for a, b in zip(times[variant], times[BASELINE])]


def change(old: dict, new: dict, variant: str) -> list[float] | None:
    """Per-repeat change of one cell from ``old`` to ``new`` (``{variant: [seconds]}`` each): the ratio of the
    variant's ratios to standard, or for :data:`BASELINE` the ratio of its times."""
    if variant == BASELINE:
        if BASELINE not in old or BASELINE not in new:
            return None
        return [b / a for a, b in zip(old[BASELINE], new[BASELINE])]
    r_old, r_new = ratios(old, variant), ratios(new, variant)
    if r_old is None or r_new is None:
        return None
    return [b / a for a, b in zip(r_old, r_new)]


def verdict(ci: dict | None, threshold: float, conf: float = 0.95) -> str:
    """``"slower"`` (interval above ``1 + threshold``), ``"faster"`` (below ``1 - threshold``), ``"same"``, or
    ``"n/a"`` (no change measured, or too few repeats for an interval at level ``conf``)."""
    if ci is None or ci["coverage"] < conf:
        return "n/a"
    if ci["low"] > 1 + threshold:
        return "slower"
    if ci["high"] < 1 - threshold:
        return "faster"
    return "same"


def compare(result: dict, threshold: float = THRESHOLD, clock: str = "step", conf: float = 0.95) -> list[dict]:
    """One row per cell and variant of :func:`measure`'s ``result``: ``{"cell", "variant", "old", "new", "change",
    "verdict"}``; ``old``/``new`` are :func:`median_ci` of the ratio to standard (of the time in ms for
    ``standard``), ``change`` of the per-repeat change (``None`` where a revision lacks the cell or variant).

    Raises:
        ValueError: an unknown ``clock``.
    """
    if clock not in ab_worker.CLOCKS:
        raise ValueError(f"clock={clock!r} is unknown; expected one of {ab_worker.CLOCKS}")
    rows = []
    old_t, new_t = result["times"]["old"][clock], result["times"]["new"][clock]
    for cell in [c["name"] for c in result["settings"]["cells"]]:
        old, new = old_t.get(cell, {}), new_t.get(cell, {})
        for v in result["settings"]["variants"]:
            if v == BASELINE:
                side = [([1000 * s for s in t[v]] if v in t else None) for t in (old, new)]
            else:
                side = [ratios(t, v) for t in (old, new)]
            ch = change(old, new, v)
            ch_ci = median_ci(ch, conf) if ch else None
            rows.append(
                dict(
                    cell=cell,
                    variant=v,
                    old=median_ci(side[0], conf) if side[0] else None,
                    new=median_ci(side[1], conf) if side[1] else None,
                    change=ch_ci,
                    verdict=verdict(ch_ci, threshold, conf),
                )
            )
    return rows


def slower_cells(rows: list[dict]) -> list[str]:
    """``"cell / variant"`` of every row flagged slower."""
    return [f"{r['cell']} / {r['variant']}" for r in rows if r["verdict"] == "slower"]


def shown(ci: dict | None, unit: str = "x") -> str:
    """``1.084x [1.061, 1.102]`` (a :func:`median_ci` result), ``-`` for ``None``."""
    return "-" if ci is None else f"{ci['median']:.3f}{unit} [{ci['low']:.3f}, {ci['high']:.3f}]"


def ab_markdown(result: dict, rows: list[dict], threshold: float, clock: str, accepted: dict | None = None) -> str:
    """The A/B report: revisions, machine line, command, the table of :func:`compare`'s rows (with the
    ``accepted`` ratios of a tracked file, ``{cell: {variant: ratio}}``, as a column when given), the verdict and
    the ratio table of the new revision (:func:`ratio_table`)."""
    revs, s = result["revisions"], result["settings"]
    slower = slower_cells(rows)
    lines = [
        f"# Revision A/B benchmark: {revs['new']['label']} against {revs['old']['label']} ({s['preset']} preset, CPU)",
        "",
        machine_line(result["machine"]),
        f"- command: `{result.get('command', '')}`",
        f"- measured {result.get('date', '?')}: {s['repeats']} repeats alternating the two revisions, "
        f"{s['threads']} thread(s) each; 1-minute load {result['load'][0]:.1f} before, {result['load'][1]:.1f} after; "
        f"{result['elapsed_s']:.0f} s; model: preset {s['preset']}"
        + "".join(f", {k}={v}" for k, v in s["base"].items()),
    ]
    for side in ("old", "new"):
        r = revs[side]
        lines.append(f"- {side}: {r['label']} ({r['commit']})" + _unsupported(r.get("unsupported") or {}))
    lines += [
        f"- cells: train-bB = one training step (forward, backward, AdamW) of B x {TRAIN_SEQ} tokens (at most "
        f"block_size); decode-MODE-bB = one greedy `GPT.generate` call with the cache, B prompts of {PROMPT} tokens "
        f"and {NEW_TOKENS} new ones (fewer when block_size is shorter), eager or `compile=True`",
        f"- clock: {clock} ({CLOCK_TEXT[clock]})",
        "- old / new: median over repeats of time / standard's time in the same repeat [95% interval of the median]; "
        "for standard itself its ms. change: median of new / old per repeat (ratios; standard: times) [95% "
        f"interval]; **slower** when the interval lies above {1 + threshold:.2f}, faster below {1 - threshold:.2f}",
        "",
        "| cell | variant | old | new | change new/old | verdict |" + (" accepted |" if accepted else ""),
        "|---|---|---:|---:|---:|---|" + ("---:|" if accepted else ""),
    ]
    for r in rows:
        unit = " ms" if r["variant"] == BASELINE else "x"
        mark = f"**{r['verdict']}**" if r["verdict"] == "slower" else r["verdict"]
        row = f"| {r['cell']} | {r['variant']} | {shown(r['old'], unit)} | {shown(r['new'], unit)} | "
        row += f"{shown(r['change'])} | {mark} |"
        if accepted:
            value = (accepted.get(r["cell"]) or {}).get(r["variant"])
            row += " - |" if value is None else f" {value:.3f}{unit} |"
        lines.append(row)
    lines += ["", "Slower: " + (", ".join(slower) if slower else "none"), ""]
    lines += ratio_table(result, rows, "new")
    return "\n".join(lines) + "\n"


CLOCK_TEXT = {
    "step": "decoding: the fastest single-token step, an undisturbed one (eager: the variants' steps taken in turn "
    "after an untimed prefill; compiled: the steps of the generate call); train: the fastest of 3 steps per repeat, "
    "the variants' steps taken in turn",
    "wall": "wall-clock time of the whole call, prefill included",
    "cpu": "process CPU time of the call, all threads",
}


def _unsupported(unsupported: dict) -> str:
    if not unsupported:
        return ""
    parts = [
        f"{cell}: {why}" if isinstance(why, str) else f"{cell}: " + ", ".join(f"{v} ({r})" for v, r in why.items())
        for cell, why in unsupported.items()
    ]
    return "; not run: " + "; ".join(parts)


def ratio_table(result: dict, rows: list[dict], side: str) -> list[str]:
    """Markdown lines of one revision's ratios to standard: a row per variant, a column per cell (standard's own
    row in ms), each ``median [95% interval]`` -- the decode and train table of ``benchmarks/README.md``."""
    cells = [c["name"] for c in result["settings"]["cells"]]
    rev = result["revisions"][side]["label"]
    by = {(r["cell"], r["variant"]): r[side] for r in rows}
    lines = [
        f"Ratios to standard at {rev} ({result.get('date', '?')}; standard in ms; median [95% interval]):",
        "",
        "| variant | " + " | ".join(cells) + " |",
        "|---|" + "---:|" * len(cells),
    ]
    for v in result["settings"]["variants"]:
        unit = " ms" if v == BASELINE else "x"
        lines.append(f"| {v} | " + " | ".join(shown(by.get((c, v)), unit) for c in cells) + " |")
    return lines
