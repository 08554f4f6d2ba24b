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

import functools
import gc
import time
from pathlib import Path

import numpy as np
import torch

from coupled_qk.devices import AUTOCAST_DTYPES, TORCH_DTYPES
from coupled_qk.experiments.bench.machine import compiled_graphs, machine_info, report_header
from coupled_qk.experiments.bench.step import TrainStepRunner, step_time_stats
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT, coupling_parameter_overhead
from coupled_qk.models.registry import OPTION_ALIASES, get_attention
from coupled_qk.models.specs import parse_variants, variant_overrides
from coupled_qk.study.executor import Report, write_report
from coupled_qk.training.distributed import pick_device, warn_if_emulated

BASELINE = "standard"


def with_baseline(text: str | list[str] | None) -> list[str]:
    """Variant specs (see :mod:`coupled_qk.models.specs`) with ``standard`` always first; ``None``/``"all"`` -> the
    paper's variants and baselines.

    Raises:
        ValueError: an unknown variant (the message lists the valid ones).
    """
    names = parse_variants(text)
    return [BASELINE] + [n for n in names if n != BASELINE]


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` (autocast) on CUDA, ``fp32`` elsewhere; otherwise the name, checked. An explicit
    ``bf16`` / ``fp16`` on a CPU without it natively is measured as asked, with the training loop's
    ``RuntimeWarning`` (:func:`~coupled_qk.training.distributed.warn_if_emulated`: emulated, several times slower).

    Raises:
        ValueError: an unknown name.
    """
    if name == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {list(AUTOCAST_DTYPES)}")
    warn_if_emulated(name, device)
    return name


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
        variants: variant specs of :mod:`coupled_qk.models.specs` (list or comma-separated); ``standard`` is always
        included.
        batch_size, seq_len: tokens per step (``seq_len`` defaults to ``base.block_size``).
        repeats: timed steps per variant (medians over these); warmup: untimed steps per variant first (at
            least 1: the first step compiles when ``compile_model``).
        device: ``auto``, ``cpu``, ``cuda`` (or a ``torch.device``); dtype: ``auto``, ``fp32``, ``bf16``,
            ``fp16`` (non-fp32 runs under ``torch.autocast``; ``auto`` is bf16 on CUDA, fp32 on CPU).
        compile_model: regional compilation (:meth:`GPT.compile`, per block); a variant whose compile fails runs eager
        and
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
    _check_sizes(base, batch_size, seq_len, repeats, warmup)
    log = log or (lambda *a, **k: None)
    configs = variant_configs(base, names, map_options or {})
    runners = _build_runners(configs, names, base.vocab_size, batch_size, seq_len, dev, dtype, compile_model, seed)
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


def _check_sizes(base: GPTConfig, batch_size: int, seq_len: int, repeats: int, warmup: int) -> None:
    """``ValueError`` for a ``seq_len`` outside ``[1, block_size]`` or a ``batch_size``, ``repeats`` or
    ``warmup`` below 1."""
    if not 1 <= seq_len <= base.block_size:
        raise ValueError(f"seq_len={seq_len} must be in [1, block_size={base.block_size}]")
    if batch_size < 1 or repeats < 1 or warmup < 1:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 1; got {batch_size}, {repeats}, {warmup}")


def _build_runners(
    configs: dict[str, GPTConfig],
    names: list[str],
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    dev: torch.device,
    dtype: str,
    compile_model: bool,
    seed: int,
) -> dict[str, TrainStepRunner]:
    """One :class:`TrainStepRunner` per variant, all on the same random batch ``(batch_size, seq_len)`` drawn
    from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen).to(dev)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if compile_model:
        # one compiled frame (GPT.loss) per variant: keep dynamo from giving up after the default limit
        dyn = torch._dynamo.config
        dyn.recompile_limit = max(dyn.recompile_limit, 2 * len(names))
    autocast = None if dtype == "fp32" else TORCH_DTYPES[dtype]
    compile_fn = GPT.compile if compile_model else None  # regional: one graph per block structure, plain names
    return {
        n: TrainStepRunner(n, functools.partial(GPT, configs[n]), x, y, dev, seed, autocast, compile_fn) for n in names
    }


def _time_interleaved(runners: dict, warmup: int, repeats: int, log) -> tuple[dict, dict, int]:
    """Warm every runner up (compiling if asked), then time ``repeats`` rounds of one step per variant, the
    order rotated each round; returns wall and process-CPU milliseconds per variant and the number of graphs
    compiled during the timed rounds (a recompile inside a timed step)."""
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
        for n in order[i % len(order) :] + order[: i % len(order)]:
            wall_ms, cpu_ms = runners[n].timed_step()
            times[n].append(wall_ms)
            cpu_times[n].append(cpu_ms)
        if (i + 1) % max(1, repeats // 5) == 0:
            log(f"  repeat {i + 1}/{repeats}")
    return times, cpu_times, compiled_graphs() - graphs_before


def _variant_results(
    runners: dict, configs: dict, times: dict, cpu_times: dict, tokens_per_step: int, dev: torch.device
) -> dict:
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
        *report_header("Train-step", result),
        f"- model: n_layer={c['n_layer']} d_model={c['d_model']} n_heads={c['n_heads']} "
        f"vocab={c['vocab_size']}; map options for every variant (--set): {s.get('map_options') or 'none'} "
        f"(a variant spec's own options are in its name); batch {s['batch_size']} x seq {s['seq_len']} "
        f"= {s['tokens_per_step']} tokens/step; dtype {s['dtype']}; compile {'on' if s['compile'] else 'off'}"
        + (
            f" (graphs compiled during timed steps: {s['recompiles_during_timing']})"
            if s["compile"] and "recompiles_during_timing" in s
            else ""
        ),
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
            f"{v['p10_ms']:.1f}-{v['p90_ms']:.1f} | {v['tokens_per_s']:,.0f} | {v['ratio']:.3f}x | "
            f"{v['paired_ratio']:.3f}x | {cpu} |"
        )
    errors = {n: v["compile_error"] for n, v in result["variants"].items() if v["compile_error"]}
    if errors:
        lines += ["", "Compile failures (these variants ran eager):", ""]
        lines += [f"- {n}: `{e}`" for n, e in errors.items()]
    return "\n".join(lines) + "\n"


def write_results(result: dict, out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``out_dir`` (created); returns both paths."""
    json_path, md_path = write_report(
        out_dir, Report(json={f"{stem}.json": result}, text={f"{stem}.md": bench_markdown(result)})
    )
    return json_path, md_path
