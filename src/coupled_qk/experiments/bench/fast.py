"""``coupled-qk bench --mode fastpath``: the compiled fast path against eager, fp32 against bf16, every variant
against ``standard``, and two peers, measured interleaved in one run.

Train step (forward with next-token loss, backward, AdamW step, zero_grad; one fixed random batch): one
runner per (model, mode); a model is a variant of :mod:`coupled_qk.models.specs` or a peer built from
``transformers`` at the same dimensions (``gpt2``: ``GPT2LMHeadModel``, learned positions, GELU MLP;
``llama``: ``LlamaForCausalLM``, RoPE, SwiGLU MLP with the same ``d_ff``, hence three MLP matrices instead of
two: see the ``params`` column); a mode is ``eager`` or ``compiled`` (regional: :meth:`GPT.compile` for our
models, ``nn.Module.compile`` of every decoder layer for the peers) times ``fp32`` or ``bf16`` (autocast,
fp32 weights). After the untimed warmup steps (the first compiles; its wall time is ``compile_s``), every
repeat times one step of every runner in round-robin order, rotated by one runner per repeat. Reported per
runner: median and p10-p90 step time, tokens/s, ``ratio`` = median / median of ``standard`` in the same mode,
``speedup`` = median of ``standard`` eager fp32 / median, and achieved model FLOP/s (FLOPs of
:func:`coupled_qk.experiments.bench.cost_curve.train_step_flops`) against the matrix-multiply peak measured in the
same run at the model's MLP shapes in the runner's dtype (``mfu``).

Decode (cached greedy decoding, fp32): for each (batch, prefix) cell, after an untimed prefill, the time of
``new_tokens`` single-token steps: our models eager (:meth:`GPT.next_token_logits` with a :class:`KVCache`)
and compiled (:meth:`GPT.compiled_decode_step` over a :class:`StaticKVCache`), the peers eager (their own
``DynamicCache``); runners interleaved per repeat; ``ratio`` = median / median of ``standard`` in the same
mode.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import torch
import torch.nn as nn

from coupled_qk.experiments.bench.decode import decode_seconds, fitting_cells
from coupled_qk.experiments.bench.machine import compiled_graphs, machine_info, report_header, sync_device
from coupled_qk.experiments.bench.step import TrainStepRunner, step_time_stats
from coupled_qk.experiments.bench.train import BASELINE, variant_configs, with_baseline
from coupled_qk.layers.kv_cache import StaticKVCache
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.generation import static_capacity
from coupled_qk.models.gpt import GPT
from coupled_qk.training.distributed import native_bf16, pick_device

MODES = ("eager-fp32", "compiled-fp32", "eager-bf16", "compiled-bf16")
"""Train-step modes: execution (``eager``, ``compiled``) x precision (``fp32``, ``bf16`` autocast)."""
PEERS = ("gpt2", "llama")
"""Peers built from ``transformers`` at the same dimensions."""


def _check_choices(flag: str, values: list[str], allowed: tuple[str, ...]) -> list[str]:
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{flag}: unknown {bad}; expected a subset of {list(allowed)}")
    return values


def peer_model(name: str, c: GPTConfig) -> nn.Module:
    """A ``transformers`` causal LM with the dimensions of ``c`` (layers, width, heads, key/value heads, ``d_ff``,
    vocabulary, context), tied embeddings, no dropout, SDPA attention, randomly initialised.

    Raises:
        ValueError: an unknown peer name.
    """
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=c.vocab_size,
            n_positions=c.block_size,
            n_embd=c.d_model,
            n_layer=c.n_layer,
            n_head=c.n_heads,
            n_inner=c.d_ff,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=None,
        )
        cfg._attn_implementation = "sdpa"
        return GPT2LMHeadModel(cfg)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.d_model,
            intermediate_size=c.d_ff,
            num_hidden_layers=c.n_layer,
            num_attention_heads=c.n_heads,
            num_key_value_heads=c.n_kv_heads,
            head_dim=c.d_head,
            max_position_embeddings=c.block_size,
            rope_theta=c.rope_base,
            tie_word_embeddings=True,
            attention_dropout=0.0,
        )
        cfg._attn_implementation = "sdpa"
        return LlamaForCausalLM(cfg)
    raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")


def _peer_layers(model: nn.Module) -> nn.ModuleList:
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def model_step_flops(name: str, config: GPTConfig, batch_size: int, seq_len: int) -> int:
    """FLOPs of one training step of variant or peer ``name`` (:func:`train_step_flops` counting rules; the
    Llama peer adds its third MLP matrix, ``2 d_model d_ff`` per token and layer, forward)."""
    from coupled_qk.experiments.bench.cost_curve import train_step_flops

    if name in PEERS:
        flops = train_step_flops(config.replace(attention="standard"), batch_size, seq_len)["step"]
        if name == "llama":
            flops += 3 * batch_size * seq_len * config.n_layer * 2 * config.d_model * config.d_ff
        return int(flops)
    return int(train_step_flops(config, batch_size, seq_len)["step"])


def matmul_peak(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, repeats: int = 9) -> float:
    """Measured matrix-multiply throughput in FLOP/s: the median over ``repeats`` of ``(m, k) @ (k, n)`` in
    ``dtype`` (``2 m k n`` FLOPs each; one untimed call first)."""
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        sync_device(device)
        start = time.perf_counter()
        a @ b
        sync_device(device)
        times.append(time.perf_counter() - start)
    return 2.0 * m * k * n / float(np.median(times))


def train_runner(name: str, mode: str, config: GPTConfig, x, y, device, seed: int, backend: str) -> TrainStepRunner:
    """The :class:`TrainStepRunner` of one (model, mode): a variant's :class:`GPT` or a peer's model
    (:func:`peer_model`), compiled per block with ``backend`` for the ``compiled-*`` modes, under bf16 autocast
    for the ``*-bf16`` modes. Its ``mode`` attribute is set to ``mode``."""
    compiled, dtype = mode.split("-")[0] == "compiled", mode.split("-")[1]

    def build() -> nn.Module:
        return peer_model(name, config) if name in PEERS else GPT(config)

    def compile_model(model: nn.Module) -> None:
        if isinstance(model, GPT):
            model.compile(backend=backend)
        else:
            for layer in _peer_layers(model):
                layer.compile(backend=backend)

    runner = TrainStepRunner(
        name,
        build,
        x,
        y,
        device,
        seed,
        torch.bfloat16 if dtype == "bf16" else None,
        compile_model if compiled else None,
    )
    runner.mode = mode
    return runner


def _native_modes(dev: torch.device, bf16: bool, log) -> list[str]:
    """The default modes of :func:`run_fastpath`: every one of :data:`MODES` that ``dev`` computes natively (the bf16
    modes only where ``bf16``, :func:`~coupled_qk.training.distributed.native_bf16`), logging the choice when it
    leaves modes out."""
    modes = [m for m in MODES if not m.endswith("bf16") or bf16]
    if len(modes) < len(MODES):
        flags = " (no avx512_bf16/amx_bf16 flag)" if dev.type == "cpu" else ""
        log(
            f"fastpath: this {dev.type} has no native bf16{flags}: measuring "
            f"{', '.join(modes)} (--modes with a bf16 mode asks for it and is refused here)"
        )
    return modes


def _measure_train_steps(
    base, configs, names, peers, modes, shape, batch_size, seq_len, dev, seed, warmup, repeats, backend, log
):
    """The train-step half of :func:`run_fastpath`: build and warm every runner (``names + peers`` x ``modes``), time
    them in interleaved rounds with the ``shape`` matmul reference, and free them. Returns ``(train results per
    runner, peak memory per runner, recompiles during timing)``."""
    runners = _warm_runners(
        names + peers, modes, configs, base.vocab_size, batch_size, seq_len, dev, seed, warmup, backend, log
    )
    times, peak, recompiles = _time_rounds(runners, modes, shape, dev, repeats, log)
    train = _train_results(runners, times, configs, peers, peak, batch_size, seq_len)
    del runners
    gc.collect()
    return train, peak, recompiles


def run_fastpath(
    base: GPTConfig,
    variants=None,
    modes=None,
    peers=PEERS,
    batch_size: int = 16,
    seq_len: int | None = None,
    repeats: int = 5,
    warmup: int = 2,
    device="cpu",
    seed: int = 0,
    decode: bool = True,
    decode_batch_sizes=(1, 8),
    prefixes=(128, 512),
    new_tokens: int = 32,
    decode_repeats: int = 5,
    log=None,
    backend: str = "inductor",
) -> dict:
    """Measure the train step (every variant x mode and peer x mode) and cached decoding (eager and compiled)
    interleaved, as the module docstring describes.

    Args:
        base: shared model configuration; variants: variant specs (``standard`` always included); modes: subset
            of :data:`MODES` (default ``None``: every mode the device computes natively, so the bf16 modes only
            where :func:`~coupled_qk.training.distributed.native_bf16`; the choice is logged); peers: subset of
            :data:`PEERS` (needs ``transformers``); batch_size, seq_len (default ``block_size``): the training batch;
            repeats, warmup:
            timed and untimed steps per runner (``warmup >= 1``: the first step compiles); decode: also measure decoding
            over the cells
            ``decode_batch_sizes x prefixes`` that fit ``block_size`` with ``new_tokens``; backend: the
            ``torch.compile`` backend of the compiled modes (``"eager"`` in the tests).

    Returns:
        ``{"mode": "fastpath", "settings", "machine", "train": {runner: {...}}, "decode": [cells], "peaks",
        "elapsed_s"}``; runner keys are ``"<model> <mode>"``.

    Raises:
        ValueError: unknown variants, modes or peers; ``repeats``, ``warmup``, ``batch_size`` or ``new_tokens``
            < 1; ``seq_len`` outside ``[1, block_size]``; with ``decode``, no prefix that fits ``block_size`` with
            ``new_tokens``; bf16 modes on a device without native bf16
            (:func:`~coupled_qk.training.distributed.native_bf16`).
    """
    t0 = time.perf_counter()
    log = log or (lambda *a, **k: None)
    names = with_baseline(variants)
    dev = device if isinstance(device, torch.device) else pick_device(device)
    bf16 = native_bf16(dev)  # reads /proc/cpuinfo on CPU: once per run
    modes = _check_choices("modes", list(_native_modes(dev, bf16, log) if modes is None else modes), MODES)
    peers = _check_choices("peers", list(peers), PEERS)
    seq_len = base.block_size if seq_len is None else seq_len
    _check_fastpath_sizes(base, dev, bf16, modes, seq_len, batch_size, repeats, warmup, new_tokens, decode_repeats)
    if decode:  # before minutes of training steps, not after them with an empty decoding table
        fitting_cells(decode_batch_sizes, prefixes, new_tokens, base.block_size)
    configs = variant_configs(base, names, {})
    configs.update({p: base.replace(attention="standard") for p in peers})
    shape = (batch_size * seq_len, base.d_model, base.d_ff)
    train, peak, recompiles = _measure_train_steps(
        base, configs, names, peers, modes, shape, batch_size, seq_len, dev, seed, warmup, repeats, backend, log
    )
    cells = []
    if decode:
        grid = (decode_batch_sizes, prefixes, new_tokens, decode_repeats)
        cells = _decode_cells(base, names, peers, configs, dev, seed, grid, log, backend)
    return dict(
        mode="fastpath",
        settings=dict(
            variants=names,
            modes=modes,
            peers=peers,
            batch_size=batch_size,
            seq_len=seq_len,
            tokens_per_step=batch_size * seq_len,
            repeats=repeats,
            warmup=warmup,
            device=str(dev),
            seed=seed,
            recompiles_during_timing=recompiles,
            config=base.to_dict(),
            decode_batch_sizes=list(decode_batch_sizes),
            prefixes=list(prefixes),
            new_tokens=new_tokens,
            decode_repeats=decode_repeats,
            matmul_shape=list(shape),
            backend=backend,
        ),
        machine=dict(machine_info(dev), cpu_bf16=bf16 if dev.type == "cpu" else None),
        train=train,
        peaks=peak,
        decode=cells,
        elapsed_s=time.perf_counter() - t0,
    )


def _check_fastpath_sizes(
    base: GPTConfig,
    dev: torch.device,
    bf16: bool,
    modes: list[str],
    seq_len: int,
    batch_size: int,
    repeats: int,
    warmup: int,
    new_tokens: int,
    decode_repeats: int,
) -> None:
    """:func:`run_fastpath`'s ``ValueError`` for a ``seq_len`` outside ``[1, block_size]``, a count below 1, or
    bf16 modes on a device without native bf16 (``bf16``: :func:`native_bf16` of ``dev``)."""
    if not 1 <= seq_len <= base.block_size:
        raise ValueError(f"seq_len={seq_len} must be in [1, block_size={base.block_size}]")
    if min(batch_size, repeats, warmup, new_tokens, decode_repeats) < 1:
        raise ValueError(
            "batch_size, repeats, warmup, new_tokens and decode_repeats must be >= 1; got "
            f"{batch_size}, {repeats}, {warmup}, {new_tokens}, {decode_repeats}"
        )
    if any(m.endswith("bf16") for m in modes) and not bf16:
        raise ValueError(f"modes {modes} include bf16, which this {dev.type} does not compute natively")


def _warm_runners(
    models: list[str],
    modes: list[str],
    configs: dict,
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    dev: torch.device,
    seed: int,
    warmup: int,
    backend: str,
    log,
) -> dict:
    """``{"<model> <mode>": runner}`` on one random batch drawn from ``seed``, each through its first step
    (compiling) and ``warmup - 1`` more untimed rounds."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen).to(dev)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    dyn = torch._dynamo.config
    dyn.recompile_limit = max(dyn.recompile_limit, 4 * len(models))
    runners = {}
    for m in models:
        for mode in modes:
            r = runners[f"{m} {mode}"] = train_runner(m, mode, configs[m], x, y, dev, seed, backend)
            r.first_step()
            log(
                f"  {m} {mode}: "
                + (
                    f"compiled in {r.compile_s:.1f} s"
                    if r.compiled
                    else f"eager{' (compile failed: ' + r.compile_error + ')' if r.compile_error else ''}"
                )
            )
    for _ in range(warmup - 1):
        for r in runners.values():
            r.timed_step()
    return runners


def _time_rounds(
    runners: dict, modes: list[str], shape: tuple[int, int, int], dev: torch.device, repeats: int, log
) -> tuple[dict, dict, int]:
    """``repeats`` rounds of one timed step per runner (order rotated each round), each round followed by the
    matmul peak (:func:`matmul_peak` of ``shape``) of every precision in ``modes``; returns the step times (ms)
    per runner, the median peak per precision and the graphs compiled during the rounds (should be 0)."""
    peaks: dict[str, list[float]] = {"fp32": [], "bf16": []}
    precisions = sorted({m.split("-")[1] for m in modes})
    gc.collect()
    graphs_before = compiled_graphs()
    times: dict[str, list[float]] = {k: [] for k in runners}
    keys = list(runners)
    for i in range(repeats):
        for k in keys[i % len(keys) :] + keys[: i % len(keys)]:
            times[k].append(runners[k].timed_step()[0])
        for p in precisions:  # the matmul peak, interleaved with the steps (same load)
            peaks[p].append(matmul_peak(*shape, torch.bfloat16 if p == "bf16" else torch.float32, dev, repeats=3))
        log(f"  train repeat {i + 1}/{repeats}")
    recompiles = compiled_graphs() - graphs_before  # graphs compiled inside timed steps: should be 0
    return times, {p: float(np.median(v)) for p, v in peaks.items() if v}, recompiles


def _train_results(runners: dict, times: dict, configs: dict, peers, peak: dict, batch_size: int, seq_len: int) -> dict:
    """``{"<model> <mode>": {...}}`` of :func:`run_fastpath`: each runner's step-time statistics, FLOPs and MFU
    against the measured matmul ``peak`` of its precision, and its ratios to ``standard`` in the same mode
    (``ratio`` of medians, ``paired_ratio`` median of per-repeat ratios) and ``speedup`` over standard eager
    fp32."""
    train = {}
    for k, r in runners.items():
        stats = step_time_stats(times[k], batch_size * seq_len)
        flops = model_step_flops(r.name, configs[r.name], batch_size, seq_len)
        achieved = flops / (stats["median_ms"] / 1000.0)
        train[k] = dict(
            model=r.name,
            mode=r.mode,
            peer=r.name in peers,
            params=r.params,
            **stats,
            compiled=r.compiled,
            compile_s=r.compile_s,
            compile_error=r.compile_error,
            step_flops=flops,
            achieved_flops=achieved,
            mfu=achieved / peak[r.mode.split("-")[1]],
            times_ms=times[k],
        )
    reference = train.get(f"{BASELINE} eager-fp32")
    for k, v in train.items():
        base_k = f"{BASELINE} {v['mode']}"
        v["ratio"] = v["median_ms"] / train[base_k]["median_ms"]
        v["paired_ratio"] = float(np.median(np.asarray(times[k]) / np.asarray(times[base_k])))
        v["speedup"] = None if reference is None else reference["median_ms"] / v["median_ms"]
    return train


def _decode_cells(base, names, peers, configs, dev, seed, grid: tuple, log, backend) -> list:
    """The decoding half of :func:`run_fastpath`: every model (``names`` eager and compiled, ``peers`` eager) timed
    on each cell of ``grid`` (``(batch_sizes, prefixes, new_tokens, repeats)``) that fits ``block_size``, the runs of
    a cell interleaved; one dict per cell."""
    batch_sizes, prefixes, new_tokens, repeats = grid
    models = {}
    for n in names + peers:
        torch.manual_seed(seed)
        models[n] = (peer_model(n, configs[n]) if n in peers else GPT(configs[n])).to(dev).eval()
        if n not in peers:
            models[n].compiled_decode_step(backend=backend)
    runs = [(n, "eager") for n in names + peers] + [(n, "compiled") for n in names]
    gen = torch.Generator().manual_seed(seed)
    cells = []
    for b in batch_sizes:
        for p in prefixes:
            if p + new_tokens > base.block_size:
                log(f"  decode batch {b} prefix {p}: skipped (prefix + new tokens > block_size {base.block_size})")
                continue
            prompt = torch.randint(0, base.vocab_size, (b, p), generator=gen).to(dev)
            for n, how in runs:  # warm-up (compiles the static step for this batch and capacity)
                _decode_time(models[n], how, prompt, new_tokens, dev)
            times = {r: [] for r in runs}
            for i in range(repeats):
                for r in runs[i % len(runs) :] + runs[: i % len(runs)]:
                    times[r].append(_decode_time(models[r[0]], r[1], prompt, new_tokens, dev))
            res = {}
            for (n, how), t in times.items():
                base_t = times[(BASELINE, how)]
                res[f"{n} {how}"] = dict(
                    model=n,
                    mode=how,
                    peer=n in peers,
                    ms_per_token=1000.0 * float(np.median(t)) / new_tokens,
                    p10_ms=1000.0 * float(np.percentile(t, 10)) / new_tokens,
                    p90_ms=1000.0 * float(np.percentile(t, 90)) / new_tokens,
                    ratio=float(np.median(np.asarray(t) / np.asarray(base_t))),
                    times_s=t,
                )
            cells.append(dict(batch=b, prefix=p, runs=res))
            log(f"  decode batch {b} prefix {p}: done")
    return cells


@torch.no_grad()
def _decode_time(model: nn.Module, how: str, prompt: torch.Tensor, new_tokens: int, dev) -> float:
    """Seconds for ``new_tokens`` greedy steps after an untimed prefill of ``prompt``."""
    if not isinstance(model, GPT):
        out = model(prompt, use_cache=True)  # transformers >= 5.24 (the hf extra): the cache is ``cache``
        past, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        sync_device(dev)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(nxt, cache=past, use_cache=True)
            past, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        sync_device(dev)
        return time.perf_counter() - start
    if how != "compiled":
        return decode_seconds(model, prompt, new_tokens, dev)
    total = prompt.shape[1] + new_tokens
    cache = model.new_cache(static_capacity(total, model.config.block_size))
    nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
    static, step = StaticKVCache.from_cache(cache), model.compiled_decode_step()
    sync_device(dev)
    start = time.perf_counter()
    for _ in range(new_tokens):
        nxt = step(nxt, static).argmax(-1, keepdim=True)
        static.advance()
    sync_device(dev)
    return time.perf_counter() - start


def fastpath_markdown(result: dict) -> str:
    """Markdown tables of :func:`run_fastpath`'s result (train step, then decode)."""
    s, c = result["settings"], result["settings"]["config"]
    peaks = ", ".join(f"{p} {v / 1e9:.1f} GFLOP/s" for p, v in result["peaks"].items())
    lines = [
        *report_header("Fast-path", result, f"; native CPU bf16: {result['machine'].get('cpu_bf16')}"),
        f"- model: n_layer={c['n_layer']} d_model={c['d_model']} n_heads={c['n_heads']} d_ff={c['d_ff']} "
        f"vocab={c['vocab_size']}; train batch {s['batch_size']} x seq {s['seq_len']}; {s['warmup']} warmup, "
        f"median of {s['repeats']} interleaved repeats; graphs compiled during timed steps: "
        f"{s.get('recompiles_during_timing', '?')}; total {result['elapsed_s']:.0f} s",
        f"- ratio = median / median of standard in the same mode; speedup = standard eager-fp32 / this; MFU = model "
        f"FLOP/s / matmul peak measured in the same run at (M, K, N) = {tuple(s['matmul_shape'])} "
        f"({peaks})",
        "",
        "| model | mode | params | compile s | median ms | p10-p90 ms | tokens/s | ratio vs standard | speedup | "
        "GFLOP/s | MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in result["train"].values():
        comp = f"{v['compile_s']:.0f}" if v["compile_s"] is not None else ("failed" if v["compile_error"] else "-")
        speed = f"{v['speedup']:.2f}x" if v["speedup"] is not None else "-"
        name = f"{v['model']} (peer)" if v["peer"] else v["model"]
        lines.append(
            f"| {name} | {v['mode']} | {v['params']:,} | {comp} | {v['median_ms']:.1f} | "
            f"{v['p10_ms']:.1f}-{v['p90_ms']:.1f} | {v['tokens_per_s']:,.0f} | {v['ratio']:.3f}x | {speed} | "
            f"{v['achieved_flops'] / 1e9:.1f} | {100 * v['mfu']:.0f}% |"
        )
    if result["decode"]:
        lines += [
            "",
            f"Cached greedy decoding (fp32), {s['new_tokens']} timed tokens after an untimed prefill, median "
            f"of {s['decode_repeats']} interleaved repeats; ratio = median over repeats of time / standard's time "
            "in the same mode (eager or compiled)",
            "",
            "| batch | prefix | model | mode | ms/token | p10-p90 | ratio vs standard |",
            "|---:|---:|---|---|---:|---:|---:|",
        ]
        for cell in result["decode"]:
            for v in cell["runs"].values():
                name = f"{v['model']} (peer)" if v["peer"] else v["model"]
                lines.append(
                    f"| {cell['batch']} | {cell['prefix']} | {name} | {v['mode']} | {v['ms_per_token']:.2f} | "
                    f"{v['p10_ms']:.2f}-{v['p90_ms']:.2f} | {v['ratio']:.3f}x |"
                )
    return "\n".join(lines) + "\n"
