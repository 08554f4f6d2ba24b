"""``coupled-qk export RUN_DIR HF_DIR``: a training run as a Hugging Face folder (weights, config, tokenizer)."""

from __future__ import annotations

HELP = "write a run's checkpoint as a Hugging Face folder (AutoModelForCausalLM / AutoTokenizer)"


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="a run folder (uses its latest checkpoint) or a ckpt-* folder")
    parser.add_argument("hf_dir", help="output folder for save_pretrained files")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty HF_DIR")


def run(args) -> int:
    try:
        from coupled_qk.hf.export import export_run
    except ModuleNotFoundError as exc:
        if exc.name != "transformers":
            raise
        raise ValueError('export needs transformers: pip install "coupled-qk[hf]"') from exc
    info = export_run(args.run_dir, args.hf_dir, overwrite=args.overwrite)
    tok = f"tokenizer {info['tokenizer']}" if info["tokenizer"] else "no tokenizer (the run has none)"
    print(f"exported {info['checkpoint']} (step {info['step']}, attention={info['attention']}) with {tok} to "
          f"{info['hf_dir']}\nload it with: import coupled_qk; from transformers import AutoModelForCausalLM, "
          f"AutoTokenizer; AutoModelForCausalLM.from_pretrained({info['hf_dir']!r})")
    return 0
