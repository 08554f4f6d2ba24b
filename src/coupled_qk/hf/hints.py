"""Hints for the mistakes users make with Hugging Face loading (shared by the model classes and the Auto
registration, so neither imports the other)."""

from __future__ import annotations

import os
from pathlib import Path


def run_folder_hint(path) -> str | None:
    """The hint for a local coupled-qk training run (or ``ckpt-*``) folder given where a Hugging Face model
    folder is expected (``None`` for anything else): convert it with ``coupled-qk export``."""
    try:
        folder = Path(os.fspath(path)).expanduser()
    except TypeError:
        return None
    from coupled_qk.training.checkpoint_format import Checkpoint
    from coupled_qk.training.run_folder import RunFolder

    if folder.is_dir() and (RunFolder(folder).is_run() or Checkpoint(folder).model_config_path.is_file()):
        return (
            f"{folder} is a coupled-qk training run or checkpoint, not a Hugging Face model folder; convert it "
            f"with `coupled-qk export {folder} HF_DIR` and load HF_DIR"
        )
    return None
