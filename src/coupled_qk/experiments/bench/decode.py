"""``coupled-qk bench --mode decode|memory``: cached greedy decoding speed and memory of every variant vs standard.

Decode (tokens/s of cached greedy decoding): for each cell (batch size ``B``, prefix length ``P``), each repeat
builds a fresh preallocated cache, encodes a random ``B x P`` prompt (untimed) and then times ``new_tokens``
greedy steps (:meth:`coupled_qk.GPT.next_token_logits` + argmax); the variants run round-robin within each
repeat (rotated by one per repeat). Reported per variant and cell: median ms per token, tokens/s
(``B * new_tokens / median time``) and the paired ratio to ``standard`` (median over repeats of the
per-repeat ratio) with a 95% bootstrap interval (:func:`paired_ratio`).

Memory: the peak memory of one training step (forward, backward, AdamW) above what was allocated before it
(after one warm-up step, so the optimizer state exists): on CUDA ``torch.cuda.max_memory_allocated``; on CPU
the peak of the running sum of the CPU allocator's records from ``torch.profiler`` (``profile_memory=True``),
a real allocation measurement. And the bytes of the KV cache after a ``B x L`` prefill (:meth:`KVCache.nbytes`,
the preallocated buffers).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from coupled_qk.devices import TORCH_DTYPES
from coupled_qk.experiments.bench.machine import machine_info, report_header, sync_device
from coupled_qk.experiments.bench.train import resolve_dtype, variant_configs, with_baseline
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.training.distributed import pick_device

BASELINE = "standard"


def paired_ratio(times, base_times, seed: int = 0, n_boot: int = 2000) -> dict:
    """Paired ratio of two equally long series of repeat times: ``median`` of the per-repeat ratios and a 95%
    percentile-bootstrap interval ``lo, hi`` of that median (resampling repeats; ``n_boot`` resamples)."""
    r = np.asarray(times, dtype=np.float64) / np.asarray(base_times, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = np.median(r[rng.integers(0, len(r), (n_boot, len(r)))], axis=1)
    return dict(median=float(np.median(r)), lo=float(np.percentile(boots, 2.5)), hi=float(np.percentile(boots, 97.5)))


def decode_seconds(model: GPT, prompt: torch.Tensor, new_tokens: int, device) -> float:
    """Seconds for ``new_tokens`` cached greedy steps after an (untimed) prefill of ``prompt``."""
    with torch.no_grad():
        cache = model.new_cache(prompt.shape[1] + new_tokens)
        nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
        sync_device(device)
        start = time.perf_counter()
        for _ in range(new_tokens):
            nxt = model.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
        sync_device(device)
    return time.perf_counter() - start


def fitting_cells(batch_sizes, prefixes, new_tokens: int, block_size: int) -> tuple[list, list]:
    """The decoding cells ``(batch, prefix)`` with ``prefix + new_tokens <= block_size``, and those skipped; used by
    :func:`run_decode` and ``run_fastpath`` before anything is measured.

    Raises:
        ValueError: no cell fits (naming ``prefixes``, ``new_tokens`` and ``block_size``).
    """
    cells = [(b, p) for b in batch_sizes for p in prefixes if p + new_tokens <= block_size]
    skipped = [(b, p) for b in batch_sizes for p in prefixes if (b, p) not in cells]
    if not cells:
        raise ValueError(
            f"no (batch, prefix) cell fits block_size={block_size} with new_tokens={new_tokens}: "
            f"prefixes {list(prefixes)} (each prefix + new_tokens must be <= block_size)"
        )
    return cells, skipped


def run_decode(
    base: GPTConfig,
    variants=None,
    batch_sizes=(1, 8),
    prefixes=(128, 512),
    new_tokens: int = 32,
    repeats: int = 5,
    device="auto",
    seed: int = 0,
    map_options=None,
    log=None,
) -> dict:
    """Cached greedy decoding speed of each variant against ``standard`` (see the module docstring).

    Args:
        base: shared model configuration; cells with ``prefix + new_tokens > block_size`` are skipped (listed in
            ``settings.skipped``).
        batch_sizes, prefixes: the grid of cells; new_tokens: timed steps per repeat; repeats: >= 1.

    Returns:
        ``{"mode": "decode", "settings", "machine", "cells": [{"batch", "prefix", "variants": {name:
        {"ms_per_token", "tokens_per_s", "ratio": {"median", "lo", "hi"}, "times_s"}}}], "elapsed_s"}``.

    Raises:
        ValueError: ``repeats`` or ``new_tokens`` < 1, no cell fitting ``block_size``, or as ``run_bench``.
    """
    t0 = time.perf_counter()
    if repeats < 1 or new_tokens < 1:
        raise ValueError(f"need repeats >= 1 and new_tokens >= 1; got {repeats}, {new_tokens}")
    names = with_baseline(variants)
    dev = device if isinstance(device, torch.device) else pick_device(device)
    configs = variant_configs(base, names, map_options or {})
    cells, skipped = fitting_cells(batch_sizes, prefixes, new_tokens, base.block_size)
    log = log or (lambda *a, **k: None)
    models = {}
    for n in names:
        torch.manual_seed(seed)
        models[n] = GPT(configs[n]).to(dev).eval()
    gen = torch.Generator().manual_seed(seed)
    out_cells = []
    for b, p in cells:
        prompt = torch.randint(0, base.vocab_size, (b, p), generator=gen).to(dev)
        times = {n: [] for n in names}
        for n in names:  # warm-up
            decode_seconds(models[n], prompt, min(new_tokens, 4), dev)
        for i in range(repeats):
            for n in names[i % len(names) :] + names[: i % len(names)]:
                times[n].append(decode_seconds(models[n], prompt, new_tokens, dev))
        log(f"  decode batch {b} prefix {p}: done")
        res = {}
        for n in names:
            med = float(np.median(times[n]))
            res[n] = dict(
                ms_per_token=1000.0 * med / new_tokens,
                tokens_per_s=b * new_tokens / med,
                ratio=paired_ratio(times[n], times[BASELINE]),
                times_s=times[n],
            )
        out_cells.append(dict(batch=b, prefix=p, variants=res))
    return dict(
        mode="decode",
        settings=dict(
            variants=names,
            batch_sizes=list(batch_sizes),
            prefixes=list(prefixes),
            new_tokens=new_tokens,
            repeats=repeats,
            device=str(dev),
            seed=seed,
            config=base.to_dict(),
            map_options=dict(map_options or {}),
            skipped=skipped,
        ),
        machine=machine_info(dev),
        cells=out_cells,
        elapsed_s=time.perf_counter() - t0,
    )


def peak_step_bytes(step, device: torch.device) -> int:
    """Peak bytes allocated during ``step()`` above the bytes allocated before it (CUDA: allocator statistics;
    CPU: the running sum of the profiler's allocator records)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    records = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    running = np.cumsum([e.nbytes() for e in records if e.device_type() == records[0].device_type()])
    return int(max(0, running.max())) if len(running) else 0


class _MemoryStep:
    """One training step of ``model`` (forward under autocast when ``dtype`` is not fp32, backward, AdamW,
    ``zero_grad(set_to_none=False)`` so gradients stay resident), with the loss optionally compiled; a compile
    failure at the first call falls back to eager and is recorded in ``compile_error``."""

    def __init__(self, model: GPT, opt, tokens: torch.Tensor, device: torch.device, dtype: str, compile_model: bool):
        self.model, self.opt, self.tokens, self.device = model, opt, tokens, device
        self.autocast_dtype = None if dtype == "fp32" else TORCH_DTYPES[dtype]
        self.loss_fn = torch.compile(model.loss) if compile_model else model.loss
        self.compiled, self.compile_error = compile_model, None

    def __call__(self) -> None:
        ctx = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with ctx:
            loss = self.loss_fn(self.tokens[:, :-1], self.tokens[:, 1:])
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)

    def first(self) -> None:
        """The warm-up step (compiles when asked; eager fallback with the reason recorded)."""
        try:
            self()
        except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager
            if not self.compiled:
                raise
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            self.compile_error = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]
            self.compiled, self.loss_fn = False, self.model.loss
            self.opt.zero_grad(set_to_none=False)
            self()
        sync_device(self.device)


def _variant_memory(config: GPTConfig, tokens, prompt, dev, dtype: str, compile_model: bool, seed: int) -> dict:
    """One variant's row of :func:`run_memory`: a model built from ``seed`` takes a first training step on
    ``tokens`` (so gradients and optimizer state exist; compiled with ``compile_model``), then the bytes resident,
    the peak of a measured step, and the KV cache after a prefill of ``prompt`` (cache length ``prompt``'s)."""
    torch.manual_seed(seed)
    model = GPT(config).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    step = _MemoryStep(model, opt, tokens, dev, dtype, compile_model)
    step.first()  # optimizer state and gradients now exist (and the loss is compiled)
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    resident = sum(t.numel() * t.element_size() for t in tensors)
    peak = peak_step_bytes(step, dev)
    model.eval()
    with torch.no_grad():
        cache = model.new_cache(prompt.shape[1])
        model.next_token_logits(prompt, cache)
    return dict(
        train_peak_bytes=peak,
        resident_bytes=resident,
        kv_cache_bytes=cache.nbytes(),
        compiled=step.compiled,
        compile_error=step.compile_error,
    )


def run_memory(
    base: GPTConfig,
    variants=None,
    batch_size: int = 8,
    seq_len: int | None = None,
    cache_batch: int = 1,
    cache_len: int | None = None,
    device="auto",
    seed: int = 0,
    map_options=None,
    dtype: str = "auto",
    compile_model: bool = False,
) -> dict:
    """Peak training-step memory and KV-cache bytes of each variant against ``standard`` (module docstring).

    Args:
        dtype: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``fp32``, ``bf16`` or ``fp16``: the training step
            runs under ``torch.autocast`` with that dtype (fp32 weights, optimizer state and gradients), as
            ``coupled-qk bench`` and ``train`` do; the KV cache is measured with the fp32 weights.
        compile_model: ``torch.compile`` the loss; the warm-up step compiles, the measured step runs the
            compiled graph (a compile failure falls back to eager, reported as ``compile_error``).

    Returns:
        ``{"mode": "memory", "settings", "machine", "variants": {name: {"train_peak_bytes", "train_ratio",
        "resident_bytes", "kv_cache_bytes", "kv_ratio", "compiled", "compile_error"}}}``; ``resident_bytes`` =
        parameters, gradients and optimizer state before the measured step; ``settings`` holds ``dtype`` and
        ``compile``.

    Raises:
        ValueError: ``seq_len`` or ``cache_len`` outside ``[1, block_size]``, an unknown dtype, or as
            ``run_bench``.
    """
    names = with_baseline(variants)
    dev = device if isinstance(device, torch.device) else pick_device(device)
    dtype = resolve_dtype(dtype, dev)
    seq_len = base.block_size if seq_len is None else seq_len
    cache_len = base.block_size if cache_len is None else cache_len
    for name, value in (("seq_len", seq_len), ("cache_len", cache_len)):
        if not 1 <= value <= base.block_size:
            raise ValueError(f"{name}={value} must be in [1, block_size={base.block_size}]")
    configs = variant_configs(base, names, map_options or {})
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, base.vocab_size, (batch_size, seq_len + 1), generator=gen).to(dev)
    prompt = torch.randint(0, base.vocab_size, (cache_batch, cache_len), generator=gen).to(dev)
    if compile_model:  # one compiled frame (GPT.loss) per variant
        dyn = torch._dynamo.config
        dyn.recompile_limit = max(dyn.recompile_limit, 2 * len(names))
    out = {n: _variant_memory(configs[n], tokens, prompt, dev, dtype, compile_model, seed) for n in names}
    for n in names:
        out[n]["train_ratio"] = out[n]["train_peak_bytes"] / max(1, out[BASELINE]["train_peak_bytes"])
        out[n]["kv_ratio"] = out[n]["kv_cache_bytes"] / out[BASELINE]["kv_cache_bytes"]
    return dict(
        mode="memory",
        settings=dict(
            variants=names,
            batch_size=batch_size,
            seq_len=seq_len,
            cache_batch=cache_batch,
            cache_len=cache_len,
            device=str(dev),
            dtype=dtype,
            compile=compile_model,
            seed=seed,
            config=base.to_dict(),
            map_options=dict(map_options or {}),
        ),
        machine=machine_info(dev),
        variants=out,
    )


def decode_markdown(result: dict) -> str:
    """Markdown table of :func:`run_decode`'s result."""
    s = result["settings"]
    lines = [
        *report_header("Decode", result),
        f"- cached greedy decoding, {s['new_tokens']} timed tokens after an untimed prefill, median of "
        f"{s['repeats']} interleaved repeats; ratio = median over repeats of time / standard's time in the same "
        f"round, [95% bootstrap interval]; lower is faster. Skipped cells (too long for block_size): "
        f"{s['skipped'] or 'none'}",
        "",
        "| batch | prefix | variant | ms/token | tokens/s | time ratio vs standard |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for c in result["cells"]:
        for n, v in c["variants"].items():
            r = v["ratio"]
            lines.append(
                f"| {c['batch']} | {c['prefix']} | {n} | {v['ms_per_token']:.2f} | {v['tokens_per_s']:,.0f} "
                f"| {r['median']:.3f}x [{r['lo']:.3f}, {r['hi']:.3f}] |"
            )
    return "\n".join(lines) + "\n"


def memory_markdown(result: dict) -> str:
    """Markdown table of :func:`run_memory`'s result."""
    s = result["settings"]
    how = (
        "torch.cuda.max_memory_allocated" if s["device"].startswith("cuda") else "torch.profiler CPU allocator records"
    )
    lines = [
        *report_header("Memory", result),
        f"- train step peak ({how}) above the resident parameters, gradients and AdamW state; batch "
        f"{s['batch_size']} x seq {s['seq_len']}; dtype {s.get('dtype', 'fp32')}, compile "
        f"{'on' if s.get('compile') else 'off'}. KV cache: allocated buffers after a {s['cache_batch']} x "
        f"{s['cache_len']} prefill",
        "",
        "| variant | resident MiB | train-step peak MiB | ratio | KV cache MiB | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    mib = 2.0**20
    for n, v in result["variants"].items():
        note = " (eager: compile failed)" if v.get("compile_error") else ""
        lines.append(
            f"| {n}{note} | {v['resident_bytes'] / mib:.1f} | {v['train_peak_bytes'] / mib:.1f} | "
            f"{v['train_ratio']:.3f}x | {v['kv_cache_bytes'] / mib:.2f} | {v['kv_ratio']:.3f}x |"
        )
    return "\n".join(lines) + "\n"
