"""In-process A/B of one attention layer's training step: the map on head-major copies of q, k or on views.

One ``CausalSelfAttention`` (RoPE, SDPA) per arm, forward + backward on the same random input, arms
round-robin with the starting arm rotated each repeat. Arms: ``standard``, and ``coupled`` / ``coupled_leapfrog``
with ``copy_map_inputs`` on (the CPU default since issue 12) and off (the projection's strided views). Reported:
median time per arm and, against ``standard`` and between the two settings of each variant, the paired ratio
(median over repeats of time / the other arm's time in the same repeat) with a 95% bootstrap interval. A layer
step isolates the map's cost from the rest of a training step (embedding, MLP, LM head, AdamW), whose
run-to-run noise on a shared VM is larger than the effect.

    python benchmarks/layer_ab.py --shape tiny --threads 1 --repeats 60
    python benchmarks/layer_ab.py --shape 60m --threads 1 --repeats 25

Writes ``benchmarks/results/issue12/layer-ab-<shape>-cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from coupled_qk.experiments.bench import machine_info, machine_line
from coupled_qk.experiments.bench_decode import paired_ratio
from coupled_qk.layers.attention import CausalSelfAttention
from coupled_qk.layers.qk_maps import QKDynamics
from coupled_qk.ops.rope import rope_tables

SHAPES = {"tiny": dict(d_model=128, n_heads=4, batch=16, seq=128), "60m": dict(d_model=512, n_heads=8, batch=2, seq=512)}
"""Layer shapes of the ``tiny`` and ``60m`` presets with the batches of ``benchmarks/cpu_round.sh``."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--out-dir", default="benchmarks/results/issue12")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    s = SHAPES[args.shape]
    d_head = s["d_model"] // s["n_heads"]
    rope = rope_tables(s["seq"], d_head, 10000.0)
    torch.manual_seed(0)

    def layer(integrator=None):
        qk_map = None if integrator is None else (lambda d, h: QKDynamics(d, h, integrator=integrator))
        return CausalSelfAttention(s["d_model"], s["n_heads"], s["n_heads"], d_head, qk_map=qk_map)

    layers = {"standard": layer(), "coupled": layer("euler"), "coupled_leapfrog": layer("leapfrog")}
    arms = [("standard", True)] + [(n, c) for n in ("coupled", "coupled_leapfrog") for c in (True, False)]
    x = torch.randn(s["batch"], s["seq"], s["d_model"], requires_grad=True)
    grad = torch.randn_like(x)

    def step(name, copy):
        m = layers[name]
        m.copy_map_inputs = copy
        start = time.perf_counter()
        m(x, rope).backward(grad)
        return time.perf_counter() - start

    for arm in arms:  # warm-up
        step(*arm), step(*arm)
    times = {arm: [] for arm in arms}
    for r in range(args.repeats):
        for i in range(len(arms)):
            arm = arms[(i + r) % len(arms)]
            times[arm].append(step(*arm))
    label = {arm: arm[0] + ("" if arm[0] == "standard" else (" (copies)" if arm[1] else " (views)")) for arm in arms}
    base = times[("standard", True)]
    rows = []
    for arm in arms:
        row = dict(arm=label[arm], median_ms=1000 * float(np.median(times[arm])),
                   vs_standard=paired_ratio(times[arm], base), times_ms=[1000 * t for t in times[arm]])
        if arm[0] != "standard" and arm[1]:
            row["copies_vs_views"] = paired_ratio(times[arm], times[(arm[0], False)])
        rows.append(row)
    command = "python benchmarks/layer_ab.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = dict(shape=args.shape, layer=s, repeats=args.repeats, command=command,
                  machine=machine_info(torch.device("cpu")), arms=rows)
    fmt = "{median:.3f}x [{lo:.3f}, {hi:.3f}]".format
    lines = [f"# One attention layer, forward + backward: {args.shape} shape on CPU", "",
             machine_line(result["machine"]), f"- command: `{command}`",
             f"- layer: d_model={s['d_model']} n_heads={s['n_heads']}, batch {s['batch']} x seq {s['seq']}; "
             f"{args.repeats} interleaved repeats; ratios: median over repeats of the paired time ratio [95% bootstrap]",
             "", "| arm | median ms | vs standard | copies vs views |", "|---|---:|---:|---:|"]
    for row in rows:
        cv = fmt(**row["copies_vs_views"]) if "copies_vs_views" in row else ""
        lines.append(f"| {row['arm']} | {row['median_ms']:.2f} | {fmt(**row['vs_standard'])} | {cv} |")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"layer-ab-{args.shape}-cpu"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
