"""Language-modelling task: corpus, tokenizer, cached token arrays, deterministic batches, perplexity."""

from __future__ import annotations

import dataclasses
import hashlib
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from coupled_qk.checks.values import MAX_SEED, check_declared, coerce_fields
from coupled_qk.data.cache import tokenize_to_cache
from coupled_qk.data.corpora import MIN_SPLIT_WORDS, Corpus, load_corpus, split_documents
from coupled_qk.data.paths import default_cache_dir
from coupled_qk.data.tokenizers import META_FILE, Tokenizer, get_tokenizer
from coupled_qk.models.options import option
from coupled_qk.progress import announce
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.eval_budget import MAX_EVAL_BATCHES
from coupled_qk.training.perplexity import evaluate_perplexity, perplexity_windows, text_units
from coupled_qk.training.run_folder import RunFolder, data_changes
from coupled_qk.training.tasks import check_options

MIN_EVAL_TOKENS = 10_000  # smaller evaluation splits give noisy perplexities (a warning says so)
WORD_LEVEL_CORPORA = ("wiki-vital", "wikitext-2", "wikitext-103", "wikitext-2-raw", "wikitext-103-raw")


@dataclasses.dataclass
class LMOptions:
    """``TrainConfig.task_options`` of the language-modelling task, each field's valid values declared once in
    its metadata (``coupled_qk.option``; docs/RELIABILITY.md, "Configuration"); see :data:`OPTIONS` for their
    meaning. Construction converts each to its type and checks it.

    Raises:
        ValueError: naming ``task_options.<field>``, the value and what was expected.
    """

    split_seed: int = option(0, lo=0, hi=MAX_SEED)
    valid_fraction: float = option(0.01, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    test_fraction: float = option(0.01, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    min_split_words: int = option(MIN_SPLIT_WORDS, lo=0)
    final_eval_windows: int | None = option(None, lo=1)

    def __post_init__(self):
        coerce_fields(self, "task_options")
        check_declared(self, "task_options")

    @classmethod
    def from_options(cls, task_options: dict | None) -> LMOptions:
        """The checked options of a run's ``task_options`` dict (``None``: the defaults).

        Raises:
            ValueError: ``task_options`` is not a dict (``[]``, ``0`` and ``""`` are not read as ``{}``), an
                unknown key (listing the valid ones) or a value out of its declared range.
        """
        opts = task_options if task_options is not None else {}
        check_options("lm", opts, OPTIONS)
        return cls(**opts)


OPTIONS = tuple(f.name for f in dataclasses.fields(LMOptions))
"""``TrainConfig.task_options`` of the language-modelling task (the fields of :class:`LMOptions`). The split
options are used only by corpora split at random, and refused at a non-default value for others (see
:func:`coupled_qk.data.corpora.load_corpus`): ``split_seed`` (int >= 0, default 0) seeds the document-level
split; ``valid_fraction`` and ``test_fraction`` (default 0.01 each) are the documents' shares of the evaluation
splits, each of which then grows to ``min_split_words`` words (default 10,000) within 20% of the corpus.
``final_eval_windows`` (int >= 1, default none: whole splits) makes the final evaluation score only the first
that many ``block_size`` windows of the valid and test splits (a smoke run's estimate, e.g. ``demo --quick``):
its results carry ``<split>/subsample_windows`` and no word perplexity."""


def run_corpus(corpus: str, data_dir: str | None, task_options: dict, saved: bool = False) -> Corpus:
    """The corpus of a language-modelling run, split exactly as the run split it.

    ``task_options`` may hold ``split_seed`` (0), ``valid_fraction`` and ``test_fraction`` (0.01 each) and
    ``min_split_words`` (:data:`~coupled_qk.data.corpora.MIN_SPLIT_WORDS`); they matter only for corpora split
    at random (see :func:`~coupled_qk.data.corpora.load_corpus`). Training, ``eval`` and ``analyze`` all call
    this, so they see the same held-out text. A split option at a non-default value for a corpus with fixed
    splits is refused (``ValueError`` naming it and the corpus), or with ``saved`` (a finished run's saved
    options, read back by ``eval`` and ``analyze``) warned about.
    """
    opts = LMOptions.from_options(task_options)
    return load_corpus(
        corpus,
        data_dir,
        seed=opts.split_seed,
        valid_fraction=opts.valid_fraction,
        test_fraction=opts.test_fraction,
        min_split_words=opts.min_split_words,
        unused_split_options="warn" if saved else "refuse",
    )


def saved_run_corpus(run: RunFolder, corpus: str, data_dir: str | None, task_options: dict) -> Corpus:
    """:func:`run_corpus` of the corpus a run recorded (its ``config.json``: ``eval``, ``analyze`` without
    ``--corpus``), the saved split options warned about where unused.

    Raises:
        FileNotFoundError / ValueError: as :func:`run_corpus`, the message saying that the corpus is the one
            recorded in the run's ``config.json`` and how to point at the text elsewhere.
    """
    try:
        return run_corpus(corpus, data_dir, task_options, saved=True)
    except (FileNotFoundError, ValueError) as exc:
        raise type(exc)(
            f"the corpus recorded in {run.config_path} cannot be read: {exc}; if the text "
            "is elsewhere now, pass --corpus (and --data-dir)"
        ) from exc


def cached_tokenizer(where: Path) -> Tokenizer | None:
    """The tokenizer cached in ``where`` (a folder written by :meth:`Tokenizer.save`), or ``None`` when there is
    none or it is damaged: a file that does not parse, a missing ``coupled_qk_tokenizer.json`` (a save cut short),
    a fingerprint that does not match the file. A damaged entry is warned about and trained again, as a damaged
    token array is rebuilt (:func:`coupled_qk.data.cache.tokenize_to_cache`), instead of blocking every run.

    Warns:
        UserWarning: naming the damaged folder and what is wrong with it.
    """
    if not where.exists():
        return None
    try:
        if not (where / META_FILE).is_file():
            raise ValueError(f"{META_FILE} is missing")
        return Tokenizer.load(where)
    except (ValueError, OSError) as exc:
        warnings.warn(f"the cached tokenizer {where} is damaged ({exc}); training it again", stacklevel=3)
        return None


def text_sha256(text: str) -> str:
    """SHA-256 hex digest of ``text``'s UTF-8 bytes: a split's fingerprint in ``data.json`` (``text_sha256``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_changes(run: RunFolder, corpus: Corpus, splits, tokens: dict | None = None) -> list[str]:
    """How ``splits`` of ``corpus`` (the run's own corpus read back) differ from what the run recorded in its
    ``data.json``: each split's text SHA-256 (``text_sha256``), and its token count where ``tokens`` (split ->
    count with the run's tokenizer) is given; ``[]`` when they match or nothing was recorded (a run written before
    ``text_sha256`` was: only its token counts can be compared). Items as
    :func:`~coupled_qk.training.run_folder.data_changes` gives them.

    Raises:
        ValueError: ``data.json`` is damaged (naming it).
    """
    recorded = run.read_data()
    if recorded is None:
        return []
    now = {"text_sha256": {split: text_sha256(corpus.split(split)) for split in splits}}
    if tokens is not None:
        now["tokens"] = {split: int(tokens[split]) for split in splits}
    return data_changes(recorded, now, ("tokens", "text_sha256"), run.data_path)


def batch_offsets(seed: int, step: int, micro: int, n_windows: int, global_batch: int) -> np.ndarray:
    """Start offsets of the global batch of ``(step, micro)``: a pure function of its arguments.

    Because batches depend only on ``(seed, step, micro)``, resuming at a step reproduces the data order
    exactly, and ``R`` ranks taking consecutive slices of one global batch see the same data as one process.
    """
    rng = np.random.default_rng([seed, step, micro])
    return rng.integers(0, n_windows, size=global_batch)


class LMTask:
    """Next-token prediction on a corpus (see :func:`coupled_qk.data.corpora.load_corpus`).

    The tokenizer is the GPT-2 BPE (``tokenizer="gpt2"``), a byte-level BPE trained on the training split
    (``"bpe-<vocab>"``, cached by corpus content and saved with the run) or a saved tokenizer path.
    Token arrays are memory-mapped from the cache (:func:`coupled_qk.data.cache.tokenize_to_cache`).
    Implements :class:`coupled_qk.training.tasks.Task`; options: :data:`OPTIONS`.

    Raises:
        ValueError: an unknown ``task_options`` key, a bad ``split_seed``, a training split shorter than
            ``block_size + 2`` tokens; FileNotFoundError: a missing corpus.
    """

    name = "lm"
    config_fields = ("corpus", "data_dir", "tokenizer", "cache_dir", "eval_batches", "full_eval")  # tasks.TASK_FIELDS
    options_class = LMOptions
    data_identity = ("vocab_size", "tokens", "text_sha256")  # describe() keys a resume compares with data.json
    data_model_fields = ("vocab_size",)  # GPTConfig fields model_overrides() sets from the data (the tokenizer)

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None):
        self.cfg = cfg
        cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        self.options = LMOptions.from_options(cfg.task_options)
        self.corpus = run_corpus(cfg.corpus, cfg.data_dir, cfg.task_options)
        self.text_sha256 = {split: text_sha256(self.corpus.split(split)) for split in ("train", "valid", "test")}
        run = RunFolder(run_dir) if run_dir is not None else None
        resuming = cfg.resume and run is not None and run.has_checkpoint()
        if resuming and run.has_tokenizer():
            self.tokenizer = Tokenizer.load(run.tokenizer_dir)  # the checkpoint's ids must keep their meaning
        else:
            self.tokenizer = self._tokenizer(cfg, cache_dir)
        self.tokens = {
            split: tokenize_to_cache(self.corpus.split(split), self.tokenizer, cache_dir / "tokens")
            for split in ("train", "valid", "test")
        }
        self.block_size = cfg.gpt_config().block_size
        self.eval_batches = cfg.eval_batches  # the training loop sets it when the config leaves it to the run
        n_train = len(self.tokens["train"])
        if n_train <= self.block_size + 1:
            raise ValueError(
                f"the training split of {cfg.corpus!r} has {n_train} tokens, fewer than block_size + 2 = "
                f"{self.block_size + 2}"
            )
        self._check_context(cfg, n_train)
        self._warn_about_sizes(cfg, n_train)
        announce(
            "data: "
            + "; ".join(
                f"{split} {n:,} tokens, {self.n_documents(split):,} documents"
                for split, n in self.describe()["tokens"].items()
            )
            + f" ({self.corpus.name}, tokenizer {self.tokenizer.name})",
            enabled=cfg.progress,
            once=True,  # the runs of a comparison read the same data: said once
        )

    def n_documents(self, split: str) -> int:
        """Documents in ``split``: the count of the document-level split where the corpus was split at random,
        else the documents :func:`coupled_qk.data.corpora.split_documents` finds in the given split's text."""
        counted = (self.corpus.source.get("n_documents") or {}).get(split)
        return counted if counted is not None else len(split_documents(self.corpus.split(split)))

    def _check_context(self, cfg: TrainConfig, n_train: int) -> None:
        """The context length against the data, where the data enters (docs/RELIABILITY.md, "Data").

        Raises:
            ValueError: an evaluation split with fewer than 2 tokens (nothing to score), naming the split, its
                tokens and ``block_size``.

        Warns:
            UserWarning: an evaluation split shorter than ``block_size + 1`` tokens (its one window has less
                context than the model's, so its loss is not comparable with a run whose windows are full), or a
                training split with fewer distinct windows (``tokens - block_size``) than a batch has sequences.
        """
        block = self.block_size
        for split in ("valid", "test"):
            n = len(self.tokens[split])
            if n < 2:
                raise ValueError(
                    f"the {split} split of {cfg.corpus!r} has {n} token(s): nothing to evaluate "
                    f"(block_size={block}); give the corpus a longer {split} split"
                )
            if n < block + 1:
                warnings.warn(
                    f"block_size={block} is longer than the {split} split of {cfg.corpus!r} ({n:,} tokens): its "
                    f"evaluation is one window of {n - 1:,} targets with less context than the model's, not "
                    "comparable with runs whose windows are full; lower block_size (--set block_size=...) or use "
                    "a longer split",
                    stacklevel=3,
                )
        windows = n_train - block
        if windows < cfg.batch_size:
            warnings.warn(
                f"block_size={block} leaves only {windows:,} distinct training windows in the {n_train:,} tokens of "
                f"the training split of {cfg.corpus!r}, fewer than batch_size={cfg.batch_size}: every batch "
                "repeats the same text; lower block_size or use a longer training split",
                stacklevel=3,
            )

    def _warn_about_sizes(self, cfg: TrainConfig, n_train: int) -> None:
        """Warn when evaluation splits are too small to trust or the budget repeats the training data."""
        given = self.corpus.source.get("split") == "given"  # split options do not apply there (refused)
        for split in ("valid", "test"):
            n = len(self.tokens[split])
            if n < MIN_EVAL_TOKENS:
                fix = (
                    f"its splits are fixed by the corpus's files: use a larger {split} file"
                    if given
                    else "use a bigger corpus, a folder with train.txt/valid.txt/test.txt, or a larger "
                    f"--{split}-fraction"
                )
                warnings.warn(
                    f"the {split} split of {cfg.corpus!r} has only {n:,} tokens (< {MIN_EVAL_TOKENS:,}): its "
                    f"perplexity is a noisy estimate; {fix}",
                    stacklevel=3,
                )
        if cfg.max_tokens and cfg.max_tokens > n_train:
            warnings.warn(
                f"max_tokens={cfg.max_tokens:,} is {cfg.max_tokens / n_train:.1f} passes over the {n_train:,} "
                "training tokens: the model sees the same text repeatedly (fine if intended; watch for "
                "overfitting in the validation loss)",
                stacklevel=3,
            )

    def _tokenizer(self, cfg: TrainConfig, cache_dir: Path) -> Tokenizer:
        spec = cfg.tokenizer
        if not spec.startswith("bpe-"):
            return get_tokenizer(spec, data_dir=cfg.data_dir)
        key = hashlib.sha256((spec + "\0" + self.corpus.train).encode()).hexdigest()[:16]
        where = cache_dir / "tokenizers" / f"{spec}-{key}"
        cached = cached_tokenizer(where)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        announce(
            f"training a byte-level BPE ({spec}) on the {len(self.corpus.train) / 1e6:.1f} MB training split; "
            f"cached in {where}",
            enabled=cfg.progress,
        )
        tok = get_tokenizer(spec, train_text=self.corpus.train, data_dir=cfg.data_dir)
        announce(f"BPE trained in {time.perf_counter() - t0:.0f} s: {tok.vocab_size:,} tokens", enabled=cfg.progress)
        tok.save(where)
        return tok

    def model_overrides(self) -> dict:
        """Fields the model takes from the task: the tokenizer's vocabulary size."""
        return {"vocab_size": self.tokenizer.vocab_size}

    def describe(self) -> dict:
        """Corpus, tokenizer, token counts and each split's text SHA-256 (``text_sha256``), for results files and
        ``data.json`` (a resume, ``eval`` and ``analyze`` compare the data they read back with it)."""
        return {
            "corpus": self.corpus.name,
            "tokenizer": self.tokenizer.name,
            "vocab_size": self.tokenizer.vocab_size,
            "tokens": {split: int(len(t)) for split, t in self.tokens.items()},
            "text_sha256": dict(self.text_sha256),
        }

    def step_tokens(self, step: int, world: int) -> int:
        """Tokens of one optimiser step over all ranks: ``batch_size * grad_accum * world * block_size``."""
        return self.cfg.batch_size * self.cfg.grad_accum * world * self.block_size

    def train_batch(self, step: int, micro: int, rank: int, world: int, batch_size: int, device) -> tuple:
        """``(x, y)`` LongTensors ``(batch_size, block_size)`` for this rank; ``y`` is ``x`` shifted by one."""
        tokens = self.tokens["train"]
        offsets = batch_offsets(self.cfg.seed, step, micro, len(tokens) - self.block_size, batch_size * world)
        offsets = offsets[rank * batch_size : (rank + 1) * batch_size]
        idx = offsets[:, None] + np.arange(self.block_size + 1)
        chunk = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)

    def evaluate(self, model, device, quick: bool = True, autocast_dtype=None) -> dict:
        """Validation loss/perplexity (``quick``: the first ``eval_batches`` batches) or, with ``quick=False``,
        full validation and test perplexity (and word-level perplexity for WikiText-style corpora)."""
        out = {}
        splits = ("valid",) if quick else ("valid", "test")
        subsample = None if quick else self.options.final_eval_windows
        for split in splits:
            units: dict = {}
            if not quick and subsample is None:
                units = text_units(self.corpus.split(split))
                if self.corpus.name in WORD_LEVEL_CORPORA:
                    units["n_words"] = self.corpus.words(split)
            elif not quick:
                units = text_units(self._scored_text(split, subsample))
            res = evaluate_perplexity(
                model,
                self.tokens[split],
                self.block_size,
                batch_size=self.cfg.batch_size,
                device=device,
                autocast_dtype=autocast_dtype,
                **units,
                max_windows=self._eval_windows(quick, subsample),
                desc=None
                if quick or not self.cfg.progress
                else f"final evaluation, {split} split"
                + (f" (first {subsample} windows: a smoke-run estimate)" if subsample else ""),
            )
            if subsample is not None:
                res["subsample_windows"] = subsample
            out.update({f"{split}/{k}": v for k, v in res.items()})
        return out

    def _eval_windows(self, quick: bool, subsample: int | None) -> int | None:
        """Windows an evaluation reads: ``eval_batches`` batches for a quick one (all with ``full_eval``; the
        training loop sizes ``self.eval_batches`` to the run where the config leaves it ``None``, else at most
        :data:`~coupled_qk.training.eval_budget.MAX_EVAL_BATCHES`), the ``final_eval_windows`` subsample or all for
        the final one."""
        if quick:
            batches = self.eval_batches if self.eval_batches is not None else MAX_EVAL_BATCHES
            return None if self.cfg.full_eval else batches * self.cfg.batch_size
        return subsample

    def _scored_text(self, split: str, n_windows: int) -> str:
        """The text of the tokens that the first ``n_windows`` evaluation windows of ``split`` read (decoded:
        a byte-level tokenizer gives back the original text)."""
        tokens = self.tokens[split]
        start, length, _ = list(perplexity_windows(len(tokens), self.block_size))[:n_windows][-1]
        return self.tokenizer.decode(np.asarray(tokens[: start + length + 1], dtype=np.int64).tolist())
