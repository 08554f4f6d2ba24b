"""``coupled-qk bench``: median train-step time of every attention variant against ``standard``, interleaved.

Writes ``bench-<preset>-<device>[-<dtype>][-compile].json`` and ``.md`` under ``--out-dir``
(``benchmarks/results`` by default); see ``benchmarks/README.md`` for the method.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from coupled_qk.commands.options import add_model_options, config_from_args
from coupled_qk.experiments.bench import bench_markdown, result_stem, run_bench, write_results
from coupled_qk.models.variants import VARIANTS

HELP = "train-step speed of every attention variant against standard"


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
    invoked = sys.argv[1:]
    reproduce = _reproduce_command(args, result["machine"]["threads"])
    result = dict(
        preset=args.preset,
        command=shlex.join(["coupled-qk", *invoked]) if invoked[:1] == ["bench"] else reproduce,
        reproduce=reproduce,
        **result,
    )
    json_path, md_path = write_results(result, args.out_dir, result_stem(args.preset, result))
    print(bench_markdown(result))
    print(f"wrote {json_path} and {md_path}")
    return 0
