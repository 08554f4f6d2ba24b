"""Compiled decoding step under Inductor/Dynamo options: which of them narrows coupled's decode overhead?

Issue 29's compiled-decode targets (coupled Euler <= 1.05x of standard at batch 1) were unmet at ``tiny``. This
script times :meth:`GPT.decode_step` compiled (``dynamic=False``) over a ``StaticKVCache`` for ``standard``,
``coupled`` and ``coupled_leapfrog`` under several configurations, all in one process, interleaved (round-robin,
rotated start), and reports per configuration the median ms/token and the paired ratio to ``standard`` of the
same configuration (median and inter-quartile range over repeats) and to ``standard`` of ``default``:

- ``default``: what ``GPT.compiled_decode_step()`` does on CPU;
- ``cpp``: Inductor's C++ wrapper (``options={"cpp_wrapper": True}``), fewer Python calls per kernel;
- ``noguard``: Dynamo guards on module internals dropped (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``;
  each model gets its own copy of the function's code object so the models' caches stay apart);
- ``tags``: Dynamo's recursive dict-tag guards (``torch._dynamo.config.use_recursive_dict_tags_for_guards``, set
  while the step compiles): a module subtree whose ``__dict__`` tags are unchanged since the last call skips its
  guards;
- ``red``: the coupling MLP's two tiny matrix products written as broadcast-multiply-sum while compiling a
  single-token step, so Inductor fuses the whole map into the attention's pointwise kernel (no extern GEMM);
- ``autotune``: ``options={"max_autotune": True}``: Inductor benchmarks its C++ GEMM templates (which can fuse
  the pointwise work around a small product) against the library GEMMs at compile time;
- ``freeze``: Inductor's freezing (``options={"freezing": True}``): weights become constants of the graph, which
  lets Inductor pre-pack them for the CPU's matrix kernels (the graph then ignores later weight updates).

Configurations combine with ``+`` (e.g. ``noguard+cpp``). Usage:
``python benchmarks/decode_compile_options.py --configs default,cpp,noguard,red --batch 1 --repeats 15``.
Each row also gives the time Dynamo spends checking the step's guards per call (``guard_us``, timed on the cache
entry's guard manager directly). Writes ``--out`` (JSON with every time). A measurement script, not a feature: none of
these options is used by the
library (see ``benchmarks/results/fastpath/decode-options/README.md`` for why).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import types

import numpy as np
import torch

import coupled_qk.layers.forces as forces
from coupled_qk import GPT
from coupled_qk.layers.kv_cache import StaticKVCache
from coupled_qk.models.compiled import make_graph_room
from coupled_qk.models.config import GPTConfig

VARIANTS = {
    "standard": dict(attention="standard"),
    "coupled": dict(attention="coupled"),
    "coupled_leapfrog": dict(attention="coupled", integrator="leapfrog"),
}
REDUCE = {"on": False}
_mlp_layer = forces.mlp_layer


def _reduced_mlp_layer(x, weight, per_head):
    """``mlp_layer`` as multiply-and-sum for a single-token step while tracing (``red``), else unchanged."""
    if REDUCE["on"] and torch.compiler.is_compiling() and x.shape[-2] == 1 and not per_head:
        return (x.unsqueeze(-2) * weight).sum(-1)
    return _mlp_layer(x, weight, per_head)


def own_step(model: GPT):
    """``model.decode_step`` bound through a private copy of its code object (Dynamo keeps one cache per code)."""
    fn = type(model).decode_step
    return types.MethodType(types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__), model)


def build(config: str, variant: str, preset: str, seed: int):
    parts = set(config.split("+")) - {"default"}
    unknown = parts - {"cpp", "noguard", "red", "freeze", "autotune", "tags"}
    if unknown:
        raise SystemExit(
            f"--configs: unknown part(s) {sorted(unknown)}; expected default, cpp, noguard, red, freeze, autotune, tags"
        )
    options = {}
    if "cpp" in parts:
        options["cpp_wrapper"] = True
    if "freeze" in parts:
        options["freezing"] = True
    if "autotune" in parts:  # Inductor's own C++ GEMM templates compete with the library GEMMs (epilogues fused)
        options["max_autotune"] = True
    if "noguard" in parts:
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_preset(preset, block_size=256, **VARIANTS[variant])).eval()
    bound = own_step(model)
    return model, torch.compile(bound, dynamic=False, options=options), parts, bound.__func__.__code__


@torch.no_grad()
def guard_seconds(model, code, prompt, calls: int = 5000) -> float:
    """Seconds Dynamo spends checking the guards of the compiled step of ``code`` (its own copy per model, so one
    cache entry) for one call, timed on the entry's guard manager directly (median of 5 batches of ``calls``)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    cache = model.new_cache(256)
    model.next_token_logits(prompt, cache)
    local = {"self": model, "idx": prompt.new_zeros(prompt.shape[0], 1), "cache": StaticKVCache.from_cache(cache)}
    (entry,) = _debug_get_cache_entry_list(code)
    check = entry.guard_manager.check
    if not check(local):
        raise RuntimeError("the guards of the compiled step fail on a fresh cache: not the measured graph")
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            check(local)
        batches.append((time.perf_counter() - start) / calls)
    return float(np.median(batches))


@torch.no_grad()
def seconds_per_token(model, step, prompt, new_tokens: int) -> float:
    cache = model.new_cache(256)
    nxt = model.next_token_logits(prompt, cache).argmax(-1, keepdim=True)
    static = StaticKVCache.from_cache(cache)
    start = time.perf_counter()
    for _ in range(new_tokens):
        nxt = step(nxt, static).argmax(-1, keepdim=True)
        static.advance()
    return (time.perf_counter() - start) / new_tokens


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="default,cpp,noguard,red")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    make_graph_room()
    forces.mlp_layer = _reduced_mlp_layer
    runs = {(v, c): build(c, v, a.preset, 0) for c in a.configs.split(",") for v in VARIANTS}
    vocab = next(iter(runs.values()))[0].config.vocab_size
    prompt = torch.randint(0, vocab, (a.batch, a.prefix), generator=torch.Generator().manual_seed(0))
    for model, step, parts, _ in runs.values():  # warm-up: compiles, with the map written as a reduction or not
        REDUCE["on"] = "red" in parts
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards="tags" in parts):
            seconds_per_token(model, step, prompt, 2)
    REDUCE["on"] = False
    guards = {r: guard_seconds(runs[r][0], runs[r][3], prompt) for r in runs}
    keys, times = list(runs), {r: [] for r in runs}
    for i in range(a.repeats):
        for r in keys[i % len(keys) :] + keys[: i % len(keys)]:
            times[r].append(seconds_per_token(*runs[r][:2], prompt, a.new_tokens))
    rows = []
    for v, c in keys:
        t = np.asarray(times[(v, c)])
        same, default = t / np.asarray(times[("standard", c)]), t / np.asarray(times[("standard", keys[0][1])])
        rows.append(
            dict(
                config=c,
                variant=v,
                ms_per_token=1e3 * float(np.median(t)),
                ratio=float(np.median(same)),
                ratio_q25=float(np.percentile(same, 25)),
                ratio_q75=float(np.percentile(same, 75)),
                vs_first_standard=float(np.median(default)),
                guard_us=1e6 * guards[(v, c)],
                times_s=t.tolist(),
            )
        )
        print(
            f"b{a.batch} {c:12s} {v:17s} {rows[-1]['ms_per_token']:.3f} ms/token  ratio {rows[-1]['ratio']:.3f} "
            f"[{rows[-1]['ratio_q25']:.3f}, {rows[-1]['ratio_q75']:.3f}]  vs {keys[0][1]} standard "
            f"{rows[-1]['vs_first_standard']:.3f}  guards {rows[-1]['guard_us']:.1f} us/call",
            flush=True,
        )
    if a.out:
        meta = dict(
            command="python " + " ".join(sys.argv),
            torch=torch.__version__,
            machine=platform.platform(),
            processor=platform.processor(),
            threads=1,
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        )
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, args=vars(a), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
