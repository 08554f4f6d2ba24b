"""Paired ratios of `coupled-qk bench --mode fastpath` rounds (training steps and cached decoding): per round
and pooled over rounds.

Each round's JSON keeps every repeat's time per model and mode (``train[<model> <mode>]["times_ms"]``, repeats
interleaved). The ratio of a repeat is the model's time over ``standard``'s time in the same repeat and mode;
this script prints, per model and mode, each round's median paired ratio and the median over all rounds'
repeats pooled, with a distribution-free 95% interval for that median (order statistics of the binomial(n, 1/2)
distribution; Conover 1999, section 3.2: ``coupled_qk.study.stats.median_ci``).

Usage: ``python benchmarks/paired_rounds.py benchmarks/results/fastpath/rounds-60m/r{4,5,6}-train``
(a folder holds one ``fastpath-*.json``). Prints a markdown table; reads only, writes nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from coupled_qk.study.stats import median_ci


def paired(folder: Path) -> dict:
    """``{(model, mode): [ratio per repeat]}`` of one round folder: training steps, and decoding cells as
    ``(model, "<mode> decode b<batch> p<prefix>")``."""
    (path,) = sorted(Path(folder).glob("fastpath-*.json"))
    data = json.loads(path.read_text())
    cells = [("", data.get("train") or {}, "times_ms")]
    cells += [(f" decode b{d['batch']} p{d['prefix']}", d["runs"], "times_s") for d in data.get("decode") or []]
    out = {}
    for suffix, runs, field in cells:
        for key, row in runs.items():
            model, mode = key.rsplit(" ", 1)
            base = runs.get(f"standard {mode}")
            if model != "standard" and base and row.get(field):
                out[(model, mode + suffix)] = [a / b for a, b in zip(row[field], base[field])]
    return out


def main(folders: list[str]) -> str:
    rounds = [paired(Path(f)) for f in folders]
    keys = sorted(set().union(*rounds))
    lines = [
        "| model | mode | " + " | ".join(Path(f).name for f in folders) + " | pooled median [95% interval] |",
        "|---|---|" + "---:|" * (len(folders) + 1),
    ]
    for key in keys:
        per = [r.get(key, []) for r in rounds]
        pooled = [x for p in per for x in p]
        ci = median_ci(pooled)
        lo, hi = ci["low"], ci["high"]
        lines.append(
            f"| {key[0]} | {key[1]} | "
            + " | ".join(f"{statistics.median(p):.3f}" if p else "-" for p in per)
            + f" | {statistics.median(pooled):.3f} [{lo:.3f}, {hi:.3f}] (n={len(pooled)}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python benchmarks/paired_rounds.py ROUND_FOLDER [ROUND_FOLDER ...]")
    print(main(sys.argv[1:]))
