"""coupled-qk export: a trained run loads with AutoModelForCausalLM and AutoTokenizer; lazy registration."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from coupled_qk.cli import main  # noqa: E402
from coupled_qk.data.tokenizers import Tokenizer  # noqa: E402
from coupled_qk.output_dir import RECORD  # noqa: E402
from coupled_qk.training.loop import train  # noqa: E402
from coupled_qk.training.run_folder import load_checkpoint_model  # noqa: E402


@pytest.fixture
def trained_run(tiny_cfg):
    cfg = tiny_cfg(
        max_steps=2, eval_interval=2, model=dict(n_layer=1, d_model=32, n_heads=2, block_size=16, attention="coupled")
    )
    train(cfg)
    return cfg.out_dir


def test_export_loads_with_auto_classes(trained_run, tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    assert main(["export", str(trained_run), str(hf_dir)]) == 0
    assert "exported" in capsys.readouterr().out
    gpt, _ = load_checkpoint_model(trained_run)
    lm = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    run_tok = Tokenizer.load(os.path.join(trained_run, "tokenizer"))
    text = "the cat sat on the mat"
    ids = tok(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == run_tok.encode(text)
    assert tok.decode(ids[0]) == text and tok.eos_token_id == run_tok.eot_id == lm.config.eos_token_id
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, gpt(ids))
    before = {p.name: p.read_bytes() for p in hf_dir.iterdir()}
    assert main(["export", str(trained_run), str(hf_dir)]) == 2  # refuses to overwrite
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in hf_dir.iterdir()} == before
    assert main(["export", str(trained_run), str(hf_dir), "--overwrite"]) == 0
    assert sorted(p.name for p in hf_dir.iterdir()) == sorted(before)  # no temporary folder left
    (hf_dir / "notes.txt").write_text("mine")  # a file export does not write: refused even with --overwrite
    assert main(["export", str(trained_run), str(hf_dir), "--overwrite"]) == 2
    assert "notes.txt" in capsys.readouterr().err and (hf_dir / "notes.txt").read_text() == "mine"


def test_an_overwritten_export_keeps_no_file_of_the_earlier_one(trained_run, tmp_path):
    """``export RUN_WITHOUT_TOKENIZER HF --overwrite`` over an export of a run with one replaced the model and left
    the earlier run's tokenizer files, which AutoTokenizer then loaded beside the new model. And the weights were
    0600 whatever the umask, unlike every other file the project writes."""
    import shutil

    from coupled_qk.files import file_mode

    hf_dir = tmp_path / "hf"
    assert main(["export", str(trained_run), str(hf_dir)]) == 0
    assert (hf_dir / "tokenizer.json").is_file()
    bare = tmp_path / "bare"
    shutil.copytree(trained_run, bare)
    shutil.rmtree(bare / "tokenizer")  # a run without a tokenizer: an MQAR run (an LM run needs its tokenizer)
    config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "task": "mqar"}))
    assert main(["export", str(bare), str(hf_dir), "--overwrite"]) == 0
    shown = sorted(p.name for p in hf_dir.iterdir() if p.name != RECORD)  # RECORD: which command wrote each file
    assert shown == ["config.json", "generation_config.json", "model.safetensors"]
    assert all((p.stat().st_mode & 0o777) == file_mode() for p in hf_dir.iterdir())
    assert AutoModelForCausalLM.from_pretrained(hf_dir) is not None


def test_loading_a_run_folder_points_to_export(trained_run):
    from coupled_qk.hf import CoupledQKForCausalLM

    with pytest.raises(FileNotFoundError, match="coupled-qk export"):
        CoupledQKForCausalLM.from_pretrained(trained_run)
    # transformers' own error ("Unrecognized model in RUN. Should have a `model_type` key in its config.json.")
    # carries the hint too: import coupled_qk wraps AutoConfig.from_pretrained (hf/registration.py)
    with pytest.raises(ValueError, match=r"Unrecognized model in .*coupled-qk training run .*`coupled-qk export "):
        AutoModelForCausalLM.from_pretrained(trained_run)
    ckpt = sorted(Path(trained_run).glob("ckpt-*"))[-1]
    with pytest.raises((ValueError, OSError), match="coupled-qk training run or checkpoint"):
        AutoModelForCausalLM.from_pretrained(ckpt)


@pytest.mark.slow
def test_import_is_lazy_and_auto_classes_work_offline(trained_run, tmp_path):
    hf_dir = tmp_path / "hf"
    assert main(["export", str(trained_run), str(hf_dir)]) == 0
    code = textwrap.dedent(f"""
        import sys
        import coupled_qk
        assert "transformers" not in sys.modules, "import coupled_qk imported transformers"
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained({str(hf_dir)!r})
        lm = AutoModelForCausalLM.from_pretrained({str(hf_dir)!r})
        out = lm.generate(**tok(["the cat"], return_tensors="pt"), max_new_tokens=3, min_new_tokens=3,
                          do_sample=False)
        print(type(lm).__name__, out.shape[1])
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-2:] == ["CoupledQKForCausalLM", str(len(Tokenizer.load(hf_dir).encode("the cat")) + 3)]


def test_text_generation_pipeline_on_an_exported_folder(trained_run, tmp_path):
    """README: ``pipeline("text-generation", model=..., tokenizer=...)`` works on an exported folder (its own
    tokenizer), with the static cache too, and generates what ``model.generate`` does; the pipeline's default of
    256 new tokens exceeds the model's context (16) and is refused, not cropped."""
    from transformers import pipeline

    hf_dir = tmp_path / "hf"
    assert main(["export", str(trained_run), str(hf_dir)]) == 0
    lm = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    generator = pipeline("text-generation", model=lm, tokenizer=tok)
    prompts = ["the cat", "the cat sat on"]
    kw = dict(max_new_tokens=4, do_sample=False, return_full_text=False)
    texts = [r[0]["generated_text"] for r in generator(prompts, **kw)]
    assert texts == [r[0]["generated_text"] for r in generator(prompts, cache_implementation="static", **kw)]
    for prompt, text in zip(prompts, texts):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert text == tok.decode(lm.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1] :])
    with pytest.raises(ValueError, match="max_new_tokens=256 .* exceeds block_size=16"):
        generator("the cat")
