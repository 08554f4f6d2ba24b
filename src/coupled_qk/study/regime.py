"""What regime a converged study's runs ended in, read from their records: how fast validation still fell at the
end (annealed vs at a minimum), where a run stopped on its learning-rate schedule, and what extra training text is
worth (the value of coupling expressed as a multiple of the data).

These readings qualify the claims' wording; they decide nothing in a study (the pre-registered plateau rule of
:mod:`coupled_qk.study.grid` alone sets a horizon).
"""

from __future__ import annotations

import math

import numpy as np

from coupled_qk.extras import LazyModule

st = LazyModule("scipy.stats", "claims", "regime readings (intervals)")

FINAL_WINDOW_EPOCHS = 1.5
"""The end of a run whose validation slope :func:`final_slope` fits (epochs)."""


def final_slope(rec: dict, window: float = FINAL_WINDOW_EPOCHS) -> dict:
    """Least-squares slope of a run's validation loss against epochs over its last ``window`` epochs.

    A run at a minimum has a slope interval containing zero; one still falling when its schedule ended (annealed,
    not converged) has an interval below zero.

    Args:
        rec: a run record (``tokens``, ``epochs`` > 0 and ``curve["valid"]``: ``[tokens, loss]`` pairs).
        window: epochs before the last validation that the fit covers.

    Returns:
        ``{"slope", "low", "high", "n"}``: nats per epoch, its 95% t-interval and the number of validations, or
        ``{}`` when the window holds fewer than 3 validations (no interval).
    """
    points = np.asarray(rec["curve"]["valid"], dtype=np.float64).reshape(-1, 2)
    per_epoch = rec["tokens"] / rec["epochs"]
    epochs = points[:, 0] / per_epoch
    sel = epochs >= epochs.max(initial=0.0) - window
    n = int(sel.sum())
    if n < 3:
        return {}
    fit = st.linregress(epochs[sel], points[sel, 1])
    half = float(st.t.ppf(0.975, n - 2)) * float(fit.stderr)
    return {"slope": float(fit.slope), "low": float(fit.slope) - half, "high": float(fit.slope) + half, "n": n}


def lr_fraction_at_stop(rec: dict) -> float:
    """The learning rate at a run's last step as a fraction of its peak, on the trainer's schedule (linear warmup,
    cosine decay to ``min_lr_ratio`` at the step ``max_tokens`` ends at; :func:`coupled_qk.training.resume.lr_at`).

    A run stopped early by patience keeps a high fraction; one that ran its schedule ends at ``min_lr_ratio``.

    Args:
        rec: a run record (``tokens``, ``steps`` > 0, ``config`` with ``max_tokens``, ``warmup_steps``,
            ``min_lr_ratio``).
    """
    c = rec["config"]
    total = math.ceil(c["max_tokens"] / (rec["tokens"] / rec["steps"]))
    warmup = c["warmup_steps"]
    if rec["steps"] <= warmup:
        return rec["steps"] / max(1, warmup)
    progress = min(1.0, (rec["steps"] - warmup) / max(1, total - warmup))
    floor = c["min_lr_ratio"]
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def data_worth(loss_base: float, loss_coupled: float, loss_more: float, factor: float) -> float:
    """The multiple of the training text at which standard would reach coupled's test loss, by log-linear
    interpolation of standard's loss between the base data (``loss_base``, multiple 1) and ``factor`` x the data
    (``loss_more``): ``factor ** ((loss_coupled - loss_base) / (loss_more - loss_base))``.

    1.0 means coupling is worth nothing; 1.1 means it is worth 10% more text. All losses in nats per token of one
    tokenizer (the same text).

    Raises:
        ValueError: ``factor <= 1`` or ``loss_more == loss_base`` (no slope to interpolate along).
    """
    if not factor > 1:
        raise ValueError(f"factor={factor!r} must be > 1 (the larger data's multiple of the base data)")
    if loss_more == loss_base:
        raise ValueError(f"loss_more == loss_base == {loss_base!r}: more data changed nothing, no interpolation")
    return math.exp(math.log(factor) * (loss_coupled - loss_base) / (loss_more - loss_base))
