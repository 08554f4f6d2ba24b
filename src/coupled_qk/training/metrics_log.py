"""A run's ``metrics.jsonl`` (one JSON record per line), TensorBoard scalars and the progress bar.

A kill can leave a torn final line; readers drop it (with a warning), and a resumed run truncates the file
to the records up to its checkpoint's step. A damaged line anywhere else is an error naming file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

from coupled_qk.io import write_text_atomic
from coupled_qk.progress import announce, progress
from coupled_qk.training.rundir import RunDir, parse_metrics

__all__ = ["Logger", "parse_metrics", "read_metrics"]  # parse_metrics lives in rundir (the run folder's files)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` (``[]`` without the file; see :func:`parse_metrics`)."""
    return RunDir(run_dir).read_metrics()


class Logger:
    """JSON-lines metrics (``metrics.jsonl``), TensorBoard scalars and the progress bar, on rank 0 only.

    Records after ``start_step`` (written by a killed session after its last checkpoint) are dropped.
    """

    def __init__(self, run_dir: Path, cfg, is_main: bool, start_step: int, total_steps: int):
        self.active = is_main
        self.file = self.tb = self.bar = None
        if not self.active:
            return
        path = RunDir(run_dir).metrics_path
        if path.exists():
            keep = [r for r in parse_metrics(path) if r.get("step", 0) <= start_step]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))  # a crash keeps the old file
        self.file = path.open("a")
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(RunDir(run_dir).tensorboard_dir))
            except ImportError:  # said once per process, not once per run of a comparison
                announce(
                    "tensorboard is not installed: metrics go to metrics.jsonl only (pip install "
                    "'coupled-qk[tensorboard]' for TensorBoard events, --no-tensorboard to silence this)",
                    once=True,
                )
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
