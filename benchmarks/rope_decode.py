"""RoPE at decoding cost (issue 29 item 4): cached greedy decoding of the `tiny` standard model with RoPE against
the same model with learned positions, eager (RoPE in the plain five-kernel form and in the fused form with the
precomputed signed sine table) and compiled (`GPT.compiled_decode_step`), interleaved, paired ratios.

    PYTHONPATH=src python benchmarks/rope_decode.py [--repeats 15] [--out
    benchmarks/results/fastpath/rope-decode-tiny-cpu.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import coupled_qk.layers.attention as attention
from coupled_qk import GPT, GPTConfig
from coupled_qk.experiments.bench.machine import machine_info
from coupled_qk.layers.kv_cache import StaticKVCache
from coupled_qk.models.generation import static_capacity

FUSED = attention.apply_rope


def plain_rope(x, cos, sin, *_):
    """The rotation as it was before issue 29: chunk, negate, cat, two products and a sum."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


@torch.no_grad()
def per_token_ms(model, how, prompt, n):
    attention.apply_rope = plain_rope if how == "eager-plain" else FUSED
    total = prompt.shape[1] + n
    if how == "compiled":
        cache = model.new_cache(static_capacity(total, model.config.block_size))
        nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
        static, step = StaticKVCache.from_cache(cache), model.compiled_decode_step()
        start = time.perf_counter()
        for _ in range(n):
            nxt = step(nxt, static).argmax(-1, keepdim=True)
            static.advance()
    else:
        cache = model.new_cache(total)
        nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(n):
            nxt = model.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
    return 1000.0 * (time.perf_counter() - start) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    models = {}
    for pos in ("learned", "rope"):
        torch.manual_seed(0)
        models[pos] = GPT(GPTConfig.from_preset("tiny", position=pos)).eval()
    prompt = torch.randint(0, 8192, (a.batch, a.prefix))
    runs = [
        ("learned", "eager"),
        ("rope", "eager-plain"),
        ("rope", "eager"),
        ("learned", "compiled"),
        ("rope", "compiled"),
    ]
    for pos, how in runs:
        per_token_ms(models[pos], how, prompt, a.new_tokens)  # warm-up, compiles
    times = {r: [] for r in runs}
    for i in range(a.repeats):
        for r in runs[i % len(runs) :] + runs[: i % len(runs)]:
            times[r].append(per_token_ms(models[r[0]], r[1], prompt, a.new_tokens))
    out = {}
    for pos, how in runs:
        base = np.asarray(times[("learned", "compiled" if how == "compiled" else "eager")])
        r = np.asarray(times[(pos, how)]) / base
        out[f"{pos} {how}"] = dict(
            ms_per_token=float(np.median(times[(pos, how)])),
            ratio_vs_learned=float(np.median(r)),
            ratio_q25=float(np.percentile(r, 25)),
            ratio_q75=float(np.percentile(r, 75)),
            times_ms=times[(pos, how)],
        )
        print(
            f"{pos:8s} {how:12s} {out[f'{pos} {how}']['ms_per_token']:.3f} ms/token, vs learned "
            f"{np.median(r):.3f}x [{np.percentile(r, 25):.3f}, {np.percentile(r, 75):.3f}]"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(settings=vars(a), machine=machine_info(torch.device("cpu")), runs=out), f, indent=2)


if __name__ == "__main__":
    main()
