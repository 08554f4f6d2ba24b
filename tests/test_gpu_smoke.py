"""``benchmarks/gpu_smoke.py`` (issue 28): the data bundle, the stage runner (a failing, a timed-out, a skipped
stage never stop the next) and the whole ``--device cpu --quick`` run that CI keeps from rotting."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coupled_qk.data.paths import default_data_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_smoke.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def smoke():
    return _load()


@pytest.fixture(scope="module")
def shared_data():
    try:
        return default_data_dir()
    except FileNotFoundError:
        pytest.skip("the shared data folder is not available")


def test_make_data_writes_a_small_bundle_in_the_shared_layout(smoke, shared_data, tmp_path):
    bundle = tmp_path / "bundle"
    manifest = smoke.make_data(shared_data, bundle, train_mb=0.05)
    assert set(manifest) == set(smoke.DATA_FILES)
    for f, meta in manifest.items():
        data = (bundle / f).read_bytes()
        assert meta == dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    train = (bundle / "wiki-vital/train.txt").read_text(encoding="utf-8")
    source = (shared_data / "wiki-vital/train.txt").read_text(encoding="utf-8")
    assert 0 < len(train) <= 50_000 and source.startswith(train)
    assert source[len(train) :].startswith(" = ")  # cut before an article heading, not inside an article
    assert (bundle / "wikitext-2/test.txt").read_bytes() == (shared_data / "wikitext-2/test.txt").read_bytes()
    assert sum(m["bytes"] for m in manifest.values()) < 5_000_000
    assert json.loads((bundle / "MANIFEST.json").read_text())["files"] == manifest
    assert smoke.resolve_data(str(bundle)) == (bundle.resolve(), "--data")
    (bundle / "tokenizer/gpt2/merges.txt").unlink()
    found, reason = smoke.resolve_data(str(bundle))
    assert found is None and "missing tokenizer/gpt2/merges.txt" in reason
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        smoke.make_data(bundle, tmp_path / "again")
    with pytest.raises(ValueError, match="--train-mb=0"):
        smoke.make_data(shared_data, tmp_path / "again", train_mb=0)


def test_results_markdown_lists_every_stage_with_its_reason(smoke):
    summary = dict(
        started="t",
        device="cpu",
        quick=True,
        budget_s=10,
        elapsed_s=3,
        data=None,
        data_found_by="no data folder",
        command="c",
        stages=[
            dict(name="env", status="ok", seconds=1.0, limit_s=30, reason=None, md=["- torch x"]),
            dict(
                name="parity",
                status="failed",
                seconds=1.0,
                limit_s=30,
                reason=None,
                checks={"coupled: fp32 loss": False, "standard: fp32 loss": True},
            ),
            dict(name="sync", status="skipped", seconds=0.0, limit_s=None, reason="no CUDA"),
        ],
    )
    md = smoke.results_markdown(summary)
    assert "| env | ok | 1.0 | 30 |  |" in md
    assert "| parity | failed | 1.0 | 30 | failed checks: coupled: fp32 loss |" in md
    assert "| sync | skipped | 0.0 |  | no CUDA |" in md
    assert "## env (ok)\n\n- torch x" in md


@pytest.mark.slow
def test_runner_goes_on_after_failures_timeouts_and_skips(tmp_path):
    empty = tmp_path / "nodata"
    empty.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--data",
            str(empty),
            "--stages",
            "_fail,_sleep,sync,train,env",
            "--budget-s",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((out / "results.json").read_text())
    st = {s["name"]: s for s in res["stages"]}
    assert list(st) == ["_fail", "_sleep", "sync", "train", "env"]
    assert st["_fail"]["status"] == "failed" and "fails on purpose" in st["_fail"]["error"]
    assert st["_fail"]["result"] == {"before": 1}  # what the stage saved before failing is kept
    assert st["_sleep"]["status"] == "timeout" and st["_sleep"]["result"] == {"slept": "started"}
    assert st["sync"] == {**st["sync"], "status": "skipped", "reason": "no CUDA"}
    assert st["train"]["status"] == "skipped" and "missing wiki-vital/train.txt" in st["train"]["reason"]
    assert st["env"]["status"] == "ok" and st["env"]["result"]["torch"]
    assert not (out / "work").exists()
    md = (out / "results.md").read_text()
    assert "| _sleep | timeout |" in md and "| sync | skipped | 0.0 |  | no CUDA |" in md
    # a budget too small for a stage skips it and says so
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "b"),
            "--stages",
            "env",
            "--budget-s",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert proc.returncode == 0 and res["stages"][0]["status"] == "skipped"
    assert res["stages"][0]["reason"].startswith("budget: 5 s left")


@pytest.mark.slow
def test_quick_cpu_run_passes_every_stage(shared_data, tmp_path):
    """The CI stand-in of the GPU run: every stage runs (sync: skipped, no CUDA) and passes its checks."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--quick",
            "--budget-s",
            "600",
            "--out",
            str(out),
            "--data",
            str(shared_data),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # the script finds src/
    res = json.loads((out / "results.json").read_text())
    status = {s["name"]: s["status"] for s in res["stages"]}
    assert status == {
        "env": "ok",
        "parity": "ok",
        "sdpa": "ok",
        "decode": "ok",
        "sync": "skipped",
        "train": "ok",
        "bench": "ok",
        "memory": "ok",
        "compile": "ok",
        "hf": "ok",
    }, (proc.stdout, (out / "results.md").read_text())
    assert proc.returncode == 0
    st = {s["name"]: s for s in res["stages"]}
    assert all(st["parity"]["checks"].values()) and len(st["parity"]["checks"]) == 4 * 4
    assert st["sdpa"]["result"]["coupled_differential"]["train"]  # an SDPA kernel was seen
    assert st["train"]["result"]["loss_rel_diff_max"] == 0.0  # CPU resume repeats the run bit for bit
    assert st["compile"]["result"]["coupled"]["recompiles"] >= 0
    assert st["hf"]["result"]["coupled"]["graphs"] == 1 and st["hf"]["result"]["coupled"]["tokens_equal"]
    assert set(st["bench"]["result"]["micro"]["variants"]) == {"standard", "coupled"}
    assert st["bench"]["result"]["vocab_padding"]["rows"] == {"unpadded": 500, "padded": 512}
    md = (out / "results.md").read_text()
    for name in status:
        assert f"| {name} | {status[name]} |" in md
