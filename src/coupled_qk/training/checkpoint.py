"""Atomic checkpoints: safetensors weights plus optimizer, RNG and progress state.

Layout of a run directory::

    run/
      config.json          the TrainConfig of the run
      latest               name of the newest complete checkpoint (replaced atomically)
      ckpt-00000100/       model.safetensors, optimizer.pt, state.json, rng.pt, model_config.json
      tokenizer/           the run's tokenizer (language modelling)

A checkpoint is written into a temporary sibling directory, flushed to disk, renamed into place and only
then named in ``latest``: a kill at any moment leaves the previous checkpoint intact and ``latest`` valid.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from coupled_qk.io import fsync_dir, write_text_atomic
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT


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


TIED_KEYS = ("lm_head.weight",)  # stored once, as tok_emb.weight


def save_checkpoint(
    run_dir: str | Path,
    model_state: dict[str, torch.Tensor],
    model_config: GPTConfig,
    optimizer_state: dict | None,
    state: dict,
    keep: int = 2,
) -> Path:
    """Write ``ckpt-<step>`` atomically under ``run_dir`` and point ``latest`` at it.

    Args:
        run_dir: the run directory.
        model_state: full (unsharded) model state dict; saved to ``model.safetensors`` without the tied
            output head.
        model_config: saved to ``model_config.json``.
        optimizer_state: full optimizer state dict, saved to ``optimizer.pt`` (``None`` to skip).
        state: JSON-serialisable progress (must contain ``step``).
        keep: number of newest checkpoints to keep (older ones are deleted after the new one is in place).

    Returns:
        The checkpoint directory.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{int(state['step']):08d}"
    final = run_dir / name
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{name}.tmp-"))
    try:
        weights = {k: v.detach().cpu().contiguous() for k, v in model_state.items() if k not in TIED_KEYS}
        save_file(weights, str(tmp / "model.safetensors"))
        model_config.save(tmp / "model_config.json")
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        if final.exists():  # re-saving the same step: move the old one aside first
            old = run_dir / f".{name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(run_dir / "latest", name + "\n")
    for old in sorted(run_dir.glob("ckpt-*"))[:-keep]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint path or a run directory (via its ``latest`` file).

    Raises:
        FileNotFoundError: no checkpoint there, naming what was looked for.
    """
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return path
    latest = path / "latest"
    if latest.is_file():
        ckpt = path / latest.read_text().strip()
        if (ckpt / "model.safetensors").is_file():
            return ckpt
        raise FileNotFoundError(f"{latest} names {ckpt.name}, which has no model.safetensors")
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a checkpoint folder with model.safetensors or a run folder with a "
        "'latest' file"
    )


def load_checkpoint_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Load a model and its progress state from a checkpoint or run directory.

    Returns:
        ``(model in eval mode, state dict from state.json)``.
    """
    ckpt = resolve_checkpoint(path)
    config = GPTConfig.load(ckpt / "model_config.json")
    model = GPT(config)
    load_weights(model, ckpt)
    return model.to(map_location).eval(), read_json(ckpt / "state.json")


def read_json(path: Path) -> dict:
    """Parse a JSON file; ``ValueError`` naming the file if it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from exc


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load ``ckpt/model.safetensors`` into ``model``; any key mismatch raises ``ValueError``."""
    file = ckpt / "model.safetensors"
    try:
        weights = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error type for damaged files
        raise ValueError(
            f"cannot read {file} ({exc}); the checkpoint is damaged: point {ckpt.parent / 'latest'} at an older "
            "ckpt-* folder or delete this one"
        ) from exc
    result = model.load_state_dict(weights, strict=False)
    missing = [k for k in result.missing_keys if k not in TIED_KEYS]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {ckpt} does not match the model: missing {missing}, unexpected {result.unexpected_keys}"
        )


def check_compatible(saved: GPTConfig, current: GPTConfig, where: Path) -> None:
    """Raise ``ValueError`` naming every field where a checkpoint's model config differs from the run's."""
    a, b = saved.to_dict(), current.to_dict()
    diff = {k: (a[k], b.get(k)) for k in a if k != "extra" and a[k] != b.get(k)}
    if diff:
        details = ", ".join(f"{k}: checkpoint {v[0]!r} vs run {v[1]!r}" for k, v in sorted(diff.items()))
        raise ValueError(f"checkpoint {where} was made with a different model config ({details})")
