"""Paired differences over seeds with 95% t-intervals from a ``coupled-qk compare`` results.json.

Usage: ``python docs/results/invertible-cpu/paired_table.py RESULTS_JSON > table.md``

For each pair (a, b) of variants and each split, the per-seed difference of mean token-level NLL
(``log(ppl_a) - log(ppl_b)``, nats/token; negative = a better) is averaged over the seeds both ran; the
interval is ``mean +- t_{0.975, n-1} * sd / sqrt(n)`` and ``p`` the two-sided paired t-test
(``scipy.stats.ttest_rel``). The relative change of perplexity is ``exp(mean) - 1``.
"""

from __future__ import annotations

import json
import math
import sys

from scipy import stats

PAIRS = [("invertible_differential", "differential"), ("differential", "standard"),
         ("invertible_differential", "standard")]


def per_seed(summary: dict, variant: str, key: str) -> dict[int, float]:
    return {r["seed"]: r["final"][key] for r in summary["variants"][variant]["runs"]}


def paired(summary: dict, a: str, b: str, key: str) -> dict:
    pa, pb = per_seed(summary, a, key), per_seed(summary, b, key)
    seeds = sorted(set(pa) & set(pb))
    diffs = [math.log(pa[s]) - math.log(pb[s]) for s in seeds]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = stats.tstd(diffs) if n > 1 else float("nan")
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
    p = stats.ttest_rel([math.log(pa[s]) for s in seeds], [math.log(pb[s]) for s in seeds]).pvalue if n > 1 else None
    return dict(a=a, b=b, metric=key, seeds=seeds, diffs=diffs, mean=mean, ci95=[mean - half, mean + half], p=p,
                rel_ppl_change=math.exp(mean) - 1)


def main(path: str) -> None:
    summary = json.loads(open(path).read())
    lines = ["| variant | " + " | ".join(f"seed {s}" for s in summary["seeds"]) + " | mean test ppl | params |",
             "|---|" + "---:|" * (len(summary["seeds"]) + 2)]
    for name, e in summary["variants"].items():
        ppl = per_seed(summary, name, "test/perplexity")
        cells = " | ".join(f"{ppl[s]:.1f}" for s in summary["seeds"])
        lines.append(f"| {name} | {cells} | {sum(ppl.values()) / len(ppl):.1f} | {e['params']:,} |")
    lines += ["", "| comparison (a - b) | split | mean diff of NLL (nats/token) | 95% t-interval | p (paired t) "
              "| perplexity change |", "|---|---|---:|---|---:|---:|"]
    results = []
    for a, b in PAIRS:
        if a not in summary["variants"] or b not in summary["variants"]:
            continue
        for key in ("valid/perplexity", "test/perplexity"):
            r = paired(summary, a, b, key)
            results.append(r)
            lines.append(f"| {a} - {b} | {key.split('/')[0]} | {r['mean']:+.4f} | [{r['ci95'][0]:+.4f}, "
                         f"{r['ci95'][1]:+.4f}] | {r['p']:.3f} | {100 * r['rel_ppl_change']:+.2f}% |")
    print("\n".join(lines))
    json.dump(results, open(path.replace("results.json", "paired.json"), "w"), indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
