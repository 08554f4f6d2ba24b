"""``coupled-qk bench``: speed and memory of every attention variant against ``standard``, interleaved.

``--mode train`` (default): median train-step time, ``bench-<preset>-<device>[-<dtype>][-compile]``.
``--mode decode``: cached greedy decoding tokens/s after each ``--prefixes`` at each ``--decode-batch-sizes``,
``decode-<preset>-<device>``. ``--mode memory``: train-step peak memory and KV-cache bytes,
``memory-<preset>-<device>``. ``--sweep``: the cost curve (train-step ratio and FLOP floor vs d_model, sequence
length and n_steps), ``sweep-<preset>-<device>`` with a PNG. JSON + markdown under ``--out-dir``
(``benchmarks/results`` by default); see ``benchmarks/README.md`` for the method.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from coupled_qk.commands.options import add_model_options, config_from_args
from coupled_qk.experiments.bench import bench_markdown, result_stem, run_bench, write_results
from coupled_qk.experiments.bench_decode import decode_markdown, memory_markdown, run_decode, run_memory
from coupled_qk.experiments.bench_fast import MODES as FAST_MODES
from coupled_qk.experiments.bench_fast import PEERS, fastpath_markdown, run_fastpath
from coupled_qk.experiments.cost_curve import plot_sweep, run_sweep, sweep_markdown
from coupled_qk.experiments.runner import Report, write_report
from coupled_qk.models.variants import VARIANTS

HELP = "train-step and decoding speed, memory and the cost curve of every attention variant against standard"


def add_arguments(parser) -> None:
    add_model_options(parser)
    for action in parser._actions:  # the variants set attention and integrator; run() rejects these two
        if action.dest in ("attention", "integrator"):
            action.help = argparse.SUPPRESS
    parser.add_argument(
        "--variants", default="all",
        help=f"comma-separated subset of {','.join(VARIANTS)} ('coupled' = Euler); standard is always "
        "measured as the baseline (default: all)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: block_size)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per variant (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first, >= 1 (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if available")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
        help="auto = fp32 on CPU, bf16 autocast on CUDA",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (eager fallback on failure)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the token batch")
    parser.add_argument("--out-dir", default="benchmarks/results", help="where the JSON and markdown go")
    parser.add_argument("--mode", default="train", choices=("train", "decode", "memory", "fastpath"),
                        help="train-step time (default), cached decoding tokens/s, memory, or fastpath: eager vs "
                        "compiled, fp32 vs bf16, peers and MFU in one interleaved run")
    parser.add_argument("--modes", default=",".join(FAST_MODES),
                        help=f"fastpath: train-step modes (default {','.join(FAST_MODES)})")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"fastpath: transformers peers at the same dimensions (default {','.join(PEERS)}; '' for none)")
    parser.add_argument("--no-decode", action="store_true", help="fastpath: skip the decoding measurements")
    parser.add_argument("--sweep", action="store_true",
                        help="cost curve: train-step ratio and FLOP floor vs d_model, seq length and n_steps (PNG)")
    parser.add_argument("--sweep-d-model", default="64,128,256", help="sweep: d_model values (default 64,128,256)")
    parser.add_argument("--sweep-seq-len", default="32,64,128", help="sweep: sequence lengths (default 32,64,128)")
    parser.add_argument("--sweep-n-steps", default="1,2,4", help="sweep: n_steps values (default 1,2,4)")
    parser.add_argument("--prefixes", default="128,512", help="decode: prompt lengths (default 128,512)")
    parser.add_argument("--decode-batch-sizes", default="1,8", help="decode: batch sizes (default 1,8)")
    parser.add_argument("--new-tokens", type=int, default=32, help="decode: timed tokens per repeat (default 32)")
    parser.add_argument("--cache-len", type=int, default=None, help="memory: KV-cache length (default block_size)")


def _reproduce_command(args, threads: int) -> str:
    """A fully spelled-out command line equivalent to ``args``."""
    parts = ["coupled-qk", "bench", "--preset", args.preset, "--variants", args.variants]
    if args.n_steps is not None:
        parts += ["--n-steps", str(args.n_steps)]
    for item in args.overrides:
        parts += ["--set", item]
    parts += ["--batch-size", str(args.batch_size)]
    if args.seq_len is not None:
        parts += ["--seq-len", str(args.seq_len)]
    parts += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--threads", str(threads)]
    parts += ["--device", args.device, "--dtype", args.dtype, "--seed", str(args.seed)]
    if args.compile:
        parts.append("--compile")
    parts += ["--out-dir", args.out_dir]
    return shlex.join(parts)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag}={text!r} must be a comma-separated list of positive integers")
    return values


def run(args) -> int:
    if args.attention is not None or args.integrator is not None:
        raise ValueError("bench sets attention and integrator per variant; choose them with --variants")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads={args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    map_options = {} if args.n_steps is None else {"n_steps": args.n_steps}
    # --n-steps applies per variant (run_bench), not to the base config, whose attention has no map
    config = config_from_args(argparse.Namespace(**{**vars(args), "n_steps": None}))
    invoked = sys.argv[1:]
    command = shlex.join(["coupled-qk", *invoked]) if invoked[:1] == ["bench"] else None
    if args.sweep or args.mode != "train":
        return _run_other(args, config, map_options, command)
    print(f"coupled-qk bench: preset {args.preset}, {args.repeats} interleaved repeats after {args.warmup} warmup")
    result = run_bench(
        config,
        variants=args.variants,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
        dtype=args.dtype,
        compile_model=args.compile,
        seed=args.seed,
        log=print,
        map_options=map_options,
    )
    reproduce = _reproduce_command(args, result["machine"]["threads"])
    result = dict(preset=args.preset, command=command or reproduce, reproduce=reproduce, **result)
    json_path, md_path = write_results(result, args.out_dir, result_stem(args.preset, result))
    print(bench_markdown(result))
    print(f"wrote {json_path} and {md_path}")
    return 0


def _run_other(args, config, map_options, command) -> int:
    """``--mode decode``, ``--mode memory`` and ``--sweep``."""
    common = dict(variants=args.variants, device=args.device, seed=args.seed)
    if args.sweep:
        result = run_sweep(config, d_models=_ints("--sweep-d-model", args.sweep_d_model),
                           seq_lens=_ints("--sweep-seq-len", args.sweep_seq_len),
                           n_steps=_ints("--sweep-n-steps", args.sweep_n_steps), batch_size=args.batch_size,
                           repeats=args.repeats, warmup=args.warmup, log=print, **common)
        kind, markdown = "sweep", sweep_markdown
    elif args.mode == "fastpath":
        if map_options:
            raise ValueError("--mode fastpath takes map options in the variant spec (e.g. coupled+n_steps=2), "
                             "not --n-steps")
        result = run_fastpath(config, modes=[m for m in args.modes.split(",") if m],
                              peers=[p for p in args.peers.split(",") if p], batch_size=args.batch_size,
                              seq_len=args.seq_len, repeats=args.repeats, warmup=args.warmup, decode=not args.no_decode,
                              decode_batch_sizes=_ints("--decode-batch-sizes", args.decode_batch_sizes),
                              prefixes=_ints("--prefixes", args.prefixes), new_tokens=args.new_tokens,
                              decode_repeats=args.repeats, log=print, **common)
        kind, markdown = "fastpath", fastpath_markdown
    elif args.mode == "decode":
        result = run_decode(config, batch_sizes=_ints("--decode-batch-sizes", args.decode_batch_sizes),
                            prefixes=_ints("--prefixes", args.prefixes), new_tokens=args.new_tokens,
                            repeats=args.repeats, map_options=map_options, log=print, **common)
        kind, markdown = "decode", decode_markdown
    else:
        result = run_memory(config, batch_size=args.batch_size, seq_len=args.seq_len, cache_len=args.cache_len,
                            map_options=map_options, **common)
        kind, markdown = "memory", memory_markdown
    result = dict(preset=args.preset, command=command or shlex.join(["coupled-qk", "bench", "--mode", kind]),
                  **result)
    stem = f"{kind}-{args.preset}-{result['settings']['device'].split(':')[0]}"
    text, plots = markdown(result), {}
    if args.sweep:
        plots = {f"{stem}.png": lambda path: plot_sweep(result, path)}
        text += f"\n![cost curve]({stem}.png)\n"
    paths = write_report(args.out_dir, Report(json={f"{stem}.json": result}, text={f"{stem}.md": text}, plots=plots),
                         log=print)
    print(text)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
