"""Run folders, checkpoints and Hugging Face folders written by the previous layout's code (a committed fixture,
``fixtures/previous_layout``: see its README) load, resume bit-exactly and export with today's code."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model, open_run

FIXTURE = Path(__file__).parent / "fixtures" / "previous_layout"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture
def old(tmp_path, monkeypatch):
    """A copy of the fixture (the run records relative paths: ``corpus``, ``cache``, ``run``), as the cwd, computed
    with as many CPU threads as the fixture was (a reduction split over other threads rounds differently)."""
    where = shutil.copytree(FIXTURE, tmp_path / "old")
    monkeypatch.chdir(where)
    threads = torch.get_num_threads()
    torch.set_num_threads(EXPECTED["threads"])
    yield where
    torch.set_num_threads(threads)


def test_the_fixture_is_small_and_was_written_by_the_previous_code():
    sizes = [p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()]
    assert sum(sizes) < 100_000
    assert RunFolder(FIXTURE / "run").latest_checkpoint().name == EXPECTED["latest"] == "ckpt-00000004-r1"


def test_an_old_run_is_read_as_it_was_written(old):
    run = RunFolder("run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no unknown key in any file the old code wrote
        results = run.read_results()
        assert Checkpoint(run.latest_checkpoint()).state()["step"] == EXPECTED["stopped_at"] == results["steps"]
        assert run.read_config()["stop_after_steps"] == 4 and run.read_data()["vocab_size"] == 257
    Checkpoint(run.latest_checkpoint()).verify()  # every checksum of the old files
    assert run.best_checkpoint().name == "best-00000004" and run.has_tokenizer() and run.has_checkpoint()
    assert run.is_run() and run.holder() is None and results["stop_reason"] == "stop_after_steps"
    logged = {r["step"]: r["train/loss"] for r in run.read_metrics() if "train/loss" in r}
    assert logged == {int(k): v for k, v in EXPECTED["train_losses"].items() if int(k) <= 4}
    opened = open_run("run", "test", text=True, data="refuse")  # every reader's state check passes
    model, state = opened.load_model()
    with torch.no_grad():
        logits = model(torch.tensor([EXPECTED["prompt"]]))[0, -1]
    torch.testing.assert_close(logits, torch.tensor(EXPECTED["latest_logits"]))
    assert load_checkpoint_model("run/best-00000004")[1]["step"] == 4


def test_an_old_run_resumes_bit_exactly(old):
    """Steps 5 and 6 of the old run resumed with today's code equal those of the old code's uninterrupted run, bit
    for bit (losses, every final weight, final metrics): optimizer, random and schedule state are read back."""
    from coupled_qk.training.loop import train

    saved = RunFolder("run").read_config()
    cfg = TrainConfig.from_dict({**saved, "resume": True, "stop_after_steps": None, "device": "cpu"})
    results = train(cfg)
    run = RunFolder("run")
    losses = {r["step"]: r["train/loss"] for r in run.read_metrics() if "train/loss" in r}
    assert losses == {int(k): v for k, v in EXPECTED["train_losses"].items()}
    weights = load_file(str(Checkpoint(run.latest_checkpoint()).weights_path))
    digests = {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest() for k, v in weights.items()}
    assert digests == EXPECTED["final_weights_sha256"]
    assert results["final"] == EXPECTED["final"] and results["steps"] == 6 and results["precision"] == "fp32"


def test_an_old_run_is_evaluated_on_the_text_it_recorded(old):
    from coupled_qk.training.evaluate import evaluate_checkpoint

    res = evaluate_checkpoint("run", splits=("valid",), device="cpu")
    assert res["step"] == 4 and res["valid"]["n_tokens"] == EXPECTED["final"]["valid/n_tokens"]


def test_an_old_hf_export_loads_and_today_s_export_writes_the_same_config(old):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import coupled_qk  # noqa: F401 - registers the model type
    from coupled_qk.hf.export import export_run

    hf = AutoModelForCausalLM.from_pretrained("hf").eval()
    with torch.no_grad():
        logits = hf(torch.tensor([EXPECTED["prompt"]])).logits[0, -1]
    torch.testing.assert_close(logits, torch.tensor(EXPECTED["latest_logits"]))
    text = "the cat sat on a mat"
    assert AutoTokenizer.from_pretrained("hf")(text)["input_ids"] == RunFolder("run").tokenizer().encode(text)
    export_run("run", "hf-today")
    ignore = ("transformers_version",)
    before, now = (json.loads(Path(d, "config.json").read_text()) for d in ("hf", "hf-today"))
    assert {k: v for k, v in now.items() if k not in ignore} == {k: v for k, v in before.items() if k not in ignore}
    assert load_file("hf-today/model.safetensors").keys() == load_file("hf/model.safetensors").keys()
