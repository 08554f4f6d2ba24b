"""The training loop: exact resume, atomic checkpoints, clear errors, runs end to end on real files."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coupled_qk.training import checkpoint_format
from coupled_qk.training.checkpoint_format import Checkpoint
from coupled_qk.training.loop import lr_at, train
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model


def losses(run_dir):
    return [r["train/loss"] for r in RunFolder(run_dir).read_metrics() if "train/loss" in r]


def test_resume_is_exact(tiny_cfg, tmp_path, capsys):
    model = dict(n_layer=1, d_model=32, n_heads=2, block_size=16, dropout=0.1, attention="coupled")
    full = train(tiny_cfg(out_dir=str(tmp_path / "full"), model=model))
    part = tmp_path / "part"
    first = train(tiny_cfg(out_dir=str(part), model=model, stop_after_steps=4))
    assert first["steps"] == 4 and first["stop_reason"] == "stop_after_steps"
    capsys.readouterr()
    second = train(tiny_cfg(out_dir=str(part), model=model, resume=True))
    assert f"resuming {part} from ckpt-00000004: step 4, 256 tokens" in capsys.readouterr().err  # said, once
    assert second["steps"] == 8
    a, b = losses(tmp_path / "full"), losses(part)
    assert len(a) == len(b) == 8
    assert a == b  # bit-identical on CPU
    assert full["final"]["test/perplexity"] == second["final"]["test/perplexity"]


def test_refuses_to_overwrite_and_checks_config(tiny_cfg, tmp_path):
    train(tiny_cfg(max_steps=2))
    with pytest.raises(ValueError, match="--resume"):
        train(tiny_cfg(max_steps=2))
    other = dict(n_layer=2, d_model=32, n_heads=2, block_size=16)
    with pytest.raises(ValueError, match="n_layer: checkpoint 1 vs run 2"):
        train(tiny_cfg(max_steps=4, model=other, resume=True))
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0.003 vs 0.05"):
        train(tiny_cfg(max_steps=4, lr=0.05, resume=True))
    with pytest.raises(ValueError, match="tokenizer: 'bpe-300' vs 'bpe-400'"):
        train(tiny_cfg(max_steps=4, tokenizer="bpe-400", resume=True))
    with pytest.raises(ValueError, match="different budget.*--on-budget-change keep"):
        train(tiny_cfg(max_steps=4, resume=True))  # a larger budget must be asked for (issue 9 C)
    res = train(tiny_cfg(max_steps=4, resume=True, on_budget_change="keep"))
    assert res["steps"] == 4


def test_a_run_whose_latest_is_gone_is_resumed_from_its_newest_checkpoint_never_restarted(tiny_cfg, capsys):
    """Without ``latest`` (deleted by hand; or a kill between a checkpoint's rename and ``latest``'s write),
    ``--resume`` said "no checkpoint; starting a new run there" and trained a new model beside the old
    checkpoints, overwriting metrics.jsonl. Now it resumes from the newest checkpoint that verifies, after checking
    the config against the run's, and without --resume it is refused."""
    run = Path(tiny_cfg().out_dir)
    train(tiny_cfg(max_steps=6, checkpoint_interval=2, stop_after_steps=4))
    (run / "latest").unlink()
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(tiny_cfg(max_steps=6))
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0.003 vs 0.01"):
        train(tiny_cfg(max_steps=6, lr=0.01, resume=True))
    assert (run / "metrics.jsonl").read_bytes() == before and not (run / "latest").exists()
    capsys.readouterr()
    res = train(tiny_cfg(max_steps=6, resume=True))
    assert f"{run / 'latest'} is missing; resuming from the newest checkpoint that verifies, ckpt-00000004" in (
        capsys.readouterr().err
    )
    # continued, not restarted: the first four steps' records (with their own timings) are kept as they were
    assert res["steps"] == 6 and (run / "metrics.jsonl").read_bytes().startswith(before)
    assert [r["step"] for r in RunFolder(run).read_metrics() if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


def test_a_run_without_its_config_json_is_not_resumed_with_unchecked_settings(tiny_cfg):
    """With ``config.json`` deleted, ``--resume`` compared nothing: a resume with another learning rate and seed
    trained on and wrote them into the new ``config.json`` as the whole run's settings. Now it is refused before
    anything is written, naming the file and how to recreate it; with it recreated, the check applies again."""
    run = Path(tiny_cfg().out_dir)
    train(tiny_cfg(max_steps=4, checkpoint_interval=2, stop_after_steps=2))
    (run / "config.json").unlink()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"cannot resume .*config\.json is missing.*--print-config"):
        train(tiny_cfg(max_steps=4, lr=0.01, seed=7, resume=True))
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    tiny_cfg(max_steps=4).save(run / "config.json")
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0.003 vs 0.01"):
        train(tiny_cfg(max_steps=4, lr=0.01, resume=True))
    assert train(tiny_cfg(max_steps=4, resume=True))["steps"] == 4


@pytest.mark.parametrize("resume", [False, True])
def test_a_finished_run_whose_checkpoints_were_deleted_is_never_trained_over(tiny_cfg, resume):
    """Checkpoints of a finished run deleted to save space: ``train`` to the same folder started a new run and
    replaced its ``results.json``, ``metrics.jsonl`` and ``config.json`` without a word (with ``--resume``: after
    "no checkpoint; starting a new run there"). Now refused before anything is written."""
    import shutil

    run = Path(tiny_cfg().out_dir)
    train(tiny_cfg(max_steps=2))
    for folder in run.glob("ckpt-*"):
        shutil.rmtree(folder)
    (run / "latest").unlink()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"holds a finished run \(results\.json\) without checkpoints"):
        train(tiny_cfg(max_steps=2, seed=5, resume=resume))
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_failed_run_leaves_no_tokenizer_for_the_next(tiny_cfg, tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for split in ("train", "valid", "test"):
        (tiny / f"{split}.txt").write_text("a b\n")
    with pytest.raises(ValueError, match="fewer than block_size"):
        train(tiny_cfg(corpus=str(tiny), tokenizer="bpe-260"))
    res = train(tiny_cfg(max_steps=2))  # same out_dir, proper corpus: its own tokenizer
    assert res["data"]["vocab_size"] == 300


def test_results_and_logs(tiny_cfg, tmp_path):
    res = train(tiny_cfg())
    run = Path(res["config"]["out_dir"])
    saved = json.loads((run / "results.json").read_text())
    assert saved["final"]["test/perplexity"] == res["final"]["test/perplexity"]
    assert saved["precision"] == "fp32"  # the autocast precision it trained in (the experiment runner compares it)
    assert (run / "config.json").is_file() and (run / "tokenizer" / "tokenizer.json").is_file()
    records = RunFolder(run).read_metrics()
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, 9))
    assert any("valid/loss" in r for r in records)
    assert losses(run)[-1] < losses(run)[0]
    model, state = load_checkpoint_model(run)
    assert state["step"] == 8 and state["tokens"] == 8 * 4 * 16


def test_schedule_warmup_and_cosine(tiny_cfg):
    cfg = tiny_cfg(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg, 110) == pytest.approx(0.1)
    assert lr_at(9, cfg, 110) == pytest.approx(1.0)
    assert lr_at(60, cfg, 110) == pytest.approx(0.55)
    assert lr_at(110, cfg, 110) == pytest.approx(0.1)


def test_failed_save_keeps_previous_checkpoint(tiny_cfg, tmp_path, monkeypatch):
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    run = tmp_path / "ck"
    RunFolder(run).save(model.state_dict(), model.config, None, {"step": 1})

    def boom(*a, **k):
        raise KeyboardInterrupt("killed during save")

    monkeypatch.setattr(checkpoint_format, "save_file", boom)
    with pytest.raises(KeyboardInterrupt):
        RunFolder(run).save(model.state_dict(), model.config, None, {"step": 2})
    assert RunFolder(run).latest_checkpoint().name == "ckpt-00000001"
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    loaded, state = load_checkpoint_model(run)
    assert state["step"] == 1
    torch.testing.assert_close(loaded.tok_emb.weight, model.tok_emb.weight)


KILL_SCRIPT = r"""
import os, sys, torch
from coupled_qk import GPT, GPTConfig
from coupled_qk.training.run_folder import RunFolder
model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
RunFolder(sys.argv[1]).save(model.state_dict(), model.config, None, {"step": 1})
real = torch.save
def die(obj, path, *a, **k):
    real(obj, path, *a, **k)
    os._exit(9)  # the process dies in the middle of writing checkpoint 2
torch.save = die
RunFolder(sys.argv[1]).save(model.state_dict(), model.config, None, {"step": 2})
"""


@pytest.mark.slow
def test_kill_during_save_leaves_previous_checkpoint(tmp_path):
    run = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(run)], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert RunFolder(run).latest_checkpoint().name == "ckpt-00000001"
    model, state = load_checkpoint_model(run)
    assert state["step"] == 1


def test_missing_checkpoint_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        RunFolder(tmp_path).latest_checkpoint()


def test_missing_corpus_and_empty_split(tiny_cfg, tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="nowhere"):
        train(tiny_cfg(corpus=str(tmp_path / "nowhere")))
    empty = tmp_path / "empty"
    empty.mkdir()
    for split in ("train", "valid", "test"):
        (empty / f"{split}.txt").write_text("" if split == "valid" else "some words here\n" * 50)
    with pytest.raises(ValueError, match="valid"):
        train(tiny_cfg(corpus=str(empty)))


DDP_SCRIPT = r"""
import json, sys
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.loop import train
cfg = TrainConfig.from_dict(json.loads(sys.argv[1]))
train(cfg)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_processes_match_single_process(tiny_cfg, tmp_path, fsdp):
    single = tiny_cfg(batch_size=4, max_steps=4, out_dir=str(tmp_path / "single"))
    train(single)
    # 2 ranks x batch 2 = the same global batch of 4 sequences, sliced from the same global sample
    ddp = tiny_cfg(batch_size=2, max_steps=4, out_dir=str(tmp_path / "ddp"), fsdp=fsdp).to_dict()
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        json.dumps(ddp),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert x == pytest.approx(y, rel=1e-5, abs=1e-5)
    res = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert res["world_size"] == 2
    # the gathered checkpoint equals the weights a single process would hold (up to reduction order)
    a_model, _ = load_checkpoint_model(tmp_path / "single")
    b_model, _ = load_checkpoint_model(tmp_path / "ddp")
    for (name, p), q in zip(a_model.named_parameters(), b_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_damaged_checkpoint_is_a_clear_error(tmp_path):
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    run = tmp_path / "damaged"
    where = RunFolder(run).save(model.state_dict(), model.config, None, {"step": 1})
    (where / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged: its SHA-256 differs"):
        load_checkpoint_model(run)
    (where / "checksums.json").unlink()  # a checkpoint from before checksums: the reader's own error
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors.*damaged"):
        load_checkpoint_model(run)
    (where / "state.json").write_text("{")
    with pytest.raises(ValueError, match=r"state\.json is not valid JSON"):
        Checkpoint(where).state()


def test_small_splits_and_repeated_data_warn(tiny_cfg):
    from coupled_qk.training.tasks.lm import LMTask

    cfg = tiny_cfg(max_steps=None, max_tokens=10_000_000)
    with pytest.warns(UserWarning) as record:
        LMTask(cfg)
    messages = [str(w.message) for w in record]
    assert any("the valid split" in m and "noisy estimate" in m for m in messages)
    assert any("passes over the" in m for m in messages)


def test_warmup_longer_than_the_run_warns(tiny_cfg):
    with pytest.warns(UserWarning, match=r"warmup_steps=8 is at least the schedule's 8 steps"):
        train(tiny_cfg(warmup_steps=8, max_steps=8))


def test_final_metrics_carry_bits_per_byte_of_the_split_files(tiny_cfg, tiny_corpus):
    """Bits per byte/char of the final evaluation, recomputed from the reported total NLL and the split files'
    own bytes and characters (read here, independently of the corpus loader)."""
    res = train(tiny_cfg(max_steps=2))
    for split in ("valid", "test"):
        raw = (tiny_corpus / f"{split}.txt").read_bytes()
        final = {k.split("/", 1)[1]: v for k, v in res["final"].items() if k.startswith(split + "/")}
        assert final["n_bytes"] == len(raw) and final["n_chars"] == len(raw.decode("utf-8"))
        bits = final["nll"] / math.log(2)
        assert final["bits_per_byte"] == pytest.approx(bits / len(raw), rel=1e-12)
        assert final["bits_per_char"] == pytest.approx(bits / final["n_chars"], rel=1e-12)
        # per token and per byte describe the same total: ln(ppl) * tokens = bpb * ln 2 * bytes
        assert math.log(final["perplexity"]) * final["n_tokens"] == pytest.approx(
            final["bits_per_byte"] * math.log(2) * len(raw), rel=1e-9
        )


def test_final_eval_subsample_is_labelled_and_counts_the_scored_text(tiny_cfg):
    from coupled_qk.data.tokenizers import Tokenizer
    from coupled_qk.training.run_folder import RunFolder

    cfg = tiny_cfg(max_steps=2, task_options={"final_eval_windows": 3})
    final = train(cfg)["final"]
    assert final["test/subsample_windows"] == 3 and final["test/n_tokens"] == 3 * 16  # block_size 16
    tok = Tokenizer.load(RunFolder(cfg.out_dir).tokenizer_dir)
    full = tok.encode((Path(cfg.corpus) / "test.txt").read_text())
    scored_text = tok.decode(full[: 3 * 16 + 1])
    assert final["test/n_bytes"] == len(scored_text.encode("utf-8"))
    assert "test/word_perplexity" not in final
    with pytest.raises(ValueError, match="final_eval_windows=0 must be a positive integer"):
        train(tiny_cfg(max_steps=2, out_dir=cfg.out_dir + "-bad", task_options={"final_eval_windows": 0}))


def test_default_eval_interval_gives_about_ten_validations_and_sizes_are_printed(tiny_cfg, capsys, monkeypatch):
    from coupled_qk import progress
    from coupled_qk.training.config import auto_eval_interval

    assert [auto_eval_interval(n) for n in (1, 8, 20, 147, 10_000)] == [1, 1, 2, 15, 1000]
    with pytest.raises(ValueError, match="total_steps=0"):
        auto_eval_interval(0)
    monkeypatch.setitem(progress._MODE, "mode", "lines")
    cfg = tiny_cfg(max_steps=20, eval_interval=None, progress=True)
    res = train(cfg)
    evaluated = [r["step"] for r in RunFolder(cfg.out_dir).read_metrics() if "valid/loss" in r]
    assert evaluated == list(range(2, 21, 2))
    err = capsys.readouterr().err
    assert "quick validation every 2 steps on 2 batches (10 over the run's 20 steps" in err
    short = tiny_cfg(max_steps=3, eval_interval=None, progress=True, out_dir=cfg.out_dir + "-short")
    train(short)  # fewer than 10 steps: one validation per step, and the message counts them (not "about 10")
    assert [r["step"] for r in RunFolder(short.out_dir).read_metrics() if "valid/loss" in r] == [1, 2, 3]
    assert "quick validation every 1 steps on 2 batches (3 over the run's 3 steps" in capsys.readouterr().err
    sizes = res["data"]["tokens"]
    assert (
        f"data: train {sizes['train']:,} tokens, 300 documents; valid {sizes['valid']:,} tokens, 20 documents; "
        f"test {sizes['test']:,} tokens, 20 documents"
    ) in err


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(attention="coupled"), "attention: checkpoint 'standard' vs run 'coupled'"),
        (dict(n_layer=2), "n_layer: checkpoint 1 vs run 2"),
        (dict(attention="standard", n_heads=4), "n_heads: checkpoint 2 vs run 4"),
    ],
)
def test_a_resume_with_another_model_is_refused_before_the_data_are_read(tiny_cfg, monkeypatch, change, words):
    """Another attention or size on --resume is refused naming the field before the task reads its data (it was
    refused only after the corpus and tokenizer had loaded); the data-decided vocabulary is taken from the
    checkpoint for that early comparison."""
    from coupled_qk.training import loop

    model = dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="standard")
    train(tiny_cfg(model=model, stop_after_steps=2))

    def no_data(*args, **kwargs):
        raise AssertionError("the data were read before the model was compared")

    monkeypatch.setattr(loop, "_build_task", no_data)
    with pytest.raises(ValueError, match=re.escape(words)):
        train(tiny_cfg(model={**model, **change}, resume=True))
