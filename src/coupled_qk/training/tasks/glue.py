"""GLUE fine-tuning task for the project's training loop (:func:`coupled_qk.training.loop.train`).

A pretrained checkpoint of this project (any attention variant) plus a linear classification head
(:class:`SequenceClassifier`), trained with cross-entropy on the labels and scored on the labelled GLUE dev
set with the GLUE metrics (:mod:`coupled_qk.data.glue`; METHOD.md section 3, claim C11). Inputs use the
pretrained run's own tokenizer (its ``tokenizer/`` folder) in the GPT layout of :func:`format_example`.

Settings live in ``TrainConfig.task_options``::

    glue_task             sst2 | cola | rte | mrpc                                       (required)
    pretrained            a run folder (with ``latest`` and ``tokenizer/``) or one of its ckpt-* folders (required)
    glue_dir              folder with SST-2/, CoLA/, RTE/, MRPC/ (default: <data dir>/glue)
    pooling               "last" (hidden state of the final <|endoftext|>, default) or "mean" (over real tokens)
    max_train_examples    keep a seeded random subset of the training set of this size (default: all)
    subsample_seed        seed of that subset (default 0; the same subset for every fine-tuning seed and model)
    quick_eval_examples   dev rows scored by the periodic (quick) evaluation (default 64; the final one: all)
    eval_batch_size       rows per evaluation forward pass (default 64)

Batches: training rows are visited in epochs; epoch ``e`` is a permutation seeded by ``(seed, e)``, and the
global batch ``g = step * grad_accum + micro`` holds rows ``[g * B * world, (g + 1) * B * world)`` of the
concatenated epochs (rank ``r`` takes its ``B`` rows), so batches are a pure function of the arguments.
Rows are right-padded to the longest row of the batch with :data:`PAD_ID`; the classifier reads only real
tokens (the models are causal, so padding after a token never changes its hidden state); :meth:`GlueTask.step_tokens`
counts real tokens only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from coupled_qk.checks.values import MAX_SEED, check_declared, coerce_fields
from coupled_qk.data.glue import GLUE_TASKS, TASK_INFO, check_task, encode_split, glue_metrics, load_glue
from coupled_qk.data.paths import default_data_dir
from coupled_qk.data.tokenizers import Tokenizer
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.models.options import option
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import open_run
from coupled_qk.training.tasks import check_options

PAD_ID = -1
POOLINGS = ("last", "mean")


@dataclasses.dataclass
class GlueOptions:
    """``TrainConfig.task_options`` of the GLUE task (module docstring: their meaning), each field's valid values
    declared once in its metadata (``coupled_qk.option``; docs/RELIABILITY.md, "Configuration"). Construction
    converts each to its type and checks it; ``glue_task`` and ``pretrained`` are required, ``glue_task`` is
    read as :func:`~coupled_qk.data.glue.check_task` reads it (``"SST-2"`` is ``"sst2"``).

    Raises:
        ValueError: naming ``task_options.<field>``, the value and what was expected.
    """

    glue_task: str | None = option(None, choices=GLUE_TASKS)
    pretrained: str | None = option(None, free="a run or ckpt-* folder (never empty): resolve_pretrained")
    glue_dir: str | None = option(
        None, free="a folder with SST-2/, CoLA/, RTE/, MRPC/ (never empty); default <data dir>/glue"
    )
    pooling: str = option("last", choices=POOLINGS)
    max_train_examples: int | None = option(None, lo=1)
    subsample_seed: int = option(0, lo=0, hi=MAX_SEED)
    quick_eval_examples: int = option(64, lo=1)
    eval_batch_size: int = option(64, lo=1)

    def __post_init__(self):
        for key in ("pretrained", "glue_dir"):
            if isinstance(getattr(self, key), os.PathLike):
                setattr(self, key, os.fspath(getattr(self, key)))
        coerce_fields(self, "task_options")  # "null" / "None" become None here: required fields checked after
        for key in ("glue_task", "pretrained"):
            if getattr(self, key) is None:
                raise ValueError(f"task 'glue' needs task_options.{key}")
        try:
            self.glue_task = check_task(self.glue_task)
        except ValueError as exc:
            raise ValueError(f"task_options.glue_task={self.glue_task!r}: {exc}") from None
        check_declared(self, "task_options")
        if not self.pretrained.strip():
            raise ValueError(f"task_options.pretrained={self.pretrained!r} is empty; expected a pretrained run folder")
        if self.glue_dir is not None and not self.glue_dir.strip():
            raise ValueError(
                f"task_options.glue_dir={self.glue_dir!r} is empty; expected the folder holding SST-2/, CoLA/, ..."
            )
        if self.subsample_seed != 0 and self.max_train_examples is None:  # read only to draw that subset
            raise ValueError(
                f"task_options.subsample_seed={self.subsample_seed} is not read without max_train_examples (every "
                "training example is used): subsample_seed seeds the subset max_train_examples keeps; leave it at 0"
            )

    @classmethod
    def from_options(cls, task_options: dict | None) -> GlueOptions:
        """The checked options of a run's ``task_options`` dict.

        Raises:
            ValueError: an unknown key (listing the valid ones), a missing ``glue_task`` or ``pretrained``, or
                a value outside its declaration.
        """
        opts = task_options if task_options is not None else {}
        check_options("glue", opts, KNOWN_OPTIONS)
        return cls(**opts)


KNOWN_OPTIONS = tuple(f.name for f in dataclasses.fields(GlueOptions))
"""The ``task_options`` names of the GLUE task (the fields of :class:`GlueOptions`)."""


class SequenceClassifier(nn.Module):
    """A :class:`GPT` body (its final LayerNorm output) with a linear head on a pooled hidden state.

    ``model(x)`` maps right-padded token ids ``x`` (LongTensor ``(B, T)``, real ids first, then
    :data:`PAD_ID` = -1) to class logits ``(B, num_classes)``. ``pooling="last"`` reads the hidden state at
    the last real token (GPT's extract token, Radford et al. 2018, section 3.3); ``"mean"`` averages the hidden
    states of the real tokens. The GPT's tied output head is replaced by the identity (never used here).

    Raises:
        ValueError: unknown ``pooling``; a row with no real token or with padding before a real token.
    """

    def __init__(self, gpt: GPT, num_classes: int, pooling: str = "last"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is unknown; expected one of {POOLINGS}")
        self.pooling = pooling
        self.config = gpt.config
        gpt.lm_head = nn.Identity()  # the body returns ln_f(hidden states) (B, T, d_model)
        self.gpt = gpt
        self.head = nn.Linear(gpt.config.d_model, num_classes)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @property
    def blocks(self) -> nn.ModuleList:
        """The GPT's blocks (the loop shards them one by one under FSDP)."""
        return self.gpt.blocks

    def num_parameters(self) -> int:
        """Number of distinct parameters (body and head)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits of right-padded token ids.

        Args:
            x: integer ``(B, T)``, each row's real ids (``[0, vocab_size)``) first, then :data:`PAD_ID`;
                ``T <= block_size``.

        Returns:
            ``(B, num_classes)`` logits in the parameters' dtype, from the pooled hidden state (``pooling``).

        Raises:
            ValueError: a row without a real token or with padding before a real token; the input errors of
                :meth:`GPT.forward <coupled_qk.models.gpt.GPT.forward>` (ids out of range, too long).
        """
        real = x != PAD_ID
        lengths = real.sum(dim=1)
        positions = torch.arange(x.shape[1], device=x.device)
        if bool((lengths == 0).any()) or not torch.equal(real, positions[None, :] < lengths[:, None]):
            raise ValueError(f"x must be right-padded with PAD_ID={PAD_ID} and hold >= 1 real token per row")
        hidden = self.gpt(x.masked_fill(~real, 0))
        if self.pooling == "last":
            pooled = hidden[torch.arange(x.shape[0], device=x.device), lengths - 1]
        else:
            pooled = (hidden * real[..., None]).sum(dim=1) / lengths[:, None].to(hidden.dtype)
        return self.head(pooled)


def pad_batch(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad token-id lists to the longest with :data:`PAD_ID`; LongTensor ``(len(rows), max_len)``."""
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def resolve_pretrained(path: str | Path) -> tuple[Path, GPTConfig, Tokenizer]:
    """The checkpoint folder, model config and tokenizer of a pretrained run (or of one of its checkpoints).

    Raises:
        FileNotFoundError: no checkpoint there, or no saved tokenizer in its run.
        ValueError: a folder of another kind or state (:func:`~coupled_qk.training.run_folder.open_run`: a run still
            training, a GLUE or MQAR run, a Hugging Face export); the tokenizer's vocabulary does not match the
            checkpoint's ``vocab_size`` (another tokenizer).
    """
    run = open_run(path, "glue", text=True)
    model_cfg = Checkpoint(run.checkpoint).model_config()
    tokenizer = run.tokenizer()
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise ValueError(
            f"the tokenizer in {run.folder.tokenizer_dir} ({tokenizer.name}, {tokenizer.vocab_size} ids) does not "
            f"match checkpoint {run.checkpoint} (vocab_size {model_cfg.vocab_size}): the checkpoint was made with "
            "another tokenizer"
        )
    return run.checkpoint, model_cfg, tokenizer


class GlueTask:
    """Fine-tune a pretrained checkpoint on one GLUE task (module docstring: options, batches, metrics).

    Raises:
        ValueError: missing or unknown options, unknown GLUE task or pooling, a tokenizer that does not match
            the checkpoint, malformed data files.
        FileNotFoundError: no checkpoint, tokenizer or data file where expected.
    """

    name = "glue"
    config_fields = ()  # its data: task_options glue_dir and the pretrained run's tokenizer
    options_class = GlueOptions
    data_identity = (
        "train_examples_total",
        "dev_examples",
        "train_label_counts",
        "dev_label_counts",
    )  # see RunFolder.check_data

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None):
        self.cfg = cfg
        self.options = opts = GlueOptions.from_options(cfg.task_options)
        self.glue_task = opts.glue_task
        self.pooling = opts.pooling
        self.quick_examples = opts.quick_eval_examples
        self.eval_batch_size = opts.eval_batch_size
        max_train, subsample_seed = opts.max_train_examples, opts.subsample_seed
        self.pretrained = opts.pretrained
        self.ckpt_dir, self.model_cfg, self.tokenizer = resolve_pretrained(self.pretrained)
        glue_dir = opts.glue_dir if opts.glue_dir is not None else default_data_dir() / "glue"
        train = load_glue(self.glue_task, "train", glue_dir)
        self.n_train_total = len(train)
        self.train_split = train.subsample(max_train, subsample_seed) if max_train else train
        self.dev_split = load_glue(self.glue_task, "dev", glue_dir)
        self.max_len = self.model_cfg.block_size
        self.train_ids, cut_train = encode_split(self.train_split, self.tokenizer, self.max_len)
        self.dev_ids, cut_dev = encode_split(self.dev_split, self.tokenizer, self.max_len)
        self.truncated = {"train": cut_train, "dev": cut_dev}
        for split, n in self.truncated.items():
            if n:
                total = len(self.train_ids if split == "train" else self.dev_ids)
                warnings.warn(
                    f"GLUE {self.glue_task} {split}: {n} of {total} examples truncated to "
                    f"{self.max_len} tokens (the model's block_size)",
                    stacklevel=2,
                )
        self.train_labels = torch.from_numpy(self.train_split.labels)
        self.num_classes = TASK_INFO[self.glue_task][1]

    def model_overrides(self) -> dict:
        """The pretrained checkpoint's full model configuration (the fine-tuned body is that model)."""
        return {k: v for k, v in self.model_cfg.to_dict().items()}

    def build_model(self, model_cfg: GPTConfig) -> SequenceClassifier:
        """The pretrained GPT (weights from the checkpoint) with a fresh head (seeded by the loop)."""
        gpt = GPT(model_cfg)
        Checkpoint(self.ckpt_dir).load_weights(gpt)
        return SequenceClassifier(gpt, self.num_classes, self.pooling)

    def describe(self) -> dict:
        """Task, checkpoint, tokenizer, sizes, truncation counts and the dev majority-class baseline."""
        dev = self.dev_split.labels
        return {
            "glue_task": self.glue_task,
            "pretrained": self.pretrained,
            "checkpoint": str(self.ckpt_dir),
            "tokenizer": self.tokenizer.name,
            "tokenizer_fingerprint": self.tokenizer.fingerprint,
            "pooling": self.pooling,
            "max_len": self.max_len,
            "train_examples": len(self.train_ids),
            "train_examples_total": self.n_train_total,
            "dev_examples": len(self.dev_ids),
            "truncated": dict(self.truncated),
            "train_label_counts": np.bincount(self.train_split.labels, minlength=self.num_classes).tolist(),
            "dev_label_counts": np.bincount(dev, minlength=self.num_classes).tolist(),
            "dev_majority": glue_metrics(self.glue_task, dev, np.full_like(dev, np.bincount(dev).argmax())),
            "files": self.train_split.files + self.dev_split.files,
        }

    @functools.lru_cache(maxsize=4)  # noqa: B019 - one task object per run
    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.train_ids))

    def _rows(self, step: int, micro: int, rank: int, world: int, batch_size: int) -> list[int]:
        n = len(self.train_ids)
        start = ((step * self.cfg.grad_accum + micro) * world + rank) * batch_size
        return [int(self._epoch_order(i // n)[i % n]) for i in range(start, start + batch_size)]

    def step_tokens(self, step: int, world: int) -> int:
        """Real (unpadded) input tokens of optimiser step ``step`` over all micro-steps and ``world`` ranks."""
        return sum(
            len(self.train_ids[r])
            for micro in range(self.cfg.grad_accum)
            for rank in range(world)
            for r in self._rows(step, micro, rank, world, self.cfg.batch_size)
        )

    def train_batch(self, step: int, micro: int, rank: int, world: int, batch_size: int, device) -> tuple:
        """``(x, y)``: right-padded ids ``(batch_size, T_max)`` and labels ``(batch_size,)`` (LongTensors)."""
        rows = self._rows(step, micro, rank, world, batch_size)
        x = pad_batch([self.train_ids[r] for r in rows])
        return x.to(device), self.train_labels[rows].to(device)

    @torch.no_grad()
    def evaluate(self, model, device, quick: bool = True, autocast_dtype=None) -> dict:
        """Dev-set loss and GLUE metrics, keys ``dev/<metric>``; ``quick``: the first ``quick_eval_examples``.
        Restores ``model``'s training mode."""
        was_training = model.training
        model.eval()
        n = min(self.quick_examples, len(self.dev_ids)) if quick else len(self.dev_ids)
        labels = torch.from_numpy(self.dev_split.labels[:n])
        order = sorted(range(n), key=lambda i: len(self.dev_ids[i]))  # batches of similar length: little padding
        logits = torch.empty(n, self.num_classes)
        for lo in range(0, n, self.eval_batch_size):
            rows = order[lo : lo + self.eval_batch_size]
            x = pad_batch([self.dev_ids[i] for i in rows]).to(device)
            with torch.autocast(
                device_type=torch.device(device).type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                logits[rows] = model(x).float().cpu()
        out = {"dev/loss": float(F.cross_entropy(logits, labels)), "dev/examples": n}
        metrics = glue_metrics(self.glue_task, labels.numpy(), logits.argmax(dim=-1).numpy())
        out.update({f"dev/{k}": v for k, v in metrics.items()})
        model.train(was_training)
        return out
