"""Perplexity over a whole token sequence: non-overlapping or sliding windows (docs/METHOD.md section 5)."""

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

    Returns:
        dict with ``nll`` (total, nats), ``n_tokens`` (scored targets), ``loss`` (mean nats per token),
        ``perplexity`` (``exp(loss)``, per token of the tokenizer), and ``word_perplexity`` if ``n_words``.
    """
    tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64)) if not torch.is_tensor(tokens) else tokens.long()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D; got shape {tuple(tokens.shape)}")
    was_training = model.training
    model.eval()
    windows = list(perplexity_windows(len(tokens), block_size, stride))
    if max_windows is not None:
        windows = windows[:max_windows]
    total, count = 0.0, 0
    by_length: dict[int, list[tuple[int, int]]] = {}
    for start, length, n_scored in windows:
        by_length.setdefault(length, []).append((start, n_scored))
    bar = progress(len(windows), desc or "", "windows", enabled=desc is not None)
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
    bar.close()
    model.train(was_training)
    loss = total / count
    out = {"nll": total, "n_tokens": count, "loss": loss, "perplexity": math.exp(loss)}
    if n_words:
        out["n_words"] = n_words
        out["word_perplexity"] = math.exp(total / n_words)
    return out
