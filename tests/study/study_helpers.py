"""Records of a study's planned runs, written as the runner writes them, for tests of the reader, the claim tests
and the reports (``from study_helpers import ...``; not a test module)."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

from coupled_qk.studies import get_study
from coupled_qk.study.claims import Evidence
from coupled_qk.study.records import record_path, settings_of
from coupled_qk.study.report import Commands, context
from coupled_qk.training.run_folder import RunFolder

COMMANDS = Commands("cmd", "cmd --report-only", "add `--report-only`")


def unit_of(study, cell: str, variant: str, seed: int, records: dict | None = None):
    """The planned unit of ``study`` (a name or a Study) for ``(cell, variant, seed)``; a converged study's plan
    made from ``records`` (``{key: record}``)."""
    study = get_study(study) if isinstance(study, str) else study
    for unit in study.plan(records or {}).units():
        if unit.key == (cell, variant, seed):
            return unit
    raise KeyError((cell, variant, seed))


def write_record(out, study, cell: str, variant: str, seed: int, final: dict, records=None, **fields) -> Path:
    """Write the record of a planned run with its plan's settings, ``final`` metrics and ``fields`` (tokens 1, one
    second of training, one minute of wall time unless given); return its path."""
    study = get_study(study) if isinstance(study, str) else study
    unit = unit_of(study, cell, variant, seed, records)
    cfg = unit.cell.config(variant, seed, Path("run"), Path("data"))
    rec = {
        "protocol": study.name,
        "cell": cell,
        "variant": variant,
        "seed": seed,
        "config": settings_of(cfg),
        "tokens": 1,
        "train_seconds": 1.0,
        "wall_seconds": 60.0,
        "final": final,
        **fields,
    }
    path = record_path(out, study.name, cell, variant, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def evidence(out, study) -> Evidence:
    """The claim tests' view of ``study``'s records under ``out``."""
    study = get_study(study) if isinstance(study, str) else study
    return context(study, out, get_study).evidence


def claim(study, cid: str):
    """The claim ``cid`` of ``study``."""
    study = get_study(study) if isinstance(study, str) else study
    return next(c for c in study.claims if c.id == cid)


WORDS = (
    "alpha beta gamma delta river mountain city music film history science cell protein gene "
    "patient study result the of and in to a is was for on with as by"
).split()


def _para(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + " ."


def build_mini_data(tmp_path, monkeypatch):
    """A data folder in the layout of ../shared/data (wiki-vital, wikitext-2, pubmed, mixed-domain), synthetic
    and small, plus a private token cache (``COUPLED_QK_CACHE``)."""
    rng = random.Random(0)
    root = tmp_path / "data"
    for sub in ("wiki-vital", "wikitext-2", "pubmed", "mixed-domain"):
        (root / sub).mkdir(parents=True)
    arts = [f" = Article {i} = \n\n{_para(rng, 80)}\n\n{_para(rng, 60)}\n" for i in range(120)]
    (root / "wiki-vital" / "train.txt").write_text("\n".join(arts))
    for split in ("valid", "test"):
        (root / "wikitext-2" / f"{split}.txt").write_text(
            "\n".join(f" = Other {split} {i} = \n\n {_para(rng, 70)} \n" for i in range(6))
        )
    (root / "pubmed" / "abstracts.txt").write_text("\n\n".join(_para(rng, 90) for _ in range(400)) + "\n")
    for name in ("a", "b"):
        (root / "mixed-domain" / f"{name}.txt").write_text("\n\n".join(_para(rng, 50) for _ in range(200)) + "\n")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "cache"))
    return root


@contextlib.contextmanager
def held_elsewhere(folder):
    """The lock of run folder ``folder`` held as another process holds it (pid 4242 on node7): an ``flock`` on an
    open file of its ``.lock`` that no :class:`~coupled_qk.training.lock.RunLock` of this process owns (this
    process's own lock would count as the reader's own)."""
    import fcntl
    import os

    path = RunFolder(folder).lock_path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": 4242, "host": "node7", "started": 0, "command": "coupled-qk train"}).encode())
        yield
    finally:
        os.close(fd)
