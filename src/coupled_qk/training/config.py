"""``TrainConfig``: one validated object per run, saved with its checkpoints and results.

Every field carries its help text in ``metadata["help"]`` (and ``metadata["choices"]`` where the values are a
fixed set); the ``coupled-qk train`` options are generated from them, so the command line, JSON config files
and the Python API share one definition, one typed parser (:func:`coupled_qk.checks.values.coerce`) and one
validation.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass

from coupled_qk.checks.values import (
    MAX_SEED,
    check_declared,
    coerce,
    coerce_fields,
    field_types,
    positive_int,
    unknown_keys,
)
from coupled_qk.devices import AUTOCAST_DTYPES
from coupled_qk.models.config import PRESETS, GPTConfig, JSONConfig, rename_fields
from coupled_qk.models.field_rules import ReadWhen
from coupled_qk.models.options import option
from coupled_qk.training.metrics import metric_direction
from coupled_qk.training.tasks import TASKS, check_task_fields

BUDGET_CHANGES = ("keep", "rewarm")
BEST_MODES = ("auto", "min", "max")

RESULT_NEUTRAL_FIELDS = frozenset(
    {
        "out_dir",
        "resume",
        "progress",
        "tensorboard",
        "log_interval",
        "checkpoint_interval",
        "checkpoint_minutes",
        "keep_checkpoints",
        "device",
        "compile",
        "data_dir",
        "cache_dir",
        "max_minutes",
    }
)
"""Fields that do not change what a finished run computed: where files live, logging and checkpointing, the
device and compilation, and the wall-clock budget (a run stopped by time is not reproducible anyway). A
finished run is reused by an experiment only if every other field matches
(:func:`coupled_qk.study.executor.check_reusable`)."""

STOPPING_POINTS = frozenset({"max_minutes", "stop_after_steps"})
"""Fields that end an invocation before the run's budget: stopping points, not settings. A run one of them
stopped has ``results.json`` with ``stop_reason`` naming the field and a checkpoint: it is unfinished, and the
experiment runner continues it when asked for more (:func:`coupled_qk.study.executor.execute`); a run that
reached its budget computed the same whatever they were."""

CONTINUATION_FIELDS = RESULT_NEUTRAL_FIELDS | {
    "max_steps",
    "max_tokens",
    "stop_after_steps",
    "eval_interval",
    "eval_batches",
    "on_budget_change",
    "batch_size",
}
"""Fields that may differ between a run and its ``--resume``: the result-neutral ones and the budget (a budget
change needs ``on_budget_change``), and ``batch_size`` together with the number of processes (the global batch
is checked by :func:`coupled_qk.training.resume.plan_batch`)."""


def _f(
    default,
    help: str,
    choices=None,
    default_factory=None,
    shown: str | None = None,
    *,
    lo=None,
    hi=None,
    lo_open: bool = False,
    hi_open: bool = False,
    free: str | None = None,
):
    """A dataclass field with its command-line help, its valid values declared once (``choices``; ``lo``/``hi``
    with ``lo_open``/``hi_open`` for numbers; ``free`` for text and dicts, saying what checks them; nothing for
    a ``bool``; see :func:`coupled_qk.models.options.option`) and how its default reads, all in ``metadata``."""
    extra = {"help": help, **({"shown": shown} if shown else {})}
    if default_factory is not None:
        return option(
            default_factory=default_factory,
            choices=choices,
            free=free,
            lo=lo,
            hi=hi,
            lo_open=lo_open,
            hi_open=hi_open,
            **extra,
        )
    return option(default, choices=choices, free=free, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, **extra)


_TEXT = "a non-empty text (check_text_fields); its meaning is checked where it is used"
_METRIC = "a metric name, checked against the task's evaluation at the first validation (check_metrics)"


@dataclass
class TrainConfig(JSONConfig):
    """Everything that defines a training run (task, data, model, optimiser, budget, logging).

    Model: ``preset`` plus ``model`` (a dict of :class:`GPTConfig` overrides); :meth:`gpt_config` resolves them
    (the task may fill ``vocab_size`` from its tokenizer).

    Budget: the run stops at the first of ``max_steps``, ``max_tokens`` (training tokens over all ranks) and
    ``max_minutes``. The learning-rate schedule (linear warmup, cosine decay to ``min_lr_ratio * lr``) spans
    ``max_steps`` or the steps implied by ``max_tokens``; ``max_minutes`` only stops early.
    ``stop_after_steps`` ends this invocation after that many steps (checkpointing) without changing the
    schedule, to split a long job across sessions. Changing the budget on ``resume`` changes the schedule's
    horizon and needs ``on_budget_change`` (``keep``: continue the saved schedule, past its end at the floor
    learning rate; ``rewarm``: a new warmup and cosine decay from the current step to the new horizon).

    Batch: ``batch_size`` sequences per device and micro-step; a step is ``grad_accum`` micro-steps on each of
    ``world_size`` ranks, so the global batch is ``batch_size * grad_accum * world_size`` sequences.

    Checkpoints: every ``checkpoint_interval`` steps and every ``checkpoint_minutes`` of training time
    (default 15), at the end, and when the run is stopped by a signal (``SIGINT``/``SIGTERM``).

    Every field is converted to its declared type on construction (``"3"`` -> ``3``, ``"false"`` -> ``False``;
    ``model`` values to the :class:`GPTConfig` field types), so JSON files, the command line and Python calls
    are parsed alike.

    Raises:
        ValueError: from :meth:`validate` (run on construction), naming the field: a value of the wrong type,
            unknown task, non-positive sizes, non-finite or out-of-range numbers, no budget at all, best_mode
            without best_metric, min_delta without patience, a data field
            (corpus, data_dir, tokenizer, cache_dir) other than its default that the task does not read; from
            :meth:`from_dict` for unknown fields.
    """

    task: str = _f("lm", "training task", tuple(TASKS))
    # data (language modelling)
    corpus: str = _f(
        "wiki-vital",
        "corpus name (wiki-vital, pubmed, mixed-domain, wikitext-103, ...) or a text "
        "file or folder with train/valid/test splits",
        free=_TEXT,
    )
    data_dir: str | None = _f(None, "folder holding the released corpora", shown="the shared data folder", free=_TEXT)
    tokenizer: str = _f(
        "bpe-8192", "gpt2, bpe-<vocab> (trained on the training split) or a saved tokenizer path", free=_TEXT
    )
    cache_dir: str | None = _f(None, "token cache folder", shown="the user cache folder", free=_TEXT)
    # model
    preset: str = _f("tiny", "model size preset", tuple(sorted(PRESETS)))
    model: dict = _f(
        None,
        "GPTConfig overrides (command line: --set FIELD=VALUE)",
        default_factory=dict,
        free="GPTConfig overrides, checked by gpt_config()",
    )
    # optimisation
    batch_size: int = _f(16, "sequences per process and micro-step", lo=1)
    grad_accum: int = _f(1, "micro-steps (gradient accumulation) per optimizer step", lo=1)
    lr: float = _f(1e-3, "peak learning rate (AdamW)", lo=0, lo_open=True)
    min_lr_ratio: float = _f(0.1, "final learning rate of the cosine decay, as a fraction of lr", lo=0, hi=1)
    warmup_steps: int = _f(100, "linear warmup steps", lo=0)
    weight_decay: float = _f(0.1, "AdamW weight decay on matrices (none on vectors)", lo=0)
    beta1: float = _f(0.9, "AdamW beta1", lo=0, hi=1, hi_open=True)
    beta2: float = _f(0.95, "AdamW beta2", lo=0, hi=1, hi_open=True)
    grad_clip: float = _f(1.0, "clip the gradient norm to this value (0: no clipping)", lo=0)
    # budget
    max_steps: int | None = _f(
        None,
        "optimizer steps of the schedule",
        shown="none; 1000 on the command line when max_tokens is none too",
        lo=1,
    )
    max_tokens: int | None = _f(
        None, "training tokens over all processes (sets the schedule when smaller than max_steps)", lo=1
    )
    max_minutes: float | None = _f(
        None, "stop (checkpointing) after this much training time; the schedule is unchanged", lo=0, lo_open=True
    )
    stop_after_steps: int | None = _f(
        None, "end this invocation after this many steps, to be continued with --resume", lo=1
    )
    on_budget_change: str | None = _f(
        None,
        "on --resume with a different max_steps/max_tokens: keep the saved "
        "schedule, or rewarm a new one from the current step",
        BUDGET_CHANGES,
    )
    # evaluation, logging, checkpoints
    eval_interval: int | None = _f(
        None,
        "steps between quick validations (none: about 10 per run, see auto_eval_interval)",
        shown="none = the schedule's steps / 10",
        lo=1,
    )
    eval_batches: int | None = _f(
        None,
        "batches per quick validation (none: scaled to the run, so that validation takes a bounded share of it; "
        "see training.eval_budget.auto_eval_batches)",
        shown="none = up to 20, fewer in short runs",
        lo=1,
    )
    log_interval: int = _f(10, "steps between metrics.jsonl records", lo=1)
    checkpoint_interval: int | None = _f(
        None, "steps between checkpoints (besides checkpoint_minutes and the end)", lo=1
    )
    checkpoint_minutes: float | None = _f(
        15.0,
        "minutes of training between checkpoints (none: only checkpoint_interval, the end and a stop signal)",
        lo=0,
        lo_open=True,
    )
    keep_checkpoints: int = _f(2, "newest checkpoints kept", lo=1)
    early_stop_metric: str | None = _f(
        None,
        "validation metric that ends training once it reaches early_stop_value (e.g. valid/accuracy)",
        free=_METRIC,
    )
    early_stop_value: float | None = _f(None, "threshold of early_stop_metric", lo=None, hi=None)
    full_eval: bool = _f(False, "periodic validations use the whole validation split (not eval_batches batches)")
    best_metric: str | None = _f(
        None,
        "keep the checkpoint with the best value of this validation metric "
        "(e.g. valid/loss) as best-<step>/; the final evaluation uses it",
        free=_METRIC,
    )
    best_mode: str = _f(
        "auto",
        "whether lower or higher best_metric is better (auto: higher for accuracy, f1, "
        "mcc and score metrics, lower otherwise)",
        BEST_MODES,
    )
    patience: int | None = _f(
        None,
        "stop after this many validations in a row without an improvement of "
        "best_metric larger than min_delta (needs best_metric)",
        lo=1,
    )
    min_delta: float = _f(0.0, "smallest change of best_metric that counts as an improvement (absolute)", lo=0)
    # runtime
    seed: int = _f(0, "random seed (initialisation and data order)", lo=0, hi=MAX_SEED)
    device: str = _f("auto", "auto (CUDA if available), cpu, cuda or cuda:N", free="a device name (check_device_name)")
    dtype: str = _f(
        "auto",
        "autocast dtype (auto: bf16 on CUDA; on CPU fp32, or bf16 with --compile where the CPU has native bf16)",
        AUTOCAST_DTYPES,
    )
    compile: bool = _f(
        False, "torch.compile the model per block (GPT.compile; eager with a warning if compilation fails)"
    )
    fsdp: bool = _f(False, "FSDP2 instead of DDP under torchrun")
    out_dir: str = _f("runs/run", "run folder (config, metrics, checkpoints, results)", free=_TEXT)
    resume: bool = _f(False, "continue the run in out_dir from its latest checkpoint")
    tensorboard: bool = _f(True, "write TensorBoard events")
    progress: bool = _f(True, "show progress: a bar on a terminal, plain periodic log lines otherwise")
    task_options: dict = _f(
        None,
        "task-specific options (command line: --opt task_options='{...}')",
        default_factory=dict,
        free="the task's options, checked by the task",
    )

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Convert every field to its type, check it against its declaration (``_f``: range or choices in the
        field metadata), then the cross-field rules; raise ``ValueError`` naming the first offending one."""
        coerce_fields(self)
        types = field_types(GPTConfig)
        self.model = rename_fields(self.model, "TrainConfig.model")  # old field names of saved run configs
        self.model = {
            k: coerce(f"TrainConfig.model.{k}", v, types[k]) if k in types else v for k, v in self.model.items()
        }
        name = type(self).__name__
        check_text_fields(self)
        check_declared(self)  # each field's range or choices, declared once in its metadata (_f)
        if self.max_steps is None and self.max_tokens is None:
            raise ValueError("TrainConfig needs max_steps or max_tokens (the learning-rate schedule's horizon)")
        if (self.early_stop_metric is None) != (self.early_stop_value is None):
            raise ValueError("TrainConfig.early_stop_metric and early_stop_value must be given together")
        if self.best_mode != "auto" and self.best_metric is None:
            raise ValueError(
                f"{name}.best_mode={self.best_mode!r} needs best_metric (the metric whose direction it "
                "sets), e.g. best_metric='valid/loss'; without one leave best_mode='auto'"
            )
        if self.min_delta != 0 and self.patience is None:
            raise ValueError(
                f"{name}.min_delta={self.min_delta!r} needs patience (only the patience counter reads "
                "it); set patience or leave min_delta=0"
            )
        if self.patience is not None and self.best_metric is None:
            raise ValueError(
                f"{name}.patience={self.patience} needs best_metric (the metric whose "
                "improvement it waits for), e.g. best_metric='valid/loss'"
            )
        for field in ("best_metric", "early_stop_metric"):
            value = getattr(self, field)
            if value is not None and not value.strip():
                raise ValueError(
                    f"{name}.{field}={value!r} is empty; expected a validation metric such as 'valid/loss'"
                )
        self.gpt_config()  # validates the model overrides
        check_task_fields(self)  # a data field the task would ignore

    def best_is_higher(self) -> bool:
        """Whether a higher ``best_metric`` is better (``best_mode``, or for ``auto`` the metric's name)."""
        return higher_is_better(self.best_metric or "", self.best_mode)

    def gpt_config(self, **extra) -> GPTConfig:
        """The model configuration: ``preset`` with ``model`` overrides, then ``extra`` (the fields the task's
        data decide: ``vocab_size`` from the tokenizer, ``block_size`` for MQAR, a GLUE checkpoint's whole config).

        Raises:
            ValueError: an invalid override (from :class:`~coupled_qk.GPTConfig`), or a ``model`` override that
                ``extra`` would replace with another value (``--set vocab_size=1000`` with a 512-token tokenizer
                used to train a 512-token model and record 1000).
        """
        if extra and self.model:
            given = GPTConfig.from_preset(self.preset, **self.model)
            for name, value in extra.items():
                if name in self.model and getattr(given, name, value) != value:
                    raise ValueError(
                        f"TrainConfig.model.{name}={self.model[name]!r} cannot apply: task={self.task!r} sets "
                        f"{name}={value!r} from its data (the tokenizer, the MQAR sequences or the pretrained "
                        f"checkpoint); remove {name} from the model overrides (--set)"
                    )
        return GPTConfig.from_preset(self.preset, **{**self.model, **extra})


COMMAND_LINE_READ_WHEN = {
    "eval_batches": ReadWhen(
        lambda c: not c.full_eval,
        lambda c: "full_eval=True (every quick validation reads the whole validation split)",
        "the size of a quick validation, full_eval=False",
        lambda c: TrainConfig.__dataclass_fields__["eval_batches"].default,
    ),
    "on_budget_change": ReadWhen(
        lambda c: c.resume,
        lambda c: "resume=False (a new run has no saved schedule to keep or to warm up again)",
        "a --resume whose max_steps or max_tokens differ from the run's",
        lambda c: None,
    ),
}
"""``TrainConfig`` fields read only in some settings (``models/field_rules.py::ReadWhen``): given on the command
line (a flag, ``--opt``) in another setting they would take no effect, so :func:`check_given_fields_are_read`
refuses them. A config built in code or read from a file is not refused (the pre-registered converged studies set
``eval_batches`` beside ``full_eval``, and their records depend on that config)."""


def check_given_fields_are_read(cfg: TrainConfig, given) -> None:
    """Refuse a field of :data:`COMMAND_LINE_READ_WHEN` that is in ``given`` (the field names the command line set),
    at a value other than its default, in a setting where ``cfg`` does not read it.

    Raises:
        ValueError: one line naming the flag, its value, the setting and what the field is for.
    """
    for name, rule in COMMAND_LINE_READ_WHEN.items():
        value = getattr(cfg, name)
        if name in given and value != rule.default(cfg) and not rule.when(cfg):
            raise ValueError(
                f"--{name.replace('_', '-')}={value} is not read with {rule.otherwise(cfg)}: {name} is for "
                f"{rule.used_for}; drop it"
            )


def higher_is_better(metric: str, mode: str = "auto") -> bool:
    """Direction of a validation metric: ``mode`` ``"max"``/``"min"``, or for ``"auto"`` the direction its name
    says (:func:`coupled_qk.training.metrics.metric_direction`: higher for accuracy, f1, mcc, matthews and score, lower
    for losses, perplexities, errors and bits per byte) and lower for a name that says nothing (the training
    loop refuses such a metric with ``auto`` at its first validation: ``training.loop.check_metrics``)."""
    if mode != "auto":
        return mode == "max"
    return metric_direction(metric) == "max"


EVALUATIONS_PER_RUN = 10


def auto_eval_interval(total_steps: int) -> int:
    """The default ``eval_interval`` of a run whose schedule has ``total_steps`` optimiser steps: about
    :data:`EVALUATIONS_PER_RUN` quick validations per run (``round(total_steps / 10)``, at least 1), so that
    a short run draws a validation curve too. The last step is always evaluated as well.

    Raises:
        ValueError: ``total_steps`` not a positive integer.
    """
    positive_int("total_steps", total_steps)
    return max(1, round(total_steps / EVALUATIONS_PER_RUN))


def check_text_fields(cfg: TrainConfig) -> None:
    """No text field is empty or blank (an empty ``out_dir`` would mean the current folder, an empty ``corpus``
    the default one), and ``device`` is spelled as a device (its presence is checked where it is used).

    Raises:
        ValueError: naming the field.
    """
    from coupled_qk.devices import check_device_name

    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"{type(cfg).__name__}.{f.name}={value!r} is empty")
    check_device_name(f"{type(cfg).__name__}.device", cfg.device)


_KINDS = {bool: (bool,), int: (int,), float: (int, float), str: (str,), dict: (dict,), list: (list,)}
_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def check_saved_config(saved, where) -> dict:
    """``saved`` (a run's parsed ``config.json``), each :class:`TrainConfig` field it holds checked for its *kind*:
    ``eval``, ``analyze``, ``generate`` and ``--resume`` read these fields back without building a
    ``TrainConfig``, so a hand edit (``"corpus": 5``, ``"task_options": []`` or ``null``, ``"cache_dir": ""``) was a
    traceback deep inside them or silently read as the default.

    Only kinds are checked (a non-empty string where a string is declared, a dict for ``model`` and
    ``task_options``, an int that is not a bool, ``null`` only for optional fields); ranges and choices are not,
    so a run saved before a range or a choice changed still loads. A field it does not hold keeps its default.

    Returns:
        ``saved`` unchanged.

    A key that is no field (``"lerning_rate"``, a hand edit) is an error naming it and its close match
    (:func:`coupled_qk.checks.values.unknown_keys`): it would silently take no effect.

    Raises:
        ValueError: one line naming the file ``where``, the field, its value and the kind expected; or an unknown key.
    """
    if not isinstance(saved, dict):
        raise ValueError(f"{where} is not a JSON object (a run's TrainConfig); it holds a {type(saved).__name__}")
    unknown_keys(saved, field_types(TrainConfig), where, "TrainConfig", error=True)  # a typo would take no effect
    for name, annotation in field_types(TrainConfig).items():
        value = saved.get(name)
        optional = type(None) in typing.get_args(annotation)
        inner = next(a for a in typing.get_args(annotation) if a is not type(None)) if optional else annotation
        if name not in saved or (value is None and optional):
            continue
        kinds = _KINDS.get(typing.get_origin(inner) or inner, (object,))
        ok = isinstance(value, kinds) and (inner is bool or not isinstance(value, bool))
        if ok and not (isinstance(value, str) and not value.strip()):
            continue
        shown = json.dumps(value) if len(json.dumps(value)) <= 60 else json.dumps(value)[:57] + "..."
        what = "empty" if ok else _JSON_NAMES.get(type(value), type(value).__name__)
        expected = (
            "a non-empty string" if inner is str else _JSON_NAMES.get(inner, getattr(inner, "__name__", str(inner)))
        )
        raise ValueError(
            f"{where}: {name}={shown} is {what}; expected {expected}{' or null' if optional else ''} "
            "(was the file edited by hand?)"
        )
    return saved


def saved_value(saved: dict, name: str):
    """Field ``name`` of a saved run config, or the field's default where the file does not hold it (a run saved
    before the field existed, as :func:`check_saved_config` reads it): comparisons then see the value the run had,
    not ``None``."""
    if name in saved:
        return saved[name]
    spec = TrainConfig.__dataclass_fields__[name]
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


RESULT_NEUTRAL_TASK_OPTIONS = frozenset({"cache_dir"})
"""``TrainConfig.task_options`` keys that do not change results (where generated data are cached)."""


def config_differences(saved: dict, current: TrainConfig, ignore=CONTINUATION_FIELDS) -> dict:
    """``{field: (saved value, current value)}`` for fields outside ``ignore`` that differ (a field the saved
    config does not hold compares as its default: :func:`saved_value`); ``task_options`` are compared without
    :data:`RESULT_NEUTRAL_TASK_OPTIONS` (an MQAR sweep folder that was moved resumes: its data cache moved too)."""
    now = current.to_dict()
    diff = {k: (saved_value(saved, k), v) for k, v in now.items() if k not in ignore and saved_value(saved, k) != v}
    if "task_options" in diff:
        a, b = (
            {k: v for k, v in (d or {}).items() if k not in RESULT_NEUTRAL_TASK_OPTIONS} for d in diff["task_options"]
        )
        if a == b:
            del diff["task_options"]
    return diff


def describe_differences(diff: dict) -> str:
    """``"lr: 0.002 vs 0.005, corpus: ..."`` for error messages."""
    return ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in sorted(diff.items()))
