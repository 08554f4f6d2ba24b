"""What each check on every eagerly decoded token costs, against the decoding step (budget: ~1% of a step each;
per-call checks stay per call, per-step work is only what the step needs).

The checks that run once per token on the path of ``GPT.generate`` (cached, greedy), and the reference step
(``next_token_logits`` + arg-max at the given batch, tiny preset, 1 thread):

- ``embed``: ``GPT.embed``'s argument checks, above what it must compute (embedding, position, RoPE rows);
- ``cache.update`` (x n_layer): ``KVCache.update``'s shape/dtype/device comparison and bookkeeping, above the two
  writes and the two returned views it must make;
- ``decoding_fold`` (x n_layer, coupled): the lookup of the fold validated once per cache;
- ``sample_next_token``: the greedy test, above the arg-max;
- ``logits``: the opt-in transposed head's test (``_transposed_head_for``) and the padded-vocabulary test, above
  the head's product;
- ``_mapped`` (x n_layer, maps that do not fold, e.g. ``uncoupled_mlp``): the map's output-shape check, above the map;
- ``check_layer_inputs``: the per-call input checks of a standalone ``CausalSelfAttention`` (``GPT`` turns them
  off), against one layer call.

Each is timed as the difference of two callables on the step's real tensors (thread CPU time, 10th percentile over
short batches of calls: what a busy shared machine's preemptions do not move), interleaved over rounds.

    PYTHONPATH=src python benchmarks/decode_checks.py [--batch 1] [--rounds 15] \
        [--out benchmarks/results/decode-checks.md]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.experiments.bench.machine import machine_info, machine_line
from coupled_qk.models.config import PRESETS
from coupled_qk.models.generation import sample_next_token
from coupled_qk.ops.rope import signed_sin


def undisturbed_us(fn, batches: int = 200, number: int = 10) -> float:
    """Thread CPU microseconds of one call of ``fn``: the 10th percentile over ``batches`` batches of ``number``."""
    out = []
    for _ in range(batches):
        start = time.thread_time()
        for _ in range(number):
            fn()
        out.append((time.thread_time() - start) / number)
    out.sort()
    return out[len(out) // 10] * 1e6


def model_at(attention: str, batch: int, integrator: str | None = None):
    """A tiny model (eval), its cache after a 16-token prompt and the next token ids ``(batch, 1)``."""
    torch.manual_seed(0)
    extra = {} if integrator is None else {"integrator": integrator}
    model = GPT(GPTConfig(**PRESETS["tiny"], attention=attention, **extra)).eval()
    cache = model.new_cache(128)
    with torch.no_grad():
        nxt = model.next_token_logits(torch.randint(0, 8192, (batch, 16)), cache).argmax(-1, keepdim=True)
    return model, cache, nxt


def lookups(model, idx, tables, past: int):
    """What ``GPT.embed`` must compute for one token: the embedding, the position and its RoPE rows."""
    positions = torch.arange(past, past + idx.shape[1])
    return model.drop(model.tok_emb(idx)), tuple(t[positions] for t in tables)


def step_pairs(batch: int) -> dict:
    """``{name: (with check, without it, times per step)}``; each callable leaves the cache as it found it."""
    std, cache, nxt = model_at("standard", batch)
    cpl, ccache, cnxt = model_at("coupled", batch, "euler")
    mlp, mcache, mnxt = model_at("uncoupled_mlp", batch)
    n = std.config.n_layer
    with torch.no_grad():
        cpl.next_token_logits(cnxt, ccache)  # the fold is built and validated (once per cache)
    length = cache.length
    k = torch.randn(batch, 4, 1, 32)
    kb, vb = cache._k[0], cache._v[0]
    x = torch.randn(batch, 1, 128)
    cos, sin = std.rope_tables(torch.device("cpu"))
    tables = (cos, sin, signed_sin(sin))
    rope = tuple(t[length : length + 1] for t in tables)
    hidden, logits = torch.randn(batch, 128), torch.randn(batch, 8192)
    layer = std.blocks[0].attn
    q = torch.randn(batch, 4, 1, 32)
    qk_map = mlp.blocks[0].attn
    fold = cpl.blocks[0].attn.decoding_fold  # bound once: each submodule read costs 1-3 us (Module.__getattr__)

    def update():
        cache.update(0, k, k)
        cache._len[0] = length

    def writes():  # what update must do: write both and return views of the filled part
        kb[..., length : length + 1, :] = k
        vb[..., length : length + 1, :] = k
        return kb[..., : length + 1, :], vb[..., : length + 1, :]

    def checked_layer():
        layer.check_every_call = True
        layer(x, rope, None)

    def unchecked_layer():
        layer.check_every_call = False
        layer(x, rope, None)

    return {
        "embed": (lambda: std.embed(nxt, cache, check_ids=False), lambda: lookups(std, nxt, tables, length), 1),
        "cache.update": (update, writes, n),
        "decoding_fold (coupled)": (lambda: fold(ccache), lambda: None, n),
        "sample_next_token": (lambda: sample_next_token(logits, 0.0, None), lambda: logits.argmax(-1, keepdim=True), 1),
        "logits": (lambda: std.logits(hidden), lambda: std.lm_head(hidden), 1),
        "_mapped (uncoupled_mlp)": (lambda: qk_map._mapped(q, q), lambda: qk_map.qk_map(q, q), n),
        "check_layer_inputs (standalone layer)": (checked_layer, unchecked_layer, 0),
    }, (std, cache, nxt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs, (std, cache, nxt) = step_pairs(args.batch)
    length = cache.length

    def step():
        std.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
        cache.crop(length)

    costs = {name: [] for name in pairs}
    steps, layer_calls = [], []
    with torch.no_grad():
        for _ in range(args.rounds):
            steps.append(undisturbed_us(step, batches=60, number=5))
            for name, (with_check, without, _) in pairs.items():
                costs[name].append(undisturbed_us(with_check) - undisturbed_us(without))
            layer_calls.append(undisturbed_us(pairs["check_layer_inputs (standalone layer)"][1]))
    step_us = statistics.median(steps)
    lines = [
        f"# Per-token checks of eager cached decoding: tiny preset, batch {args.batch}, 1 thread",
        "",
        machine_line(machine_info(torch.device("cpu"))),
        f"- measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {args.rounds} rounds: "
        f"`PYTHONPATH=src python benchmarks/decode_checks.py --batch {args.batch} --rounds {args.rounds}`",
        f"- reference: one standard decoding step (`next_token_logits` + arg-max) {step_us:.0f} us; one standalone "
        f"attention layer call {statistics.median(layer_calls):.0f} us (thread CPU time, 10th percentile of batches)",
        "",
        "| check (per token) | sites per step | us per site | us per step | % of a step |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (_, _, sites) in pairs.items():
        us = statistics.median(costs[name])
        per_step = us * max(sites, 1)
        ref = statistics.median(layer_calls) if sites == 0 else step_us
        where = "of a layer call" if sites == 0 else ""
        lines.append(f"| {name} | {sites or '-'} | {us:.2f} | {per_step:.2f} | {100 * per_step / ref:.2f}% {where}|")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
