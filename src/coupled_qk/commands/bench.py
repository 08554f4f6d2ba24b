"""``coupled-qk bench``: speed and memory of every attention variant against ``standard``, interleaved.

``--mode train`` (default): median train-step time, ``bench-<preset>-<device>[-<dtype>][-compile]``.
``--mode decode``: cached greedy decoding tokens/s after each ``--prefixes`` at each ``--decode-batch-sizes``,
``decode-<preset>-<device>``. ``--mode memory``: train-step peak memory and KV-cache bytes,
``memory-<preset>-<device>[-<dtype>][-compile]`` (honouring ``--dtype`` and ``--compile``). ``--sweep``: the cost
curve (train-step ratio and FLOP floor vs d_model, sequence length and n_steps), ``sweep-<preset>-<device>`` with a PNG.
JSON + markdown under ``--out-dir``
(``benchmarks/results`` by default); see ``benchmarks/README.md`` for the method.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from coupled_qk.checks.cli import (
    dtype_arg,
    path_arg,
    positive_int_arg,
    positive_ints_arg,
    seed_arg,
    subset_arg,
    threads_arg,
)
from coupled_qk.commands.ignored import given_options, shown_option
from coupled_qk.commands.options import (
    add_device_option,
    add_model_options,
    add_overwrite_option,
    add_progress_option,
    gpt_config_from_args,
    parse_variants_option,
    refuse_variant_conflicts,
)
from coupled_qk.experiments.bench.cost_curve import plot_sweep, run_sweep, sweep_markdown
from coupled_qk.experiments.bench.decode import decode_markdown, memory_markdown, run_decode, run_memory
from coupled_qk.experiments.bench.fast import MODES as FAST_MODES
from coupled_qk.experiments.bench.fast import PEERS, fastpath_markdown, run_fastpath
from coupled_qk.experiments.bench.train import bench_markdown, resolve_dtype, result_stem, run_bench, write_results
from coupled_qk.models.registry import default_variants, variant_names
from coupled_qk.output_dir import OutputDir
from coupled_qk.study.executor import Report, write_report

BENCH_MODES = ("train", "decode", "memory", "fastpath")
"""``--mode`` choices; a mode's results are ``<mode>-*`` files (``train``'s are ``bench-*``)."""

RESULTS_LAYOUT = (
    *(f"{'bench' if m == 'train' else m}-*" for m in BENCH_MODES),
    "sweep-*",
    "hf-generate-*",
    "README.md",
    "*/",
)
"""What a benchmark results folder may hold: result files of every mode (derived from :data:`BENCH_MODES`, so a
new mode's own files can be replaced with ``--overwrite``), the sweep's, a README and sub-folders of studies."""

HELP = "train-step and decoding speed, memory and the cost curve of every attention variant against standard"


def add_arguments(parser) -> None:
    """Register the ``bench`` options on ``parser``: the model, what each measured step is, where the results go,
    the mode and each mode's own options (in that order, as ``--help`` lists them)."""
    add_model_options(parser)
    for action in parser._actions:  # the variants set attention and integrator; run() rejects these two
        if action.dest in ("attention", "integrator"):
            action.help = argparse.SUPPRESS
    _add_step_options(parser)
    parser.add_argument(
        "--out-dir",
        default="benchmarks/results",
        type=path_arg,
        help="where the JSON and markdown go (an existing result is replaced only with --overwrite)",
    )
    add_overwrite_option(parser)
    parser.add_argument(
        "--mode",
        default="train",
        choices=BENCH_MODES,
        help="train-step time (default), cached decoding tokens/s, memory, or fastpath: eager vs "
        "compiled, fp32 vs bf16, peers and MFU in one interleaved run",
    )
    _add_fastpath_and_sweep_options(parser)
    _add_decode_and_memory_options(parser)
    add_progress_option(parser)  # the per-variant and per-repeat lines (progress_log); the results are printed


def _add_step_options(parser) -> None:
    """What is measured: the variants, the batch, the repeats, and the device, precision and seed of each step."""
    parser.add_argument(
        "--variants",
        default="all",
        help=f"comma-separated variant specs from {','.join(variant_names())} ('coupled' = Euler), each "
        "optionally +field=value; standard is always measured as the baseline (default: all = "
        f"{','.join(default_variants())})",
    )
    parser.add_argument("--batch-size", type=positive_int_arg, default=16, help="sequences per step (default 16)")
    parser.add_argument(
        "--seq-len", type=positive_int_arg, default=None, help="tokens per sequence (default: block_size)"
    )
    parser.add_argument("--repeats", type=positive_int_arg, default=10, help="timed steps per variant (default 10)")
    parser.add_argument(
        "--warmup", type=positive_int_arg, default=3, help="untimed steps per variant first, >= 1 (default 3)"
    )
    parser.add_argument("--threads", type=threads_arg, default=None, help="torch CPU threads (default: torch's choice)")
    add_device_option(parser)
    parser.add_argument(
        "--dtype",
        default="auto",
        type=dtype_arg,
        metavar="{auto,fp32,bf16,fp16}",
        help="auto = fp32 on CPU, bf16 autocast on CUDA (train and memory modes)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (eager fallback on failure)")
    parser.add_argument("--seed", type=seed_arg, default=0, help="seed of the weights and the token batch")


def _add_fastpath_and_sweep_options(parser) -> None:
    """The options of ``--mode fastpath`` (modes, peers, decoding) and of the cost-curve ``--sweep``."""
    parser.add_argument(
        "--modes",
        default=None,
        type=subset_arg(FAST_MODES),
        help=f"fastpath: train-step modes, of {','.join(FAST_MODES)} (default: all that this device "
        "computes natively; bf16 needs a GPU or CPU with native bf16)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        type=subset_arg(PEERS, allow_empty=True),
        help=f"fastpath: transformers peers at the same dimensions (default {','.join(PEERS)}; '' for none)",
    )
    parser.add_argument("--no-decode", action="store_true", help="fastpath: skip the decoding measurements")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="cost curve: train-step ratio and FLOP floor vs d_model, seq length and n_steps (PNG)",
    )
    parser.add_argument(
        "--sweep-d-model",
        default=[64, 128, 256],
        type=positive_ints_arg,
        help="sweep: d_model values (default 64,128,256)",
    )
    parser.add_argument(
        "--sweep-seq-len",
        default=[32, 64, 128],
        type=positive_ints_arg,
        help="sweep: sequence lengths (default 32,64,128)",
    )
    parser.add_argument(
        "--sweep-n-steps", default=[1, 2, 4], type=positive_ints_arg, help="sweep: n_steps values (default 1,2,4)"
    )


def _add_decode_and_memory_options(parser) -> None:
    """The options of ``--mode decode`` (prompt lengths, batch sizes, timed tokens) and ``--mode memory``."""
    parser.add_argument(
        "--prefixes", default=[128, 512], type=positive_ints_arg, help="decode: prompt lengths (default 128,512)"
    )
    parser.add_argument(
        "--decode-batch-sizes", default=[1, 8], type=positive_ints_arg, help="decode: batch sizes (default 1,8)"
    )
    parser.add_argument(
        "--new-tokens", type=positive_int_arg, default=32, help="decode: timed tokens per repeat (default 32)"
    )
    parser.add_argument(
        "--cache-len", type=positive_int_arg, default=None, help="memory: KV-cache length (default block_size)"
    )


def progress_log(args):
    """Where a measurement's progress lines go (each variant warmed up, each repeat, each decode point): ``print``,
    or ``None`` (not shown) with ``--no-progress``; the results table and the files written are printed either way."""
    return print if args.progress else None


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
    parts += ["--out-dir", str(args.out_dir)]
    return shlex.join(parts)


def _device_type(device: str) -> str:
    """``cpu``/``cuda``/``mps``: the device type a result file is named after (``auto`` resolved)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":")[0]


def _stem(args) -> str:
    """The result files' stem, known before any measurement (so a refused output costs nothing)."""
    device = _device_type(args.device)
    settings = {"device": device, "dtype": resolve_dtype(args.dtype, torch.device(device)), "compile": args.compile}
    if args.mode == "memory" and not args.sweep:  # memory-<preset>-<device>[-<dtype>][-compile], as _run_other
        return "memory" + result_stem(args.preset, {"settings": settings})[len("bench") :]
    if args.sweep or args.mode != "train":
        return f"{'sweep' if args.sweep else args.mode}-{args.preset}-{device}"
    return result_stem(args.preset, {"settings": settings})


OPTION_MODES = {
    "--dtype": ("train", "memory"),
    "--compile": ("train", "memory"),
    "--n-steps": ("train", "decode", "memory"),
    "--seq-len": ("train", "memory", "fastpath"),
    "--batch-size": ("train", "memory", "fastpath", "sweep"),
    "--warmup": ("train", "fastpath", "sweep"),
    "--repeats": ("train", "decode", "fastpath", "sweep"),
    "--modes": ("fastpath",),
    "--peers": ("fastpath",),
    "--no-decode": ("fastpath",),
    "--prefixes": ("decode", "fastpath"),
    "--decode-batch-sizes": ("decode", "fastpath"),
    "--new-tokens": ("decode", "fastpath"),
    "--cache-len": ("memory",),
    "--sweep-d-model": ("sweep",),
    "--sweep-seq-len": ("sweep",),
    "--sweep-n-steps": ("sweep",),
}
"""The measurement options that only some modes use (``sweep`` stands for ``--sweep``); every other option (model,
variants, device, threads, seed, output) applies to all. A mode refuses an option it would ignore."""

HINTS = {
    "--sweep": "it measures eager models at the default dtype, bf16 on CUDA and fp32 on CPU, and sweeps n_steps and "
    "sequence lengths itself",
    "--mode decode": "it measures eager fp32 decoding",
    "--mode fastpath": "choose precisions and compilation with --modes, map options in the variant spec",
}


def _check_mode_options(args) -> None:
    """Refuse, in one line, every option of :data:`OPTION_MODES` given (a value other than its default) to a mode
    that would ignore it, ``--mode`` other than ``train`` with ``--sweep``, and decoding options with
    ``--mode fastpath --no-decode``: asking for a measurement must never silently measure something else.

    Raises:
        ValueError: naming the option, its value, the mode and the modes that use it.
    """
    if args.sweep and args.mode != "train":
        raise ValueError(
            f"--sweep and --mode {args.mode} cannot be combined (--sweep measures train steps along "
            "d_model, sequence length and n_steps; drop one of them)"
        )
    mode = "sweep" if args.sweep else args.mode
    shown_mode = "--sweep" if args.sweep else f"--mode {mode}"
    for option, value in given_options(args, add_arguments, OPTION_MODES):
        modes = OPTION_MODES[option]
        shown = shown_option(option, value)
        if mode not in modes:
            hint = f"{HINTS[shown_mode]}; " if shown_mode in HINTS else ""
            raise ValueError(f"{shown} does not apply to {shown_mode} ({hint}{option} is for {_users(modes)})")
        if mode == "fastpath" and args.no_decode and option in ("--prefixes", "--decode-batch-sizes", "--new-tokens"):
            raise ValueError(
                f"{shown} does not apply with --no-decode (it sets the decoding measurements, which --no-decode skips)"
            )


def _check_lengths(args, config) -> None:
    """Refuse, before any measurement, a length beyond the model's ``block_size`` (``--seq-len``, ``--cache-len``,
    a ``--sweep-seq-len`` value) and a ``--sweep-d-model`` value the model cannot take: the sweep measured every
    point before them first.

    Raises:
        ValueError: naming the option, the value and the valid range.
    """
    block = config.block_size
    lengths = [("--seq-len", [args.seq_len]), ("--cache-len", [args.cache_len])]
    if args.sweep:
        lengths.append(("--sweep-seq-len", args.sweep_seq_len))
    for option, values in lengths:
        bad = [v for v in values if v is not None and v > block]
        if bad:
            raise ValueError(
                f"{option}={','.join(map(str, values))}: {', '.join(map(str, bad))} > the model's block_size={block}; "
                f"expected 1 to {block} (or a larger --set block_size)"
            )
    for value in args.sweep_d_model if args.sweep else ():
        try:
            config.replace(d_model=value, d_head=None, d_ff=None)
        except ValueError as exc:
            raise ValueError(f"--sweep-d-model={','.join(map(str, args.sweep_d_model))}: {value}: {exc}") from None


def _users(modes) -> str:
    """``("train", "memory", "sweep")`` -> ``"--mode train and memory, and --sweep"``."""
    named = [m for m in modes if m != "sweep"]
    text = "--mode " + (" and ".join(named) if len(named) < 3 else ", ".join(named[:-1]) + " and " + named[-1])
    return (text + ", and --sweep" if named else "--sweep") if "sweep" in modes else text


def run(args) -> int:
    """Measure what ``--mode`` (or ``--sweep``) asks for, every variant interleaved with ``standard``, and write the
    result's JSON and markdown (and the sweep's PNG) under ``--out-dir``, named by :func:`_stem`; the table is
    printed. Every option and the output files are checked before the first measurement; returns 0.

    Raises:
        ValueError: an option the mode ignores, ``--attention``/``--integrator`` (the variants set them), a
            variant conflicting with the model options, a length beyond ``block_size``, or a result file that
            exists without ``--overwrite`` (reported by the CLI in one line, exit 2).
    """
    _check_mode_options(args)
    refuse_variant_conflicts(args, parse_variants_option(args.variants))  # before the output folder is claimed
    # claim the output before measuring: a measurement must never be lost to its output path
    out = OutputDir(args.out_dir, "--out-dir", overwrite=args.overwrite, layout=RESULTS_LAYOUT, what="bench")
    stem = _stem(args)
    for suffix in (".json", ".md") + ((".png",) if args.sweep else ()):
        out.claim(stem + suffix, check_only=True)
    args.out_dir = out
    if args.attention is not None or args.integrator is not None:
        raise ValueError("bench sets attention and integrator per variant; choose them with --variants")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    map_options = {} if args.n_steps is None else {"n_steps": args.n_steps}
    # --n-steps applies per variant (run_bench), not to the base config, whose attention has no map
    config = gpt_config_from_args(argparse.Namespace(**{**vars(args), "n_steps": None}))
    _check_lengths(args, config)
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
        log=progress_log(args),
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
        result = run_sweep(
            config,
            d_models=args.sweep_d_model,
            seq_lens=args.sweep_seq_len,
            n_steps=args.sweep_n_steps,
            batch_size=args.batch_size,
            repeats=args.repeats,
            warmup=args.warmup,
            log=progress_log(args),
            **common,
        )
        kind, markdown = "sweep", sweep_markdown
    elif args.mode == "fastpath":
        result = run_fastpath(
            config,
            modes=args.modes,
            peers=args.peers,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            repeats=args.repeats,
            warmup=args.warmup,
            decode=not args.no_decode,
            decode_batch_sizes=args.decode_batch_sizes,
            prefixes=args.prefixes,
            new_tokens=args.new_tokens,
            decode_repeats=args.repeats,
            log=progress_log(args),
            **common,
        )
        kind, markdown = "fastpath", fastpath_markdown
    elif args.mode == "decode":
        result = run_decode(
            config,
            batch_sizes=args.decode_batch_sizes,
            prefixes=args.prefixes,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            map_options=map_options,
            log=progress_log(args),
            **common,
        )
        kind, markdown = "decode", decode_markdown
    else:
        result = run_memory(
            config,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            cache_len=args.cache_len,
            map_options=map_options,
            dtype=args.dtype,
            compile_model=args.compile,
            **common,
        )
        kind, markdown = "memory", memory_markdown
    result = dict(preset=args.preset, command=command or shlex.join(["coupled-qk", "bench", "--mode", kind]), **result)
    stem = f"{kind}-{args.preset}-{result['settings']['device'].split(':')[0]}"
    if kind == "memory":  # memory-<preset>-<device>[-<dtype>][-compile], as the train mode's names
        stem = "memory" + result_stem(args.preset, result)[len("bench") :]
    text, plots = markdown(result), {}
    if args.sweep:
        plots = {f"{stem}.png": lambda path: plot_sweep(result, path)}
        text += f"\n![cost curve]({stem}.png)\n"
    paths = write_report(
        args.out_dir, Report(json={f"{stem}.json": result}, text={f"{stem}.md": text}, plots=plots), log=print
    )
    print(text)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
