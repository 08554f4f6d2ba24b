"""The run folder: one object that knows the folder of a training run, from its first start to its readers.

Layout (every entry a run folder may hold; the only place that names them)::

    <run>/
      .lock                      held (``flock``) by the one process writing the run; names it (pid, host, start,
                                 command); removed when it ends (:mod:`coupled_qk.training.lock`)
      config.json                the run's TrainConfig (rewritten by a resume with its budget)
      model_config.json          the resolved GPTConfig (vocabulary and block size filled in by the task)
      data.json                  the task's description of its data (``Task.describe()``: corpus, token counts and
                                 text SHA-256s, MQAR slices, GLUE counts); a resume and ``eval`` compare with it
      tokenizer/                 the run's tokenizer (a task with a ``tokenizer``: language modelling, GLUE)
      metrics.jsonl              one JSON object per logged step (training loss, lr, tokens, evaluations)
      tensorboard/               TensorBoard event files
      ckpt-<step>/               a training checkpoint (8-digit step; ``ckpt-<step>-r<k>`` when that step is saved
                                 again); its files: :mod:`coupled_qk.training.checkpoint_format`
      latest                     text: the name of the newest complete ``ckpt-*`` folder
      best-<step>/               the best-validation weights (``best_metric`` set; no optimizer or RNG state)
      best                       text: the name of the ``best-*`` folder
      results.json               final metrics (:data:`RESULTS_KEYS`); present only when the run finished
      results.interrupted.json   results of a run an experiment stopped on its time guard (resumable)
      glue/                      the default output folder of ``coupled-qk glue`` for this one run
      .ckpt-*.tmp-*/, .*.tmp     leftovers of a save cut short by a kill (removed by the next writer)

States: *finished* (``results.json``), *resumable* (a checkpoint: ``latest``, or a ``ckpt-*`` folder with
weights), *live* (another process holds ``.lock``), *partial* (files of a run killed before its first
checkpoint). Its precision (``fp32``/``bf16``/``fp16`` autocast) is fixed at its first start and recorded in
every checkpoint: a resume continues in it (:meth:`RunFolder.resume_precision`).

Writers (the training loop) hold the folder through :class:`RunFolder`: :meth:`~RunFolder.lock`,
:meth:`~RunFolder.resume_point`, :meth:`~RunFolder.record_start`, :meth:`~RunFolder.save`,
:meth:`~RunFolder.save_best`, :meth:`~RunFolder.open_metrics`, :meth:`~RunFolder.write_results`. Readers ask
:func:`open_run` once for the run's state (a run still training, without its tokenizer or its record of its
data, of another kind) and get its checkpoint; :func:`run_file_owner` tells any command whether a path is one of
a run's own files, which no command replaces. The torchtitan anchor: the checkpoint manager held by the trainer.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from coupled_qk.checks.values import loads_json, unknown_keys
from coupled_qk.data.tokenizers import TOKENIZER_FILE, Tokenizer
from coupled_qk.files import write_text_atomic
from coupled_qk.models.config import GPTConfig
from coupled_qk.training import checkpoint_format as fmt
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.lock import RunLock, RunLockedError, lock_holder

__all__ = [
    "RESULTS_KEYS",
    "RESULTS_FILE",
    "RUN_LAYOUT",
    "OpenedRun",
    "RunFolder",
    "checkpoint_step",
    "data_changes",
    "is_checkpoint_name",
    "load_checkpoint_model",
    "open_run",
    "parse_metrics",
    "refuse_run_file",
    "run_file_owner",
]

RESULTS_FILE = "results.json"
"""The results file of a run folder; the folders of ``compare``, ``mqar`` and ``glue`` that hold runs name their
summary the same way (one name for "the results of this folder")."""

RESULTS_KEYS = (
    "config",
    "model_config",
    "params",
    "data",
    "steps",
    "tokens",
    "train_seconds",
    "eval_seconds",
    "validations",
    "final_eval_seconds",
    "stop_reason",
    "epochs",
    "best",
    "final_from",
    "device",
    "precision",
    "initial_weights_sha256",
    "hosts",
    "world_size",
    "final",
    "compile",
)
"""The top-level keys of a run's ``results.json`` (``training.loop``'s ``_Trainer.results``)."""

_CKPT = re.compile(r"^ckpt-(\d+)(?:-r(\d+))?$")
_ANY_CKPT = re.compile(r"^(?:ckpt|best)-\d+(?:-r\d+)?$")
_FIX_LINE = "repair or delete that line (the metrics of that step are then missing from the run's record)"
NEW_STATE = {"step": 0, "tokens": 0, "train_seconds": 0.0, "eval_seconds": 0.0, "validations": 0}
"""The progress of a run that starts (no checkpoint)."""


def _member(name: str, doc: str) -> property:
    """A read-only ``Path`` property: ``<run folder>/<name>``."""
    return property(lambda self: self.path / name, doc=doc)


def checkpoint_step(folder: str | Path) -> int | None:
    """The step of a ``ckpt-<step>[-r<k>]`` folder name; ``None`` for other names."""
    m = _CKPT.match(Path(folder).name)
    return int(m.group(1)) if m else None


def is_checkpoint_name(folder: str | Path) -> bool:
    """Whether ``folder``'s name is a checkpoint folder's of a run (``ckpt-<step>[-r<k>]``, ``best-<step>[-r<k>]``);
    the folder need not exist."""
    return bool(_ANY_CKPT.match(Path(folder).name))


class RunFolder:
    """The folder of one training run (module docstring): its paths, state, reads and writes. Nothing is created
    until something is written.

    Args:
        path: the run folder (``TrainConfig.out_dir``); a ``str`` or ``Path``.

    Attributes:
        path: the folder as a ``Path``.
    """

    CONFIG = "config.json"
    MODEL_CONFIG = fmt.MODEL_CONFIG
    DATA = "data.json"
    TOKENIZER = "tokenizer"
    METRICS = "metrics.jsonl"
    TENSORBOARD = "tensorboard"
    LATEST = "latest"
    BEST = "best"
    RESULTS = RESULTS_FILE
    INTERRUPTED_RESULTS = "results.interrupted.json"
    LOCK = ".lock"
    GLUE = "glue"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RunFolder) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    # ------------------------------------------------------------------------------------------ paths

    config_path = _member(CONFIG, "``config.json``: the run's :class:`~coupled_qk.training.config.TrainConfig`.")
    model_config_path = _member(MODEL_CONFIG, "``model_config.json``: the resolved :class:`~coupled_qk.GPTConfig`.")
    data_path = _member(DATA, "``data.json``: the task's ``describe()`` output.")
    tokenizer_dir = _member(TOKENIZER, "``tokenizer/``: the run's tokenizer folder (language modelling).")
    metrics_path = _member(METRICS, "``metrics.jsonl``: one JSON object per logged step.")
    tensorboard_dir = _member(TENSORBOARD, "``tensorboard/``: TensorBoard event files.")
    latest_path = _member(LATEST, "``latest``: a text file naming the newest complete checkpoint folder.")
    best_path = _member(BEST, "``best``: a text file naming the best-validation checkpoint folder.")
    results_path = _member(RESULTS, "``results.json``: final metrics of a finished run.")
    interrupted_results_path = _member(
        INTERRUPTED_RESULTS, "``results.interrupted.json``: results of a run stopped by an experiment's time guard."
    )
    lock_path = _member(LOCK, "``.lock``: the lock file of the process writing the run.")
    glue_dir = _member(GLUE, "``glue/``: the default output folder of ``coupled-qk glue`` for this run.")

    def checkpoint_dir(self, step: int) -> Path:
        """``ckpt-<step, 8 digits>``: the checkpoint folder of optimiser step ``step`` (an int >= 0)."""
        return self.path / f"ckpt-{int(step):08d}"

    def checkpoints(self) -> list[Path]:
        """Existing ``ckpt-*`` folders, oldest first (temporary and hidden folders excluded)."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob("ckpt-*") if p.is_dir())

    def checkpoint(self, folder: str | Path) -> Checkpoint:
        """A checkpoint folder of this run as a :class:`~coupled_qk.training.checkpoint_format.Checkpoint` whose
        errors for damaged files say what to do (point ``latest`` at an older checkpoint, or delete it)."""
        folder = Path(folder)
        return Checkpoint(folder, f": point {self.latest_path} at an older ckpt-* folder or delete {folder.name}")

    # ------------------------------------------------------------------------------------------ pointers

    def read_pointer(self, pointer: Path) -> str:
        """The folder name in the run's ``latest`` or ``best`` file: UTF-8 text naming one folder of the run.

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
            steps = [(checkpoint_step(f), f.name) for f in self.checkpoints() if checkpoint_step(f) is not None]
            example = max(steps)[1] if steps else self.checkpoint_dir(100).name
            raise ValueError(
                f"{pointer} {what}: write the name of one of its ckpt-* folders into it (e.g. {example}), or "
                "delete it (--resume then takes the newest checkpoint that verifies)"
            )
        return name

    def latest_checkpoint(self) -> Path:
        """The checkpoint folder named by ``latest``.

        Raises:
            FileNotFoundError: no ``latest`` file (naming a checkpoint folder to pass instead, when there is
                one), or it names a folder without weights.
            ValueError: ``latest`` is damaged (:meth:`read_pointer`).
        """
        if self.latest_path.is_file():
            folder = self.path / self.read_pointer(self.latest_path)
            if Checkpoint(folder).has_weights():
                return folder
            raise FileNotFoundError(f"{self.latest_path} names {folder.name}, which has no {fmt.WEIGHTS}")
        found = [p.name for p in self.checkpoints() if Checkpoint(p).has_weights()]
        raise FileNotFoundError(
            f"no checkpoint at {self.path}: expected a checkpoint folder with {fmt.WEIGHTS} or a run folder with "
            f"a {self.LATEST!r} file"
            + (f" (it has none; pass one of its checkpoint folders, e.g. {self.path / found[-1]})" if found else "")
        )

    def best_checkpoint(self) -> Path | None:
        """The best-validation checkpoint folder (named by ``best``), or ``None`` if the run has none.

        Raises:
            FileNotFoundError: ``best`` names a folder without weights. ValueError: ``best`` is damaged.
        """
        if not self.best_path.is_file():
            return None
        folder = self.path / self.read_pointer(self.best_path)
        if not Checkpoint(folder).has_weights():
            raise FileNotFoundError(f"{self.best_path} names {folder.name}, which has no {fmt.WEIGHTS}")
        return folder

    def newest_checkpoint(self) -> Path | None:
        """The ``ckpt-<step>`` folder with weights of the highest step (checksums not verified), or ``None``."""
        found = [p for p in self.checkpoints() if checkpoint_step(p) is not None and Checkpoint(p).has_weights()]
        return max(found, key=lambda p: (checkpoint_step(p), p.name)) if found else None

    def resume_checkpoint(self, say=None) -> Path:
        """The checkpoint a ``--resume`` continues from: the one ``latest`` names if it verifies, else the newest
        older ``ckpt-*`` folder that does, or without ``latest`` the newest that does (docs/RELIABILITY.md,
        "Faults"). A checkpoint verifies when it has weights, every file matches ``checksums.json`` and
        ``state.json`` is one (:meth:`Checkpoint.verify_loadable`). A damaged folder is left in place (the
        resumed run's next save of its step supersedes it and :meth:`prune` removes it).

        Args:
            say: called with one line when a damaged checkpoint is skipped (naming it, why, and the one used).

        Raises:
            ValueError / FileNotFoundError: the damage of ``latest``'s checkpoint (naming the file), when no
                older checkpoint verifies either.
        """
        try:
            where = self.latest_checkpoint()
            self.checkpoint(where).verify_loadable()
            return where
        except (ValueError, FileNotFoundError) as exc:
            damage = exc
        try:
            latest = self.read_pointer(self.latest_path) if self.latest_path.is_file() else ""
        except ValueError:
            latest = "?"  # damaged: every ckpt-* folder is a candidate
        latest_step = checkpoint_step(latest)
        older = sorted(
            (
                f
                for f in self.checkpoints()
                if f.name != latest
                and checkpoint_step(f) is not None
                and (latest_step is None or checkpoint_step(f) < latest_step)
            ),
            key=lambda f: (checkpoint_step(f), f.name),
            reverse=True,
        )
        for folder in older:
            try:
                self.checkpoint(folder).verify_loadable()
            except (ValueError, FileNotFoundError):
                continue
            if say is not None:
                found = f"{folder.name} (step {checkpoint_step(folder)})"
                say(
                    f"warning: {self.latest_path} is missing; resuming from the newest checkpoint that verifies, "
                    f"{found}"
                    if not latest
                    else f"warning: the latest checkpoint is refused ({damage}); resuming from the previous good "
                    f"checkpoint {found}; the damaged folder is left in place"
                )
            return folder
        raise type(damage)(f"{damage}; and no older checkpoint of {self.path} verifies") from None

    # ------------------------------------------------------------------------------------------ state

    def has_checkpoint(self) -> bool:
        """Whether the run holds a checkpoint to resume: ``latest`` exists, or (``latest`` deleted by hand, or a
        kill between a checkpoint's rename and ``latest``'s write) a ``ckpt-<step>`` folder with weights. Such a
        run is resumed (:meth:`resume_checkpoint`) or refused, never started over."""
        return self.latest_path.is_file() or self.newest_checkpoint() is not None

    def is_finished(self) -> bool:
        """Whether the run finished (``results.json`` exists)."""
        return self.results_path.is_file()

    def has_tokenizer(self) -> bool:
        """Whether the run's tokenizer was saved (``tokenizer/`` holds its tokenizer file)."""
        return (self.tokenizer_dir / TOKENIZER_FILE).is_file()

    def holder(self) -> str | None:
        """Who is writing the run now: another process holding ``.lock`` (its pid, host, start and command), or
        ``None`` (no writer, or this process itself)."""
        return lock_holder(self.lock_path)

    def is_run(self) -> bool:
        """Whether the folder holds a run: ``config.json`` beside another file only a run writes, a ``latest``
        pointer, or a ``ckpt-*`` checkpoint (a Hugging Face export's ``config.json`` alone is not one)."""
        if not self.path.is_dir():
            return False
        if self.config_path.is_file() and any(
            p.exists() for p in (self.model_config_path, self.data_path, self.metrics_path, self.results_path)
        ):
            return True
        return self.latest_path.is_file() or self.newest_checkpoint() is not None

    def owns(self, path: str | Path) -> bool:
        """Whether ``path`` (existing or not) is one of this run's own files: an entry of :data:`RUN_LAYOUT` or
        anything inside one (a checkpoint's files, the tokenizer's, TensorBoard's), ``.lock`` and the leftovers of
        a save included. ``glue/`` (another command's output) and files the run does not write are not."""
        try:
            rel = Path(path).absolute().relative_to(self.path.absolute())
        except ValueError:
            return False
        if not rel.parts or rel.parts[0] == self.GLUE:
            return False
        own = (*RUN_LAYOUT, self.LOCK, ".ckpt-*", ".*.tmp")
        return any(fnmatch.fnmatchcase(rel.parts[0], pattern.rstrip("/")) for pattern in own)

    # ------------------------------------------------------------------------------------------ reads

    def read_config(self) -> dict | None:
        """``config.json`` as a dict, or ``None`` when it does not exist; every ``TrainConfig`` field it holds is of
        its declared kind (:func:`~coupled_qk.training.config.check_saved_config`), as its readers expect.

        Raises:
            ValueError: the file is not valid JSON or not an object, or a field has another kind (naming the file
                and the field).
        """
        from coupled_qk.training.config import check_saved_config

        saved = _read_json(self.config_path)
        return None if saved is None else check_saved_config(saved, self.config_path)

    def read_data(self) -> dict | None:
        """``data.json`` (the task's description of its data) as a dict, or ``None`` when it does not exist.

        Raises:
            ValueError: the file is not valid JSON or not a JSON object (naming it).
        """
        data = _read_json(self.data_path)
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"{self.data_path} is not a JSON object (the description of the run's data)")
        return data

    def check_data(self, task) -> None:
        """Refuse resuming this run when ``task``'s data is not what the run recorded in ``data.json``: each key of
        the task's ``data_identity`` (LM: the splits' token counts and text SHA-256s; MQAR: the slices; GLUE: the
        example and label counts) compared with its ``describe()`` now. A key the run did not record is not
        compared; without ``data.json`` at all (deleted) nothing is, and a warning says so; a recorded key the task
        does not describe is a warning naming it (:func:`~coupled_qk.checks.values.unknown_keys`).

        Raises:
            ValueError: one line naming ``data.json`` and each difference.
        """
        keys = getattr(task, "data_identity", ())
        recorded = self.read_data() if keys else None
        if keys and recorded is None:
            warnings.warn(
                f"{self.data_path} is missing: this resume cannot check that the data is what the run "
                "trained on (an edited corpus would be used without a word)",
                stacklevel=2,
            )
        now = task.describe() if recorded is not None else {}
        if recorded is not None:  # the task writes data.json (a later version may add keys): a warning
            unknown_keys(recorded, now, self.data_path, "data description", error=False)
        changes = data_changes(recorded, now, keys, self.data_path) if recorded is not None else []
        if changes:
            raise ValueError(
                f"cannot resume {self.path}: its data is not what it trained on ({self.data_path} vs now: "
                f"{'; '.join(changes)}); restore the data the run was trained on (a corpus: its files as they "
                "were), or train a new run in another --out-dir"
            )

    def read_results(self) -> dict | None:
        """``results.json`` as a dict, or ``None`` when the run has not finished.

        A key outside :data:`RESULTS_KEYS` (or a ``config`` key that is no ``TrainConfig`` field) is a warning
        naming it and its close match: the file is the project's own, which a later version may extend.

        Raises:
            ValueError: naming the file, if it is not valid JSON, not a JSON object, or its ``config`` or ``final``
                is not an object (the readers, e.g. the experiment runner deciding whether to reuse the run,
                compare them).
        """
        results = _read_json(self.results_path)
        if results is None:
            return None
        wrong = (
            f"holds a JSON {type(results).__name__}"
            if not isinstance(results, dict)
            else next(
                (
                    f"its {key!r} is a {type(results[key]).__name__}"
                    for key in ("config", "final")
                    if key in results and not isinstance(results[key], dict)
                ),
                None,
            )
        )
        if wrong:
            raise ValueError(
                f"{self.results_path} is not a run's results ({wrong}, expected an object): delete it; "
                "resuming the run (--resume, or the command that made it) writes it again from its "
                "latest checkpoint"
            )
        from coupled_qk.training.config import TrainConfig

        unknown_keys(results, RESULTS_KEYS, self.results_path, "results", error=False)  # the project writes it
        unknown_keys(
            results.get("config", {}), TrainConfig.__dataclass_fields__, self.results_path, "config", error=False
        )
        return results

    def read_metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl`` in file order (``[]`` without the file; :func:`parse_metrics`: a torn
        last line is dropped, a damaged line elsewhere raises ``ValueError`` naming the file and line)."""
        if not self.metrics_path.is_file():
            return []
        return parse_metrics(self.metrics_path)

    def train_seconds(self) -> float:
        """Training seconds already spent according to the latest checkpoint (``0.0`` without one)."""
        if not self.has_checkpoint():
            return 0.0
        try:
            latest = self.latest_path.is_file()
            folder = self.path / self.read_pointer(self.latest_path) if latest else self.newest_checkpoint()
            return float(Checkpoint(folder).state().get("train_seconds", 0.0))
        except (OSError, ValueError, TypeError):
            return 0.0

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer (``tokenizer/``).

        Raises:
            FileNotFoundError: the run has none, naming where it was expected.
        """
        if not self.has_tokenizer():
            raise FileNotFoundError(
                f"the run's tokenizer is missing: expected {self.tokenizer_dir / TOKENIZER_FILE} (written when the "
                "run started)"
            )
        return Tokenizer.load(self.tokenizer_dir)

    # ------------------------------------------------------------------------------------------ writes

    def lock(self) -> RunLock:
        """The run's lock (:class:`~coupled_qk.training.lock.RunLock` on ``.lock``; not yet taken)."""
        return RunLock(self.lock_path)

    def record_start(self, cfg, model_cfg: GPTConfig, task) -> None:
        """Write what a (re)started run is: ``config.json`` (``cfg``), ``model_config.json`` (``model_cfg``),
        ``data.json`` (``task.describe()``) and, for a task with a ``tokenizer`` attribute, ``tokenizer/``; each
        atomically."""
        self.path.mkdir(parents=True, exist_ok=True)
        cfg.save(self.config_path)
        model_cfg.save(self.model_config_path)
        tokenizer = getattr(task, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save(self.tokenizer_dir)
        write_text_atomic(self.data_path, json.dumps(task.describe(), indent=2))

    def _fresh_name(self, kind: str, step: int) -> str:
        """``<kind>-<step>``, or ``<kind>-<step>-r<k>`` with the first ``k`` no folder of the run has."""
        name, k = f"{kind}-{step:08d}", 0
        while (self.path / name).exists():
            k += 1
            name = f"{kind}-{step:08d}-r{k}"
        return name

    def save(
        self, model_state: dict, model_config: GPTConfig, optimizer_state: dict | None, state: dict, keep: int = 2
    ):
        """Write a checkpoint of ``state["step"]`` atomically and point ``latest`` at it, then :meth:`prune`.

        The folder is written under a temporary name, flushed and renamed to a name no existing folder has
        (``ckpt-<step>``, or ``ckpt-<step>-r<k>`` when that step is saved again); only then is ``latest`` replaced
        atomically and superseded folders deleted. No folder ``latest`` names is ever moved or modified, so a
        kill at any moment leaves ``latest`` naming a complete checkpoint.

        Args:
            model_state: full (unsharded) model state dict (saved without the tied output head).
            model_config: saved to ``model_config.json``.
            optimizer_state: full optimizer state dict (``None`` to skip).
            state: JSON-serialisable progress (must contain ``step``).
            keep: number of newest checkpoint steps to keep.

        Returns:
            The checkpoint folder (``Path``).

        Raises:
            OSError: a file could not be written (full disk, permissions), naming it; the previous checkpoint and
                ``latest`` are untouched and the partial folder is removed.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        step = int(state["step"])
        files = fmt.checkpoint_files(model_state, model_config, state, optimizer_state)
        name = fmt.write_folder(self.path, files, f".ckpt-{step:08d}.tmp-", lambda: self._fresh_name("ckpt", step))
        write_text_atomic(self.latest_path, name + "\n")
        self.prune(keep)
        return self.path / name

    def save_best(self, model_state: dict, model_config: GPTConfig, info: dict) -> Path:
        """Write the best-validation weights atomically as ``best-<step>/`` and point ``best`` at it.

        The folder holds the weights, model config, ``state.json`` (``info``: at least ``step``; the loop adds
        the metric, its value, tokens and epoch) and checksums, so it loads like any checkpoint (``coupled-qk eval
        RUN/best-<step>``); no optimizer or RNG state (training resumes from ``latest``). The pointer is replaced
        atomically and older ``best-*`` folders are deleted only after it, so a kill at any moment leaves ``best``
        naming a complete folder (or no ``best`` yet).

        Raises:
            OSError: a file could not be written, naming it; the previous best is untouched.
        """
        step = int(info["step"])
        files = fmt.checkpoint_files(model_state, model_config, info, with_rng=False)
        name = fmt.write_folder(self.path, files, f".ckpt-best-{step:08d}.tmp-", lambda: self._fresh_name("best", step))
        write_text_atomic(self.best_path, name + "\n")
        for old in self.path.glob("best-*"):
            if old.name != name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return self.path / name

    def prune(self, keep: int) -> None:
        """Delete checkpoints other than the ``keep`` newest steps up to ``latest``'s, superseded copies of
        ``latest``'s step and leftovers of interrupted saves (:meth:`clean_leftovers`); the folder ``latest`` names
        is always kept, and steps newer than it are left alone (the user pointed ``latest`` back)."""
        latest = self.latest_path.read_text().strip() if self.latest_path.is_file() else None
        self.clean_leftovers()
        by_step: dict[int, list[Path]] = {}
        for folder in self.path.glob("ckpt-*"):
            step = checkpoint_step(folder)
            if step is not None:
                by_step.setdefault(step, []).append(folder)
        latest_step = checkpoint_step(latest) if latest else None
        if latest_step is None:
            return
        kept_steps = sorted(s for s in by_step if s <= latest_step)[-keep:] if keep > 0 else []
        for step, folders in by_step.items():
            if step > latest_step:
                continue
            for folder in folders:
                if folder.name != latest and (step not in kept_steps or step == latest_step):
                    shutil.rmtree(folder, ignore_errors=True)

    def clean_leftovers(self) -> None:
        """Remove what a hard kill during a save leaves: hidden ``.ckpt-*`` folders and ``.*.tmp`` files. Only
        safe while the caller holds the run's :meth:`lock`."""
        for tmp in self.path.glob(".ckpt-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in self.path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def open_metrics(self, start_step: int):
        """``metrics.jsonl`` opened for appending, after dropping the records after ``start_step`` (written by a
        killed session after its last checkpoint; the file is rewritten atomically, so a crash keeps the old one).
        """
        if self.metrics_path.exists():
            keep = [r for r in parse_metrics(self.metrics_path) if r.get("step", 0) <= start_step]
            write_text_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))
        return self.metrics_path.open("a")

    def write_results(self, results: dict) -> None:
        """Write ``results.json`` atomically (indented JSON; non-JSON values written with ``str``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.results_path, json.dumps(results, indent=2, default=str))

    def mark_interrupted(self) -> None:
        """Rename ``results.json`` to ``results.interrupted.json``, so the run counts as unfinished (resumable)."""
        if self.results_path.is_file():
            self.results_path.replace(self.interrupted_results_path)

    def remove_partial(self) -> None:
        """Delete the files a run writes before its first checkpoint, when it has neither a checkpoint nor results
        (a run killed early), so it starts again cleanly: configs, data description, metrics, tokenizer,
        TensorBoard folder and ``ckpt-*`` folders without weights. Files outside the layout are kept.

        Holds the run's :meth:`lock` while it checks and deletes: a run still training before its first
        checkpoint looks exactly like a killed one. The caller must not hold the lock itself.

        Raises:
            RunLockedError: another process is writing the run (nothing is deleted; a ``ValueError``).
            ValueError: the run has a checkpoint or results (refusing to delete them).
        """
        with self.lock():
            if self.has_checkpoint() or self.is_finished():
                raise ValueError(f"{self.path} holds a checkpoint or results; not removing it")
            for path in (
                self.config_path,
                self.model_config_path,
                self.data_path,
                self.metrics_path,
                self.interrupted_results_path,
            ):
                path.unlink(missing_ok=True)
            for folder in (self.tokenizer_dir, self.tensorboard_dir):
                shutil.rmtree(folder, ignore_errors=True)
            for orphan in self.checkpoints():  # folders without weights (has_checkpoint is false)
                shutil.rmtree(orphan, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ (re)start

    def check_start(self, resume: bool) -> bool:
        """Whether the run holds a checkpoint to resume; refuses starting a run that would replace another:
        checkpoints without ``resume``, or a finished run's ``results.json`` without a checkpoint (deleted to
        save space: a new run trained over it would replace its results, metrics and config without a word).

        Raises:
            ValueError: naming the folder and what to do.
        """
        has_ckpt = self.has_checkpoint()
        if has_ckpt and not resume:
            raise ValueError(
                f"{self.path} already holds checkpoints; pass --resume to continue it or choose another --out-dir"
            )
        if not has_ckpt and self.is_finished():
            raise ValueError(
                f"{self.path} holds a finished run ({self.RESULTS}) without checkpoints to resume: a new run "
                "there would replace its results; choose another --out-dir, or delete the folder to train "
                "it again"
            )
        return has_ckpt

    def check_config(self, cfg) -> None:
        """Refuse resuming with settings that change the run (the model is compared separately), without its
        ``config.json`` (then nothing could be compared), or with a damaged ``metrics.jsonl`` (the resumed run
        rewrites it); called before the resumed run writes anything.

        Raises:
            ValueError: naming the folder, the file or each differing field.
        """
        from coupled_qk.training.config import CONTINUATION_FIELDS, config_differences, describe_differences

        saved = self.read_config()  # its fields' kinds checked, naming the file
        if saved is None:
            raise ValueError(
                f"cannot resume {self.path}: its {self.CONFIG} is missing, so the settings a resume must keep "
                f"(learning rate, seed, data, ...) cannot be checked; restore {self.config_path}, or recreate it "
                f"with the run's own options: coupled-qk train <its options> --print-config > {self.config_path}"
            )
        diff = config_differences(saved, cfg, CONTINUATION_FIELDS | {"model", "preset"})
        if diff:
            raise ValueError(
                f"cannot resume {self.path}: the run was made with a different config "
                f"({describe_differences(diff)}); only the budget, logging and paths may change on --resume"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn last line: said once, by open_metrics' reader
            self.read_metrics()

    def resume_point(self, cfg, say) -> tuple[dict, Path | None]:
        """The run's starting progress (``step``, ``tokens``, ``train_seconds``, ...: a checkpoint's ``state.json``,
        or :data:`NEW_STATE`) and the checkpoint folder it resumes from (``None`` for a new run), after
        :meth:`check_start` and, for a resume, :meth:`check_config`; ``say`` receives one line for a damaged
        checkpoint skipped or a ``--resume`` without a checkpoint."""
        has_ckpt = self.check_start(cfg.resume)
        if cfg.resume and has_ckpt:
            self.check_config(cfg)
            where = self.resume_checkpoint(say)  # latest, or the previous good one if latest is damaged
            return self.checkpoint(where).state(), where
        if cfg.resume:
            say(f"no checkpoint in {self.path}; starting a new run there")
        return dict(NEW_STATE), None

    @staticmethod
    def resume_precision(state: dict, now: str, cfg, say) -> str:
        """The autocast precision (``"fp32"``, ``"bf16"``, ``"fp16"``) a run continues in: the one its checkpoint
        ``state`` recorded (fixed at the run's first start), whatever ``--dtype auto`` would pick now (``now``:
        by device, and on a CPU with native bf16 by ``--compile``), said in one line when they differ; ``now`` for
        a new run or a checkpoint written before precisions were recorded.

        Raises:
            ValueError: ``cfg.dtype`` names another precision explicitly (a resume may not change the run's
                precision: its results would pass for one precision while mixing two).
        """
        saved = state.get("precision")
        if saved is None or saved == now:
            return now
        if cfg.dtype != "auto":
            raise ValueError(
                f"cannot resume {cfg.out_dir} in {now} (--dtype {cfg.dtype}): the run trained in {saved} until step "
                f"{state['step']}, and a run's precision is fixed at its first start; resume with --dtype {saved} "
                "(or auto), or train a new run in another --out-dir"
            )
        say(
            f"precision: continuing in {saved}, the run's precision since its first start (--dtype auto would "
            f"pick {now} here: compile={cfg.compile}, device {cfg.device})"
        )
        return saved


RUN_LAYOUT = (
    RunFolder.CONFIG,
    RunFolder.MODEL_CONFIG,
    RunFolder.DATA,
    RunFolder.TOKENIZER + "/",
    RunFolder.METRICS,
    RunFolder.TENSORBOARD + "/",
    "ckpt-*/",
    RunFolder.LATEST,
    RunFolder.BEST,
    "best-*/",
    RunFolder.RESULTS,
    RunFolder.INTERRUPTED_RESULTS,
    RunFolder.GLUE + "/",
)
"""Top-level names of a run folder as glob patterns (``x/``: a folder); ``.lock`` and temporary files aside. A
folder holding anything else is not a run folder and is refused as ``out_dir``
(:func:`coupled_qk.output_dir.check_run_out_dir`)."""


# ---------------------------------------------------------------------------------------------- readers


@dataclass(frozen=True)
class OpenedRun:
    """A run folder as a reader found it (:func:`open_run`): its state was checked once, for this reader.

    Attributes:
        folder: the :class:`RunFolder`.
        checkpoint: the checkpoint folder to read (the one given, or the run's ``latest``).
        config: the run's ``config.json`` (``{}`` when it has none), each field of its declared kind.
    """

    folder: RunFolder
    checkpoint: Path
    config: dict

    @property
    def task(self) -> str | None:
        """The run's task (``config.json``'s ``task``; ``None`` without a config)."""
        return self.config.get("task")

    def load_model(self, map_location="cpu"):
        """``(GPT in eval mode on map_location, state.json)`` of :attr:`checkpoint`, checksums verified
        (:meth:`Checkpoint.load_model <coupled_qk.training.checkpoint_format.Checkpoint.load_model>`)."""
        return self.folder.checkpoint(self.checkpoint).load_model(map_location)

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer (:meth:`RunFolder.tokenizer`)."""
        return self.folder.tokenizer()


def _hf_export_model_type(path: Path) -> str | None:
    """The ``model_type`` of a Hugging Face export folder (weights and a ``config.json`` naming a model type, no
    ``model_config.json``), else ``None``."""
    if Checkpoint(path).model_config_path.exists() or not Checkpoint(path).has_weights():
        return None
    model_type = _json_object(RunFolder(path).config_path).get("model_type")
    return model_type if isinstance(model_type, str) else None


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``, or ``{}`` where there is no readable one (what a folder *is* is asked before
    its files are checked: a damaged file is reported by the reader that needs it)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _locate(path: Path) -> tuple[RunFolder, Path | None]:
    """The run folder of a reader's path and the checkpoint folder it names explicitly (``None``: the run's)."""
    hf = _hf_export_model_type(path)
    if hf is not None:
        raise ValueError(
            f"{path} is a Hugging Face export (its config.json has model_type={hf!r}), not a coupled-qk "
            "run or checkpoint: load it with transformers (AutoModelForCausalLM.from_pretrained), or "
            "pass the run folder it was exported from"
        )
    if Checkpoint(path).has_weights():
        return RunFolder(path.parent), path
    return RunFolder(path), None


def open_run(path: str | Path, reader: str, *, text: bool = False, data: str | None = None) -> OpenedRun:
    """A run folder (its ``latest`` checkpoint) or one checkpoint folder of it (``ckpt-*``, ``best-*``), for the
    reader ``reader`` (a command's name for the messages: ``"eval"``, ``"export"``), after one look at the run's
    state. Refused, each with one line naming the folder and what to do:

    - a Hugging Face export folder, or a GLUE fine-tuning run (its checkpoints hold a sequence classifier);
    - a run another process is still writing (``.lock`` held): its ``latest`` is no result of it (given one
      of its checkpoint folders explicitly, that checkpoint is read, with a warning);
    - a language-model run (``task`` ``lm``) without its tokenizer (an incomplete folder), and with ``text``
      (the reader tokenizes text) any run without one (an MQAR run reads the task's ids, not text);
    - with ``data`` (the reader reads the run's own corpus as the run's data), a run without ``data.json``:
      nothing could tell the corpus's current text from what the run trained on; ``"refuse"`` raises,
      ``"warn"`` warns.

    Raises:
        FileNotFoundError: no checkpoint there, no tokenizer, naming what was looked for.
        ValueError: a folder of another kind or state (above); a damaged ``config.json``, ``latest`` (naming it).
        RunLockedError: (a ``ValueError``) the run is still training.
    """
    run, ckpt = _locate(Path(path))
    holder = run.holder()
    if holder is not None and ckpt is None:
        raise RunLockedError(
            f"{run.path} is still training ({holder}): its latest checkpoint is not the run's result; wait "
            f"for it to finish, or pass one of its checkpoint folders (ckpt-*) to {reader} that checkpoint"
        )
    if holder is not None:
        warnings.warn(f"{ckpt} is a checkpoint of a run still training ({holder})", UserWarning, stacklevel=2)
    ckpt = ckpt if ckpt is not None else run.latest_checkpoint()
    config = run.read_config() or {}
    _check_kind(run, config.get("task"), path, reader, text)
    if data is not None and config and not run.data_path.is_file():
        message = (
            f"{run.data_path} is missing, so {reader} cannot check that the run's corpus "
            f"{config.get('corpus')!r} still holds the text the run trained on; restore it, or pass --corpus to "
            f"{reader} the corpus's current text (then not the run's own held-out text)"
        )
        if data == "refuse":
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=2)
    return OpenedRun(run, ckpt, config)


def _check_kind(run: RunFolder, task, path, reader: str, text: bool) -> None:
    """:func:`open_run`'s refusals by the run's ``task`` and tokenizer."""
    if task == "glue":
        raise ValueError(
            f"{path} is a GLUE fine-tuning run (task='glue' in {run.config_path}): its checkpoints hold a "
            "sequence classifier, not a language model; pass the language-model run it was "
            "fine-tuned from (task_options.pretrained in that config.json)"
        )
    if run.has_tokenizer():
        return
    if task not in (None, "lm") and text:
        raise ValueError(
            f"{path} is a run of the synthetic task {task!r} (task={task!r} in {run.config_path}): its model "
            "reads the task's token ids, not text, and has no tokenizer; pass a language-model "
            "run trained on text (task 'lm')"
        )
    if task == "lm" or text:
        raise FileNotFoundError(
            f"the run's tokenizer is missing: expected {run.tokenizer_dir / TOKENIZER_FILE} (written when the "
            f"run started); {reader} needs it"
            + (" to read text" if text else " (the run is incomplete: the model's ids mean nothing without it)")
        )


def load_checkpoint_model(path: str | Path, map_location="cpu", reader: str = "load_checkpoint_model"):
    """The model and ``state.json`` of a run folder (its ``latest`` checkpoint) or a checkpoint folder:
    ``open_run(path, reader).load_model(map_location)`` (:func:`open_run`: the run's state checked once).

    Returns:
        ``(GPT in eval mode, state dict)``.

    Raises:
        FileNotFoundError, ValueError: as :func:`open_run` and :meth:`OpenedRun.load_model` (a damaged file named,
            a ``map_location`` that is neither ``"auto"`` nor a device of this machine).
    """
    from coupled_qk.devices import resolve_device

    resolve_device("device", map_location)  # an absent device: one line before anything is read
    return open_run(path, reader).load_model(map_location)


# ---------------------------------------------------------------------------------------------- a run's own files


def run_file_owner(path: str | Path) -> RunFolder | None:
    """The run folder whose own file ``path`` is (existing or not: ``RUN/results.json`` of a run not finished yet
    counts), or ``None``: the nearest of ``path``'s folders that holds a run (:meth:`RunFolder.is_run`) when it
    owns ``path`` (:meth:`RunFolder.owns`); a checkpoint folder outside a run counts as its own run. For any
    command that replaces a file given by its user (``eval --json``, report files): a run's own files are never
    replaced, ``--overwrite`` or not, or the run could no longer be resumed or read."""
    path = Path(path).absolute()
    for folder in path.parents:
        run = RunFolder(folder)
        if run.is_run():
            return run if run.owns(path) else None
        if Checkpoint(folder).has_weights() and Checkpoint(folder).model_config_path.is_file():
            return RunFolder(folder.parent) if RunFolder(folder.parent).is_run() else RunFolder(folder)
    return None


def refuse_run_file(option: str, path: str | Path) -> None:
    """Refuse ``path`` as the output of ``option`` when it is one of a run's own files (:func:`run_file_owner`).

    Raises:
        ValueError: naming the option, the path and the run, whatever ``--overwrite`` says.
    """
    owner = run_file_owner(path)
    if owner is not None:
        raise ValueError(
            f"{option}={str(path)!r} is a file of the training run {owner.path}: no command replaces a run's own "
            "files (--overwrite included), or the run could no longer be resumed or read; choose another path"
        )


# ---------------------------------------------------------------------------------------------- file contents


def parse_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` file, without a torn (unparseable) last line (with a warning).

    Raises:
        ValueError: a line other than the last is not a JSON object, naming the file and line number.
    """
    lines = Path(path).read_text(errors="replace").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                warnings.warn(f"{path}: dropping a torn last line (left by an interrupted write)", stacklevel=2)
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON ({exc.msg}); {_FIX_LINE}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {i + 1} is not a JSON object; {_FIX_LINE}")
        records.append(record)
    return records


_JSON_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def data_changes(recorded: dict, now: dict, keys, where: str | Path) -> list[str]:
    """How the data described by ``now`` differs from what a run ``recorded`` in its ``data.json`` (``where``), for
    each of ``keys`` (one level of nested dicts compared per key, e.g. ``tokens.valid``), one ``"<key>: <recorded>
    recorded, <now> now"`` item per difference. A key (or nested key) missing on either side is not compared: a
    run written before a key was recorded keeps loading.

    Raises:
        ValueError: a recorded value of another kind than the task describes (``"tokens": "x"``, a ``null``
            hash: a hand edit, not changed data), naming ``where``, the key and both kinds.
    """

    def shown(value) -> str:
        text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        return text if len(text) <= 16 else text[:12] + "..."

    def same_kind(key: str, before, after) -> None:
        kinds = [_JSON_KINDS.get(type(v), type(v).__name__) for v in (before, after)]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, after))
        if kinds[0] != kinds[1] and not numbers and after is not None:
            raise ValueError(
                f"{where}: {key}={json.dumps(before)[:40]} is {kinds[0]}; expected {kinds[1]} (was the "
                "file edited by hand?)"
            )

    out = []
    for key in keys:
        if key not in recorded or key not in now:
            continue
        before, after = recorded[key], now[key]
        same_kind(key, before, after)
        if isinstance(before, dict) and isinstance(after, dict):
            for sub in after:
                if sub in before:
                    same_kind(f"{key}.{sub}", before[sub], after[sub])
            out += [
                f"{key}.{sub}: {shown(before[sub])} recorded, {shown(after[sub])} now"
                for sub in after
                if sub in before and before[sub] != after[sub]
            ]
        elif before != after:
            out.append(f"{key}: {shown(before)} recorded, {shown(after)} now")
    return out


def _read_json(path: Path):
    """The JSON value in ``path``, ``None`` when the file does not exist; ``ValueError`` naming it when invalid."""
    if not path.is_file():
        return None
    try:
        return loads_json(path.read_text(encoding="utf-8"), str(path))  # a key twice: refused (one value per key)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
