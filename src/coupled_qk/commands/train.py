"""``coupled-qk train``: train a language model (or any task) from a preset or a config file plus overrides."""

from __future__ import annotations

import json
import os

from coupled_qk.commands.options import add_model_options, parse_overrides
from coupled_qk.training.config import TrainConfig

HELP = "train a language model on a corpus"

# command-line flag -> TrainConfig field (only flags given on the command line override the config)
TRAIN_FLAGS = {
    "corpus": str, "data_dir": str, "tokenizer": str, "cache_dir": str, "batch_size": int, "grad_accum": int,
    "lr": float, "warmup_steps": int, "weight_decay": float, "max_steps": int, "max_tokens": int,
    "max_minutes": float, "stop_after_steps": int, "eval_interval": int, "eval_batches": int,
    "log_interval": int, "checkpoint_interval": int, "seed": int, "device": str, "dtype": str, "out_dir": str,
}


def add_train_options(parser, model: bool = True) -> None:
    """Flags shared by ``train``, ``compare`` and ``demo``."""
    parser.add_argument("--config", default=None, help="TrainConfig JSON file (e.g. configs/wt103-60m.json)")
    if model:
        add_model_options(parser, default_preset=None)
    for name, kind in TRAIN_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None, dest=name)
    parser.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    parser.add_argument("--fsdp", action="store_true", default=None, help="FSDP2 instead of DDP under torchrun")
    parser.add_argument("--no-tensorboard", dest="tensorboard", action="store_false", default=None)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument(
        "--opt", dest="train_overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override any TrainConfig field, e.g. --opt min_lr_ratio=0.05 (repeatable)",
    )


def config_from_args(args, **fields) -> TrainConfig:
    """Merge the config file, ``fields``, explicit flags and ``--opt``/``--set`` overrides (later wins)."""
    data = TrainConfig.load(args.config).to_dict() if args.config else {}
    data.update(fields)
    for name in [*TRAIN_FLAGS, "compile", "fsdp", "tensorboard", "progress"]:
        value = getattr(args, name, None)
        if value is not None:
            data[name] = value
    data.update(parse_overrides(args.train_overrides, TrainConfig, "--opt"))
    model = dict(data.get("model", {}))
    if getattr(args, "preset", None):
        data["preset"] = args.preset
    for name in ("attention", "integrator", "n_steps"):
        if getattr(args, name, None) is not None:
            model[name] = getattr(args, name)
    model.update(parse_overrides(getattr(args, "overrides", [])))
    data["model"] = model
    if data.get("max_steps") is None and data.get("max_tokens") is None:
        data["max_steps"] = 1000
    return TrainConfig.from_dict(data)


def add_arguments(parser) -> None:
    add_train_options(parser)
    parser.add_argument("--resume", action="store_true", help="continue the run in --out-dir from its latest checkpoint")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args) -> int:
    cfg = config_from_args(args, **({"resume": True} if args.resume else {}))
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from coupled_qk.training.loop import train

    results = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    final = results["final"]
    print(json.dumps({k: v for k, v in final.items() if "perplexity" in k or k.endswith("loss")}, indent=2))
    print(f"run: {cfg.out_dir}  steps={results['steps']} tokens={results['tokens']:,} "
          f"time={results['train_seconds'] / 60:.1f} min ({results['stop_reason']})")
    return 0
