"""Perplexity over a whole token sequence: non-overlapping or sliding windows (docs/METHOD.md section 5).

Besides perplexity per token of the run's tokenizer (which depends on the tokenizer) and per word (the WikiText
convention), :func:`evaluate_perplexity` reports the tokenizer-free units of the text itself: bits per byte of
its UTF-8 encoding and bits per character (the units of byte-level language modelling, e.g. enwik8 and The
Pile; Gao et al. 2020, section 5.1): ``total NLL / ln 2 / n_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from coupled_qk.progress import progress


def perplexity_windows(n_tokens: int, block_size: int, stride: int | None = None) -> Iterator[tuple[int, int, int]]:
    """Windows that score every target token ``1 .. n_tokens - 1`` exactly once.

    Window ``(start, length, n_scored)`` feeds ``tokens[start : start + length]`` and scores the last
    ``n_scored`` of its predictions (targets ``tokens[start + 1 : start + length + 1]``). Without ``stride`` the
    windows do not overlap (each token sees at most ``block_size - 1`` tokens of context, on average half);
    with ``stride < block_size`` windows advance by ``stride`` and score only the new targets (more context,
    ``block_size / stride`` times the compute).

    Raises:
        ValueError: ``n_tokens < 2``, ``block_size < 1`` or a stride outside ``[1, block_size]``.
    """
    if n_tokens < 2:
        raise ValueError(f"need at least 2 tokens to score a prediction; got n_tokens={n_tokens}")
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    stride = block_size if stride is None else stride
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride={stride} must be in [1, block_size={block_size}]")
    n_targets = n_tokens - 1
    scored = 0  # targets 1..scored are done
    start = 0
    while scored < n_targets:
        length = min(block_size, n_targets - start)
        end = start + length  # last target index scored by this window
        yield start, length, end - scored
        scored = end
        start += stride
        if stride < block_size and start + block_size > n_targets:
            start = max(0, n_targets - block_size)  # last sliding window: full context, new targets only


@torch.no_grad()
def evaluate_perplexity(
    model: torch.nn.Module,
    tokens: np.ndarray | torch.Tensor,
    block_size: int,
    batch_size: int = 8,
    stride: int | None = None,
    device: str | torch.device = "cpu",
    n_words: int | None = None,
    max_windows: int | None = None,
    autocast_dtype: torch.dtype | None = None,
    desc: str | None = None,
    n_bytes: int | None = None,
    n_chars: int | None = None,
) -> dict:
    """Token-level (and optionally word-level) perplexity of ``model`` on a 1-D token sequence.

    Args:
        model: maps ``(B, T)`` ids to ``(B, T, vocab)`` logits.
        tokens: 1-D integer ids (NumPy memmap or tensor) of the whole split.
        block_size: window length (at most the model's context).
        stride: sliding-window stride (``None``: non-overlapping windows); see :func:`perplexity_windows`.
        n_words: whitespace-separated words of the original text; adds ``word_perplexity =
            exp(total NLL / n_words)`` (the traditional WikiText unit).
        max_windows: score only the first windows (a quick estimate during training).
        desc: show progress (:func:`coupled_qk.progress.progress`) under this label; ``None``: silent.
        n_bytes: UTF-8 bytes of the text the scored tokens encode; adds ``bits_per_byte = total NLL / ln 2 /
            n_bytes`` (tokenizer-free, comparable across tokenizers and with byte-level results). Pass the
            bytes of the whole text for a whole split (the first token, which is never a target, is then
            counted in the denominator: a relative bias of about one token in ``n_tokens``, as in the usual
            definition over a whole test set), or of the scored range when ``max_windows`` cuts it short.
        n_chars: Unicode characters of the same text; adds ``bits_per_char = total NLL / ln 2 / n_chars``.

    Returns:
        dict with ``nll`` (total, nats), ``n_tokens`` (scored targets), ``loss`` (mean nats per token),
        ``perplexity`` (``exp(loss)``, per token of the tokenizer), ``word_perplexity`` (and ``n_words``) if
        ``n_words``, ``bits_per_byte`` (and ``n_bytes``) if ``n_bytes``, ``bits_per_char`` (and ``n_chars``)
        if ``n_chars``.

    Raises:
        ValueError: ``tokens`` not 1-D, a bad ``batch_size``, or ``n_words``/``n_bytes``/``n_chars`` not a
            positive integer (or ``None``); window errors from :func:`perplexity_windows`.
    """
    tokens = _checked_tokens(tokens, batch_size, n_words, n_bytes, n_chars)
    was_training = model.training
    model.eval()
    windows = list(perplexity_windows(len(tokens), block_size, stride))
    if max_windows is not None:
        windows = windows[:max_windows]
    bar = progress(len(windows), desc or "", "windows", enabled=desc is not None)
    total, count = _summed_nll(model, tokens, windows, batch_size, device, autocast_dtype, bar)
    bar.close()
    model.train(was_training)
    return _per_unit(total, count, n_words, n_bytes, n_chars)


def _checked_tokens(tokens, batch_size, n_words, n_bytes, n_chars) -> torch.Tensor:
    """:func:`evaluate_perplexity`'s ``tokens`` as a 1-D long tensor, its arguments checked (``ValueError``)."""
    tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64)) if not torch.is_tensor(tokens) else tokens.long()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D; got shape {tuple(tokens.shape)}")
    for name, value in (("n_words", n_words), ("n_bytes", n_bytes), ("n_chars", n_chars)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name}={value!r} must be a positive integer or None")
    return tokens


def _summed_nll(
    model, tokens: torch.Tensor, windows: list, batch_size: int, device, autocast_dtype, bar
) -> tuple[float, int]:
    """Total NLL (nats, float64 sum) and number of scored targets over ``windows`` (``(start, length,
    n_scored)``), batching windows of equal length."""
    total, count = 0.0, 0
    by_length: dict[int, list[tuple[int, int]]] = {}
    for start, length, n_scored in windows:
        by_length.setdefault(length, []).append((start, n_scored))
    for length, group in by_length.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i : i + batch_size]
            x = torch.stack([tokens[s : s + length] for s, _ in chunk]).to(device)
            y = torch.stack([tokens[s + 1 : s + length + 1] for s, _ in chunk]).to(device)
            with torch.autocast(torch.device(device).type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(x)
            nll = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # (B, T)
            for row, (_, n_scored) in enumerate(chunk):
                total += nll[row, length - n_scored :].double().sum().item()
                count += n_scored
            bar.update(len(chunk))
    return total, count


def _per_unit(total: float, count: int, n_words, n_bytes, n_chars) -> dict:
    """The result of :func:`evaluate_perplexity` from the total NLL over ``count`` targets."""
    loss = total / count
    out = {"nll": total, "n_tokens": count, "loss": loss, "perplexity": math.exp(loss)}
    if n_words:
        out["n_words"] = n_words
        out["word_perplexity"] = math.exp(total / n_words)
    bits = total / math.log(2)
    if n_bytes:
        out["n_bytes"] = n_bytes
        out["bits_per_byte"] = bits / n_bytes
    if n_chars:
        out["n_chars"] = n_chars
        out["bits_per_char"] = bits / n_chars
    return out


def text_units(text: str) -> dict:
    """``{"n_bytes": UTF-8 bytes, "n_chars": Unicode code points}`` of ``text``: the denominators of
    ``bits_per_byte`` and ``bits_per_char`` in :func:`evaluate_perplexity`."""
    return {"n_bytes": len(text.encode("utf-8")), "n_chars": len(text)}
