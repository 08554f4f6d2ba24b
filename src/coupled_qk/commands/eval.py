"""``coupled-qk eval CHECKPOINT``: perplexity (per token and per word) and bits per byte and per character of a
trained model on whole corpus splits."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "perplexity and bits per byte of a checkpoint on a corpus split"


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="a run folder (uses its latest checkpoint) or a ckpt-* folder")
    parser.add_argument("--corpus", default=None, help="corpus name or path (default: the run's corpus)")
    parser.add_argument("--data-dir", default=None,
                        help="data folder of named corpora (default: the run's, else COUPLED_QK_DATA or ../shared/data)")
    parser.add_argument("--splits", default="valid,test", help="comma-separated splits (train, valid, test)")
    parser.add_argument("--stride", type=int, default=None, help="sliding-window stride (default: non-overlapping)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the results to this JSON file")


def run(args) -> int:
    from coupled_qk.training.evaluate import evaluate_checkpoint

    res = evaluate_checkpoint(args.checkpoint, args.corpus, args.data_dir, args.splits.split(","), args.stride,
                              args.batch_size, args.device)
    for split in args.splits.split(","):
        r = res[split]
        line = f"{split}: token perplexity {r['perplexity']:.3f} over {r['n_tokens']:,} {res['tokenizer']} tokens"
        if "word_perplexity" in r:
            line += f"; word perplexity {r['word_perplexity']:.3f} over {r['n_words']:,} words"
        if "bits_per_byte" in r:
            line += (f"; {r['bits_per_byte']:.4f} bits per byte over {r['n_bytes']:,} bytes, "
                     f"{r['bits_per_char']:.4f} bits per character")
        print(line)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2))
    return 0
