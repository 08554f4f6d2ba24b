"""``RunDir``: the folder of one training run and the one place that knows its layout.

Layout (written by :func:`coupled_qk.training.loop.train`, read by ``eval``, ``analyze``, the experiment
runner and the sweeps)::

    <run>/
      config.json                the run's TrainConfig (JSON)
      model_config.json          the resolved GPTConfig (vocabulary and block size filled in by the task)
      data.json                  the task's description of its data (corpus, tokenizer, MQAR slices ...)
      tokenizer/                 the run's tokenizer (language modelling; tokenizer.json inside)
      metrics.jsonl              one JSON object per logged step (training loss, lr, tokens, evaluations)
      tensorboard/               TensorBoard event files
      ckpt-00000100/             a checkpoint (see coupled_qk.training.checkpoint)
      latest                     the name of the newest complete checkpoint folder
      results.json               final metrics; present only when the run finished
      results.interrupted.json   final metrics of a run an experiment stopped on its time guard (resumable)

A finished run is one with ``results.json``; a resumable one has ``latest``. See ``docs/DESIGN.md``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from coupled_qk.io import unknown_keys, write_text_atomic

__all__ = ["RunDir"]


def _member(name: str, doc: str) -> property:
    """A read-only ``Path`` property: ``<run folder>/<name>``."""
    return property(lambda self: self.path / name, doc=doc)


_FIX_LINE = "repair or delete that line (the metrics of that step are then missing from the run's record)"


def parse_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` file, without a torn (unparseable) last line.

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
    "world_size",
    "final",
    "compile",
)
"""The top-level keys of a run's ``results.json`` (``training.loop``'s ``_Trainer.results``)."""


class RunDir:
    """Paths and reads of one run folder (nothing is created until something is written).

    Args:
        path: the run folder (``TrainConfig.out_dir``); a ``str`` or ``Path``.

    Attributes:
        path: the folder as a ``Path``.
    """

    CONFIG = "config.json"
    MODEL_CONFIG = "model_config.json"
    DATA = "data.json"
    TOKENIZER = "tokenizer"
    METRICS = "metrics.jsonl"
    TENSORBOARD = "tensorboard"
    LATEST = "latest"
    CHECKPOINT_PREFIX = "ckpt-"
    RESULTS = "results.json"
    INTERRUPTED_RESULTS = "results.interrupted.json"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # ------------------------------------------------------------------------------------------ paths

    config_path = _member(CONFIG, "``config.json``: the run's :class:`~coupled_qk.training.config.TrainConfig`.")
    model_config_path = _member(MODEL_CONFIG, "``model_config.json``: the resolved :class:`~coupled_qk.GPTConfig`.")
    data_path = _member(DATA, "``data.json``: the task's ``describe()`` output.")
    tokenizer_dir = _member(TOKENIZER, "``tokenizer/``: the run's tokenizer folder (language modelling).")
    metrics_path = _member(METRICS, "``metrics.jsonl``: one JSON object per logged step.")
    tensorboard_dir = _member(TENSORBOARD, "``tensorboard/``: TensorBoard event files.")
    latest_path = _member(LATEST, "``latest``: a text file naming the newest complete checkpoint folder.")
    results_path = _member(RESULTS, "``results.json``: final metrics of a finished run.")
    interrupted_results_path = _member(
        INTERRUPTED_RESULTS, "``results.interrupted.json``: results of a run stopped by an experiment's time guard."
    )

    def checkpoint_dir(self, step: int) -> Path:
        """``ckpt-<step, 8 digits>``: the checkpoint folder of optimiser step ``step`` (an int >= 0)."""
        return self.path / f"{self.CHECKPOINT_PREFIX}{int(step):08d}"

    def checkpoints(self) -> list[Path]:
        """Existing checkpoint folders, oldest first (temporary and hidden folders excluded)."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob(f"{self.CHECKPOINT_PREFIX}*") if p.is_dir())

    # ------------------------------------------------------------------------------------------ state

    def has_checkpoint(self) -> bool:
        """Whether the run holds a checkpoint to resume: ``latest`` exists, or (``latest`` deleted by hand, or a
        kill between a checkpoint's rename and ``latest``'s write) a ``ckpt-<step>`` folder with
        ``model.safetensors``. Such a run is resumed (from the newest checkpoint that verifies,
        :func:`~coupled_qk.training.checkpoint_load.resume_checkpoint`) or refused, never started over."""
        return self.latest_path.is_file() or self.newest_checkpoint() is not None

    def newest_checkpoint(self) -> Path | None:
        """The ``ckpt-<step>`` folder with ``model.safetensors`` of the highest step (checksums not verified), or
        ``None``."""
        from coupled_qk.training.checkpoint_load import checkpoint_step

        found = [
            p for p in self.checkpoints() if checkpoint_step(p) is not None and (p / "model.safetensors").is_file()
        ]
        return max(found, key=lambda p: (checkpoint_step(p), p.name)) if found else None

    def is_finished(self) -> bool:
        """Whether the run finished (``results.json`` exists)."""
        return self.results_path.is_file()

    def has_tokenizer(self) -> bool:
        """Whether ``tokenizer/tokenizer.json`` exists."""
        return (self.tokenizer_dir / "tokenizer.json").is_file()

    def latest_checkpoint(self) -> Path:
        """The checkpoint folder named by ``latest``.

        Raises:
            FileNotFoundError: no ``latest`` file, or it names a folder without ``model.safetensors``.
        """
        from coupled_qk.training.checkpoint_load import resolve_checkpoint

        return resolve_checkpoint(self.path)

    # ------------------------------------------------------------------------------------------ reads

    def read_config(self) -> dict | None:
        """``config.json`` as a dict, or ``None`` when it does not exist; every ``TrainConfig`` field it holds is of
        its declared kind (:func:`~coupled_qk.training.config.check_saved_config`), as its readers (``eval``,
        ``analyze``, ``generate``, ``--resume``) expect.

        Raises:
            ValueError: the file is not valid JSON or not an object, or a field has another kind (naming the file
                and the field).
        """
        from coupled_qk.training.config import check_saved_config

        saved = _read_json(self.config_path)
        return None if saved is None else check_saved_config(saved, self.config_path)

    def read_data(self) -> dict | None:
        """``data.json`` (the task's description of its data, :meth:`Task.describe`) as a dict, or ``None`` when it
        does not exist.

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
        example and label counts) compared with its ``describe()`` now (a corpus file edited or appended to since,
        a GLUE file replaced). A key the run did not record is not compared; without ``data.json`` at all (deleted)
        nothing is, and a warning says so; a recorded key the task does not describe is a warning naming it
        (:func:`~coupled_qk.io.unknown_keys`).

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
        naming it and its close match (:func:`~coupled_qk.io.unknown_keys`): the file is the project's own, which a
        later version may extend.

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
        """The records of ``metrics.jsonl`` in file order (``[]`` without the file).

        A torn last line (what a kill during a write leaves) is dropped; a damaged line elsewhere raises.

        Raises:
            ValueError: a line before the last is not valid JSON (naming the file and line number).
        """
        if not self.metrics_path.is_file():
            return []
        return parse_metrics(self.metrics_path)

    def train_seconds(self) -> float:
        """Training seconds already spent according to the latest checkpoint (``0.0`` without one)."""
        if not self.has_checkpoint():
            return 0.0
        try:
            folder = (
                self.path / self.latest_path.read_text().strip()
                if self.latest_path.is_file()
                else self.newest_checkpoint()
            )
            from coupled_qk.training.checkpoint_load import read_json

            return float(read_json(folder / "state.json").get("train_seconds", 0.0))
        except (OSError, ValueError, TypeError):
            return 0.0

    # ------------------------------------------------------------------------------------------ writes

    def write_results(self, results: dict) -> None:
        """Write ``results.json`` atomically (indented JSON; non-JSON values written with ``str``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.results_path, json.dumps(results, indent=2, default=str))

    def mark_interrupted(self) -> None:
        """Rename ``results.json`` to ``results.interrupted.json``, so the run counts as unfinished (resumable)."""
        if self.results_path.is_file():
            self.results_path.replace(self.interrupted_results_path)

    def remove_partial(self) -> None:
        """Delete the files a run writes before its first checkpoint, when it has neither a checkpoint
        (:meth:`has_checkpoint`) nor results (a run killed early), so it starts again cleanly: configs, data
        description, metrics, tokenizer, TensorBoard folder and ``ckpt-*`` folders without weights. Files outside
        the layout are kept.

        Holds the run's lock (:class:`~coupled_qk.training.lock.RunLock`) while it checks and deletes: a run
        that is still training before its first checkpoint looks exactly like a killed one, and must not lose
        its files to a second process. The caller must not hold the lock itself.

        Raises:
            RunLockedError: another process is writing the run (nothing is deleted; a ``ValueError``).
            ValueError: the run has a checkpoint or results (refusing to delete them).
        """
        from coupled_qk.training.lock import RunLock

        with RunLock(self.path):
            if self.has_checkpoint() or self.is_finished():
                raise ValueError(f"{self.path} holds a checkpoint or results; not removing it")
            for name in (self.CONFIG, self.MODEL_CONFIG, self.DATA, self.METRICS, self.INTERRUPTED_RESULTS):
                (self.path / name).unlink(missing_ok=True)
            for name in (self.TOKENIZER, self.TENSORBOARD):
                shutil.rmtree(self.path / name, ignore_errors=True)
            for orphan in self.checkpoints():  # folders without model.safetensors (has_checkpoint is false)
                shutil.rmtree(orphan, ignore_errors=True)


_JSON_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def data_changes(recorded: dict, now: dict, keys, where: str | Path = "data.json") -> list[str]:
    """How the data described by ``now`` differs from what a run ``recorded`` in its ``data.json`` (``where``), for
    each of ``keys`` (one level of nested dicts compared per key, e.g. ``tokens.valid``), one ``"<key>: <recorded>
    recorded, <now> now"`` item per difference. A key (or nested key) missing on either side is not compared: a
    run written before a key was recorded keeps loading.

    Raises:
        ValueError: a recorded value of another kind than the task describes (``"tokens": "x"``, ``"vocab_size":
            "512"``, a ``null`` hash: a hand edit, not changed data), naming ``where``, the key and both kinds.
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


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
