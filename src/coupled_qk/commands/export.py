"""``coupled-qk export RUN_DIR HF_DIR``: a training run as a Hugging Face folder (weights, config, tokenizer)."""

from __future__ import annotations

HELP = "write a run's checkpoint as a Hugging Face folder (AutoModelForCausalLM / AutoTokenizer)"


def add_arguments(parser) -> None:
    """Register ``RUN_DIR``, ``HF_DIR`` and ``--overwrite`` on ``parser``."""
    from coupled_qk.checks.cli import path_arg
    from coupled_qk.commands.options import add_overwrite_option

    parser.add_argument("run_dir", type=path_arg, help="a run folder (uses its latest checkpoint) or a ckpt-* folder")
    parser.add_argument(
        "hf_dir",
        type=path_arg,
        help="output folder for save_pretrained files (new or empty, or an earlier export with --overwrite)",
    )
    add_overwrite_option(parser)


def run(args) -> int:
    """Write the run's latest (or the given) checkpoint into ``HF_DIR`` as ``save_pretrained`` files with its
    tokenizer (:func:`coupled_qk.hf.export.export_run`; the folder claimed first) and print how to load it.
    Returns 0.

    Raises:
        ValueError: ``transformers`` not installed (naming the extra), an ``HF_DIR`` that is not new, empty or an
            earlier export with ``--overwrite``, or a run folder that cannot be exported (exit 2 from the CLI).
    """
    try:
        from coupled_qk.hf.export import export_run
    except ModuleNotFoundError as exc:
        if exc.name != "transformers":
            raise
        raise ValueError('export needs transformers: pip install "coupled-qk[hf]"') from exc
    from coupled_qk.hf.export import EXPORT_LAYOUT
    from coupled_qk.output_dir import OutputDir

    out = OutputDir(args.hf_dir, "HF_DIR", overwrite=args.overwrite, layout=EXPORT_LAYOUT, what="export")
    info = export_run(args.run_dir, out, overwrite=args.overwrite)
    tok = f"tokenizer {info['tokenizer']}" if info["tokenizer"] else "no tokenizer (the run has none)"
    print(
        f"exported {info['checkpoint']} (step {info['step']}, attention={info['attention']}) with {tok} to "
        f"{info['hf_dir']}\nload it with: import coupled_qk; from transformers import AutoModelForCausalLM, "
        f"AutoTokenizer; AutoModelForCausalLM.from_pretrained({info['hf_dir']!r})"
    )
    return 0
