"""When a training run stops: stop signals, the time budget, periodic checkpoints and non-finite values,
decided once per step and shared by all ranks.

Every rank contributes its local observations (signals received, loss, gradient norm) and rank 0 its clock to
one all-reduce per step (:meth:`StopControl.sync`), so under ``torchrun`` all ranks take the same decision at
the same step: none waits in a collective the others never reach.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass

from coupled_qk.training.distributed import Runtime, all_reduce_sum

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training was stopped by ``SIGINT``/``SIGTERM`` after saving a checkpoint of the current step.

    Attributes:
        signum: the signal; ``exit_code`` is ``128 + signum`` (130 for Ctrl-C, 143 for ``SIGTERM``).
        step: the step saved; ``checkpoint``: its folder.
        finished: the signal arrived after the last step: the run is complete (results written) and only the
            process stops (a command that trains several runs does not start the next one).
    """

    def __init__(self, signum: int, step: int, checkpoint, finished: bool = False):
        self.signum, self.step, self.checkpoint, self.finished = signum, step, checkpoint, finished
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if finished:
            super().__init__(
                f"stopped by {name} after the last step ({step}); the run finished and is saved in {checkpoint}"
            )
        else:
            super().__init__(f"stopped by {name} at step {step}; checkpoint saved in {checkpoint}")


class TrainingDiverged(RuntimeError):
    """The training loss or gradient norm became NaN or infinite; nothing after the last good checkpoint was
    saved (the message names the step, the value and that checkpoint)."""


class SignalCatcher:
    """Turn the first ``SIGINT``/``SIGTERM`` into a flag read at the next step; a second one interrupts at once.

    Installed only in the main thread (Python delivers signals there); elsewhere it is inert and signals keep
    their previous behaviour. The previous handlers are restored on exit.
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is not None:  # second signal: stop now (the checkpoint on disk is the previous one)
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@dataclass
class Decision:
    """What all ranks agreed on after a step: mean loss, and why to stop or checkpoint (if at all)."""

    loss: float
    non_finite: bool
    signum: int | None
    time_up: bool
    checkpoint_due: bool


class StopControl:
    """Shared per-step decisions of a run (see the module docstring).

    Args:
        runtime: the process group.
        max_minutes: training-time budget (``None``: none), counted over all sessions of a resumed run.
        checkpoint_minutes: training time between periodic checkpoints (``None``: none).
        base_seconds: training seconds of earlier sessions.
        catcher: the :class:`SignalCatcher` whose flag this rank contributes.
    """

    def __init__(self, runtime: Runtime, max_minutes, checkpoint_minutes, base_seconds: float, catcher: SignalCatcher):
        self.runtime = runtime
        self.max_minutes, self.checkpoint_minutes = max_minutes, checkpoint_minutes
        self.base_seconds = base_seconds
        self.catcher = catcher
        self.t0 = time.perf_counter()
        self.last_checkpoint = self.t0

    def train_seconds(self) -> float:
        """Training seconds over all sessions (this rank's clock)."""
        return self.base_seconds + time.perf_counter() - self.t0

    def checkpointed(self) -> None:
        """Restart the periodic-checkpoint clock."""
        self.last_checkpoint = time.perf_counter()

    def sync(self, loss_sum: float, n_micro: int, grad_norm: float | None) -> Decision:
        """One all-reduce of ``[loss, non-finite, SIGINT, SIGTERM, time up, checkpoint due]``.

        ``loss_sum`` is this rank's sum over ``n_micro`` micro-steps; ``grad_norm`` (``None`` if not checked)
        is non-finite when a step must not be taken. Clocks are rank 0's alone.
        """
        main = self.runtime.is_main
        got = self.catcher.received
        bad = not math.isfinite(loss_sum) or (grad_norm is not None and not math.isfinite(grad_norm))
        time_up = main and self.max_minutes is not None and self.train_seconds() >= 60 * self.max_minutes
        due = (
            main
            and self.checkpoint_minutes is not None
            and time.perf_counter() - self.last_checkpoint >= 60 * self.checkpoint_minutes
        )
        flags = [
            loss_sum / n_micro if math.isfinite(loss_sum) else 0.0,
            float(bad),
            float(got == signal.SIGINT),
            float(got == signal.SIGTERM),
            float(time_up),
            float(due),
        ]
        total = all_reduce_sum(flags, self.runtime)
        signum = signal.SIGINT if total[2] else signal.SIGTERM if total[3] else None
        loss = total[0] / self.runtime.world if not total[1] else math.nan
        return Decision(loss, bool(total[1]), signum, bool(total[4]), bool(total[5]))
