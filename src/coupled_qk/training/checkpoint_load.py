"""Finding, verifying and loading the checkpoints that :mod:`coupled_qk.training.checkpoint` writes.

A checkpoint folder (``ckpt-<step>[-r<k>]``, or ``best-<step>``) holds ``model.safetensors`` (without the tied
output head, :data:`TIED_KEYS`), ``model_config.json``, ``state.json`` and ``checksums.json`` (the SHA-256 of
every file); a ``ckpt-*`` folder also holds ``optimizer.pt`` and ``rng.pt``. Everything here reads: the
``latest`` / ``best`` pointers of a run folder, checksums, the checkpoint a ``--resume`` continues from, and
weights, JSON and torch files, with errors that name the damaged file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from coupled_qk.devices import resolve_device
from coupled_qk.io import unknown_keys
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT

CHECKSUMS = "checksums.json"
TIED_KEYS = ("lm_head.weight",)  # stored once, as tok_emb.weight
_NAME = re.compile(r"^ckpt-(\d+)(?:-r(\d+))?$")


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


BEST = "best"
"""Pointer file naming the best-validation checkpoint folder (``best-<step>``) of a run."""


def resolve_best(run_dir: str | Path) -> Path | None:
    """The best-validation checkpoint folder of a run (named by ``run_dir/best``), or ``None`` if it has none.

    Raises:
        FileNotFoundError: ``best`` names a folder without ``model.safetensors``.
        ValueError: ``best`` is not a folder name (:func:`read_pointer`).
    """
    pointer = Path(run_dir) / BEST
    if not pointer.is_file():
        return None
    folder = Path(run_dir) / read_pointer(pointer)
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{pointer} names {folder.name}, which has no model.safetensors")
    return folder


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint path or a run directory (via its ``latest`` file).

    Raises:
        FileNotFoundError: no checkpoint there, naming what was looked for.
        ValueError: ``latest`` is not the name of a folder of the run (:func:`read_pointer`).
    """
    path = Path(path)
    hf = _hf_export_model_type(path)
    if hf is not None:
        raise ValueError(
            f"{path} is a Hugging Face export (its config.json has model_type={hf!r}), not a coupled-qk "
            "run or checkpoint: load it with transformers (AutoModelForCausalLM.from_pretrained), or "
            "pass the run folder it was exported from"
        )
    if (path / "model.safetensors").is_file():
        return path
    latest = path / "latest"
    if latest.is_file():
        ckpt = path / read_pointer(latest)
        if (ckpt / "model.safetensors").is_file():
            return ckpt
        raise FileNotFoundError(f"{latest} names {ckpt.name}, which has no model.safetensors")
    folders = sorted(f.name for f in path.glob("ckpt-*") if (f / "model.safetensors").is_file())
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a checkpoint folder with model.safetensors or a run folder with a "
        "'latest' file"
        + (f" (it has none; pass one of its checkpoint folders, e.g. {path / folders[-1]})" if folders else "")
    )


def read_pointer(pointer: Path) -> str:
    """The folder name in a run's ``latest`` or ``best`` file: UTF-8 text naming one folder of the run.

    Raises:
        ValueError: naming the file, if it is not UTF-8, empty, or names something other than a folder of the
            run (a path such as ``../x``): a damaged or hand-edited pointer.
    """
    try:
        name = Path(pointer).read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        name = None
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        what = "is not UTF-8 text" if name is None else f"names {name!r}, not a folder of the run"
        raise ValueError(
            f"{pointer} {what}: write the name of one of its ckpt-* folders into it (e.g. "
            f"{_newest_name(Path(pointer).parent)}), or delete it (--resume then takes the newest "
            "checkpoint that verifies)"
        )
    return name


def _newest_name(run_dir: Path) -> str:
    steps = [(checkpoint_step(f), f.name) for f in run_dir.glob("ckpt-*") if checkpoint_step(f) is not None]
    return max(steps)[1] if steps else "ckpt-00000100"


def _hf_export_model_type(path: Path) -> str | None:
    """The ``model_type`` of a Hugging Face export folder (weights and a ``config.json`` naming a model type, no
    ``model_config.json``), else ``None``."""
    if (path / "model_config.json").exists() or not (path / "model.safetensors").is_file():
        return None
    model_type = _json_object(path / "config.json").get("model_type")
    return model_type if isinstance(model_type, str) else None


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``, or ``{}`` where there is no readable one (what a folder *is* is asked before
    its files are checked: a damaged file is reported by the reader that needs it)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def language_model_checkpoint(path: str | Path, needs_text: bool = False) -> Path:
    """:func:`resolve_checkpoint` for the commands that load a language model (``eval``, ``generate``,
    ``export``, ``analyze``, ``glue``'s pretrained run): a GLUE fine-tuning run (its checkpoints hold a sequence
    classifier) is named as such instead of failing on mismatched weights. With ``needs_text`` (the caller
    tokenizes text: ``eval``, ``generate``/``load_run``, ``analyze``, ``glue``), a run of a synthetic task
    without a tokenizer (an MQAR run) is named as such instead of as a missing tokenizer file.

    Raises:
        FileNotFoundError, ValueError: as :func:`resolve_checkpoint` (a Hugging Face export folder included);
            ``ValueError`` for a checkpoint of a GLUE run, or with ``needs_text`` of a run whose task is not
            ``lm`` and that has no tokenizer, naming its ``config.json``.
    """
    ckpt = resolve_checkpoint(path)
    for folder in (ckpt, ckpt.parent):
        config = folder / "config.json"
        if not config.is_file():
            continue
        task = _json_object(config).get("task")
        if task == "glue":
            raise ValueError(
                f"{path} is a GLUE fine-tuning run (task='glue' in {config}): its checkpoints hold a "
                "sequence classifier, not a language model; pass the language-model run it was "
                "fine-tuned from (task_options.pretrained in that config.json)"
            )
        if needs_text and task not in (None, "lm") and not (folder / "tokenizer" / "tokenizer.json").is_file():
            raise ValueError(
                f"{path} is a run of the synthetic task {task!r} (task={task!r} in {config}): its model "
                "reads the task's token ids, not text, and has no tokenizer; pass a language-model "
                "run trained on text (task 'lm')"
            )
        break
    return ckpt


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
    if not all(isinstance(v, str) for v in sums.values()):
        raise ValueError(
            f"{path} holds values other than SHA-256 texts; the checkpoint is damaged: {_what_to_do(Path(ckpt))}"
        )
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
    older ``ckpt-*`` folder of the run that does, or without ``latest`` the newest that does (docs/RELIABILITY.md,
    "Faults").

    A checkpoint verifies when its ``latest`` target exists with ``model.safetensors``, every file matches
    ``checksums.json`` (:func:`verify_checksums`: a truncated or zeroed file differs) and ``state.json`` is one
    (:func:`read_state`).
    The damaged folder is left in place (the next save rewrites ``latest``;
    :func:`~coupled_qk.training.checkpoint.prune_checkpoints` removes it once the resumed run has saved its step
    again, as a superseded copy).

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
        read_state(folder)

    try:
        where = resolve_checkpoint(run_dir)
        check(where)
        return where
    except (ValueError, FileNotFoundError) as exc:
        damage = exc
    try:
        latest = read_pointer(run_dir / "latest") if (run_dir / "latest").is_file() else ""
    except ValueError:
        latest = "?"  # damaged: every ckpt-* folder is a candidate
    latest_step = checkpoint_step(Path(latest))
    older = sorted(
        (
            f
            for f in run_dir.glob("ckpt-*")
            if f.is_dir()
            and f.name != latest
            and checkpoint_step(f) is not None
            and (latest_step is None or checkpoint_step(f) < latest_step)
        ),
        key=lambda f: (checkpoint_step(f), f.name),
        reverse=True,
    )
    for folder in older:
        try:
            check(folder)
        except (ValueError, FileNotFoundError):
            continue
        if say is not None and not latest:
            say(
                f"warning: {run_dir / 'latest'} is missing; resuming from the newest checkpoint that verifies, "
                f"{folder.name} (step {checkpoint_step(folder)})"
            )
        elif say is not None:
            say(
                f"warning: the latest checkpoint is refused ({damage}); resuming from the previous good checkpoint "
                f"{folder.name} (step {checkpoint_step(folder)}); the damaged folder is left in place"
            )
        return folder
    raise type(damage)(f"{damage}; and no older checkpoint of {run_dir} verifies") from None


def load_checkpoint_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Load a model and its progress state from a checkpoint or run directory (checksums verified).

    Returns:
        ``(model in eval mode, state dict from state.json)``.

    Raises:
        FileNotFoundError, ValueError: no checkpoint there, or a damaged one (naming the file); a folder of
            another kind (:func:`language_model_checkpoint`); a ``map_location`` that is neither ``"auto"`` nor a
            device of this machine (the error lists those).
    """
    device = resolve_device("device", map_location)  # "auto" as on the command line; an absent device: one line
    ckpt = language_model_checkpoint(path)
    verify_checksums(ckpt, ("model.safetensors", "model_config.json", "state.json"))
    config = GPTConfig.load(ckpt / "model_config.json")
    model = GPT(config)
    load_weights(model, ckpt)
    return model.to(device).eval(), read_state(ckpt)


def read_json(path: Path) -> dict:
    """Parse a checkpoint's JSON file, which holds an object.

    Raises:
        ValueError: naming the file, if it is not valid JSON or not a JSON object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a JSON {type(data).__name__}, expected an object; the checkpoint is "
            f"damaged: {_what_to_do(Path(path).parent)}"
        )
    return data


STATE_KEYS = (
    "step",
    "tokens",
    "train_seconds",
    "eval_seconds",
    "validations",
    "schedule",
    "grad_scaler",
    "global_batch",
    "precision",
    "best",
)
"""The keys of a checkpoint's ``state.json`` (``training.loop``'s ``_Trainer.save``)."""
BEST_STATE_KEYS = ("metric", "value", "step", "tokens", "epoch")
"""The keys of a best-validation checkpoint's (``best-<step>/``) ``state.json``: the record of
:func:`coupled_qk.training.best.track_best`."""


def read_state(ckpt: Path) -> dict:
    """``ckpt/state.json``: the progress of a checkpoint, a JSON object whose ``step`` is an integer >= 0.

    A key outside :data:`STATE_KEYS` (:data:`BEST_STATE_KEYS` for a ``best-<step>`` folder) is a warning naming it and
    its close match (:func:`~coupled_qk.io.unknown_keys`).

    Raises:
        ValueError: naming the file, if it is not a JSON object with such a ``step`` (hand-edited, or damaged in
            a checkpoint without ``checksums.json``).
    """
    path = Path(ckpt) / "state.json"
    state = read_json(path)
    step = state.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        raise ValueError(
            f"{path} has step={step!r}, expected an integer >= 0; the checkpoint is damaged: {_what_to_do(Path(ckpt))}"
        )
    keys = BEST_STATE_KEYS if Path(ckpt).name.startswith("best-") else STATE_KEYS  # its best record warned
    unknown_keys(state, keys, path, "checkpoint state", error=False)  # the project's own file: a warning
    return state


def _what_to_do(ckpt: Path) -> str:
    return f"point {ckpt.parent / 'latest'} at an older ckpt-* folder or delete {ckpt.name}"


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
