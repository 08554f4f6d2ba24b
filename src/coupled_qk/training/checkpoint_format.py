"""The file format of one checkpoint folder: what it holds, how it is written atomically and read back verified.

A checkpoint folder (``ckpt-<step>[-r<k>]`` or ``best-<step>[-r<k>]`` of a run folder, whose layout and names are
:mod:`coupled_qk.training.run_folder`'s) holds::

    model.safetensors    the weights, without the tied output head (:data:`TIED_KEYS`, stored once as the
                         embedding); every floating tensor finite
    model_config.json    the GPTConfig (:meth:`GPTConfig.save <coupled_qk.models.config.GPTConfig.save>`)
    state.json           progress: a JSON object with an integer ``step`` >= 0 (keys: :data:`STATE_KEYS`;
                         a ``best-*`` folder's: :data:`BEST_STATE_KEYS`)
    optimizer.pt         the full optimizer state (torch.save; training checkpoints only)
    rng.pt               Python, NumPy and torch random states (training checkpoints only)
    checksums.json       the SHA-256 of every file above (written last, before the folder is renamed)

A folder is written into a hidden temporary sibling, each file flushed to disk and checksummed, then renamed into
place in one step (:func:`write_folder`); a reader verifies the checksums (:meth:`Checkpoint.verify`), so damaged
bytes are an error naming the file, never ``nan`` weights. Folders written before checksums existed have no
``checksums.json`` and load as they are. The torchtitan anchor: one checkpoint = one atomic folder, held by the
run folder object that decides its name, its pointer and its pruning.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from coupled_qk.checks.values import unknown_keys
from coupled_qk.devices import resolve_device
from coupled_qk.files import file_mode, fsync_dir, make_temp_dir, write_error
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT

__all__ = [
    "Checkpoint",
    "BEST_STATE_KEYS",
    "STATE_KEYS",
    "TIED_KEYS",
    "check_compatible",
    "rng_state",
    "set_rng_state",
    "sha256_file",
    "write_folder",
]

WEIGHTS = "model.safetensors"
MODEL_CONFIG = "model_config.json"
STATE = "state.json"
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
CHECKSUMS = "checksums.json"

TIED_KEYS = ("lm_head.weight",)
"""Weights stored once, as ``tok_emb.weight`` (the tied output head)."""

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
    "initial_weights_sha256",
    "hosts",
)
"""The keys of a checkpoint's ``state.json`` (``training.loop``'s ``_Trainer.save``; the last two from
:mod:`coupled_qk.training.provenance`, absent in checkpoints written before it)."""
BEST_STATE_KEYS = ("metric", "value", "step", "tokens", "epoch")
"""The keys of a best-validation checkpoint's (``best-<step>/``) ``state.json``: the record of
:func:`coupled_qk.training.best.track_best`."""


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def checkpoint_files(
    model_state: dict[str, torch.Tensor],
    model_config: GPTConfig,
    state: dict,
    optimizer_state: dict | None = None,
    with_rng: bool = True,
) -> dict[str, Callable[[Path], object]]:
    """The files of a checkpoint folder as ``{name: writer of a path}`` for :func:`write_folder`: the weights
    (``model_state``, a full unsharded state dict, without :data:`TIED_KEYS`), ``model_config``, ``state`` (JSON,
    with ``step``), and optionally ``optimizer_state`` and the random states (``with_rng``)."""
    files = {
        WEIGHTS: lambda p: save_file(
            {k: v.detach().cpu().contiguous() for k, v in model_state.items() if k not in TIED_KEYS}, str(p)
        ),
        MODEL_CONFIG: model_config.save,
        STATE: lambda p: p.write_text(json.dumps(state, indent=2, sort_keys=True)),
    }
    if with_rng:
        files[RNG] = lambda p: torch.save(rng_state(), p)
    if optimizer_state is not None:
        files[OPTIMIZER] = lambda p: torch.save(optimizer_state, p)
    return files


def write_folder(parent: Path, files: dict, tmp_prefix: str, final_name: Callable[[], str]) -> str:
    """Write ``files`` (name -> writer of a path) into a hidden temporary folder of ``parent`` (named
    ``tmp_prefix`` + a random suffix) with ``checksums.json``, flush it and rename it to ``final_name()``; return
    that name. On any error the partial folder is removed.

    Raises:
        OSError: a file could not be written (full disk, permissions), naming it (:func:`coupled_qk.files.write_error`).
    """
    tmp = make_temp_dir(parent, tmp_prefix)
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
        os.replace(tmp, parent / name)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return name


def read_json_object(path: Path, damaged: str = "") -> dict:
    """The JSON object in the file ``path``.

    Raises:
        ValueError: naming the file (and ``damaged``, what to do), if it is not valid JSON or not an object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a JSON {type(data).__name__}, expected an object; the checkpoint is damaged{damaged}"
        )
    return data


class Checkpoint:
    """One checkpoint folder (module docstring): its files, verified and read.

    Args:
        path: the folder.
        damaged: what to do when a file of it is damaged, appended to those errors (the run folder names its
            older checkpoints there: ``"; point RUN/latest at ..."``).
    """

    def __init__(self, path: str | Path, damaged: str = ""):
        self.path = Path(path)
        self.damaged = damaged

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r})"

    @property
    def weights_path(self) -> Path:
        """``model.safetensors``."""
        return self.path / WEIGHTS

    @property
    def model_config_path(self) -> Path:
        """``model_config.json``."""
        return self.path / MODEL_CONFIG

    def has_weights(self) -> bool:
        """Whether the folder holds ``model.safetensors`` (a checkpoint; nothing verified)."""
        return self.weights_path.is_file()

    def verify(self, names: tuple[str, ...] | None = None) -> None:
        """Compare the folder's files with ``checksums.json`` (all recorded files, or those of ``names``);
        a folder without ``checksums.json`` (written before checksums existed) is accepted as it is.

        Raises:
            ValueError: a file's SHA-256 differs from the recorded one, or a recorded file is missing, naming it.
        """
        path = self.path / CHECKSUMS
        if not path.is_file():
            return
        sums = read_json_object(path, self.damaged)
        if not all(isinstance(v, str) for v in sums.values()):
            raise ValueError(f"{path} holds values other than SHA-256 texts; the checkpoint is damaged{self.damaged}")
        for name, expected in sums.items():
            if names is not None and name not in names:
                continue
            file = self.path / name
            if not file.is_file():
                raise ValueError(f"{file} is missing from the checkpoint ({path} lists it)")
            if sha256_file(file) != expected:
                raise ValueError(
                    f"{file} is damaged: its SHA-256 differs from the one recorded in {path}{self.damaged}"
                )

    def verify_loadable(self) -> None:
        """What a resume needs: the weights exist, every file matches its checksum, ``state.json`` is one.

        Raises:
            FileNotFoundError: no ``model.safetensors``. ValueError: as :meth:`verify` and :meth:`state`.
        """
        if not self.has_weights():
            raise FileNotFoundError(f"{self.path} has no {WEIGHTS}")
        self.verify()
        self.state()

    def state(self) -> dict:
        """``state.json``: a JSON object whose ``step`` is an integer >= 0; a key outside :data:`STATE_KEYS`
        (:data:`BEST_STATE_KEYS` for a ``best-<step>`` folder) is a warning naming it and its close match (the
        project's own file, which a later version may extend).

        Raises:
            ValueError: naming the file, if it is not such an object (hand-edited, or damaged in a checkpoint
                without ``checksums.json``).
        """
        path = self.path / STATE
        state = read_json_object(path, self.damaged)
        step = state.get("step")
        if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
            raise ValueError(
                f"{path} has step={step!r}, expected an integer >= 0; the checkpoint is damaged{self.damaged}"
            )
        keys = BEST_STATE_KEYS if self.path.name.startswith("best-") else STATE_KEYS
        unknown_keys(state, keys, path, "checkpoint state", error=False)
        return state

    def model_config(self) -> GPTConfig:
        """The checkpoint's :class:`~coupled_qk.GPTConfig` (``model_config.json``)."""
        return GPTConfig.load(self.model_config_path)

    def load_weights(self, model: torch.nn.Module) -> None:
        """Load ``model.safetensors`` into ``model`` (the tied head follows its embedding).

        Raises:
            ValueError: the file is unreadable, a weight is NaN/inf, or its keys do not match the model.
        """
        try:
            weights = load_file(str(self.weights_path))
        except Exception as exc:  # safetensors raises its own error type for damaged files
            raise ValueError(
                f"cannot read {self.weights_path} ({exc}); the checkpoint is damaged{self.damaged}"
            ) from exc
        bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise ValueError(
                f"{self.weights_path} holds non-finite (NaN or inf) weights in {bad[:3]}; resume from an older "
                "checkpoint"
            )
        result = model.load_state_dict(weights, strict=False)
        missing = [k for k in result.missing_keys if k not in TIED_KEYS]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"checkpoint {self.path} does not match the model: missing {missing}, unexpected "
                f"{result.unexpected_keys}"
            )

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors of ``model.safetensors`` as stored (without the tied head; for sharded loading)."""
        return load_file(str(self.weights_path))

    def _torch_file(self, name: str, map_location=None):
        path = self.path / name
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except FileNotFoundError:
            raise
        except Exception as exc:  # torch reports truncated or corrupt archives as RuntimeError, EOFError, ...
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ValueError(
                f"cannot read {path} ({type(exc).__name__}: {first}); the checkpoint is damaged{self.damaged}"
            ) from exc

    def optimizer_state(self, map_location=None) -> dict:
        """``optimizer.pt`` (``torch.load``); ``ValueError`` naming the file if it is damaged."""
        return self._torch_file(OPTIMIZER, map_location)

    def restore_rng(self) -> None:
        """Restore the random states of ``rng.pt`` (:func:`set_rng_state`); ``ValueError`` if it is damaged."""
        set_rng_state(self._torch_file(RNG))

    def load_model(self, map_location: str | torch.device = "cpu") -> tuple[GPT, dict]:
        """The :class:`~coupled_qk.GPT` of this checkpoint in eval mode on ``map_location`` and its ``state.json``
        (the weights, config and state verified against their checksums first).

        Raises:
            ValueError: a damaged file (naming it); a ``map_location`` that is neither ``"auto"`` nor a device of
                this machine (the error lists those).
        """
        device = resolve_device("device", map_location)
        self.verify((WEIGHTS, MODEL_CONFIG, STATE))
        model = GPT(self.model_config())
        self.load_weights(model)
        return model.to(device).eval(), self.state()


def check_compatible(saved: GPTConfig, current: GPTConfig, where: Path) -> None:
    """Raise ``ValueError`` naming every field where a checkpoint's model config differs from the run's."""
    a, b = saved.to_dict(), current.to_dict()
    diff = {k: (a[k], b.get(k)) for k in a if k != "extra" and a[k] != b.get(k)}
    if diff:
        details = ", ".join(f"{k}: checkpoint {v[0]!r} vs run {v[1]!r}" for k, v in sorted(diff.items()))
        raise ValueError(f"checkpoint {where} was made with a different model config ({details})")
