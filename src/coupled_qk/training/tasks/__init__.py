"""Task registry: what ``TrainConfig.task`` may name, and the interface the training loop needs from a task.

Adding a task is one line in :data:`TASKS` (``name -> "module:Class"``, imported only when used) plus a class
with the :class:`Task` interface. The built-in tasks live beside this module: :mod:`.lm` (language modelling),
:mod:`.mqar` with :mod:`.mqar_accuracy` (multi-query associative recall) and :mod:`.glue` (GLUE fine-tuning). See
``docs/DESIGN.md`` (how data flows through a training run).
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "TASKS",
    "TASK_FIELDS",
    "Task",
    "check_options",
    "check_task_fields",
    "check_task_options",
    "steps_for_tokens",
    "task_class",
    "unread_fields",
]

TASKS: dict[str, str] = {
    "lm": "coupled_qk.training.tasks.lm:LMTask",
    "mqar": "coupled_qk.training.tasks.mqar:MQARTask",
    "glue": "coupled_qk.training.tasks.glue:GlueTask",
}
"""Task name -> ``"module:Class"`` of a class implementing :class:`Task`."""


@runtime_checkable
class Task(Protocol):
    """What :func:`coupled_qk.training.loop.train` needs from a task (language modelling, MQAR, ...).

    Constructed as ``Task(cfg: TrainConfig, run_dir: Path | None)``: read the task's settings from ``cfg``
    (its own settings from ``cfg.task_options``, rejecting unknown keys with ``ValueError``), load or build
    the data. ``run_dir`` is the run folder (a resumed run may reload its tokenizer from there).

    The run folder (:class:`~coupled_qk.training.run_folder.RunFolder`) records what evaluation and resumption
    need: :meth:`describe` as its data description, and a task's ``tokenizer`` attribute (a
    :class:`~coupled_qk.data.tokenizers.Tokenizer`), when it has one, as its tokenizer. A task never writes into
    the run folder itself.

    Attributes:
        name: the registry name (``"lm"``, ``"mqar"``).

    A task names, as the class attribute ``config_fields``, the data fields of
    :class:`~coupled_qk.training.config.TrainConfig` it reads (of :data:`TASK_FIELDS`); a value other than the default
    in any other one is refused (:func:`check_task_fields`). A task should also name, as the class attribute
    ``options_class``, the dataclass of its ``task_options``
    (fields declared with ``coupled_qk.option``, a ``from_options(dict)`` class method): the command line checks
    the options with it before any work (:func:`check_task_options`) and the introspection tests draw valid and
    invalid values from its declarations (``tests/reliability/test_field_declarations.py``). A task may name, as
    the class attribute ``data_identity``, the keys of :meth:`describe` that identify its data (LM: token counts
    and text SHA-256s): a resume whose data differs there from the run's ``data.json`` is refused
    (:meth:`coupled_qk.training.run_folder.RunFolder.check_data`).
    """

    name: str

    def model_overrides(self) -> dict:
        """:class:`~coupled_qk.GPTConfig` fields the data decide (``vocab_size``, and ``block_size`` for MQAR)."""

    def describe(self) -> dict:
        """A JSON-serialisable description of the data, recorded by the run folder (its data description, and in its
        results)."""

    def train_batch(
        self, step: int, micro: int, rank: int, world: int, batch_size: int, device: str | torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of micro-step ``micro`` of optimiser step ``step`` for ``rank`` of ``world``.

        Must be a pure function of its arguments (exact resume; ``world`` ranks with ``batch_size`` rows see
        the same global batch as one process with ``world * batch_size``). Returns ``(x, y)``, int64 of
        shape ``(batch_size, T)`` with ``T <= block_size``; ``y`` is -100 where no loss is taken.
        """

    def step_tokens(self, step: int, world: int) -> int:
        """Input tokens of optimiser step ``step`` over all micro-steps and all ``world`` ranks: the real
        length of each sequence (no padding, not ``block_size``). Counts ``tokens``, ``tokens_per_s`` and the
        ``max_tokens`` budget."""

    def evaluate(
        self,
        model: torch.nn.Module,
        device: str | torch.device,
        quick: bool = True,
        autocast_dtype: torch.dtype | None = None,
    ) -> dict:
        """Metrics as ``{"valid/<metric>": float, ...}`` (``quick``: the periodic, cheaper evaluation; the
        final one also reports ``test/...`` where the task has a test split). Restores ``model``'s mode."""


def task_class(name: str) -> type:
    """The class registered as ``name`` in :data:`TASKS` (imported on first use).

    Raises:
        ValueError: ``name`` is not registered (listing the registered names).
    """
    if name not in TASKS:
        raise ValueError(f"TrainConfig.task={name!r} is unknown; expected one of {list(TASKS)}")
    module, _, attr = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


DATA_FIELDS = ("corpus", "data_dir", "tokenizer", "cache_dir")
"""The data fields of :class:`~coupled_qk.training.config.TrainConfig` that only some tasks read."""

EVAL_FIELDS = ("eval_batches", "full_eval")
"""The quick-validation fields of :class:`~coupled_qk.training.config.TrainConfig` that only some tasks read (MQAR
and GLUE size their quick validation with ``task_options.quick_eval_examples`` instead)."""

TASK_FIELDS = (*DATA_FIELDS, *EVAL_FIELDS)
"""Every field a task's ``config_fields`` may name; a task reads a subset of them."""


def unread_fields(task: str) -> frozenset[str]:
    """The :data:`TASK_FIELDS` that the task registered as ``task`` does not read (outside its class's
    ``config_fields``; a task without the attribute reads them all): MQAR reads only ``cache_dir``, so its
    ``eval_batches`` or ``corpus`` do not change what it computes. The one list of "settings this run ignores" of
    the reuse decision (:func:`coupled_qk.study.executor.setting_differences`) and of a record's fingerprint
    (:func:`coupled_qk.study.records.fingerprint`).

    Raises:
        ValueError: ``task`` is not registered (:func:`task_class`).
    """
    return frozenset(TASK_FIELDS) - frozenset(getattr(task_class(task), "config_fields", TASK_FIELDS))


_INSTEAD = {f: "size its quick validations with task_options quick_eval_examples" for f in EVAL_FIELDS}


def check_task_fields(cfg) -> None:
    """Refuse a :data:`TASK_FIELDS` value other than its default in a ``TrainConfig`` whose task does not read that
    field (its class's ``config_fields``; a task without the attribute is not checked): ``--task mqar --corpus
    pubmed`` would otherwise train on MQAR and record a corpus it never saw, ``--task glue --eval-batches 5``
    validate on what ``quick_eval_examples`` says. Run by ``TrainConfig.validate``.

    Raises:
        ValueError: naming the field, its value, the task and the fields the task reads.
    """
    used = getattr(task_class(cfg.task), "config_fields", None)
    if used is None:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name in TASK_FIELDS:
        value = getattr(cfg, name)
        if name not in used and value != defaults[name]:
            reads = f"it reads {', '.join(used)}" if used else "it reads none of " + ", ".join(TASK_FIELDS)
            instead = f"; {_INSTEAD[name]}" if name in _INSTEAD else ""
            raise ValueError(
                f"TrainConfig.{name}={value!r} does not apply to task={cfg.task!r} ({reads}; "
                f"leave {name} at its default {defaults[name]!r}{instead})"
            )


def check_options(task: str, options: dict, known) -> dict:
    """``options`` if every key is in ``known``; ``ValueError`` naming the unknown keys otherwise.

    Args:
        task: the task's name, for the message.
        options: ``TrainConfig.task_options``.
        known: the option names the task reads.
    """
    if not isinstance(options, dict):
        raise ValueError(f"TrainConfig.task_options={options!r} must be a dict")
    unknown = set(options) - set(known)
    if unknown:
        from coupled_qk.checks.values import unknown_names_error

        raise unknown_names_error(f"{task} task_options", unknown, known, "valid options")
    return options


def check_task_options(task: str, options: dict | None):
    """The checked options of task ``task`` (its class's ``options_class.from_options(options)``), or ``options``
    unchanged for a task that declares no options class. Run by ``train`` before any work, so a bad option is one
    line before the run folder is touched.

    Raises:
        ValueError: an unknown task, an unknown option, a missing required one or a value outside its declaration,
            naming ``task_options.<field>``.
    """
    options_class = getattr(task_class(task), "options_class", None)
    return options if options_class is None else options_class.from_options(options)


def steps_for_tokens(task: Task, max_tokens: int, world: int, max_steps: int | None = None) -> int:
    """Fewest optimiser steps whose :meth:`Task.step_tokens` add up to at least ``max_tokens`` (at most
    ``max_steps`` when given): the schedule horizon of a token budget.

    Raises:
        ValueError: ``max_tokens`` < 1, or a step with no tokens (the budget could never be reached).

    Warns:
        UserWarning: ``max_tokens`` is smaller than the first step's tokens (the run trains one whole step).
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r} must be a positive integer")
    seen, step = 0, 0
    while seen < max_tokens and (max_steps is None or step < max_steps):
        n = task.step_tokens(step, world)
        if n < 1:
            raise ValueError(f"task {task.name!r} reports {n} tokens at step {step}; a token budget needs >= 1")
        if step == 0 and n > max_tokens:
            warnings.warn(
                f"max_tokens={max_tokens:,} is smaller than one optimizer step ({n:,} tokens: batch_size x "
                "grad_accum x processes x sequence length); the run trains one step of "
                f"{n:,} tokens. Raise max_tokens or lower batch_size for a smaller budget",
                stacklevel=2,
            )
        seen += n
        step += 1
    return step
