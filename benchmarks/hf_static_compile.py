"""Hugging Face ``generate`` with a static cache, eager and compiled: decoding time per token and what Dynamo
compiled, for ``standard`` and coupled variants.

For each variant (tiny preset, random weights), greedy ``generate`` of one prompt ``(B, P)`` with
``max_new_tokens = N`` is timed in three modes, interleaved over repeats with a rotated start:
``dynamic`` (the default ``DynamicCache``, eager), ``static`` (``cache_implementation="static"``, eager) and
``static-compiled`` (the same, with ``compile_config=CompileConfig(backend="inductor", fullgraph=True)`` and
``_compile_all_devices`` so that ``generate`` compiles the forward on CPU too, as it does on GPU by default).
A run with ``max_new_tokens = 1`` (prefill and one token) is timed next to each, and
``(t(N) - t(1)) / (N - 1)`` is the time per decoded token. Ratios are per repeat (time / ``standard``'s time
in the same repeat and mode), medians with min-max. Dynamo's counters (graphs, graph breaks) are recorded
after the warm-up: one graph per variant means the decoding step never recompiled.

    OMP_NUM_THREADS=1 python benchmarks/hf_static_compile.py --out benchmarks/results/hf-static-compile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from coupled_qk import GPT, GPTConfig
from coupled_qk.experiments.bench.machine import machine_info
from coupled_qk.hf import CoupledQKForCausalLM
from coupled_qk.models.specs import variant_overrides

MODES = ("dynamic", "static", "static-compiled")


def build(variant: str, block_size: int) -> CoupledQKForCausalLM:
    torch.manual_seed(0)
    cfg = GPTConfig.from_preset("tiny", block_size=block_size, **variant_overrides(variant))
    return CoupledQKForCausalLM.from_gpt(GPT(cfg).eval(), pad_token_id=0)


def generate_s(model, prompt: torch.Tensor, new: int, mode: str, fullgraph: bool = True) -> tuple[float, torch.Tensor]:
    from transformers import CompileConfig

    kw = {}
    if mode != "dynamic":
        kw["cache_implementation"] = "static"
    if mode == "static-compiled":
        config = CompileConfig(backend="inductor", mode=None, fullgraph=fullgraph)
        config._compile_all_devices = True
        kw["compile_config"] = config
    else:
        kw["disable_compile"] = True
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="standard,coupled,coupled_leapfrog")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-fullgraph", action="store_true", help="compile with fullgraph=False (graph breaks allowed)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    variants = a.variants.split(",")
    models = {v: build(v, a.prefix + a.new_tokens + 8) for v in variants}
    prompt = torch.randint(1, 8192, (a.batch, a.prefix), generator=torch.Generator().manual_seed(0))
    cells = [(v, m) for v in variants for m in MODES]
    torch._dynamo.reset()
    counters.clear()
    compile_s, tokens = {}, {}
    for v, m in cells:  # warm-up: the compiled cells compile here (the counters are read after this loop)
        t, out = generate_s(models[v], prompt, a.new_tokens, m, not a.no_fullgraph)
        if m == "static-compiled":
            compile_s[v] = t
        tokens[(v, m)] = out
    graphs = dict(unique_graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(counters["graph_break"].values()))
    same = {v: all(torch.equal(tokens[(v, m)], tokens[(v, "dynamic")]) for m in MODES) for v in variants}
    per_token = {c: [] for c in cells}
    for r in range(a.repeats):
        for v, m in cells[r % len(cells) :] + cells[: r % len(cells)]:
            t1, _ = generate_s(models[v], prompt, 1, m, not a.no_fullgraph)
            tn, _ = generate_s(models[v], prompt, a.new_tokens, m, not a.no_fullgraph)
            per_token[(v, m)].append((tn - t1) / (a.new_tokens - 1))
    graphs_after = dict(
        unique_graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(counters["graph_break"].values())
    )
    rows = []
    for v, m in cells:
        ms = [x * 1e3 for x in per_token[(v, m)]]
        row = dict(variant=v, mode=m, ms_per_token=statistics.median(ms), ms_all=[round(x, 4) for x in ms])
        if v != "standard":
            ratios = [x / y for x, y in zip(per_token[(v, m)], per_token[("standard", m)])]
            row["ratio_to_standard"] = dict(median=statistics.median(ratios), min=min(ratios), max=max(ratios))
        if m != "dynamic":
            ratios = [x / y for x, y in zip(per_token[(v, m)], per_token[(v, "dynamic")])]
            row["ratio_to_dynamic"] = dict(median=statistics.median(ratios), min=min(ratios), max=max(ratios))
        rows.append(row)
        rr = row.get("ratio_to_standard", {}).get("median", 1.0)
        print(f"{v:18s} {m:16s} {row['ms_per_token']:.3f} ms/token  x{rr:.3f} of standard", flush=True)
    result = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/hf_static_compile.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        machine=machine_info(torch.device("cpu")),
        torch=torch.__version__,
        batch=a.batch,
        prefix=a.prefix,
        new_tokens=a.new_tokens,
        repeats=a.repeats,
        first_compiled_generate_s=compile_s,
        dynamo_after_warmup=graphs,
        dynamo_after_timing=graphs_after,
        same_tokens_as_dynamic=same,
        rows=rows,
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"graphs after warm-up {graphs}, after timing {graphs_after}; same tokens {same}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
