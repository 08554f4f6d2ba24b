"""Atomic, checksummed checkpoints: safetensors weights plus optimizer, RNG and progress state.

Layout of a run directory::

    run/
      config.json          the TrainConfig of the run
      latest               name of the newest complete checkpoint (replaced atomically)
      ckpt-00000100/       model.safetensors, optimizer.pt, state.json, rng.pt, model_config.json, checksums.json
      tokenizer/           the run's tokenizer (language modelling)

A checkpoint is written into a temporary sibling folder, flushed to disk and renamed to a name no existing
folder has (``ckpt-<step>``, or ``ckpt-<step>-r<k>`` when that step is saved again); only then is ``latest``
replaced atomically and the superseded folders deleted. No folder that ``latest`` names is ever moved or
modified, so a kill at any moment leaves ``latest`` naming a complete checkpoint. ``checksums.json`` records
the SHA-256 of every file; loading verifies it, so damaged bytes are an error, not ``nan``.

This module writes (and prunes); finding, verifying and loading checkpoints is
:mod:`coupled_qk.training.checkpoint_load`, whose names are importable from here too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from coupled_qk.io import file_mode, fsync_dir, make_temp_dir, write_error, write_text_atomic
from coupled_qk.models.config import GPTConfig
from coupled_qk.training.checkpoint_load import (  # noqa: F401 - the reading side: public here too
    BEST,
    CHECKSUMS,
    TIED_KEYS,
    check_compatible,
    checkpoint_step,
    language_model_checkpoint,
    load_checkpoint_model,
    load_torch_file,
    load_weights,
    read_json,
    read_state,
    resolve_best,
    resolve_checkpoint,
    resume_checkpoint,
    sha256_file,
    verify_checksums,
)


def rng_state() -> dict:
    """Python, NumPy and torch (CPU and CUDA) random states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore a state from :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fresh_name(run_dir: Path, kind: str, step: int) -> str:
    """``<kind>-<step>``, or ``<kind>-<step>-r<k>`` with the first ``k`` no folder of ``run_dir`` has."""
    name, k = f"{kind}-{step:08d}", 0
    while (run_dir / name).exists():
        k += 1
        name = f"{kind}-{step:08d}-r{k}"
    return name


def save_checkpoint(
    run_dir: str | Path,
    model_state: dict[str, torch.Tensor],
    model_config: GPTConfig,
    optimizer_state: dict | None,
    state: dict,
    keep: int = 2,
) -> Path:
    """Write a checkpoint of ``state["step"]`` atomically under ``run_dir`` and point ``latest`` at it.

    Args:
        run_dir: the run directory.
        model_state: full (unsharded) model state dict; saved to ``model.safetensors`` without the tied
            output head.
        model_config: saved to ``model_config.json``.
        optimizer_state: full optimizer state dict, saved to ``optimizer.pt`` (``None`` to skip).
        state: JSON-serialisable progress (must contain ``step``).
        keep: number of newest checkpoint steps to keep (older ones are deleted after the new one is in place).

    Returns:
        The checkpoint directory.

    Raises:
        OSError: a file could not be written (full disk, permissions), naming it; the previous checkpoint and
            ``latest`` are untouched and the partial folder is removed.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    files = {
        "model.safetensors": lambda p: _save_weights(model_state, p),
        "model_config.json": model_config.save,
        "rng.pt": lambda p: torch.save(rng_state(), p),
        "state.json": lambda p: p.write_text(json.dumps(state, indent=2, sort_keys=True)),
    }
    if optimizer_state is not None:
        files["optimizer.pt"] = lambda p: torch.save(optimizer_state, p)
    name = _write_folder(run_dir, files, f".ckpt-{step:08d}.tmp-", lambda: _fresh_name(run_dir, "ckpt", step))
    write_text_atomic(run_dir / "latest", name + "\n")
    prune_checkpoints(run_dir, keep)
    return run_dir / name


def _save_weights(model_state: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items() if k not in TIED_KEYS}, str(path))


def _write_folder(run_dir: Path, files: dict, tmp_prefix: str, final_name) -> str:
    """Write ``files`` (name -> writer of a path) into a temporary folder of ``run_dir`` with checksums, flush
    it and rename it to ``final_name()``; return that name. On any error the partial folder is removed and the
    error (``OSError`` naming the file) is raised."""
    tmp = make_temp_dir(run_dir, tmp_prefix)
    current = None
    try:
        sums, mode = {}, file_mode()
        for name, write in files.items():
            current = tmp / name
            try:
                write(current)
            except (OSError, RuntimeError, SafetensorError) as exc:  # torch: RuntimeError, safetensors: its own
                raise write_error(current, exc) from exc
            os.chmod(current, mode)  # safetensors writes 0600 whatever the umask
            with open(current, "rb") as fh:
                os.fsync(fh.fileno())
            sums[name] = sha256_file(current)
        current = tmp / CHECKSUMS
        current.write_text(json.dumps(sums, indent=2, sort_keys=True))
        fsync_dir(tmp)
        name = final_name()
        os.replace(tmp, run_dir / name)
        fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return name


def save_best(run_dir: str | Path, model_state: dict[str, torch.Tensor], model_config: GPTConfig, info: dict) -> Path:
    """Write the best-validation weights atomically as ``run_dir/best-<step>/`` and point ``run_dir/best`` at it.

    The folder holds ``model.safetensors``, ``model_config.json``, ``state.json`` (``info``: at least ``step``;
    the loop adds the metric, its value, tokens and epoch) and ``checksums.json``, so it loads like any
    checkpoint (:func:`load_checkpoint_model`, ``coupled-qk eval RUN/best-<step>``). No optimizer state: the
    best weights are for evaluation; training resumes from ``latest``. The pointer is replaced atomically and
    older ``best-*`` folders are deleted only after it, so a kill at any moment leaves ``best`` naming a
    complete folder (or no ``best`` yet).

    Raises:
        OSError: a file could not be written, naming it; the previous best is untouched.
    """
    run_dir = Path(run_dir)
    step = int(info["step"])
    files = {
        "model.safetensors": lambda p: _save_weights(model_state, p),
        "model_config.json": model_config.save,
        "state.json": lambda p: p.write_text(json.dumps(info, indent=2, sort_keys=True)),
    }
    name = _write_folder(run_dir, files, f".ckpt-best-{step:08d}.tmp-", lambda: _fresh_name(run_dir, "best", step))
    write_text_atomic(run_dir / BEST, name + "\n")
    for old in run_dir.glob("best-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return run_dir / name


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete checkpoints other than the ``keep`` newest steps up to ``latest``'s, superseded copies of
    ``latest``'s step and leftovers of interrupted saves (hidden ``.ckpt-*`` folders, ``.*.tmp`` files); the
    folder ``latest`` names is always kept, and steps newer than it are left alone."""
    run_dir = Path(run_dir)
    latest_file = run_dir / "latest"
    latest = latest_file.read_text().strip() if latest_file.is_file() else None
    clean_leftovers(run_dir)
    by_step: dict[int, list[Path]] = {}
    for folder in run_dir.glob("ckpt-*"):
        step = checkpoint_step(folder)
        if step is not None:
            by_step.setdefault(step, []).append(folder)
    latest_step = checkpoint_step(Path(latest)) if latest else None
    if latest_step is None:
        return
    kept_steps = sorted(s for s in by_step if s <= latest_step)[-keep:] if keep > 0 else []
    for step, folders in by_step.items():
        if step > latest_step:  # newer than latest (the user pointed latest back): not ours to judge
            continue
        for folder in folders:
            if folder.name != latest and (step not in kept_steps or step == latest_step):
                shutil.rmtree(folder, ignore_errors=True)


def clean_leftovers(run_dir: Path) -> None:
    """Remove what a hard kill during a save leaves: hidden ``.ckpt-*`` folders and ``.*.tmp`` files.

    Only safe while the caller owns the run folder (:class:`coupled_qk.training.lock.RunLock`).
    """
    for tmp in Path(run_dir).glob(".ckpt-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    for tmp in Path(run_dir).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
