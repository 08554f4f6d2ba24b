"""``load_run`` and ``coupled-qk generate``: determinism, cache parity, prompt round trip, clear errors."""

import pytest
import torch

import coupled_qk
from coupled_qk.cli import main
from coupled_qk.training.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from coupled_qk.training.config import TrainConfig
    from tests.conftest import write_corpus

    root = tmp_path_factory.mktemp("gen")
    corpus = write_corpus(root / "corpus", (200, 10, 10))
    cfg = TrainConfig.from_dict(
        dict(
            corpus=str(corpus),
            tokenizer="bpe-300",
            cache_dir=str(root / "cache"),
            out_dir=str(root / "run"),
            model=dict(n_layer=1, d_model=32, n_heads=2, block_size=32, attention="coupled"),
            batch_size=4,
            max_steps=4,
            warmup_steps=1,
            eval_interval=4,
            eval_batches=1,
            progress=False,
            tensorboard=False,
        )
    )
    train(cfg)
    return root / "run"


def test_load_run_gives_model_and_tokenizer(run_dir):
    run = coupled_qk.load_run(run_dir)
    assert run.step == 4 and run.model.config.attention == "coupled"
    assert run.model.config.vocab_size == run.tokenizer.vocab_size
    text = "the cat sat on the mat"
    ids = run.encode(text)
    assert run.tokenizer.decode(ids[0]) == text  # the prompt round-trips through the run's tokenizer
    assert not run.model.training


def test_generate_deterministic_and_cache_exact(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "the dog", "--max-new-tokens", "12", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert first.splitlines()[1].startswith("the dog")
    run = coupled_qk.load_run(run_dir)
    prompt = run.encode("the dog")
    outs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(5)
        outs.append(run.model.generate(prompt, 20, temperature=1.0, top_k=20, use_cache=use_cache, generator=g))
    assert torch.equal(outs[0], outs[1])


def test_generate_with_the_transposed_head_writes_the_same_text(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "the dog", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--transposed-head"]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-new-tokens", "40", "--context", "error"], "exceeds the model's context block_size=32"),
        (["--temperature", "-1"], "--temperature=-1 must be"),
        (["--top-k", "0"], "--top-k=0"),
    ],
)
def test_generate_errors(run_dir, capsys, extra, message):
    assert main(["generate", str(run_dir), "--prompt", "the"] + extra) == 2
    assert message in capsys.readouterr().err


def test_generate_slides_past_the_context_by_default(run_dir, capsys):
    """40 new tokens after a 2-token prompt with block_size 32: the window slides, and the text is what the
    model gives when re-run on the last 32 tokens before every token (greedy)."""
    assert main(["generate", str(run_dir), "--prompt", "the dog", "--max-new-tokens", "40", "--temperature", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "sliding context of 32 tokens" in out[0]
    run = coupled_qk.load_run(run_dir)
    seq = run.encode("the dog")
    n_prompt = seq.shape[1]
    with torch.no_grad():
        for _ in range(40):
            seq = torch.cat([seq, run.model(seq[:, -32:])[:, -1:].argmax(-1)], dim=1)
    assert seq.shape[1] == n_prompt + 40
    assert "\n".join(out[1:]) == "the dog" + run.tokenizer.decode(seq[0, n_prompt:])


@pytest.mark.parametrize("extra", [[], ["--compile"]])
def test_a_prompt_longer_than_the_context_slides_as_the_api_does(run_dir, capsys, extra):
    """`generate --prompt <2000 x's>` refused under the default --context slide, while GPT.generate reads the last
    block_size tokens of such a prompt: the command now writes what the API gives; --context error refuses."""
    run = coupled_qk.load_run(run_dir)
    text = " ".join(["the dog sat on the mat"] * 12)
    prompt = run.encode(text)
    assert prompt.shape[1] > 32  # block_size
    want = run.model.generate(prompt, 5, temperature=0)
    assert (
        main(["generate", str(run_dir), "--prompt", text, "--max-new-tokens", "5", "--temperature", "0", *extra]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert "sliding context of 32 tokens" in out[0]
    assert "\n".join(out[1:]) == text + run.tokenizer.decode(want[0, prompt.shape[1] :])
    assert main(["generate", str(run_dir), "--prompt", text, "--context", "error"]) == 2
    assert (
        f"--prompt has {prompt.shape[1]} tokens, more than the model's context block_size=32" in capsys.readouterr().err
    )


def test_generate_default_temperature_is_the_model_default():
    import inspect

    from coupled_qk.cli import build_parser
    from coupled_qk.models.gpt import GPT

    args = build_parser("generate").parse_args(["generate", "x"])
    assert args.temperature == inspect.signature(GPT.generate).parameters["temperature"].default == 1.0
    assert args.context == inspect.signature(GPT.generate).parameters["context"].default == "slide"


@pytest.mark.parametrize(
    "device,error",
    [
        ("auto", None),
        ("cpu", None),
        ("meta", "is not a device name"),
        ("cuda:7", "is not available on this machine"),
        ("", "is not a device name"),
        (3, "must be a device name"),
    ],
)
def test_load_run_device_is_checked_before_anything_loads(run_dir, device, error):
    """``device`` as ``--device`` takes it: "auto" works (it used to be torch's RuntimeError), "meta" (which
    loaded "successfully" with the weights discarded) and absent devices are one line listing those present."""
    if error is None:
        assert coupled_qk.load_run(run_dir, device=device).model.lm_head.weight.device.type == "cpu"
        return
    with pytest.raises(ValueError, match=f"device=.*{error}.*available here: auto, cpu"):
        coupled_qk.load_run(run_dir, device=device)


@pytest.mark.parametrize("device", ["meta", "cuda:7", "", 3])
def test_load_checkpoint_model_checks_its_device_too(run_dir, device):
    """The check sits where the device enters: ``load_checkpoint_model`` (``eval``, ``export``, claims records and
    ``load_run`` all load through it)."""
    from coupled_qk.training.run_folder import load_checkpoint_model

    with pytest.raises(ValueError, match="device=.*available here: auto, cpu"):
        load_checkpoint_model(run_dir, device)
    model, _ = load_checkpoint_model(run_dir, "auto")
    assert model.lm_head.weight.device.type == "cpu"


def test_load_run_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        coupled_qk.load_run(tmp_path)


@pytest.mark.slow
def test_generate_compile_prints_the_same_text(run_dir, capsys, monkeypatch):
    import functools

    from coupled_qk.models.gpt import GPT

    # Dynamo capture only (the Inductor decoding step is checked in tests/models/test_compile.py)
    monkeypatch.setattr(GPT, "compiled_decode_step", functools.partialmethod(GPT.compiled_decode_step, backend="eager"))
    args = [
        "generate",
        str(run_dir),
        "--prompt",
        "the dog",
        "--max-new-tokens",
        "12",
        "--seed",
        "3",
        "--num-samples",
        "2",
    ]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main(args + ["--compile"]) == 0
    out = capsys.readouterr()
    assert out.out == eager
    assert "# compiled decoding step: first call (compile)" in out.err
    # past the context: the tokens that fit it go through the compiled step (they used to decode eagerly, unsaid)
    n_prompt = coupled_qk.load_run(run_dir).encode("the dog").shape[1]
    args[args.index("--max-new-tokens") + 1] = "40"
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main(args + ["--compile"]) == 0
    out = capsys.readouterr()
    assert out.out == eager
    assert f"the {n_prompt + 40 - 32} new tokens past the context decoded eagerly" in out.err


def test_generate_compile_says_when_no_compiled_step_ran(run_dir, capsys):
    """`--compile --max-new-tokens 1` (the prefill gives the only token) and a prompt longer than the context (every
    token decoded eagerly from the window) used to print nothing about compilation."""
    base = ["generate", str(run_dir), "--temperature", "0", "--compile"]
    assert main(base + ["--prompt", "the dog", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "# --compile: no compiled step ran (the first new token comes from the prompt's eager pass)" in err
    assert main(base + ["--prompt", " ".join(["the dog sat on the mat"] * 12), "--max-new-tokens", "3"]) == 0
    assert (
        "no compiled step ran (the first new token comes from the prompt's eager pass, tokens past the context "
        "decode eagerly); decoded eagerly" in capsys.readouterr().err
    )


@pytest.fixture(scope="module")
def foreign_folders(run_dir, tmp_path_factory):
    """An HF export of the run, and a copy of the run whose config.json says it is a GLUE fine-tuning run."""
    import json
    import shutil

    from coupled_qk.hf.export import export_run

    root = tmp_path_factory.mktemp("foreign")
    export_run(run_dir, root / "hf")
    glue = root / "glue-run"
    shutil.copytree(run_dir, glue)
    config = json.loads((glue / "config.json").read_text())
    (glue / "config.json").write_text(json.dumps({**config, "task": "glue"}))
    return {"hf": (root / "hf", "is a Hugging Face export"), "glue": (glue, "is a GLUE fine-tuning run")}


@pytest.mark.parametrize("kind", ["hf", "glue"])
@pytest.mark.parametrize(
    "command",
    [["eval"], ["generate", "--max-new-tokens", "2"], ["export", "OUT"], ["analyze", "--out-dir", "OUT", "--no-plots"]],
)
def test_a_folder_of_another_kind_is_named_as_such(foreign_folders, kind, command, tmp_path, capsys):
    """An HF export folder or a GLUE fine-tuning run given where a language-model run is expected: one line saying
    what the folder is (it used to be "model_config.json does not exist" or "does not match the model: missing
    [...]", which read like a damaged checkpoint)."""
    from coupled_qk.cli import main

    folder, what = foreign_folders[kind]
    argv = [command[0], str(folder), *[str(tmp_path / "out") if a == "OUT" else a for a in command[1:]]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0], err


@pytest.mark.parametrize("kind", ["hf", "glue"])
def test_glue_refuses_a_folder_of_another_kind_as_its_pretrained_run(foreign_folders, kind):
    """GLUE fine-tunes a language-model run: a GLUE run or an HF export given as ``task_options.pretrained`` is
    named as such (resolve_pretrained) before any data or weights are read."""
    from coupled_qk.training.tasks.glue import resolve_pretrained

    folder, what = foreign_folders[kind]
    for path in [folder] + sorted(folder.glob("ckpt-*")):  # the run folder and each of its checkpoints
        with pytest.raises(ValueError, match=what):
            resolve_pretrained(path)
