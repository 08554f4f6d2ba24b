"""One model's timed training step (:class:`TrainStepRunner`) and the statistics of its step times, shared by
``bench`` (:mod:`coupled_qk.experiments.bench.train`) and ``bench --fast``'s train cells."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from coupled_qk.experiments.bench.machine import sync_device
from coupled_qk.models.compiled import compile_error_summary, uncompile_regions
from coupled_qk.models.gpt import GPT
from coupled_qk.ops.losses import next_token_loss


class TrainStepRunner:
    """One model's timed training step (the runner of ``bench`` and of ``bench --fast``'s train cells).

    One step is forward (next-token loss: :meth:`GPT.loss`, or cross-entropy of a Hugging Face model's logits,
    run without its KV cache), backward, ``AdamW.step()`` (lr ``1e-4``, weight decay 0.1) and ``zero_grad()``,
    under autocast to ``autocast_dtype`` when given.

    Args:
        name: the label of the model (a variant spec or a peer's name).
        build: ``() -> nn.Module``, called after ``torch.manual_seed(seed)`` (so every runner of one seed starts
            from the same random state).
        x, y: the token batch ``(B, T)`` and its targets, on ``device``.
        device: where the model runs.
        seed: the seed set before ``build``.
        autocast_dtype: ``torch.bfloat16`` / ``torch.float16`` for mixed precision, ``None`` for full precision.
        compile: ``(model) -> None`` that compiles the model in place (regional), or ``None`` for eager; the
            first step then compiles, falling back to eager with the reason in ``compile_error``.
    """

    def __init__(
        self,
        name: str,
        build,
        x: torch.Tensor,
        y: torch.Tensor,
        device: torch.device,
        seed: int,
        autocast_dtype: torch.dtype | None = None,
        compile=None,
    ):
        self.name, self.x, self.y, self.device = name, x, y, device
        torch.manual_seed(seed)
        self.model = build().to(device).train()
        self.params = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.1)
        self.autocast_dtype = autocast_dtype
        self.compiled = compile is not None
        self.compile_error: str | None = None
        self.compile_s: float | None = None
        if compile is not None:
            compile(self.model)

    def _loss(self) -> torch.Tensor:
        if isinstance(self.model, GPT):
            return self.model.loss(self.x, self.y)
        # no KV cache in training (transformers builds one by default: wasted work, and a recompile per layer)
        return next_token_loss(self.model(self.x, use_cache=False).logits, self.y)

    def step(self) -> None:
        """One untimed training step."""
        ctx = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with ctx:
            loss = self._loss()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def first_step(self) -> None:
        """The first (warmup) step; compiles when asked, falling back to eager with the reason recorded."""
        start = time.perf_counter()
        try:
            self.step()
        except Exception as exc:  # noqa: BLE001 - a failure of the (lazily compiled) backward: run eager
            if not self.compiled:
                raise
            self.compile_error, self.compiled = compile_error_summary(exc), False
            uncompile_regions(self.model, self.compile_error)
            self.optimizer.zero_grad(set_to_none=True)
            self.step()
        sync_device(self.device)
        error = getattr(self.model, "compile_info", {}).get("error")
        if self.compiled and error:  # the forward fell back (GPT.compile)
            self.compiled, self.compile_error = False, error
        if self.compiled:
            self.compile_s = time.perf_counter() - start

    def timed_step(self) -> tuple[float, float]:
        """One step; returns its wall and process CPU time in ms (accelerator synchronised before and after)."""
        sync_device(self.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        self.step()
        sync_device(self.device)
        return 1000.0 * (time.perf_counter() - start), 1000.0 * (time.process_time() - cpu_start)


def step_time_stats(times_ms: list[float], tokens_per_step: int) -> dict:
    """``median_ms, min_ms, p10_ms, p90_ms, tokens_per_s`` of step times (tokens/s from the median)."""
    t = np.asarray(times_ms, dtype=np.float64)
    median = float(np.median(t))
    return dict(
        median_ms=median,
        min_ms=float(t.min()),
        p10_ms=float(np.percentile(t, 10)),
        p90_ms=float(np.percentile(t, 90)),
        tokens_per_s=tokens_per_step / (median / 1000.0),
    )
