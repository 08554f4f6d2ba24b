"""A/B of the fused one-step integrators (coupled_qk.ops.fused_dynamics) against the reference autograd path.

One process, the same models and batch; every round times one training step (forward, backward, AdamW) of
standard, Euler and leapfrog with the fused path on and off (``set_fused``), in a rotated order. Reported: the
median step time, the paired ratio to standard and the paired ratio fused / reference (median over rounds,
with the 10th-90th percentile of the per-round ratios).

    python benchmarks/fused_ab.py --preset tiny --threads 1 --rounds 20 --out benchmarks/results/fused-ab-tiny.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.models.variants import variant_overrides
from coupled_qk.ops.fused_dynamics import set_fused

CASES = [("standard", True), ("coupled", True), ("coupled", False), ("coupled_leapfrog", True),
         ("coupled_leapfrog", False)]


def _spread(values: list[float]) -> tuple[float, float, float]:
    deciles = statistics.quantiles(values, n=10)
    return statistics.median(values), deciles[0], deciles[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-size", type=int, default=None, help="default 16 (tiny) or 2 (other presets)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None, help="JSON file for the raw times and the summary")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    batch = args.batch_size or (16 if args.preset == "tiny" else 2)
    setups = {}
    for variant in ("standard", "coupled", "coupled_leapfrog"):
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_preset(args.preset, **variant_overrides(variant)))
        setups[variant] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    seq = setups["standard"][0].config.block_size
    tokens = torch.randint(0, setups["standard"][0].config.vocab_size, (batch, seq + 1),
                           generator=torch.Generator().manual_seed(0))

    def step(variant: str, fused: bool) -> float:
        set_fused(fused)
        model, opt = setups[variant]
        start = time.perf_counter()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for case in CASES:  # warm-up
        step(*case)
    times = {case: [] for case in CASES}
    for r in range(args.rounds):
        for case in CASES[r % len(CASES):] + CASES[:r % len(CASES)]:
            times[case].append(step(*case))
    set_fused(True)
    rows = []
    for variant, fused in CASES:
        vs_std = [a / b for a, b in zip(times[(variant, fused)], times[("standard", True)])]
        row = {"variant": variant, "fused": fused, "median_ms": 1e3 * statistics.median(times[(variant, fused)]),
               "ratio_vs_standard": _spread(vs_std)}
        if variant != "standard" and fused:
            pairs = zip(times[(variant, True)], times[(variant, False)])
            row["fused_over_reference"] = _spread([a / b for a, b in pairs])
        rows.append(row)
    print(f"preset {args.preset}, batch {batch} x {seq}, {args.threads} thread(s), {args.rounds} rounds, "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}")
    print("| variant | path | median ms | vs standard (paired) [p10, p90] | fused / reference (paired) [p10, p90] |")
    print("|---|---|---:|---|---|")
    for row in rows:
        med, lo, hi = row["ratio_vs_standard"]
        fr = row.get("fused_over_reference")
        fr_text = f"{fr[0]:.3f} [{fr[1]:.3f}, {fr[2]:.3f}]" if fr else "-"
        path = "-" if row["variant"] == "standard" else "fused" if row["fused"] else "reference"
        print(f"| {row['variant']} | {path} | {row['median_ms']:.1f} | {med:.3f} [{lo:.3f}, {hi:.3f}] | {fr_text} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "rows": rows,
                       "times_s": {f"{v}/{'fused' if f else 'reference'}": t for (v, f), t in times.items()}},
                      fh, indent=1)


if __name__ == "__main__":
    main()
