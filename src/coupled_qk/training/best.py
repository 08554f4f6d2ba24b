"""Best-validation tracking: which validation metric decides, its direction, the best value so far
with its step, tokens and epoch, and patience-based early stopping. Used by the training loop at each
validation (:mod:`coupled_qk.training.loop`); the state lives in every checkpoint, so a resume continues it.
"""

from __future__ import annotations

from coupled_qk.training.config import TrainConfig
from coupled_qk.training.metrics import check_metric


def check_metrics(cfg: TrainConfig, metrics: dict, task=None) -> None:
    """Check ``best_metric`` and ``early_stop_metric`` against the validation ``metrics`` that the task reports,
    and their directions (:func:`coupled_qk.training.metrics.check_metric`); called once, at the first validation.

    Raises:
        ValueError: naming the field: a metric the task does not report (listing those it does), a
            ``best_mode`` that contradicts the metric's name (``max`` for a loss), or a metric whose name does
            not say which direction is better and no ``best_mode`` for it.
    """
    known = [k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if cfg.best_metric is not None:
        check_metric("TrainConfig.best_metric", cfg.best_metric, cfg.best_mode, known, cfg.task)
    if cfg.early_stop_metric is not None:
        mode = cfg.best_mode if cfg.early_stop_metric == cfg.best_metric else None
        check_metric("TrainConfig.early_stop_metric", cfg.early_stop_metric, mode, known, cfg.task)


def track_best(cfg: TrainConfig, state: dict, metrics: dict, train_tokens: int | None, save_best) -> bool:
    """Update ``state["best"]`` with a validation result; save the weights when it is the best so far.

    ``state["best"]`` (saved in every checkpoint, so a resume continues it) holds the metric, its best
    ``value``, the ``step``, ``tokens`` and ``epoch`` where it was reached, ``patience_ref`` (the value that
    the patience counter compares with) and ``evals_since`` (validations in a row without an improvement
    larger than ``min_delta``). ``save_best(info)`` is called with the new best's record. Returns whether
    ``patience`` validations have passed without such an improvement (the run should stop: it plateaued).
    """
    higher = cfg.best_is_higher()
    value = float(metrics[cfg.best_metric])
    best = state.get("best")
    sign = 1.0 if higher else -1.0
    if best is None or sign * (value - best["value"]) > 0:
        ref = best["patience_ref"] if best is not None else None
        best = {
            "metric": cfg.best_metric,
            "value": value,
            "step": state["step"],
            "tokens": state["tokens"],
            "epoch": state["tokens"] / train_tokens if train_tokens else None,
            "patience_ref": ref,
            "evals_since": best["evals_since"] if best is not None else 0,
        }
        save_best({k: v for k, v in best.items() if k not in ("patience_ref", "evals_since")})
    if best["patience_ref"] is None or sign * (value - best["patience_ref"]) > cfg.min_delta:
        best["patience_ref"], best["evals_since"] = value, 0
    else:
        best["evals_since"] += 1
    state["best"] = best
    return cfg.patience is not None and best["evals_since"] >= cfg.patience
