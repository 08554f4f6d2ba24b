"""``coupled-qk generate RUN_DIR --prompt TEXT``: sample text from a trained run with its own tokenizer.

Past the model's context (``block_size`` tokens) the window slides by default: each new token is predicted from
the last ``block_size`` tokens, as nanoGPT's ``sample.py`` does (:meth:`coupled_qk.models.gpt.GPT.generate_sliding`;
the KV cache is used while the text fits and rebuilt from the window after that); a prompt longer than the context
is read through its last ``block_size`` tokens, as :meth:`~coupled_qk.models.gpt.GPT.generate` does. ``--context
error`` refuses both instead. The default temperature is 1.0, the same as :meth:`~coupled_qk.models.gpt.GPT.generate`.
"""

from __future__ import annotations

HELP = "sample text from a trained run (its own tokenizer, KV-cache decoding)"


def _sampling(args) -> bool:
    """Whether ``--temperature`` samples (below float32's smallest normal number decoding is greedy)."""
    from coupled_qk.checks.tensors import GREEDY_BELOW

    return args.temperature >= GREEDY_BELOW


def _ignored_options() -> dict:
    """The options that only sampling uses: ``--temperature 0`` takes the most likely token at every step, so a
    top-k restriction, a seed or more than one sample would change nothing (checked against the decoding in
    ``tests/training/test_generate_options.py``)."""
    from coupled_qk.commands.ignored import Applies

    greedy = Applies(
        _sampling,
        "--temperature=0 (greedy decoding: the most likely token at every step, nothing is "
        "sampled, so every sample is the same text)",
        "sampling, --temperature > 0",
    )
    return {"--top-k": (greedy,), "--seed": (greedy,), "--num-samples": (greedy,)}


def add_arguments(parser) -> None:
    """Register the ``generate`` options on ``parser``: the run, the prompt and length, the context policy, the
    sampling options (temperature, top-k, samples, seed), the device and the decoding options."""
    from coupled_qk.checks.cli import nonneg_float_arg, nonneg_int_arg, path_arg, positive_int_arg, seed_arg
    from coupled_qk.commands.options import add_device_option

    parser.add_argument("run_dir", type=path_arg, help="a run folder (its latest checkpoint) or a ckpt-* folder")
    parser.add_argument(
        "--prompt",
        default="",
        help="text to continue, of any length (see --context) (default: empty = start of a document)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=nonneg_int_arg,
        default=100,
        help="tokens to generate; past the context the window slides (see --context) (default 100)",
    )
    parser.add_argument(
        "--context",
        choices=("slide", "error"),
        default="slide",
        help="when prompt + new tokens exceed the model's context: slide (predict each token from "
        "the last block_size tokens, as nanoGPT and GPT.generate; a longer prompt is read "
        "through its last block_size tokens; the cache is rebuilt from the window) or "
        "error (default slide)",
    )
    parser.add_argument(
        "--temperature",
        type=nonneg_float_arg,
        default=1.0,
        help="0 = greedy; 1 samples the model's distribution (default 1.0, as GPT.generate)",
    )
    parser.add_argument(
        "--top-k", type=positive_int_arg, default=50, help="sample among the k most likely tokens (default 50)"
    )
    parser.add_argument("--num-samples", type=positive_int_arg, default=1, help="independent samples (default 1)")
    parser.add_argument("--seed", type=seed_arg, default=0, help="sampling seed (default 0); same seed, same text")
    add_device_option(parser, default="cpu")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="decode through one compiled single-token step over a static KV cache "
        "(GPT.generate(compile=True); eager with a warning if compilation fails)",
    )
    parser.add_argument(
        "--transposed-head",
        action="store_true",
        help="compute the logits from a transposed copy of the output head (GPT.use_transposed_head: "
        "faster single-row decoding on CPUs, the head's memory once more)",
    )


def run(args) -> int:
    """Load the run (model and its own tokenizer), encode ``--prompt`` and print ``--num-samples`` continuations of
    ``--max-new-tokens`` tokens (:meth:`coupled_qk.models.gpt.GPT.generate`, KV-cached), each preceded by the
    prompt, after a header line naming the checkpoint. Returns 0.

    Raises:
        ValueError: a sampling-only option with ``--temperature 0``; with ``--context error``, a prompt or prompt
            plus new tokens longer than ``block_size``; a run that cannot be loaded (exit 2 from the CLI).
    """
    import torch

    from coupled_qk.checks.values import finite, nonneg_int, positive_int
    from coupled_qk.commands.ignored import refuse_ignored_options
    from coupled_qk.training.distributed import pick_device
    from coupled_qk.training.pretrained import load_run

    nonneg_int("--max-new-tokens", args.max_new_tokens)
    finite("--temperature", args.temperature, 0)
    positive_int("--top-k", args.top_k)
    positive_int("--num-samples", args.num_samples)
    refuse_ignored_options(args, add_arguments, _ignored_options())
    device = pick_device(args.device)
    run = load_run(args.run_dir, device)
    if args.transposed_head:
        run.model.use_transposed_head()
    prompt = run.encode(args.prompt, device)
    limit = run.model.config.block_size
    over = prompt.shape[1] + args.max_new_tokens > limit
    if prompt.shape[1] > limit and args.context == "error":
        raise ValueError(
            f"--prompt has {prompt.shape[1]} tokens, more than the model's context block_size={limit}; "
            f"shorten it, or use --context slide (reads its last {limit} tokens)"
        )
    if over and args.context == "error":
        raise ValueError(
            f"--max-new-tokens={args.max_new_tokens} plus the prompt's {prompt.shape[1]} tokens "
            f"exceeds the model's context block_size={limit}; use at most "
            f"{max(limit - prompt.shape[1], 0)}, or --context slide"
        )
    sampling = _sampling(args)  # greedy decoding takes neither (GPT.generate refuses them there)
    generator = torch.Generator(device=device).manual_seed(args.seed) if sampling else None
    top_k = args.top_k if sampling else None
    print(
        f"# {run.checkpoint} (step {run.step}, {run.model.config.attention}); tokenizer {run.tokenizer.name}"
        + (f"; sliding context of {limit} tokens" if over else "")
    )
    for i in range(args.num_samples):
        out = run.model.generate(
            prompt,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=top_k,
            generator=generator,
            context=args.context,
            **_compile_kwargs(args),
        )
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + run.tokenizer.decode(out[0, prompt.shape[1] :]))
    _report_compile(args, run.model, prompt.shape[1])
    return 0


def _compile_kwargs(args) -> dict:
    """``generate()`` keyword arguments of ``--compile`` (none without it)."""
    return {"compile": True} if getattr(args, "compile", False) else {}


def _report_compile(args, model, prompt_len: int) -> None:
    """One line on stderr: the compiled step's first-call (compile) time, why it fell back to eager, or why it never
    ran; and how many new tokens, past the context, were decoded eagerly anyway."""
    import sys

    if not getattr(args, "compile", False):
        return
    info = model.compile_info
    limit = model.config.block_size
    past = args.max_new_tokens - max(min(args.max_new_tokens, limit - prompt_len), 0)  # generate_sliding's split
    note = f"; the {past} new tokens past the context decoded eagerly" if past else ""
    if "decode_error" in info:
        print(f"# compile failed, decoded eagerly: {info['decode_error']}", file=sys.stderr)
    elif "decode_first_call_s" in info:
        print(
            f"# compiled decoding step: first call (compile) {info['decode_first_call_s']:.1f} s{note}", file=sys.stderr
        )
    else:
        print(
            "# --compile: no compiled step ran (the first new token comes from the prompt's eager pass"
            f"{', tokens past the context decode eagerly' if past else ''}); decoded eagerly",
            file=sys.stderr,
        )
