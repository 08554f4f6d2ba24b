"""The training loop's logger: a run's metrics records (the run folder's ``metrics.jsonl``), TensorBoard scalars
and the progress bar. Reading the records back is :meth:`coupled_qk.training.run_folder.RunFolder.read_metrics`.
"""

from __future__ import annotations

import json

from coupled_qk.progress import announce, progress
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
            except ImportError:  # said once per process, not once per run of a comparison
                announce(
                    "tensorboard is not installed: metrics go to metrics.jsonl only (pip install "
                    "'coupled-qk[tensorboard]' for TensorBoard events, --no-tensorboard to silence this)",
                    once=True,
                )
        self.bar = progress(total_steps, "training", "steps", initial=start_step, enabled=cfg.progress)

    def log(self, record: dict) -> None:
        """Append ``record`` (a JSON-serialisable dict with an int ``"step"``) as one line of ``metrics.jsonl``,
        flushed, and its numeric entries other than ``step`` as TensorBoard scalars at that step; nothing off rank 0.

        Raises:
            TypeError: a value ``json.dumps`` cannot write.
        """
        if not self.active:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def progress(self, n: int, **postfix) -> None:
        """Advance the progress bar (or line reporter) by ``n`` steps and show ``postfix`` (``loss=...``) on it."""
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        """Close the progress bar, the metrics file and the TensorBoard writer (whichever are open)."""
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
