"""MQAR task for the project's training loop (:func:`coupled_qk.training.loop.train`).

Multi-query associative recall as in Zoology (Arora, Eyuboglu et al., arXiv:2312.04927; ``docs/METHOD.md`` section 6):
the data come from :mod:`coupled_qk.data.mqar`, the model is trained with next-token cross-entropy on the
query positions only (every other label is -100) and scored by argmax accuracy over those positions, overall
and per (L, K) slice.

Settings live in ``TrainConfig.task_options`` (all optional except the slices)::

    vocab_size            V (default 8192, Zoology's figure 2)
    train_slices          list of [seq_len, num_kv_pairs, num_examples]   (required)
    test_slices           list of [seq_len, num_kv_pairs, num_examples]   (required)
    data_seed             master seed of the per-slice data seeds (default 123, Zoology's DataConfig.seed)
    power_a               query-slot power law (default 0.01)
    random_non_queries    random filler tokens (default False, as in the paper sweeps)
    cache_dir             where generated slices are cached (default: TrainConfig.cache_dir/mqar, or none)
    quick_eval_examples   rows per test slice used by the periodic (quick) evaluation (default: all)
    eval_batch_size       rows per evaluation forward pass (default: TrainConfig.batch_size)

``TrainConfig.seed`` seeds the model and the order of the training batches; ``data_seed`` the data, so a
learning-rate sweep sees the same examples.

Batches: an *epoch* visits every training row once. Each slice's rows are permuted (seed ``(seed, epoch,
slice)``) and cut into global batches of ``batch_size * world`` rows (the last one wraps around to the start
of the permutation, so every batch is full and no row is skipped); the batches of all slices are then
shuffled together (seed ``(seed, epoch)``). A batch never mixes slices (Zoology batches segments separately,
so sequences of different lengths are never padded together); the model accepts any ``T <= block_size``.
Micro-batch ``micro`` of step ``step`` is global batch ``step * grad_accum + micro``, and rank ``r`` takes
rows ``[r * batch_size, (r + 1) * batch_size)`` of it, so the batches are a pure function of the arguments.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from coupled_qk.checks.values import MAX_SEED, MAX_VOCAB, check_declared, coerce_fields
from coupled_qk.data.mqar_dataset import MQARSlice, MQARSliceSpec, make_mqar_dataset
from coupled_qk.models.options import option
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.tasks import check_options
from coupled_qk.training.tasks.mqar_accuracy import evaluate_slices

__all__ = ["MQAROptions", "MQARTask", "batches_per_epoch", "parse_slices", "steps_per_epoch"]

DEFAULT_VOCAB_SIZE = 8192
DEFAULT_DATA_SEED = 123
_SLICES = "parse_slices: a non-empty list of [seq_len, num_kv_pairs, num_examples], three positive integers each"


def parse_slices(value, name: str) -> list[tuple[int, int, int]]:
    """Validate a list of ``[seq_len, num_kv_pairs, num_examples]`` triples.

    Args:
        value: a non-empty sequence of 3-sequences of positive ints (JSON lists or tuples).
        name: the option's name, used in error messages (e.g. ``"task_options.train_slices"``).

    Returns:
        ``[(L, K, N), ...]`` as Python ints, in the given order.

    Raises:
        ValueError: naming ``name``, the offending entry and the expected form, if ``value`` is not a
            non-empty list of three positive integers each.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{name}={value!r} must be a non-empty list of [seq_len, num_kv_pairs, num_examples]")
    out = []
    for i, item in enumerate(value):
        ok = isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and len(item) == 3
        ok = ok and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in item)
        if not ok:
            raise ValueError(
                f"{name}[{i}]={item!r} must be [seq_len, num_kv_pairs, num_examples], three positive integers"
            )
        out.append((int(item[0]), int(item[1]), int(item[2])))
    return out


@dataclasses.dataclass
class MQAROptions:
    """``TrainConfig.task_options`` of the MQAR task (module docstring: their meaning), each field's valid values
    declared once in its metadata (``coupled_qk.option``; docs/RELIABILITY.md, "Configuration"). Construction
    converts each to its type (``"false"`` is ``False``, ``2.5`` is not an int) and checks it; ``train_slices``
    and ``test_slices`` are required and checked by :func:`parse_slices` (kept as given).

    Raises:
        ValueError: naming ``task_options.<field>``, the value and what was expected.
    """

    vocab_size: int = option(DEFAULT_VOCAB_SIZE, lo=4, hi=MAX_VOCAB)
    train_slices: Sequence | None = option(None, free=_SLICES)
    test_slices: Sequence | None = option(None, free=_SLICES)
    data_seed: int = option(DEFAULT_DATA_SEED, lo=0, hi=MAX_SEED)
    power_a: float = option(0.01, lo=0.0, lo_open=True)
    random_non_queries: bool = False
    cache_dir: str | None = option(
        None, free="a folder for generated slices (never empty); default TrainConfig.cache_dir/mqar"
    )
    quick_eval_examples: int | None = option(None, lo=1)
    eval_batch_size: int | None = option(None, lo=1)

    def __post_init__(self):
        for required in ("train_slices", "test_slices"):
            if getattr(self, required) is None:
                raise ValueError(
                    f"task_options.{required} is required for task='mqar' "
                    "(a list of [seq_len, num_kv_pairs, num_examples])"
                )
        if isinstance(self.cache_dir, os.PathLike):
            self.cache_dir = os.fspath(self.cache_dir)
        coerce_fields(self, "task_options")
        check_declared(self, "task_options")
        for name in ("train_slices", "test_slices"):
            parse_slices(getattr(self, name), f"task_options.{name}")
        if self.cache_dir is not None and not self.cache_dir.strip():
            raise ValueError(
                f"task_options.cache_dir={self.cache_dir!r} is empty; expected a folder (or leave it "
                "out: TrainConfig.cache_dir/mqar)"
            )

    @classmethod
    def from_options(cls, task_options: dict | None) -> MQAROptions:
        """The checked options of a run's ``task_options`` dict.

        Raises:
            ValueError: an unknown key (listing the valid ones), a missing slice list, or a value outside its
                declaration.
        """
        opts = task_options if task_options is not None else {}
        check_options("MQAR", opts, KNOWN_OPTIONS)
        return cls(**opts)


KNOWN_OPTIONS = tuple(f.name for f in dataclasses.fields(MQAROptions))
"""The ``task_options`` names of the MQAR task (the fields of :class:`MQAROptions`)."""


def batches_per_epoch(slice_sizes: Sequence[int], global_batch: int) -> int:
    """Global batches in one epoch: ``sum(ceil(N_s / global_batch))`` over the training slices.

    Args:
        slice_sizes: number of rows of each training slice.
        global_batch: rows per global batch (``batch_size * world``).

    Raises:
        ValueError: if ``global_batch`` < 1 or a slice size < 1.
    """
    if global_batch < 1:
        raise ValueError(f"global_batch={global_batch} must be >= 1")
    if any(n < 1 for n in slice_sizes):
        raise ValueError(f"slice_sizes={list(slice_sizes)} must all be >= 1")
    return sum(math.ceil(n / global_batch) for n in slice_sizes)


def steps_per_epoch(train_slices, batch_size: int, grad_accum: int = 1, world: int = 1) -> float:
    """Optimiser steps per epoch (may be fractional when ``grad_accum`` does not divide the batch count).

    Args:
        train_slices: ``[[L, K, N], ...]`` as in ``task_options["train_slices"]``.
        batch_size: rows per device and micro-step; ``grad_accum`` micro-steps per step; ``world`` ranks.

    Returns:
        ``batches_per_epoch(N's, batch_size * world) / grad_accum``.

    Raises:
        ValueError: from :func:`parse_slices` and :func:`batches_per_epoch`.
    """
    sizes = [n for _, _, n in parse_slices(train_slices, "train_slices")]
    return batches_per_epoch(sizes, batch_size * world) / grad_accum


class MQARTask:
    """Zoology MQAR behind the training loop's task interface (see the module docstring for the options).

    Args:
        cfg: the run's :class:`TrainConfig` (``task == "mqar"``); MQAR settings come from ``cfg.task_options``.
        run_dir: the run's folder (unused: the run folder records :meth:`describe` itself).

    Attributes:
        dataset: the :class:`~coupled_qk.data.mqar.MQARDataset` (train and test slices, never mixed).
        vocab_size: V.
        max_seq_len: longest L over the train and test slices (the model's ``block_size``).

    Raises:
        ValueError: unknown option names, malformed slices, or an invalid MQAR setting (from
            :func:`coupled_qk.data.mqar.make_mqar_dataset`, naming the slice, its value and the requirement).

    Source: Zoology arXiv:2312.04927 (``zoology/train.py``, ``zoology/data/utils.py``); ``docs/METHOD.md`` section 6.
    """

    name = "mqar"
    config_fields = ("cache_dir",)  # TrainConfig data fields it reads (tasks.check_task_fields)
    options_class = MQAROptions
    data_identity = ("vocab_size", "data_seed", "train", "test")  # describe() keys a resume compares with data.json
    data_model_fields = ("vocab_size", "block_size")  # GPTConfig fields model_overrides() sets from the data

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None):
        self.cfg = cfg
        self.options = opts = MQAROptions.from_options(cfg.task_options)
        self.vocab_size = opts.vocab_size
        self.data_seed = opts.data_seed
        self.power_a = opts.power_a
        self.random_non_queries = opts.random_non_queries
        self.quick_eval_examples = opts.quick_eval_examples
        self.eval_batch_size = opts.eval_batch_size if opts.eval_batch_size is not None else cfg.batch_size
        train = parse_slices(opts.train_slices, "task_options.train_slices")
        test = parse_slices(opts.test_slices, "task_options.test_slices")
        cache_dir = opts.cache_dir
        if cache_dir is None and cfg.cache_dir:
            cache_dir = str(Path(cfg.cache_dir) / "mqar")
        self.cache_dir = cache_dir

        def split(triple):
            L, K, N = triple
            return MQARSliceSpec(L, K, N, power_a=self.power_a, random_non_queries=self.random_non_queries)

        self.dataset = make_mqar_dataset(
            [split(t) for t in train],
            [split(t) for t in test],
            self.vocab_size,
            cache_dir=cache_dir,
            seed=self.data_seed,
        )
        self.max_seq_len = max(s.seq_len for s in self.dataset.train + self.dataset.test)
        names = [s.name for s in self.dataset.test]
        self.test_names = [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]
        self._plan_key = None
        self._plan: list[tuple[int, np.ndarray]] = []

    # ---------------------------------------------------------------------------------------------- interface

    def model_overrides(self) -> dict:
        """``{"vocab_size": V, "block_size": longest L}`` (train or test), for :meth:`TrainConfig.gpt_config`."""
        return {"vocab_size": self.vocab_size, "block_size": self.max_seq_len}

    def batches_per_epoch(self, global_batch: int) -> int:
        """Global batches of ``global_batch`` rows in one epoch (see :func:`batches_per_epoch`)."""
        return batches_per_epoch([len(s) for s in self.dataset.train], global_batch)

    def describe(self) -> dict:
        """Vocabulary, seeds and every slice (name, L, K, rows, resolved seed), for ``results.json``."""

        def info(s: MQARSlice) -> dict:
            return {
                "name": s.name,
                "seq_len": s.seq_len,
                "num_kv_pairs": s.num_kv_pairs,
                "num_examples": len(s),
                "seed": int(s.spec.seed),
            }

        return {
            "task": "mqar",
            "source": "Zoology arXiv:2312.04927 multiquery_ar (coupled_qk.data.mqar)",
            "vocab_size": self.vocab_size,
            "data_seed": self.data_seed,
            "power_a": self.power_a,
            "random_non_queries": self.random_non_queries,
            "train": [info(s) for s in self.dataset.train],
            "test": [info(s) for s in self.dataset.test],
            "batches_per_epoch": self.batches_per_epoch(self.cfg.batch_size),
            "quick_eval_examples": self.quick_eval_examples,
        }

    def _epoch_plan(self, epoch: int, global_batch: int) -> list[tuple[int, np.ndarray]]:
        key = (epoch, global_batch)
        if self._plan_key == key:
            return self._plan
        plan = []
        for si, s in enumerate(self.dataset.train):
            n = len(s)
            perm = np.random.default_rng([self.cfg.seed, epoch, si]).permutation(n)
            n_batches = math.ceil(n / global_batch)
            idx = np.arange(n_batches * global_batch) % n  # wrap the last batch around to the start
            rows = perm[idx].reshape(n_batches, global_batch)
            plan.extend((si, r) for r in rows)
        order = np.random.default_rng([self.cfg.seed, epoch, 1 << 20]).permutation(len(plan))
        self._plan_key, self._plan = key, [plan[i] for i in order]
        return self._plan

    def batch_rows(self, index: int, global_batch: int) -> tuple[int, np.ndarray]:
        """Slice index and row indices (int64, ``(global_batch,)``) of global batch number ``index``.

        Raises:
            ValueError: if ``index`` < 0 or ``global_batch`` < 1.
        """
        if index < 0:
            raise ValueError(f"batch index={index} must be >= 0")
        n_batches = self.batches_per_epoch(global_batch)
        epoch, pos = divmod(index, n_batches)
        return self._epoch_plan(epoch, global_batch)[pos]

    def step_tokens(self, step: int, world: int) -> int:
        """Input tokens of optimiser step ``step`` over all ranks: for each of its ``grad_accum`` global batches,
        ``batch_size * world`` rows times the length ``L`` of the slice it comes from (not ``block_size``)."""
        global_batch = self.cfg.batch_size * world
        first = step * self.cfg.grad_accum
        lengths = [
            self.dataset.train[self.batch_rows(first + m, global_batch)[0]].seq_len for m in range(self.cfg.grad_accum)
        ]
        return global_batch * sum(lengths)

    def train_batch(self, step: int, micro: int, rank: int, world: int, batch_size: int, device) -> tuple:
        """Training batch of micro-step ``micro`` of ``step`` for ``rank`` of ``world``.

        Returns:
            ``(x, y)``: ``torch.int64`` tensors of shape ``(batch_size, L)`` on ``device``, where ``L`` is the
            sequence length of the single slice this batch comes from; ``y`` is -100 except at query
            positions, where it is the value paired with the queried key (Zoology's labels).

        Raises:
            ValueError: if ``rank`` is not in ``[0, world)`` or ``micro`` not in ``[0, grad_accum)``.
        """
        if not 0 <= rank < world:
            raise ValueError(f"rank={rank} must be in [0, world={world})")
        if not 0 <= micro < self.cfg.grad_accum:
            raise ValueError(f"micro={micro} must be in [0, grad_accum={self.cfg.grad_accum})")
        si, rows = self.batch_rows(step * self.cfg.grad_accum + micro, batch_size * world)
        rows = torch.from_numpy(rows[rank * batch_size : (rank + 1) * batch_size])
        s = self.dataset.train[si]
        return s.inputs[rows].to(device), s.labels[rows].to(device)

    def evaluate(self, model, device, quick: bool = True, autocast_dtype=None) -> dict:
        """Argmax accuracy over the query positions, overall (micro-averaged) and per test slice.

        Args:
            model: maps ``(B, L)`` int64 token ids to logits ``(B, L, V)``; put in eval mode for the call and
                restored to its previous mode afterwards.
            device: where the inputs go.
            quick: use the first ``quick_eval_examples`` rows of each test slice (all rows if unset);
                ``False`` always uses the full test set.
            autocast_dtype: ``torch.autocast`` dtype or ``None`` (fp32).

        Returns:
            ``{"valid/accuracy": overall, "valid/loss": mean cross-entropy (nats) over query positions,
            "valid/accuracy/<L..._K...>": per-slice accuracy, ...}`` as Python floats (see
            :func:`coupled_qk.training.tasks.mqar_accuracy.evaluate_slices`).
        """
        max_rows = self.quick_eval_examples if quick else None
        return evaluate_slices(
            model, self.dataset.test, self.test_names, self.eval_batch_size, device, autocast_dtype, max_rows
        )
