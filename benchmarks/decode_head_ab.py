"""Batch-1 decoding with and without the transposed output head (``GPT.use_transposed_head``), eager and compiled.

Two copies of one model (same weights), one with the transposed head, interleaved repeats of ``--new-tokens``
greedy steps after an untimed ``--prefix``-token prefill; prints ms/token (median) and the paired ratio
(with / without). Usage: ``python benchmarks/decode_head_ab.py --preset 60m --repeats 7``.
"""

import argparse
import copy
import statistics
import time

import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.layers.kv_cache import StaticKVCache
from coupled_qk.models.generation import static_capacity


@torch.no_grad()
def seconds(model, prompt, new_tokens, compiled):
    total = prompt.shape[1] + new_tokens
    cache = model.new_cache(static_capacity(total, model.config.block_size) if compiled else total)
    nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
    static = StaticKVCache.from_cache(cache) if compiled else None
    step = model.compiled_decode_step() if compiled else None
    start = time.perf_counter()
    for _ in range(new_tokens):
        if compiled:
            nxt = step(nxt, static).argmax(-1, keepdim=True)
            static.advance()
        else:
            nxt = model.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
    return (time.perf_counter() - start) / new_tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="60m")
    p.add_argument("--attention", default="standard")
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    plain = GPT(GPTConfig.from_preset(a.preset, attention=a.attention)).eval()
    fast = copy.deepcopy(plain)
    fast.use_transposed_head()
    prompt = torch.randint(0, plain.config.vocab_size, (1, a.prefix), generator=torch.Generator().manual_seed(0))
    runs = [(m, c) for c in (False, True) for m in ("plain", "fast")]
    models = {"plain": plain, "fast": fast}
    for m, c in runs:
        seconds(models[m], prompt, 2, c)
    times = {r: [] for r in runs}
    for i in range(a.repeats):
        for r in runs[i % 4 :] + runs[: i % 4]:
            times[r].append(seconds(models[r[0]], prompt, a.new_tokens, r[1]))
    print(
        f"torch {torch.__version__}, 1 thread, {a.preset} {a.attention}, batch 1, prefix {a.prefix}, "
        f"{a.new_tokens} tokens, {a.repeats} interleaved repeats"
    )
    for c in (False, True):
        tp, tf = times[("plain", c)], times[("fast", c)]
        ratios = [f / p_ for f, p_ in zip(tf, tp)]
        print(
            f"{'compiled' if c else 'eager':8s}: plain head {1e3 * statistics.median(tp):.2f} ms/token, transposed "
            f"{1e3 * statistics.median(tf):.2f} ms/token, ratio {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}, {max(ratios):.3f}]"
        )


if __name__ == "__main__":
    main()
