"""``coupled-qk train``: train a language model (or any task) from a preset or a config file plus overrides.

The training options are generated from the :class:`~coupled_qk.training.config.TrainConfig` fields (their
help text and defaults live there), so every field has a flag, a help line and its default shown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from coupled_qk.checks.cli import fraction_arg, positive_int_arg, seed_arg
from coupled_qk.checks.values import check_value, coerce, field_types
from coupled_qk.commands.options import GivenOnce, add_model_options, model_overrides
from coupled_qk.models.config import parse_overrides
from coupled_qk.training.config import TrainConfig, check_given_fields_are_read

TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}

HELP = "train a language model on a corpus"

# fields set otherwise: model via --preset/--attention/--set, task_options via --opt
NOT_FLAGS = ("preset", "model", "task_options")
SPLIT_FLAGS = ("valid_fraction", "test_fraction", "min_split_words", "split_seed")  # -> LM task_options
DEFAULT_MAX_STEPS = 1000  # when neither --max-steps nor --max-tokens is given


def _metavar(annotation) -> str:
    text = str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    for name, meta in (("int", "INT"), ("float", "FLOAT"), ("str", "TEXT")):
        if text.startswith(name):
            return meta + ("|none" if "None" in text else "")
    return "VALUE"


def train_flags(resume: bool = False) -> list[str]:
    """The ``TrainConfig`` fields that have a command-line flag of their own."""
    skip = set(NOT_FLAGS) | (set() if resume else {"resume"})
    return [f.name for f in dataclasses.fields(TrainConfig) if f.name not in skip]


def add_train_options(
    parser, model: bool = True, defaults: dict | None = None, resume: bool = False, variant_flags: bool = True
) -> None:
    """Flags shared by ``train``, ``compare`` and ``demo``: one per :class:`TrainConfig` field (its help and
    default from the field's metadata; ``defaults`` replaces the shown defaults, as ``demo`` does), plus
    ``--config``, the model options (``variant_flags``: see :func:`add_model_options`) and ``--opt FIELD=VALUE``.
    Values stay strings here; they are parsed to the field's type in :func:`train_config_from_args`."""
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TrainConfig JSON file (e.g. configs/wt103-60m-coupled.json); flags override its fields",
    )
    if model:
        add_model_options(parser, default_preset=None, variant_flags=variant_flags)
    group = parser.add_argument_group("training options (TrainConfig fields)")
    types = field_types(TrainConfig)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    defaults = defaults or {}
    for name in train_flags(resume):
        f = fields[name]
        default = defaults.get(name, f.default)
        choices = f.metadata.get("choices")
        shown = f.metadata.get("shown") if name not in defaults else None
        text = f.metadata["help"] + f" (default: {shown or ('none' if default is None else default)})"
        flag = "--" + name.replace("_", "-")
        if types[name] is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            metavar = "{" + ",".join(choices) + "}" if choices else _metavar(types[name])
            group.add_argument(flag, dest=name, default=None, metavar=metavar, help=text)
    split = parser.add_argument_group(
        "held-out splits (language modelling): for corpora split at random by documents (a text file, a folder "
        "of *.txt files, pubmed, mixed-domain); a folder with train.txt/valid.txt/test.txt is used as given"
    )
    split.add_argument(
        "--valid-fraction",
        type=fraction_arg,
        default=None,
        metavar="FLOAT",
        help="share of documents in the validation split (default: 0.01)",
    )
    split.add_argument(
        "--test-fraction",
        type=fraction_arg,
        default=None,
        metavar="FLOAT",
        help="share of documents in the test split (default: 0.01)",
    )
    split.add_argument(
        "--min-split-words",
        type=positive_int_arg,
        default=None,
        metavar="INT",
        help="each evaluation split grows to this many words (~1.3 tokens each), within 20%% of the "
        "corpus (default: 10000)",
    )
    split.add_argument(
        "--split-seed", type=seed_arg, default=None, metavar="INT", help="seed of the document shuffle (default: 0)"
    )
    parser.add_argument(
        "--opt",
        dest="train_overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any TrainConfig field, e.g. --opt min_lr_ratio=0.05 or --opt task_options='{...}' (repeatable)",
    )


def _load_config_file(path: str) -> dict:
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--config {path} is a folder; expected a TrainConfig JSON file")
    return TrainConfig.load(p).to_dict()


def train_config_from_args(args, **fields) -> TrainConfig:
    """The run's :class:`TrainConfig`: ``fields`` (the command's own defaults, e.g. ``demo``'s), then the
    ``--config`` file, then the command line (flags, ``--opt``, the split flags, ``--preset``, ``--set`` and the
    variant flags), each later source overriding a field of an earlier one.

    Within the command line each setting is given once (:class:`~coupled_qk.commands.options.GivenOnce`): a field
    given two different values, e.g. ``--opt max_steps=5 --max-steps 7`` or ``--valid-fraction 0.2 --opt
    task_options='{"valid_fraction": 0.1}'``, is refused naming both. Every value is parsed to its field's
    declared type (:func:`coupled_qk.checks.values.coerce`).

    Raises:
        ValueError: naming the flag or field and the value, for a value of the wrong type or range, an
            unknown field, a bad config file (duplicate keys included), a field given twice.
    """
    data = {**fields, **(_load_config_file(args.config) if args.config else {})}  # the file over the defaults
    given = GivenOnce()
    data.update(_train_fields(args, given))
    split = {k: getattr(args, k) for k in SPLIT_FLAGS if getattr(args, k, None) is not None}
    for name, value in split.items():
        given.add(f"task_options.{name}", value, "--" + name.replace("_", "-"))
    if split:
        data["task_options"] = {**(data.get("task_options") or {}), **split}
    if getattr(args, "preset", None):
        given.add("preset", args.preset, "--preset")
        data["preset"] = args.preset
    model = dict(data.get("model") or {}) if isinstance(data.get("model", {}), dict) else data.get("model")
    overrides = model_overrides(args, given)
    if isinstance(model, dict):
        model.update(overrides)
    data["model"] = model
    _absolute_paths(data)
    if data.get("max_steps") is None and data.get("max_tokens") is None:
        data["max_steps"] = DEFAULT_MAX_STEPS
    cfg = TrainConfig.from_dict(data)
    check_given_fields_are_read(cfg, given.names())  # e.g. --eval-batches with --full-eval: no effect
    return cfg


def _train_fields(args, given: GivenOnce) -> dict:
    """The ``TrainConfig`` fields set by flags and ``--opt`` items (typed, checked), each recorded in ``given``;
    the fields inside ``--opt model='{...}'`` and ``--opt task_options='{...}'`` one by one."""
    types = field_types(TrainConfig)
    out: dict = {}
    for name in types:
        value = getattr(args, name, None)
        if value is not None and name not in NOT_FLAGS:
            flag = "--" + name.replace("_", "-")
            out[name] = coerce(flag, value, types[name])
            check_value(flag, out[name], types[name], TRAIN_FIELDS[name].metadata)  # range/choices, named as given
            given.add(name, out[name], flag)
    for item in args.train_overrides:
        for name, value in parse_overrides([item], TrainConfig, "--opt").items():
            where = f"--opt {item}"
            if name == "model" and isinstance(value, dict):
                for key, sub in value.items():
                    given.add_model(key, sub, where)
            elif name == "task_options" and isinstance(value, dict):
                for key, sub in value.items():
                    given.add(f"task_options.{key}", sub, where)
            else:
                given.add(name, value, where)
            out[name] = value
    return out


def _absolute_paths(data: dict) -> None:
    """A corpus given as a relative path (and a relative ``data_dir``) is stored absolute, so ``eval``,
    ``analyze`` and resumes started from another folder find the same text."""
    from coupled_qk.data.corpora import KNOWN_CORPORA

    corpus = data.get("corpus")  # an empty one is left as it is, for preflight's error ('' would resolve to the cwd)
    if isinstance(corpus, str) and corpus.strip() and corpus not in KNOWN_CORPORA and not corpus.startswith("hf:"):
        path = Path(corpus).expanduser()
        if path.exists() and not path.is_absolute():
            data["corpus"] = str(path.resolve())
    if (
        isinstance(data.get("data_dir"), str)
        and data["data_dir"].strip()
        and Path(data["data_dir"]).expanduser().is_dir()
    ):
        data["data_dir"] = str(Path(data["data_dir"]).expanduser().resolve())


def preflight(cfg: TrainConfig, run_folder: bool = True) -> None:
    """Checks of a training config against this machine and its file system, before any data is read:
    ``device`` and ``dtype`` exist here, ``data_dir`` is not a file, ``cache_dir`` can be created, the task's
    ``task_options`` are valid (:func:`coupled_qk.training.tasks.check_task_options`), and (with ``run_folder``)
    ``out_dir`` may hold a run (:func:`coupled_qk.output_dir.check_run_out_dir`).

    Raises:
        ValueError: naming the option (``--device``, ``--dtype``, ``--data-dir``, ``--cache-dir``,
            ``task_options.<field>``, ``out_dir``).
    """
    from coupled_qk.checks.paths import folder_value, output_location, path_value
    from coupled_qk.data.tokenizers import check_tokenizer_spec
    from coupled_qk.devices import check_device, check_dtype
    from coupled_qk.output_dir import check_run_out_dir
    from coupled_qk.training.tasks import check_task_options

    device = check_device("--device", cfg.device)
    check_dtype("--dtype", cfg.dtype, device)
    if cfg.data_dir is not None:
        folder_value("--data-dir", cfg.data_dir)
    if cfg.cache_dir is not None:
        output_location("--cache-dir", cfg.cache_dir)
    for name in ("corpus", "tokenizer"):
        if not str(getattr(cfg, name)).strip():
            raise ValueError(f"--{name}='' is empty")
    if not cfg.resume:  # a resumed run reads the tokenizer saved in its folder
        check_tokenizer_spec("--tokenizer", cfg.tokenizer)
    check_task_options(cfg.task, cfg.task_options)
    if run_folder:
        check_run_out_dir(path_value("--out-dir", cfg.out_dir))


def read_corpus_first(cfg: TrainConfig) -> None:
    """Read a language-modelling config's corpus once, before a command claims a folder of several runs
    (``compare``, ``demo``): a missing, unreadable or unsplittable corpus is then one line with nothing created,
    instead of failing in the first run after the comparison's folders were made (``train`` reads its data before
    its run folder is created anyway).

    Raises:
        FileNotFoundError / ValueError: as :func:`coupled_qk.training.tasks.lm.run_corpus`.
    """
    if cfg.task == "lm":
        from coupled_qk.training.tasks.lm import run_corpus

        run_corpus(cfg.corpus, cfg.data_dir, cfg.task_options)


def add_arguments(parser) -> None:
    """Register the training options (:func:`add_train_options`, with ``--resume``) and ``--print-config``."""
    add_train_options(parser, resume=True)
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args) -> int:
    """Train one run (:func:`coupled_qk.training.loop.train`) after :func:`preflight`, then print its final
    held-out metrics (JSON) and a summary line on rank 0; ``--print-config`` prints the resolved
    :class:`TrainConfig` and trains nothing. Returns 0 (on every rank).

    Raises:
        ValueError: a bad option, config file or ``--opt`` item, naming it; a run folder or resume refused
            (exit 2 from the CLI). ``TrainingDiverged`` (exit 3) and ``TrainingInterrupted`` (exit 130 / 143, after
            a checkpoint) propagate to :func:`coupled_qk.cli.main`.
    """
    cfg = train_config_from_args(args)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    preflight(cfg)
    from coupled_qk.training.loop import train

    results = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    final = results["final"]
    print(
        json.dumps(
            {k: v for k, v in final.items() if "perplexity" in k or "bits_per" in k or k.endswith("loss")}, indent=2
        )
    )
    print(  # the time, with the share of validation, is the training loop's closing line (stderr)
        f"run: {cfg.out_dir}  steps={results['steps']} tokens={results['tokens']:,} ({results['stop_reason']})"
    )
    return 0
