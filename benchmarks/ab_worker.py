"""One revision's side of the revision A/B benchmark (:mod:`ab_measure`).

Run as a script (``python ab_worker.py``) with ``PYTHONPATH`` pointing at the ``src`` folder of the revision to
measure; the driver starts one worker per revision and alternates their repeats. The worker reads one JSON
command per line on stdin and answers each with one JSON line on stdout:

- ``{"op": "setup", "preset", "base": {field: value}, "variants": {name: GPTConfig overrides}, "cells": [cell],
  "seed", "threads"}``: builds every variant (``GPTConfig(**preset, **base, **overrides)``, same seed), runs each
  cell once per variant untimed (twice for a train step; compiling the compiled cells) and answers ``{"ok": true,
  "torch", "threads", "package", "unsupported": {cell name: reason or {variant: reason}}}``: what this revision
  cannot run (a cell, or a variant it cannot build or that failed in the cell) is left out and reported.
- ``{"op": "repeat", "index": i}``: times each supported cell once per variant, variants round-robin rotated by
  ``i`` (an eager decoding cell then also takes the variants' steps in turn, :meth:`Cell.lockstep`, and a train
  cell more steps, :meth:`Cell.train_rounds`); answers
  ``{"ok": true, clock: {cell name: {variant: seconds}}}`` for each of :data:`CLOCKS`.
- ``{"op": "quit"}``: exits.

A cell is ``{"name", "kind": "train", "batch", "seq"}`` (one training step: :meth:`GPT.loss` forward, backward,
AdamW step, ``zero_grad``) or ``{"name", "kind": "decode", "compiled", "batch", "prompt", "new_tokens"}`` (one
greedy :meth:`GPT.generate` call with the cache, ``temperature=0``, ``compile=True`` for compiled cells). An error
answers ``{"ok": false, "error"}``.

This file must run against any revision of ``coupled_qk``, old ones included: it imports nothing from
``coupled_qk`` but ``GPT`` and ``GPTConfig``/``PRESETS`` (``models.config``), and decides what a revision can
run by reading ``GPT.generate``'s signature (a revision without ``compile=`` reports its compiled cells as
unsupported).
"""

from __future__ import annotations

import copy
import gc
import inspect
import json
import sys
import time

CLOCKS = ("wall", "cpu", "step")
"""What a repeat reports per cell and variant: ``wall`` (seconds of the call), ``cpu`` (process CPU seconds of the
call, all threads) and ``step`` (the fastest, :data:`STEP_QUANTILE`, of the wall seconds of single-token decoding
steps: for an eager cell from :meth:`Cell.lockstep`, the variants' steps taken in turn; for a compiled cell from
its ``generate`` call; for a train cell the fastest of its steps in the repeat, :meth:`Cell.train_rounds`)."""

TRAIN_ROUNDS = 2
"""Extra training steps per variant and repeat, taken in turn, for a train cell's ``step`` clock (the fastest of
the repeat's ``1 + TRAIN_ROUNDS`` steps)."""

STEP_QUANTILE = 0.0
"""Which quantile of a call's single-token step times the ``step`` clock reports: the minimum. On a shared machine
a step is either undisturbed or preempted (several times slower), and the share of preempted steps swings with
the load: at load 13 the median of a call's 100 steps moved by 45% between calls; at load 11-19 even the 10th
percentile fell into the preempted cluster for batch-8 steps (3 ms: 9.7 ms, interquartile range of the ratio to
standard over repeats 0.53), while the fastest step stayed undisturbed (3.0 ms, 0.11). A step cannot run faster
than its work, so the minimum estimates that work; with the variants' steps taken in turn (:meth:`Cell.lockstep`)
every variant's minimum comes from the same milliseconds."""


def _build(request: dict) -> tuple[dict, dict]:
    """The models ``{variant: GPT}`` (eval mode, each built after ``torch.manual_seed(seed)``) and ``{variant:
    reason}`` for the variants this revision cannot build (an attention or field it does not know)."""
    import torch

    from coupled_qk.models.config import PRESETS, GPTConfig
    from coupled_qk.models.gpt import GPT

    models, failed = {}, {}
    for name, overrides in request["variants"].items():
        torch.manual_seed(request["seed"])
        try:
            config = GPTConfig(**{**PRESETS[request["preset"]], **request["base"], **overrides})
        except (TypeError, ValueError) as exc:
            failed[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        models[name] = GPT(config).eval()
    return models, failed


STEPS: list[float] = []
"""Wall seconds of the compiled decoding steps of the call being timed (appended by the wrappers of
:func:`_time_compiled_steps`, cleared before each call)."""


class Cell:
    """One cell's inputs and its timed call per variant (train step or ``generate``)."""

    def __init__(self, spec: dict, models: dict, seed: int):
        import torch

        self.spec, self.name, self.models = spec, spec["name"], models
        gen = torch.Generator().manual_seed(seed)
        vocab = next(iter(models.values())).config.vocab_size
        self.eager_decode = spec["kind"] == "decode" and not spec["compiled"]
        if spec["kind"] == "train":
            self.tokens = torch.randint(0, vocab, (spec["batch"], spec["seq"] + 1), generator=gen)
            self.train = {n: copy.deepcopy(m).train() for n, m in models.items()}
            self.opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in self.train.items()}
        else:
            self.prompt = torch.randint(0, vocab, (spec["batch"], spec["prompt"]), generator=gen)
            if spec["compiled"]:
                for model in models.values():
                    _time_compiled_steps(model)

    def unsupported(self) -> str | None:
        """Why this revision cannot run the cell, or ``None``."""
        model = next(iter(self.models.values()))
        if self.spec["kind"] == "decode" and self.spec["compiled"]:
            if "compile" not in inspect.signature(model.generate).parameters:
                return "GPT.generate has no compile= argument in this revision"
        return None

    def call(self, variant: str) -> None:
        """One untimed call for ``variant``."""
        if self.spec["kind"] == "train":
            model, opt = self.train[variant], self.opts[variant]
            model.loss(self.tokens[:, :-1], self.tokens[:, 1:]).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        else:
            extra = {"compile": True} if self.spec["compiled"] else {}
            self.models[variant].generate(self.prompt, self.spec["new_tokens"], temperature=0.0, **extra)

    def run(self, variant: str) -> tuple[float, float, float]:
        """Wall-clock and process CPU seconds (all threads) of one call for ``variant``, and its undisturbed step
        time: :func:`low_quantile` of a compiled call's steps, the call's wall time for a train step (an eager
        decoding cell's comes from :meth:`lockstep`)."""
        STEPS.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        self.call(variant)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, low_quantile(STEPS) if STEPS else wall

    def train_rounds(self, order: list[str], rounds: int = TRAIN_ROUNDS) -> dict[str, float]:
        """A train cell's undisturbed step time per variant: the fastest of ``rounds`` more steps, the variants'
        steps taken in turn (one each per round)."""
        best = {v: float("inf") for v in order}
        for _ in range(rounds):
            for v in order:
                start = time.perf_counter()
                self.call(v)
                best[v] = min(best[v], time.perf_counter() - start)
        return best

    def lockstep(self, order: list[str]) -> dict[str, float]:
        """An eager decoding cell's undisturbed step time per variant: every variant prefills its cache with the
        prompt (untimed), then the variants take their single-token steps in turn (``next_token_logits`` and the
        arg-max, as greedy ``generate``), so each step of one variant is timed beside the others' in the same
        milliseconds; :func:`low_quantile` of each variant's step times."""
        import torch

        caches, nxt, steps = {}, {}, {v: [] for v in order}
        with torch.no_grad():
            for v in order:
                caches[v] = self.models[v].new_cache(self.spec["prompt"] + self.spec["new_tokens"])
                nxt[v] = self.models[v].next_token_logits(self.prompt, caches[v]).argmax(-1, keepdim=True)
            for _ in range(self.spec["new_tokens"] - 1):
                for v in order:
                    start = time.perf_counter()
                    nxt[v] = self.models[v].next_token_logits(nxt[v], caches[v]).argmax(-1, keepdim=True)
                    steps[v].append(time.perf_counter() - start)
        return {v: low_quantile(s) for v, s in steps.items()}


def low_quantile(values: list, q: float = STEP_QUANTILE) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation between order statistics, numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def _time_compiled_steps(model) -> None:
    """Wrap ``model.compiled_decode_step`` (once, by an instance attribute) so that each step it returns appends
    its wall seconds to :data:`STEPS` (a ``perf_counter`` pair per step); a revision without it is left alone."""
    build = getattr(model, "compiled_decode_step", None)
    if build is None or getattr(build, "timed_by_ab", False):
        return

    def compiled_decode_step(*args, **kwargs):
        step = build(*args, **kwargs)

        def timed(idx, cache):
            start = time.perf_counter()
            out = step(idx, cache)
            STEPS.append(time.perf_counter() - start)
            return out

        return timed

    compiled_decode_step.timed_by_ab = True
    model.compiled_decode_step = compiled_decode_step


class Worker:
    """The state between commands: the cells, and per cell the variants that run."""

    def __init__(self):
        self.cells: list[tuple[Cell, list[str]]] = []

    def setup(self, request: dict) -> dict:
        import torch

        import coupled_qk

        torch.set_num_threads(request["threads"])
        models, failed = _build(request)
        unsupported = {}  # cell name -> reason, or {variant: reason}
        for spec in request["cells"]:
            cell = Cell(spec, models, request["seed"])
            reason = cell.unsupported()
            if reason:
                unsupported[cell.name] = reason
                continue
            runs, broken = [], dict(failed)
            for v in models:
                try:
                    for _ in range(2 if spec["kind"] == "train" else 1):  # warm-up (and compilation)
                        cell.call(v)
                    runs.append(v)
                except Exception as exc:  # noqa: BLE001 - this revision cannot run it: reported, not fatal
                    broken[v] = f"{type(exc).__name__}: {str(exc)[:200]}"
            if broken:
                unsupported[cell.name] = broken
            self.cells.append((cell, runs))
        return dict(
            ok=True,
            torch=torch.__version__,
            threads=torch.get_num_threads(),
            package=coupled_qk.__file__,
            unsupported=unsupported,
        )

    def repeat(self, request: dict) -> dict:
        gc.collect()
        times = {}
        for cell, runs in self.cells:
            k = request["index"] % max(len(runs), 1)
            order = runs[k:] + runs[:k]
            times[cell.name] = {v: cell.run(v) for v in order}
            if order and (cell.eager_decode or cell.spec["kind"] == "train"):
                steps = cell.lockstep(order) if cell.eager_decode else cell.train_rounds(order)
                for v, step in steps.items():
                    wall, cpu, first = times[cell.name][v]
                    times[cell.name][v] = (wall, cpu, min(step, first) if cell.spec["kind"] == "train" else step)
        return dict(
            ok=True,
            **{
                clock: {c: {v: t[i] for v, t in row.items()} for c, row in times.items()}
                for i, clock in enumerate(CLOCKS)
            },
        )


def main() -> None:
    worker = Worker()
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            answer = getattr(worker, request["op"])(request)
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which stops the run
            answer = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
