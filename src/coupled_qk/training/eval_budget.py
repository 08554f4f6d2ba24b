"""The evaluation budget of a run: how many batches each quick validation scores when ``eval_batches`` is not set,
and the line that says what validation cost.

A quick validation reads ``eval_batches`` batches of ``batch_size`` windows (forward passes only, about a third
of a training micro-batch's forward and backward). A fixed count made short runs mostly validation (60 steps with
10 validations of 20 batches: more validation batches than training ones), so the default scales with the run:
the validations of a run read at most :data:`EVAL_SHARE` of its training micro-batches, which keeps them near a
sixth of the run's compute, between 1 and :data:`MAX_EVAL_BATCHES` batches each (long runs keep 20, the
former fixed default). ``eval_batches`` set by the user (or a study's recipe) is used as given.
"""

from __future__ import annotations

from coupled_qk.checks.values import positive_int

EVAL_SHARE = 0.5
"""Quick-validation batches over a whole run, at most, as a fraction of its training micro-batches."""
MAX_EVAL_BATCHES = 20
"""The most batches :func:`auto_eval_batches` gives one quick validation (the former fixed default)."""


def validations_of(total_steps: int, eval_interval: int) -> int:
    """Quick validations over a schedule of ``total_steps`` steps: every multiple of ``eval_interval``, and the last
    step when it is not one.

    Raises:
        ValueError: an argument that is not a positive integer.
    """
    positive_int("total_steps", total_steps)
    positive_int("eval_interval", eval_interval)
    return total_steps // eval_interval + (total_steps % eval_interval > 0)


def auto_eval_batches(total_steps: int, grad_accum: int, eval_interval: int) -> int:
    """The default ``eval_batches`` of a run: ``EVAL_SHARE * total_steps * grad_accum`` batches shared by its
    :func:`validations_of`, rounded down, at least 1 and at most :data:`MAX_EVAL_BATCHES`.

    Example: 60 steps validated every 6 steps -> 10 validations of 3 batches; 1,000 steps -> 20 batches each.

    Raises:
        ValueError: an argument that is not a positive integer.
    """
    positive_int("grad_accum", grad_accum)
    budget = EVAL_SHARE * total_steps * grad_accum
    return max(1, min(MAX_EVAL_BATCHES, int(budget // validations_of(total_steps, eval_interval))))


def _clock(total: float):
    """A formatter of seconds for one line: seconds where the total is under 10 minutes, minutes otherwise."""
    return (lambda s: f"{s:.0f} s") if total < 600 else (lambda s: f"{s / 60:.1f} min")


def time_summary(results: dict) -> str:
    """What a run's time went to, from its ``results.json``: ``"time 212 s: training 150 s, validation 62 s (29%:
    10 quick validations 50 s, final evaluation 12 s)"`` (minutes from 10 minutes on). ``train_seconds`` counts the
    training loop with its quick validations and checkpoints (over all sessions of a resumed run),
    ``eval_seconds`` the quick validations and ``final_eval_seconds`` the final evaluation; results written before
    these were recorded (or resumed from such a checkpoint) give the total alone.
    """
    loop = float(results.get("train_seconds") or 0.0)
    quick, final = results.get("eval_seconds"), results.get("final_eval_seconds")
    if quick is None or final is None:
        return f"time {_clock(loop)(loop)}"
    total = loop + final
    t = _clock(total)
    share = 100 * (quick + final) / total if total > 0 else 0.0
    count = results.get("validations")
    return (
        f"time {t(total)}: training {t(loop - quick)}, validation {t(quick + final)} "
        f"({share:.0f}%: {'' if count is None else f'{count} '}quick validations {t(quick)}, "
        f"final evaluation {t(final)})"
    )
