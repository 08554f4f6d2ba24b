"""Validation metrics: the direction in which each improves (:func:`metric_direction`, from its name) and the
check of a metric named by the user (:func:`check_metric`: ``best_metric``, ``early_stop_metric``).

Used by the training config (``higher_is_better``) and the best-checkpoint tracking (:mod:`coupled_qk.training.best`).
"""

from __future__ import annotations

from collections.abc import Iterable

from coupled_qk.checks.values import choice

__all__ = ["METRIC_DIRECTIONS", "check_metric", "metric_direction"]


METRIC_DIRECTIONS = (
    ("loss", "min"),
    ("perplexity", "min"),
    ("error", "min"),
    ("bpb", "min"),
    ("bits", "min"),
    ("accuracy", "max"),
    ("f1", "max"),
    ("mcc", "max"),
    ("matthews", "max"),
    ("score", "max"),
    ("acc", "max"),
)
"""Name fragments and the direction in which such a metric improves (first match wins)."""


def metric_direction(metric: str) -> str | None:
    """``"min"`` or ``"max"``: the direction in which ``metric`` improves, from its name (``valid/loss`` -> min,
    ``valid/accuracy`` -> max), or ``None`` when the name does not say."""
    last = metric.rsplit("/", 1)[-1].lower()
    for fragment, direction in METRIC_DIRECTIONS:
        if fragment in last:
            return direction
    return None


def check_metric(option: str, metric, mode, available: Iterable[str], task: str | None = None) -> str:
    """Check a validation metric named by the user (``best_metric``, ``early_stop_metric``) against the metrics
    the task's evaluation reports, and its direction. The training loop calls it once, at the first validation
    (``training.loop.check_metrics``), when those names are known.

    Args:
        option: how the user named the metric, for messages (``"TrainConfig.best_metric"``).
        metric: the metric name (``"valid/loss"``).
        mode: ``"min"``, ``"max"``, or ``None``/``"auto"`` (then inferred with :func:`metric_direction`).
        available: the metric names the evaluation reports.
        task: the task's name, for messages.

    Returns:
        The direction in which the metric improves, ``"min"`` or ``"max"``.

    Raises:
        ValueError: naming ``option``: a non-string or empty metric, one that the evaluation does not report
            ("is not a validation metric ...; it reports: ..."), a mode other than min/max/auto, no mode for a
            metric whose name does not say which direction is better, or a mode that contradicts the name
            (``max`` for a loss).
    """
    names = sorted(set(available))
    of_task = f" of task {task!r}" if task else ""
    if not isinstance(metric, str) or not metric.strip():
        raise ValueError(
            f"{option}={metric!r} must be a metric name; the evaluation{of_task} reports: {', '.join(names)}"
        )
    if metric not in names:
        raise ValueError(f"{option}={metric!r} is not a validation metric{of_task}; it reports: {', '.join(names)}")
    inferred = metric_direction(metric)
    if mode is None or mode == "auto":
        if inferred is None:
            raise ValueError(
                f"{option}={metric!r}: cannot tell whether higher or lower is better; declare it with "
                "best_mode='min' or 'max' (and make it the best_metric)"
            )
        return inferred
    choice(f"{option} mode", mode, ("min", "max"))
    if inferred is not None and mode != inferred:
        raise ValueError(
            f"{option}={metric!r} improves when it goes {'down' if inferred == 'min' else 'up'}, but "
            f"the mode is {mode!r}; use {inferred!r}"
        )
    return mode
