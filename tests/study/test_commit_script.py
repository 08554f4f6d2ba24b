"""``benchmarks/commit_records.sh``: committing records as they finish is a script beside the study (the library
runs no git). Outside a git work tree it refuses in one line; inside, it commits each new record alone, once."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "commit_records.sh"
pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None, reason="needs git, bash")


def _run(cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "ONCE": "1", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["bash", str(SCRIPT), "cpu"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_outside_a_git_work_tree_it_refuses(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 2 and "is not inside a git work tree" in res.stderr


def test_it_commits_each_new_record_once(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for key, value in (("user.email", "t@example.org"), ("user.name", "t")):
        subprocess.run(["git", "-C", str(tmp_path), "config", key, value], check=True)
    rec = tmp_path / "docs" / "results" / "claims" / "runs" / "cpu" / "wv-tiny" / "coupled" / "seed0.json"
    rec.parent.mkdir(parents=True)
    record = {"protocol": "cpu", "cell": "wv-tiny", "variant": "coupled", "seed": 0, "final": {"test/perplexity": 1.5}}
    rec.write_text(json.dumps(record))
    assert _run(tmp_path).returncode == 0
    log = subprocess.run(["git", "-C", str(tmp_path), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.splitlines() == ["cpu: wv-tiny coupled seed 0 (record)"]
    assert _run(tmp_path).returncode == 0  # nothing new: no second commit
    log = subprocess.run(["git", "-C", str(tmp_path), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1
