"""``TrainConfig``: one validated object per run, saved with its checkpoints and results."""

from __future__ import annotations

from dataclasses import dataclass, field

from coupled_qk.models.config import PRESETS, GPTConfig, JSONConfig
from coupled_qk.training.tasks import TASKS

RESULT_NEUTRAL_FIELDS = frozenset({
    "out_dir", "resume", "progress", "tensorboard", "log_interval", "checkpoint_interval", "keep_checkpoints",
    "device", "compile", "data_dir", "cache_dir", "max_minutes",
})
"""Fields that do not change what a finished run computed: where files live, logging and checkpointing, the
device and compilation, and the wall-clock budget (a run stopped by time is not reproducible anyway). A
finished run is reused by an experiment only if every other field matches
(:func:`coupled_qk.experiments.runner.check_reusable`)."""

CONTINUATION_FIELDS = RESULT_NEUTRAL_FIELDS | {"max_steps", "max_tokens", "stop_after_steps", "eval_interval",
                                               "eval_batches"}
"""Fields that may differ between a run and its ``--resume``: the result-neutral ones and the budget."""


@dataclass
class TrainConfig(JSONConfig):
    """Everything that defines a training run (task, data, model, optimiser, budget, logging).

    Model: ``preset`` plus ``model`` (a dict of :class:`GPTConfig` overrides); :meth:`gpt_config` resolves them
    (the task may fill ``vocab_size`` from its tokenizer).

    Budget: the run stops at the first of ``max_steps``, ``max_tokens`` (training tokens over all ranks) and
    ``max_minutes``. The learning-rate schedule (linear warmup, cosine decay to ``min_lr_ratio * lr``) spans
    ``max_steps`` or the steps implied by ``max_tokens``; ``max_minutes`` only stops early.
    ``stop_after_steps`` ends this invocation after that many steps (checkpointing) without changing the
    schedule, to split a long job across sessions.

    Batch: ``batch_size`` sequences per device and micro-step; a step is ``grad_accum`` micro-steps on each of
    ``world_size`` ranks, so the global batch is ``batch_size * grad_accum * world_size`` sequences.

    Raises:
        ValueError: from :meth:`validate` (run on construction), naming the field: unknown task, non-positive
            sizes, no budget at all, invalid ranges; from :meth:`from_dict` for unknown fields.
    """

    task: str = "lm"
    # data (language modelling)
    corpus: str = "wiki-vital"
    data_dir: str | None = None
    tokenizer: str = "bpe-8192"
    cache_dir: str | None = None
    # model
    preset: str = "tiny"
    model: dict = field(default_factory=dict)
    # optimisation
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # budget
    max_steps: int | None = None
    max_tokens: int | None = None
    max_minutes: float | None = None
    stop_after_steps: int | None = None
    # evaluation, logging, checkpoints
    eval_interval: int = 200
    eval_batches: int = 20
    log_interval: int = 10
    checkpoint_interval: int | None = None
    keep_checkpoints: int = 2
    early_stop_metric: str | None = None
    early_stop_value: float | None = None
    # runtime
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    fsdp: bool = False
    out_dir: str = "runs/run"
    resume: bool = False
    tensorboard: bool = True
    progress: bool = True
    task_options: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field; raise ``ValueError`` naming the first offending one."""
        if self.task not in TASKS:
            raise ValueError(f"TrainConfig.task={self.task!r} is unknown; expected one of {list(TASKS)}")
        if self.preset not in PRESETS:
            raise ValueError(f"TrainConfig.preset={self.preset!r} is unknown; expected one of {sorted(PRESETS)}")
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_batches", "log_interval", "keep_checkpoints"):
            _positive_int(name, getattr(self, name))
        for name in ("max_steps", "max_tokens", "stop_after_steps", "checkpoint_interval"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"TrainConfig.max_minutes={self.max_minutes!r} must be > 0")
        if self.max_steps is None and self.max_tokens is None:
            raise ValueError("TrainConfig needs max_steps or max_tokens (the learning-rate schedule's horizon)")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr={self.lr!r} must be > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TrainConfig.min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("TrainConfig.weight_decay and grad_clip must be >= 0")
        if self.dtype not in ("auto", "fp32", "bf16", "fp16"):
            raise ValueError(f"TrainConfig.dtype={self.dtype!r}; expected auto, fp32, bf16 or fp16")
        if (self.early_stop_metric is None) != (self.early_stop_value is None):
            raise ValueError("TrainConfig.early_stop_metric and early_stop_value must be given together")
        self.gpt_config()  # validates the model overrides

    def gpt_config(self, **extra) -> GPTConfig:
        """The model configuration: ``preset`` with ``model`` overrides, then ``extra``."""
        return GPTConfig.from_preset(self.preset, **{**self.model, **extra})


def config_differences(saved: dict, current: TrainConfig, ignore=CONTINUATION_FIELDS) -> dict:
    """``{field: (saved value, current value)}`` for fields outside ``ignore`` that differ."""
    now = current.to_dict()
    return {k: (saved.get(k), v) for k, v in now.items() if k not in ignore and saved.get(k) != v}


def describe_differences(diff: dict) -> str:
    """``"lr: 0.002 vs 0.005, corpus: ..."`` for error messages."""
    return ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in sorted(diff.items()))


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"TrainConfig.{name}={value!r} must be a positive integer")
