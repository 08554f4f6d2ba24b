"""Hugging Face ``generate`` speed of coupled-qk models: cached (``DynamicCache``) vs uncached, coupled vs standard.

For every prefix length P and every variant, greedy ``CoupledQKForCausalLM.generate`` of one prompt
``(1, P)`` is timed with ``max_new_tokens = 1`` (prefill + one token) and ``max_new_tokens = 1 + N``;
``(t(1 + N) - t(1)) / N`` is the decoding time per token after the prefill, and ``(1 + N) / t(1 + N)`` the
end-to-end tokens/s. Rounds interleave every (variant, cache) cell with a rotated start; medians over
rounds, ratios as the median of per-round ratios with their min-max. Random weights (speed does not depend
on them); tiny preset with ``block_size`` raised to fit the longest prefix.

    OMP_NUM_THREADS=1 python benchmarks/hf_generate.py --out-dir benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.experiments.bench.machine import machine_info
from coupled_qk.hf import CoupledQKForCausalLM
from coupled_qk.models.specs import variant_overrides


def build(variant: str, block_size: int) -> CoupledQKForCausalLM:
    torch.manual_seed(0)
    cfg = GPTConfig.from_preset("tiny", block_size=block_size, **variant_overrides(variant))
    return CoupledQKForCausalLM.from_gpt(GPT(cfg).eval())


def timed_generate(model, prompt: torch.Tensor, new: int, use_cache: bool) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=use_cache, pad_token_id=0
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] == prompt.shape[1] + new
    return dt


def step_times(model, prompt: torch.Tensor, steps: int) -> tuple[list[float], float]:
    """Seconds of each of ``steps`` single-token cached forwards after a prefix ``prompt`` (1, P) is in a
    ``DynamicCache``, and of one uncached forward of the whole ``(1, P + 1)`` sequence."""
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prompt, cache=cache, logits_to_keep=1)
        token = prompt[:, -1:]
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            model(token, cache=cache, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model(torch.cat([prompt, token], 1), use_cache=False, logits_to_keep=1)
        full = time.perf_counter() - t0
    return times, full


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", default="32,64,128,256,448")
    p.add_argument("--variants", default="standard,coupled")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out-dir", default="benchmarks/results")
    a = p.parse_args(argv)
    prefixes = [int(x) for x in a.prefixes.split(",")]
    variants = a.variants.split(",")
    block = max(prefixes) + max(a.new_tokens, 8) + 1
    load_before = os.getloadavg()
    models = {v: build(v, block) for v in variants}
    cells = [(v, c) for v in variants for c in (True, False)]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for P in prefixes:
        prompt = torch.randint(1, 8192, (1, P), generator=gen)
        for v, c in cells:  # warm-up
            timed_generate(models[v], prompt, 2, c)
        t1 = {cell: [] for cell in cells}
        tn = {cell: [] for cell in cells}
        steps = {v: [] for v in variants}
        full = {v: [] for v in variants}
        for r in range(a.repeats):
            order = cells[r % len(cells) :] + cells[: r % len(cells)]
            for v, c in order:
                t1[(v, c)].append(timed_generate(models[v], prompt, 1, c))
                tn[(v, c)].append(timed_generate(models[v], prompt, 1 + a.new_tokens, c))
                if c:
                    st, f = step_times(models[v], prompt, 8)
                    steps[v] += st
                    full[v].append(f)
        for v, c in cells:
            one, many = np.array(t1[(v, c)]), np.array(tn[(v, c)])
            per_token = (many - one) / a.new_tokens
            extra = {}
            if c:
                extra = dict(
                    forward_step_ms=float(np.median(steps[v]) * 1e3),
                    forward_step_ms_p10_p90=np.percentile(np.array(steps[v]) * 1e3, [10, 90]).round(4).tolist(),
                )
            else:
                extra = dict(forward_full_ms=float(np.median(full[v]) * 1e3))
            rows.append(
                dict(
                    prefix=P,
                    variant=v,
                    cache=c,
                    per_token_ms=float(np.median(per_token) * 1e3),
                    **extra,
                    per_token_ms_all=(per_token * 1e3).round(4).tolist(),
                    tokens_per_s=float(np.median((1 + a.new_tokens) / many)),
                    total_s_all=many.round(5).tolist(),
                    prefill_s_all=one.round(5).tolist(),
                )
            )
        print(
            f"P={P}: "
            + ", ".join(
                f"{r['variant']}{'+cache' if r['cache'] else ''} {r['per_token_ms']:.2f} ms/tok"
                for r in rows
                if r["prefix"] == P
            ),
            flush=True,
        )

    def cell(P, v, c):
        return next(r for r in rows if (r["prefix"], r["variant"], r["cache"]) == (P, v, c))

    def ratio(num, den):
        x = np.array(num["total_s_all"]) / np.array(den["total_s_all"])
        return dict(median=float(np.median(x)), min=float(x.min()), max=float(x.max()))

    summary = {}
    for P in prefixes:
        s = {}
        for v in variants:
            s[f"{v}: uncached / cached time"] = ratio(cell(P, v, False), cell(P, v, True))
        if "standard" in variants:
            for v in variants:
                if v != "standard":
                    for c in (True, False):
                        s[f"{v} / standard time ({'cached' if c else 'uncached'})"] = ratio(
                            cell(P, v, c), cell(P, "standard", c)
                        )
        summary[P] = s
    result = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/hf_generate.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        machine=machine_info(torch.device("cpu")),
        load_average=[load_before, os.getloadavg()],
        preset="tiny",
        block_size=block,
        new_tokens=a.new_tokens,
        repeats=a.repeats,
        rows=rows,
        ratios=summary,
    )
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf-generate-tiny-cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "hf-generate-tiny-cpu.md").write_text(markdown(result, prefixes, variants))
    print(markdown(result, prefixes, variants))
    return 0


def markdown(result: dict, prefixes: list[int], variants: list[str]) -> str:
    m = result["machine"]
    lines = [
        f"# HF generate, tiny preset (block_size {result['block_size']}), CPU, batch 1, greedy",
        "",
        f"Machine: {m['cpu']}, {m['cpu_count']} cores, torch {m['torch']}, {m['threads']} thread(s). "
        f"Command: `{result['command']}`. Medians over {result['repeats']} interleaved rounds; "
        f"{result['new_tokens']} new tokens after the prefix. 1-minute load average at start and end: "
        f"{result['load_average'][0][0]:.1f}, {result['load_average'][1][0]:.1f}.",
        "",
        "Decoding time per new token inside `generate` (ms, after the prefill) and end-to-end tokens/s:",
        "",
        "| prefix | " + " | ".join(f"{v} cached | {v} uncached" for v in variants) + " |",
        "|---:|" + "---:|---:|" * len(variants),
    ]
    for P in prefixes:
        cells = []
        for v in variants:
            for c in (True, False):
                r = next(r for r in result["rows"] if (r["prefix"], r["variant"], r["cache"]) == (P, v, c))
                cells.append(f"{r['per_token_ms']:.2f} ms ({r['tokens_per_s']:.0f} tok/s)")
        lines.append(f"| {P} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Model forward alone: one cached single-token step (`DynamicCache`, median [p10, p90] over "
        f"{8 * result['repeats']} steps) vs one uncached forward of the whole sequence (ms):",
        "",
        "| prefix | " + " | ".join(f"{v} cached step | {v} uncached full" for v in variants) + " |",
        "|---:|" + "---:|---:|" * len(variants),
    ]
    for P in prefixes:
        cells = []
        for v in variants:
            r = next(r for r in result["rows"] if (r["prefix"], r["variant"], r["cache"]) == (P, v, True))
            lo, hi = r["forward_step_ms_p10_p90"]
            cells.append(f"{r['forward_step_ms']:.2f} [{lo:.2f}, {hi:.2f}]")
            r = next(r for r in result["rows"] if (r["prefix"], r["variant"], r["cache"]) == (P, v, False))
            cells.append(f"{r['forward_full_ms']:.2f}")
        lines.append(f"| {P} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Time ratios of whole `generate` calls (median of per-round ratios, [min, max]):",
        "",
        "| prefix | ratio | median | range |",
        "|---:|---|---:|---|",
    ]
    for P in prefixes:
        for name, r in result["ratios"][P].items():
            lines.append(f"| {P} | {name} | {r['median']:.2f} | [{r['min']:.2f}, {r['max']:.2f}] |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
