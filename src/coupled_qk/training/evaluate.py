"""Evaluate a saved language model: token- and word-level perplexity and bits per byte/character of a checkpoint
on whole corpus splits.

The run folder (:func:`~coupled_qk.training.run_folder.open_run`) provides the tokenizer and, unless overridden,
the corpus, data folder, token cache and split seed the model was trained with. Perplexity as in
``docs/METHOD.md`` section 5 (see :func:`coupled_qk.training.perplexity.evaluate_perplexity`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coupled_qk.data.cache import tokenize_to_cache
from coupled_qk.data.corpora import SPLITS
from coupled_qk.data.paths import default_cache_dir
from coupled_qk.training.distributed import pick_device
from coupled_qk.training.perplexity import evaluate_perplexity, text_units
from coupled_qk.training.run_folder import RunFolder, open_run
from coupled_qk.training.tasks.lm import WORD_LEVEL_CORPORA, run_corpus, saved_run_corpus, split_changes

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(
    checkpoint: str | Path,
    corpus: str | None = None,
    data_dir: str | None = None,
    splits: Sequence[str] = ("valid", "test"),
    stride: int | None = None,
    batch_size: int = 8,
    device: str = "auto",
) -> dict:
    """Token- and word-level perplexity and bits per byte and per character of a checkpoint on whole splits.

    Args:
        checkpoint: a run folder (its ``latest`` checkpoint) or a ``ckpt-*`` folder inside one.
        corpus: corpus name or path (default: the run's own corpus, checked against the run's record of its
            data, which must exist; a corpus given here is evaluated as it is now).
        data_dir: folder of the named corpora (default: the run's).
        splits: any of ``train``, ``valid``, ``test``.
        stride: sliding-window stride in tokens (``None``: non-overlapping windows of ``block_size``).
        batch_size: windows per forward pass.
        device: ``auto``, ``cpu`` or ``cuda``.

    Returns:
        ``{"checkpoint", "step", "corpus", "tokenizer", "stride", "block_size", <split>: {"perplexity",
        "n_tokens", "loss", "nll", "bits_per_byte", "n_bytes", "bits_per_char", "n_chars", ["word_perplexity",
        "n_words"]}, ...}`` (word-level for WikiText-style corpora; bits over the UTF-8 bytes and characters of
        the split's text, see :func:`~coupled_qk.training.perplexity.evaluate_perplexity`).

    Raises:
        FileNotFoundError: no checkpoint, tokenizer or corpus file where expected.
        ValueError: unknown split name, a bad stride, no corpus known, a tokenizer that does not match the
            model's vocabulary; a run of another kind or state (:func:`~coupled_qk.training.run_folder.open_run`:
            still training, a GLUE or MQAR run, without ``corpus`` a run without its record of its data); or
            (without ``corpus``) the run's corpus changed since it trained: a split's text differs from the
            SHA-256 (or token count) the run recorded.
    """
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; expected train, valid or test")
    opened = open_run(checkpoint, "eval", text=True, data="refuse" if corpus is None else None)
    run, run_cfg, ckpt = opened.folder, opened.config, opened.checkpoint
    corpus_name = corpus if corpus is not None else run_cfg.get("corpus")  # "" is an error below, not "not given"
    if corpus_name is None:
        raise ValueError(f"--corpus is needed: {run.path} has no {run.CONFIG} naming its corpus")
    tokenizer = opened.tokenizer()
    dev = pick_device(device)
    model, state = opened.load_model(dev)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"model vocab_size={model.config.vocab_size} differs from the tokenizer's {tokenizer.vocab_size}"
        )
    data_dir = data_dir if data_dir is not None else run_cfg.get("data_dir")
    data = (
        run_corpus(corpus_name, data_dir, run_cfg.get("task_options"), saved=True)
        if corpus is not None
        else saved_run_corpus(run, corpus_name, data_dir, run_cfg.get("task_options"))
    )
    cache = Path(run_cfg["cache_dir"]) if run_cfg.get("cache_dir") else default_cache_dir()
    out = {
        "checkpoint": str(ckpt),
        "step": state.get("step"),
        "corpus": data.name,
        "tokenizer": tokenizer.name,
        "stride": stride,
        "block_size": model.config.block_size,
    }
    tokens = {split: tokenize_to_cache(data.split(split), tokenizer, cache / "tokens") for split in splits}
    if corpus is None:  # the run's own corpus: it must still be the text the run recorded
        _check_recorded(run, data, splits, tokens)
    for split in splits:
        n_words = data.words(split) if data.name in WORD_LEVEL_CORPORA else None
        out[split] = evaluate_perplexity(
            model,
            tokens[split],
            model.config.block_size,
            batch_size,
            stride,
            dev,
            n_words,
            desc=f"eval {split}",
            **text_units(data.split(split)),
        )
    return out


def _check_recorded(run: RunFolder, data, splits: Sequence[str], tokens: dict) -> None:
    """Refuse evaluating the run's own corpus when its ``splits`` are not the text the run recorded in
    ``data.json`` (:func:`~coupled_qk.training.tasks.lm.split_changes`): an edited or appended corpus file re-splits
    differently, and its numbers would pass for the run's held-out perplexity."""
    changes = split_changes(run, data, splits, {split: len(t) for split, t in tokens.items()})
    if changes:
        raise ValueError(
            f"the run's corpus {data.name!r} changed since {run.path} trained on it ({run.data_path} vs now: "
            f"{'; '.join(changes)}), so its {'/'.join(splits)} text is not what the run recorded; restore the "
            f"corpus, or pass --corpus {data.name} to evaluate the current text anyway"
        )
