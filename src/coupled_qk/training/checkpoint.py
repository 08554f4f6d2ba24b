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
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from coupled_qk.io import file_mode, fsync_dir, make_temp_dir, write_error, write_text_atomic
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT

CHECKSUMS = "checksums.json"
_NAME = re.compile(r"^ckpt-(\d+)(?:-r(\d+))?$")


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


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_step(folder: Path) -> int | None:
    """The step of a ``ckpt-<step>[-r<k>]`` folder name; ``None`` for other names."""
    m = _NAME.match(folder.name)
    return int(m.group(1)) if m else None


def _fresh_name(run_dir: Path, step: int) -> str:
    name, k = f"ckpt-{step:08d}", 0
    while (run_dir / name).exists():
        k += 1
        name = f"ckpt-{step:08d}-r{k}"
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
    name = _write_folder(run_dir, files, f".ckpt-{step:08d}.tmp-", lambda: _fresh_name(run_dir, step))
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


BEST = "best"
"""Pointer file naming the best-validation checkpoint folder (``best-<step>``) of a run."""


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

    def fresh() -> str:
        name, k = f"best-{step:08d}", 0
        while (run_dir / name).exists():
            k += 1
            name = f"best-{step:08d}-r{k}"
        return name

    files = {"model.safetensors": lambda p: _save_weights(model_state, p), "model_config.json": model_config.save,
             "state.json": lambda p: p.write_text(json.dumps(info, indent=2, sort_keys=True))}
    name = _write_folder(run_dir, files, f".ckpt-best-{step:08d}.tmp-", fresh)
    write_text_atomic(run_dir / BEST, name + "\n")
    for old in run_dir.glob("best-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return run_dir / name


def resolve_best(run_dir: str | Path) -> Path | None:
    """The best-validation checkpoint folder of a run (named by ``run_dir/best``), or ``None`` if it has none.

    Raises:
        FileNotFoundError: ``best`` names a folder without ``model.safetensors``.
    """
    pointer = Path(run_dir) / BEST
    if not pointer.is_file():
        return None
    folder = Path(run_dir) / pointer.read_text().strip()
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{pointer} names {folder.name}, which has no model.safetensors")
    return folder


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


def verify_checksums(ckpt: Path, names: tuple[str, ...] | None = None) -> None:
    """Compare files of ``ckpt`` with ``checksums.json`` (all recorded files, or ``names``).

    Checkpoints written before checksums were recorded have no ``checksums.json`` and are accepted as they are.

    Raises:
        ValueError: a file's SHA-256 differs from the recorded one, or a recorded file is missing, naming it.
    """
    path = Path(ckpt) / CHECKSUMS
    if not path.is_file():
        return
    sums = read_json(path)
    for name, expected in sums.items():
        if names is not None and name not in names:
            continue
        file = Path(ckpt) / name
        if not file.is_file():
            raise ValueError(f"{file} is missing from the checkpoint ({path} lists it)")
        if sha256_file(file) != expected:
            raise ValueError(
                f"{file} is damaged: its SHA-256 differs from the one recorded in {path}; point "
                f"{Path(ckpt).parent / 'latest'} at an older ckpt-* folder or delete this one"
            )


def resume_checkpoint(run_dir: str | Path, say=None) -> Path:
    """The checkpoint a ``--resume`` continues from: the one ``latest`` names if it verifies, else the newest
    older ``ckpt-*`` folder of the run that does (docs/RELIABILITY.md, "Faults").

    A checkpoint verifies when its ``latest`` target exists with ``model.safetensors``, every file matches
    ``checksums.json`` (:func:`verify_checksums`: a truncated or zeroed file differs) and ``state.json`` parses.
    The damaged folder is left in place (the next save rewrites ``latest``; :func:`prune_checkpoints` removes it
    once the resumed run has saved its step again, as a superseded copy).

    Args:
        run_dir: the run folder.
        say: called with one line when a damaged checkpoint is skipped (naming it, why, and the one used).

    Returns:
        The checkpoint folder to resume from.

    Raises:
        ValueError / FileNotFoundError: the damage of ``latest``'s checkpoint (naming the file), when no older
            checkpoint verifies either.
    """
    run_dir = Path(run_dir)

    def check(folder: Path) -> None:
        if not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"{folder} has no model.safetensors")
        verify_checksums(folder)
        read_json(folder / "state.json")

    try:
        where = resolve_checkpoint(run_dir)
        check(where)
        return where
    except (ValueError, FileNotFoundError) as exc:
        damage = exc
    latest = (run_dir / "latest").read_text().strip() if (run_dir / "latest").is_file() else ""
    latest_step = checkpoint_step(Path(latest))
    older = sorted((f for f in run_dir.glob("ckpt-*") if f.is_dir() and f.name != latest
                    and checkpoint_step(f) is not None
                    and (latest_step is None or checkpoint_step(f) < latest_step)),
                   key=lambda f: (checkpoint_step(f), f.name), reverse=True)
    for folder in older:
        try:
            check(folder)
        except (ValueError, FileNotFoundError):
            continue
        if say is not None:
            say(f"warning: the latest checkpoint is refused ({damage}); resuming from the previous good checkpoint "
                f"{folder.name} (step {checkpoint_step(folder)}); the damaged folder is left in place")
        return folder
    raise type(damage)(f"{damage}; and no older checkpoint of {run_dir} verifies") from None


def load_checkpoint_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Load a model and its progress state from a checkpoint or run directory (checksums verified).

    Returns:
        ``(model in eval mode, state dict from state.json)``.
    """
    ckpt = resolve_checkpoint(path)
    verify_checksums(ckpt, ("model.safetensors", "model_config.json", "state.json"))
    config = GPTConfig.load(ckpt / "model_config.json")
    model = GPT(config)
    load_weights(model, ckpt)
    return model.to(map_location).eval(), read_json(ckpt / "state.json")


def read_json(path: Path) -> dict:
    """Parse a JSON file; ``ValueError`` naming the file if it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from exc


def load_torch_file(path: Path, map_location=None):
    """``torch.load`` of a checkpoint's ``optimizer.pt`` / ``rng.pt``; ``ValueError`` naming the file if damaged."""
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch reports truncated or corrupt archives as RuntimeError, EOFError, ...
        raise ValueError(
            f"cannot read {path} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the "
            f"checkpoint is damaged: point {path.parent.parent / 'latest'} at an older ckpt-* folder or delete it"
        ) from exc


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load ``ckpt/model.safetensors`` into ``model``.

    Raises:
        ValueError: the file is unreadable, its keys do not match the model, or a weight is NaN/inf.
    """
    file = ckpt / "model.safetensors"
    try:
        weights = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error type for damaged files
        raise ValueError(
            f"cannot read {file} ({exc}); the checkpoint is damaged: point {ckpt.parent / 'latest'} at an older "
            "ckpt-* folder or delete this one"
        ) from exc
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{file} holds non-finite (NaN or inf) weights in {bad[:3]}; resume from an older checkpoint")
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
