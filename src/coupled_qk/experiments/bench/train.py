"""Train-step speed of the attention variants against ``standard``, measured interleaved in one run.

Method (see ``benchmarks/README.md``): every variant is built from the same base :class:`GPTConfig` (only the
attention fields change) with its own AdamW optimizer and the same random token batch. One *step* is forward
(next-token loss), backward, ``AdamW.step()`` and ``zero_grad()``. After ``warmup`` untimed steps per variant
(which also trigger ``torch.compile``), each repeat times one step of every variant in round-robin order
(rotated by one variant per repeat, so no variant always runs first), synchronising the accelerator around
each step. Reported per variant: median, 10th and 90th percentile step time, tokens per second from the
median, and ``ratio = median / median(standard)`` from the same run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from coupled_qk.experiments.runner import Report, write_report
from coupled_qk.models.compiled import compile_error_summary, uncompile_regions
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.models.registry import OPTION_ALIASES, get_attention
from coupled_qk.models.specs import parse_variants, variant_overrides
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training.distributed import pick_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BASELINE = "standard"


def with_baseline(text: str | list[str] | None) -> list[str]:
    """Variant specs (see :mod:`coupled_qk.models.variants`) with ``standard`` always first; ``None``/``"all"`` -> the
    paper's variants and baselines.

    Raises:
        ValueError: an unknown variant (the message lists the valid ones).
    """
    names = parse_variants(text)
    return [BASELINE] + [n for n in names if n != BASELINE]


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` (autocast) on CUDA, ``fp32`` elsewhere; otherwise the name, checked."""
    if name == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected auto or one of {list(DTYPES)}")
    return name


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else :func:`platform.processor`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Hardware", "cpu model"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


TIMING_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
              "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
"""Environment variables that change CPU timings (threads, a preloaded allocator, glibc malloc tuning)."""


def machine_info(device: torch.device) -> dict:
    """Where the numbers come from: CPU, cores, torch version and threads, device and GPU name, and the
    :data:`TIMING_ENV` variables that are set (``env``)."""
    info = dict(
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        device=str(device),
        cuda=None,
        env={k: os.environ[k] for k in TIMING_ENV if k in os.environ},
    )
    if device.type == "cuda":
        info["cuda"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
    return info


def machine_line(m: dict) -> str:
    """The markdown line describing :func:`machine_info`'s ``m`` (results written before ``env`` existed too)."""
    gpu = f", GPU {m['cuda']}" if m.get("cuda") else ""
    env = "".join(f"; {k}={v}" for k, v in (m.get("env") or {}).items())
    return (f"- machine: {m['cpu']} ({m['cpu_count']} logical CPUs){gpu}; torch {m['torch']}, {m['threads']} threads"
            f"{env}; {m.get('platform', '?')}")


def compiled_graphs() -> int:
    """Graphs compiled by ``torch.compile`` in this process so far (Dynamo's ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def sync_device(device: torch.device) -> None:
    """Wait for the queued CUDA work on ``device`` (a no-op on CPU), so that a timer reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

    def __init__(self, name: str, build, x: torch.Tensor, y: torch.Tensor, device: torch.device, seed: int,
                 autocast_dtype: torch.dtype | None = None, compile=None):
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
        ctx = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None
               else contextlib.nullcontext())
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


def variant_configs(base: GPTConfig, names: list[str], map_options: dict) -> dict[str, GPTConfig]:
    """Each variant's config: ``base`` with the variant's overrides and the ``map_options`` its map has."""
    configs, used = {}, set()
    for n in names:
        overrides = variant_overrides(n)
        qk_map = get_attention(overrides["attention"]).qk_map
        valid = qk_map.option_names() if qk_map else []
        extra = {k: v for k, v in map_options.items() if OPTION_ALIASES.get(k, k) in valid}
        used.update(extra)
        configs[n] = base.replace(**{**extra, **overrides})
    unused = sorted(set(map_options) - used)
    if unused:
        raise ValueError(f"map option(s) {unused} apply to none of the variants {names}")
    return configs


def run_bench(
    base: GPTConfig,
    variants: list[str] | str | None = None,
    batch_size: int = 16,
    seq_len: int | None = None,
    repeats: int = 10,
    warmup: int = 3,
    device: str | torch.device = "auto",
    dtype: str = "auto",
    compile_model: bool = False,
    seed: int = 0,
    log=None,
    map_options: dict | None = None,
) -> dict:
    """Time a train step of each variant, interleaved, against ``standard``; returns the result dict.

    Args:
        base: model configuration shared by all variants (its ``attention``/``integrator`` are replaced).
        variants: variant specs of :mod:`coupled_qk.models.variants` (list or comma-separated); ``standard`` is always included.
        batch_size, seq_len: tokens per step (``seq_len`` defaults to ``base.block_size``).
        repeats: timed steps per variant (medians over these); warmup: untimed steps per variant first (at
            least 1: the first step compiles when ``compile_model``).
        device: ``auto``, ``cpu``, ``cuda`` (or a ``torch.device``); dtype: ``auto``, ``fp32``, ``bf16``,
            ``fp16`` (non-fp32 runs under ``torch.autocast``; ``auto`` is bf16 on CUDA, fp32 on CPU).
        compile_model: regional compilation (:meth:`GPT.compile`, per block); a variant whose compile fails runs eager and
            reports ``compile_error``.
        log: optional ``print``-like callable for progress.
        map_options: query-key map options (flat spellings, e.g. ``{"n_steps": 3}``) applied to every variant
            whose map has them (a variant spec's own ``+field=value`` wins); ``ValueError`` if no selected
            variant has one of them.

    Returns:
        ``{"settings", "machine", "variants": {name: {...}}, "elapsed_s"}``; each variant has
        ``median_ms, min_ms, p10_ms, p90_ms, tokens_per_s, ratio`` (median / median of standard),
        ``paired_ratio``, ``params, overhead_percent, times_ms``; on CPU also ``cpu_median_ms, cpu_ratio,
        cpu_times_ms`` (process CPU time, all threads); and the
        compile status (``compiled, compile_s, compile_error``).

    Raises:
        ValueError: unknown variant/device/dtype, ``repeats < 1``, ``warmup < 1`` or ``seq_len`` outside
            ``[1, block_size]``.
    """
    t0 = time.perf_counter()
    names = with_baseline(variants)
    dev = device if isinstance(device, torch.device) else pick_device(device)
    dtype = resolve_dtype(dtype, dev)
    seq_len = base.block_size if seq_len is None else seq_len
    if not 1 <= seq_len <= base.block_size:
        raise ValueError(f"seq_len={seq_len} must be in [1, block_size={base.block_size}]")
    if batch_size < 1 or repeats < 1 or warmup < 1:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 1; got {batch_size}, {repeats}, {warmup}")
    log = log or (lambda *a, **k: None)
    configs = variant_configs(base, names, map_options or {})
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, base.vocab_size, (batch_size, seq_len + 1), generator=gen).to(dev)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if compile_model:
        # one compiled frame (GPT.loss) per variant: keep dynamo from giving up after the default limit
        dyn = torch._dynamo.config
        dyn.recompile_limit = max(dyn.recompile_limit, 2 * len(names))
    autocast = None if dtype == "fp32" else DTYPES[dtype]
    compile_fn = GPT.compile if compile_model else None  # regional: one graph per block structure, plain names
    runners = {n: TrainStepRunner(n, functools.partial(GPT, configs[n]), x, y, dev, seed, autocast, compile_fn)
               for n in names}

    times, cpu_times, recompiles = _time_interleaved(runners, warmup, repeats, log)
    tokens_per_step = batch_size * seq_len
    results = _variant_results(runners, configs, times, cpu_times, tokens_per_step, dev)
    return dict(
        settings=dict(
            variants=names,
            batch_size=batch_size,
            seq_len=seq_len,
            tokens_per_step=tokens_per_step,
            repeats=repeats,
            warmup=warmup,
            device=str(dev),
            dtype=dtype,
            compile=compile_model,
            recompiles_during_timing=recompiles,
            seed=seed,
            config=base.to_dict(),
            map_options=dict(map_options or {}),
        ),
        machine=machine_info(dev),
        variants=results,
        elapsed_s=time.perf_counter() - t0,
    )


def _time_interleaved(runners: dict, warmup: int, repeats: int, log) -> tuple[dict, dict, int]:
    """Warm every runner up (compiling if asked), then time ``repeats`` rounds of one step per variant, the
    order rotated each round; returns wall and process-CPU milliseconds per variant and the number of graphs
    compiled during the timed rounds (a recompile inside a timed step, issue 28 item 2)."""
    for n, r in runners.items():  # warmup, compiling if asked
        r.first_step()
        msg = f"  {n}: compiled in {r.compile_s:.1f} s" if r.compiled else f"  {n}: warm"
        log(msg + (f" (compile failed, eager: {r.compile_error})" if r.compile_error else ""))
    for _ in range(warmup - 1):
        for r in runners.values():
            r.timed_step()

    gc.collect()
    graphs_before = compiled_graphs()
    times: dict[str, list[float]] = {n: [] for n in runners}
    cpu_times: dict[str, list[float]] = {n: [] for n in runners}
    order = list(runners)
    for i in range(repeats):
        for n in order[i % len(order):] + order[: i % len(order)]:
            wall_ms, cpu_ms = runners[n].timed_step()
            times[n].append(wall_ms)
            cpu_times[n].append(cpu_ms)
        if (i + 1) % max(1, repeats // 5) == 0:
            log(f"  repeat {i + 1}/{repeats}")
    return times, cpu_times, compiled_graphs() - graphs_before


def _variant_results(runners: dict, configs: dict, times: dict, cpu_times: dict, tokens_per_step: int,
                     dev: torch.device) -> dict:
    """Per variant: step-time statistics, parameters, compile status and the ratios against ``standard``."""
    results = {}
    for n, r in runners.items():
        info = coupling_parameter_overhead(configs[n])
        results[n] = dict(
            attention=configs[n].attention,
            integrator=getattr(configs[n].qk_map, "integrator", None),
            n_steps=getattr(configs[n].qk_map, "n_steps", None),
            **step_time_stats(times[n], tokens_per_step),
            params=info["params"],
            overhead_percent=info["overhead_percent"],
            compiled=r.compiled,
            compile_s=r.compile_s,
            compile_error=r.compile_error,
            times_ms=times[n],
        )
        if dev.type == "cpu":  # CPU time of this process (all threads): less sensitive to other processes
            results[n]["cpu_median_ms"] = float(np.median(cpu_times[n]))
            results[n]["cpu_times_ms"] = cpu_times[n]
    base_median, base_times = results[BASELINE]["median_ms"], np.asarray(times[BASELINE])
    for n in runners:
        results[n]["ratio"] = results[n]["median_ms"] / base_median
        # robustness check under load: median over repeats of (variant / standard) within the same round
        results[n]["paired_ratio"] = float(np.median(np.asarray(times[n]) / base_times))
        if dev.type == "cpu":
            results[n]["cpu_ratio"] = results[n]["cpu_median_ms"] / results[BASELINE]["cpu_median_ms"]
    return results


def result_stem(preset: str, result: dict) -> str:
    """``bench-<preset>-<device>[-<dtype>][-compile]`` (the dtype only when it is not the device's default)."""
    s = result["settings"]
    device = s["device"].split(":")[0]
    parts = ["bench", preset, device]
    if s["dtype"] != resolve_dtype("auto", torch.device(device)):
        parts.append(s["dtype"])
    if s["compile"]:
        parts.append("compile")
    return "-".join(parts)


def bench_markdown(result: dict) -> str:
    """The result as markdown: settings, machine, command and one table row per variant."""
    s = result["settings"]
    c = s["config"]
    lines = [
        f"# Train-step benchmark: {result.get('preset', '?')} preset on {s['device']}",
        "",
        machine_line(result["machine"]),
        f"- command: `{result.get('command', '')}`",
        f"- model: n_layer={c['n_layer']} d_model={c['d_model']} n_heads={c['n_heads']} "
        f"vocab={c['vocab_size']}; map options for every variant (--set): {s.get('map_options') or 'none'} "
        f"(a variant spec's own options are in its name); batch {s['batch_size']} x seq {s['seq_len']} "
        f"= {s['tokens_per_step']} tokens/step; dtype {s['dtype']}; compile {'on' if s['compile'] else 'off'}"
        + (f" (graphs compiled during timed steps: {s['recompiles_during_timing']})"
           if s['compile'] and 'recompiles_during_timing' in s else ""),
        f"- step = forward + backward + AdamW step + zero_grad; {s['warmup']} warmup, median of {s['repeats']} "
        f"interleaved repeats; ratio = median / median(standard); paired ratio = median over repeats of "
        f"step / standard step in the same round; CPU-time ratio = the same from process CPU time (all threads, "
        f"CPU runs only; less sensitive to other processes); total {result['elapsed_s']:.0f} s",
        "",
        "| variant | params | overhead | median ms | p10-p90 ms | tokens/s | ratio vs standard | paired ratio "
        "| CPU-time ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in result["variants"].items():
        note = ""
        if v["compiled"] and v["compile_s"] is not None:
            note = f" (compiled, {v['compile_s']:.0f} s)"
        elif v["compile_error"]:
            note = " (eager: compile failed)"
        cpu = f"{v['cpu_ratio']:.3f}x" if "cpu_ratio" in v else "-"
        lines.append(
            f"| {name}{note} | {v['params']:,} | {v['overhead_percent']:+.3f}% | {v['median_ms']:.1f} | "
            f"{v['p10_ms']:.1f}-{v['p90_ms']:.1f} | {v['tokens_per_s']:,.0f} | {v['ratio']:.3f}x | {v['paired_ratio']:.3f}x | {cpu} |"
        )
    errors = {n: v["compile_error"] for n, v in result["variants"].items() if v["compile_error"]}
    if errors:
        lines += ["", "Compile failures (these variants ran eager):", ""]
        lines += [f"- {n}: `{e}`" for n, e in errors.items()]
    return "\n".join(lines) + "\n"


def write_results(result: dict, out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``out_dir`` (created); returns both paths."""
    json_path, md_path = write_report(out_dir, Report(json={f"{stem}.json": result},
                                                      text={f"{stem}.md": bench_markdown(result)}))
    return json_path, md_path
