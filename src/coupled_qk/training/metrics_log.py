"""The training loop's logger: a run's metrics records (the run folder's ``metrics.jsonl``), TensorBoard scalars
and the progress bar. Reading the records back is :meth:`coupled_qk.training.run_folder.RunFolder.read_metrics`.
"""

from __future__ import annotations

import json
import warnings

from coupled_qk.progress import progress
from coupled_qk.training.run_folder import RunFolder

__all__ = ["Logger"]


class Logger:
    """JSON-lines metrics (:meth:`RunFolder.open_metrics <coupled_qk.training.run_folder.RunFolder.open_metrics>`:
    records after ``start_step``, written by a killed session after its last checkpoint, are dropped), TensorBoard
    scalars and the progress bar, on rank 0 only."""

    def __init__(self, run: RunFolder, cfg, is_main: bool, start_step: int, total_steps: int):
        self.active = is_main
        self.file = self.tb = self.bar = None
        if not self.active:
            return
        self.file = run.open_metrics(start_step)
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run.tensorboard_dir))
            except ImportError:
                warnings.warn("tensorboard is not installed; logging JSON lines only", stacklevel=2)
        self.bar = progress(total_steps, "training", "steps", initial=start_step, enabled=cfg.progress)

    def log(self, record: dict) -> None:
        if not self.active:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def progress(self, n: int, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
