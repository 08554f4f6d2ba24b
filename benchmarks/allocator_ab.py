"""What the command line's malloc tuning (``coupled_qk.allocator``) is worth: the same ``coupled-qk bench``
training-step measurement in separate processes, alternating glibc's defaults (``COUPLED_QK_DEFAULT_MALLOC=1``)
and the tuned allocator (unset), ``--pairs`` times with the order rotated.

Per pair and variant: speedup = median step time with the defaults / median step time tuned (> 1: tuning is
faster). The allocator is a property of the process, so the two arms cannot be interleaved inside one process;
pairing neighbouring processes is the next best thing. Usage:
``python benchmarks/allocator_ab.py --preset tiny --pairs 3 --out benchmarks/results/allocator/tiny.json``
(extra ``coupled-qk bench`` arguments after ``--``). Inherited ``MALLOC_*`` variables are removed (they would
make both arms tuned).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def bench(preset: str, tuned: bool, extra: list[str]) -> dict:
    """One ``coupled-qk bench`` process; returns its result JSON (``variants``, ``machine``) with the process's
    peak resident memory added (``max_rss_mb``, from ``wait4``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    env["COUPLED_QK_DEFAULT_MALLOC"] = "0" if tuned else "1"
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "coupled_qk.cli", "bench", "--preset", preset, "--out-dir", out, *extra]
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed with exit code {child.returncode}")
        (path,) = Path(out).glob("*.json")
        return dict(json.loads(path.read_text()), max_rss_mb=usage.ru_maxrss / 1024)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("bench_args", nargs="*", help="extra coupled-qk bench arguments (after --)")
    a = p.parse_args(argv)
    extra = a.bench_args or ["--variants", "coupled", "--repeats", "9", "--warmup", "2", "--threads", "1"]
    pairs = []
    for i in range(a.pairs):
        arms = {}
        for tuned in (False, True) if i % 2 == 0 else (True, False):
            arms["tuned" if tuned else "default"] = bench(a.preset, tuned, extra)
        speed = {
            v: arms["default"]["variants"][v]["median_ms"] / arms["tuned"]["variants"][v]["median_ms"]
            for v in arms["tuned"]["variants"]
        }
        pairs.append(
            dict(
                speedup=speed,
                **{
                    f"{k}_median_ms": {v: r["median_ms"] for v, r in arm["variants"].items()} for k, arm in arms.items()
                },
                allocator={k: arm["machine"].get("allocator") for k, arm in arms.items()},
                max_rss_mb={k: arm["max_rss_mb"] for k, arm in arms.items()},
            )
        )
        print(
            f"pair {i + 1}: "
            + ", ".join(f"{v} {s:.3f}x" for v, s in speed.items())
            + "; peak RSS "
            + ", ".join(f"{k} {arm['max_rss_mb']:.0f} MB" for k, arm in arms.items()),
            flush=True,
        )
    for v in pairs[0]["speedup"]:
        s = np.array([pr["speedup"][v] for pr in pairs])
        print(f"{v}: speedup median {np.median(s):.3f}x, range {s.min():.3f}-{s.max():.3f}x over {len(s)} pairs")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        meta = dict(
            command="python " + " ".join(sys.argv),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            machine=arms["tuned"]["machine"],
        )
        Path(a.out).write_text(json.dumps(dict(meta=meta, pairs=pairs), indent=1))


if __name__ == "__main__":
    main()
