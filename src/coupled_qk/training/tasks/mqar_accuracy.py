"""MQAR accuracy: argmax-correct query positions, per batch and per (L, K) slice (the one implementation).

Accuracy is Zoology's ``compute_accuracy``: the micro-average over all supervised (query) positions, those
whose label is not ``IGNORE_INDEX`` (-100). Source: Zoology arXiv:2312.04927 (``zoology/train.py``);
``docs/METHOD.md`` section 6.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from coupled_qk.data.mqar import IGNORE_INDEX

__all__ = ["evaluate_slices", "mqar_accuracy", "mqar_correct_total"]


def _predictions(logits_or_preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not isinstance(logits_or_preds, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise ValueError("mqar accuracy expects torch tensors for predictions and labels")
    if logits_or_preds.dim() == labels.dim() + 1 and logits_or_preds.shape[:-1] == labels.shape:
        return logits_or_preds.argmax(dim=-1)
    if logits_or_preds.shape == labels.shape:
        if logits_or_preds.is_floating_point():
            raise ValueError(
                "predictions with the labels' shape must be integer token ids, got "
                f"dtype {logits_or_preds.dtype}; pass logits with a trailing vocab dim"
            )
        return logits_or_preds
    raise ValueError(
        f"prediction shape {tuple(logits_or_preds.shape)} matches neither labels "
        f"{tuple(labels.shape)} (token ids) nor labels + (vocab,) (logits)"
    )


def mqar_correct_total(
    logits_or_preds: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[int, int]:
    """Count argmax-correct supervised positions.

    Args:
        logits_or_preds: logits ``(..., V)`` (float) or predicted ids with ``labels``' shape.
        labels: int tensor ``(...)``, ``ignore_index`` off the query positions.
        ignore_index: label value to skip (default -100).

    Returns:
        ``(correct, total)`` Python ints over positions with ``labels != ignore_index``.

    Raises:
        ValueError: on mismatched shapes or float predictions without a vocab dimension.
    """
    preds = _predictions(logits_or_preds, labels)
    mask = labels != ignore_index
    correct = (preds.to(labels.device) == labels) & mask
    return int(correct.sum().item()), int(mask.sum().item())


def mqar_accuracy(logits_or_preds: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> float:
    """Fraction of supervised (query) positions whose argmax prediction equals the label.

    Args:
        logits_or_preds: logits ``(..., V)`` or predicted ids with ``labels``' shape.
        labels: int tensor, ``ignore_index`` (-100) off the query positions.
        ignore_index: label value to skip.

    Returns:
        Accuracy in ``[0, 1]`` as a Python float.

    Raises:
        ValueError: on shape mismatch, or if no position is supervised.
    """
    correct, total = mqar_correct_total(logits_or_preds, labels, ignore_index)
    if total == 0:
        raise ValueError("mqar_accuracy: labels contain no supervised positions (all == ignore_index)")
    return correct / total


@torch.no_grad()
def evaluate_slices(
    model: torch.nn.Module,
    slices: Sequence,
    names: Sequence[str],
    batch_size: int,
    device: str | torch.device,
    autocast_dtype: torch.dtype | None = None,
    max_rows: int | None = None,
    prefix: str = "valid",
) -> dict[str, float]:
    """Accuracy and query-position cross-entropy of ``model`` on each slice and overall.

    Args:
        model: maps ``(B, L)`` int64 token ids to logits ``(B, L, V)``; put in eval mode for the call and
            restored to its previous mode afterwards.
        slices: :class:`~coupled_qk.data.mqar_dataset.MQARSlice` objects (anything with ``inputs``,
            ``labels`` and ``len``), evaluated separately (never padded together).
        names: one metric name per slice.
        batch_size: rows per forward pass (>= 1).
        device: where the inputs go.
        autocast_dtype: ``torch.autocast`` dtype or ``None`` (fp32).
        max_rows: use only the first ``max_rows`` rows of each slice (``None``: all).
        prefix: metric prefix.

    Returns:
        ``{"<prefix>/accuracy": micro-average over all query positions, "<prefix>/loss": mean cross-entropy
        (nats) over query positions, "<prefix>/accuracy/<name>": per slice, ...}`` as Python floats (NaN where
        nothing is supervised).

    Raises:
        ValueError: ``names`` and ``slices`` differ in length.
    """
    if len(names) != len(slices):
        raise ValueError(f"got {len(names)} names for {len(slices)} slices")
    was_training = model.training
    model.eval()
    device = torch.device(device)
    autocast = dict(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    per_slice: dict[str, float] = {}
    all_correct = all_total = 0
    loss_sum = 0.0
    try:
        for name, s in zip(names, slices):
            n = len(s) if max_rows is None else min(len(s), max_rows)
            correct = total = 0
            for start in range(0, n, batch_size):
                stop = min(n, start + batch_size)
                x, y = s.inputs[start:stop].to(device), s.labels[start:stop].to(device)
                with torch.autocast(**autocast):
                    logits = model(x)
                mask = y != IGNORE_INDEX
                picked, target = logits[mask].float(), y[mask]
                loss_sum += float(F.cross_entropy(picked, target, reduction="sum"))
                c, t = mqar_correct_total(picked, target)
                correct, total = correct + c, total + t
            per_slice[f"{prefix}/accuracy/{name}"] = correct / total if total else float("nan")
            all_correct, all_total = all_correct + correct, all_total + total
    finally:
        model.train(was_training)
    return {
        f"{prefix}/accuracy": all_correct / all_total if all_total else float("nan"),
        f"{prefix}/loss": loss_sum / all_total if all_total else float("nan"),
        **per_slice,
    }
