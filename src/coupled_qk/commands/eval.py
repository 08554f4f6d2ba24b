"""``coupled-qk eval CHECKPOINT``: perplexity of a trained model on whole corpus splits."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "perplexity of a checkpoint on a corpus split"


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="a run folder (uses its latest checkpoint) or a ckpt-* folder")
    parser.add_argument("--corpus", default=None, help="corpus name or path (default: the run's corpus)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--splits", default="valid,test", help="comma-separated splits (train, valid, test)")
    parser.add_argument("--stride", type=int, default=None, help="sliding-window stride (default: non-overlapping)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the results to this JSON file")


def evaluate_checkpoint(checkpoint, corpus=None, data_dir=None, splits=("valid", "test"), stride=None,
                        batch_size=8, device="auto") -> dict:
    """Token- and word-level perplexity of a checkpoint on whole splits (see ``training.perplexity``).

    Raises:
        FileNotFoundError: no checkpoint, tokenizer or corpus file where expected.
        ValueError: unknown split name or a bad stride.
    """
    from coupled_qk.data.cache import tokenize_to_cache
    from coupled_qk.data.paths import default_cache_dir
    from coupled_qk.data.tokenizers import Tokenizer
    from coupled_qk.training.checkpoint import load_checkpoint_model, resolve_checkpoint
    from coupled_qk.training.distributed import pick_device
    from coupled_qk.training.lm import WORD_LEVEL_CORPORA, run_corpus
    from coupled_qk.training.perplexity import evaluate_perplexity

    ckpt = resolve_checkpoint(checkpoint)
    run_dir = ckpt.parent
    run_cfg = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").is_file() else {}
    corpus_name = corpus or run_cfg.get("corpus")
    if corpus_name is None:
        raise ValueError(f"--corpus is needed: {run_dir} has no config.json naming its corpus")
    tok_dir = run_dir / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"tokenizer of the run not found: expected {tok_dir / 'tokenizer.json'}")
    tokenizer = Tokenizer.load(tok_dir)
    dev = pick_device(device)
    model, state = load_checkpoint_model(ckpt, dev)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"model vocab_size={model.config.vocab_size} differs from the tokenizer's {tokenizer.vocab_size}")
    data = run_corpus(corpus_name, data_dir or run_cfg.get("data_dir"), run_cfg.get("task_options", {}))
    cache = Path(run_cfg["cache_dir"]) if run_cfg.get("cache_dir") else default_cache_dir()
    out = {"checkpoint": str(ckpt), "step": state.get("step"), "corpus": data.name, "tokenizer": tokenizer.name,
           "stride": stride, "block_size": model.config.block_size}
    for split in splits:
        if split not in ("train", "valid", "test"):
            raise ValueError(f"split={split!r} is unknown; expected train, valid or test")
        text = data.split(split)
        tokens = tokenize_to_cache(text, tokenizer, cache / "tokens")
        n_words = data.words(split) if data.name in WORD_LEVEL_CORPORA else None
        out[split] = evaluate_perplexity(model, tokens, model.config.block_size, batch_size, stride, dev, n_words,
                                         desc=f"eval {split}")
    return out


def run(args) -> int:
    res = evaluate_checkpoint(args.checkpoint, args.corpus, args.data_dir, args.splits.split(","), args.stride,
                              args.batch_size, args.device)
    for split in args.splits.split(","):
        r = res[split]
        line = f"{split}: token perplexity {r['perplexity']:.3f} over {r['n_tokens']:,} {res['tokenizer']} tokens"
        if "word_perplexity" in r:
            line += f"; word perplexity {r['word_perplexity']:.3f} over {r['n_words']:,} words"
        print(line)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2))
    return 0
