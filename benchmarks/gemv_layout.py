"""Single-row products on CPU: ``F.linear(x, W)`` with ``W (out, in)`` (PyTorch's layout) against ``x @ Wt`` with
the transposed weight stored contiguous ``(in, out)`` (GPT-2's Conv1D layout), for the 60m preset's shapes.

Why: at batch 1 a decoding step streams every weight once; on the project's CPU (MKL, one thread) the first
layout streams the 50,257 x 512 output head at about half the speed of the second. Usage:
``python benchmarks/gemv_layout.py`` (prints ms per product, median of 10 after 2 warm-up calls).
"""

import time

import torch


def ms(f, n: int = 10) -> float:
    for _ in range(2):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[n // 2]


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread")
    for out_f, in_f in [(50257, 512), (1536, 512), (2048, 512), (512, 2048)]:
        w = torch.randn(out_f, in_f)
        wt = w.t().contiguous()
        for rows in (1, 2, 8, 64):
            x = torch.randn(rows, in_f)
            a = ms(lambda x=x, w=w: torch.nn.functional.linear(x, w))
            b = ms(lambda x=x, wt=wt: x @ wt)
            print(
                f"W {out_f}x{in_f}, {rows:2d} rows: F.linear {a:7.3f} ms, x @ W^T contiguous {b:7.3f} ms, ratio "
                f"{a / b:.2f}"
            )


if __name__ == "__main__":
    main()
