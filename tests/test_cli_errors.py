"""Issue 9 items 6-10 and issue 8 item 4 on the command line: typed values, validated ranges, one-line errors
with exit code 2 and no traceback, an untouched run folder after any bad invocation, and generated help."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from coupled_qk.cli import build_parser, main
from coupled_qk.commands.train import train_config_from_args, train_flags
from coupled_qk.training.config import TrainConfig
from tests.conftest import write_corpus


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A finished 6-step run (checkpoint interval 3) and the arguments that made it."""
    root = tmp_path_factory.mktemp("cli")
    corpus = write_corpus(root / "corpus")
    run = root / "run"
    base = [
        "--corpus",
        str(corpus),
        "--tokenizer",
        "bpe-300",
        "--cache-dir",
        str(root / "cache"),
        "--set",
        "n_layer=1",
        "--set",
        "d_model=32",
        "--set",
        "n_heads=2",
        "--set",
        "block_size=16",
        "--batch-size",
        "4",
        "--eval-interval",
        "3",
        "--eval-batches",
        "2",
        "--warmup-steps",
        "2",
        "--max-steps",
        "6",
        "--checkpoint-interval",
        "3",
        "--no-progress",
        "--no-tensorboard",
    ]
    assert main(["train", *base, "--out-dir", str(run)]) == 0
    files = {}
    for name, text in {
        "dir.json": None,
        "bad.json": "{",
        "list.json": "[1, 2]",
        "fast.json": '{"lr": "fast"}',
        "model.json": '{"model": "big"}',
        "mlp.json": '{"model": {"use_mlp": "False"}}',
        "neg.json": '{"batch_size": -4}',
        "unknown.json": '{"learning_rate": 1}',
    }.items():
        files[name] = root / name
        if text is None:
            files[name].mkdir()
        else:
            files[name].write_text(text)
    return {"run": run, "base": base, "files": files, "root": root}


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def one_line_error(capsys) -> str:
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert len(lines) == 1, cap.err
    return lines[0]


def _units(words: list[str]) -> list[tuple[str, list[str]]]:
    """``words`` as (setting, its words): an option with its value (``--set`` per field), or a flag alone."""
    out, i = [], 0
    while i < len(words):
        word = words[i]
        takes_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        unit = words[i : i + 2] if takes_value else [word]
        key = f"--set {unit[1].split('=')[0]}" if word == "--set" and takes_value else word.split("=")[0]
        out.append((key, unit))
        i += len(unit)
    return out


def without(base: list[str], extra: list[str]) -> list[str]:
    """``base`` without the settings that ``extra`` gives again (one setting is given once on a command line)."""
    given = {key for key, _ in _units(extra)}
    return [w for key, unit in _units(base) if key not in given for w in unit]


# every item is (id, extra arguments, expected text of the one-line message)
BAD = [
    ("lr-word", ["--lr", "fast"], "--lr='fast' is not a number"),
    ("lr-inf", ["--lr", "inf"], "--lr=inf must be a finite number"),
    ("lr-nan", ["--lr", "nan"], "must be a finite number"),
    ("lr-neg", ["--lr", "-1"], "--lr=-1.0 must be in (0, inf"),
    ("lr-zero", ["--lr", "0"], "--lr=0.0 must be in (0, inf"),
    ("batch-zero", ["--batch-size", "0"], "--batch-size=0 must be a positive integer"),
    ("batch-frac", ["--batch-size", "2.5"], "--batch-size='2.5' is not an integer"),
    ("batch-word", ["--batch-size", "abc"], "is not an integer"),
    ("accum-neg", ["--grad-accum", "-1"], "--grad-accum=-1"),
    ("steps-zero", ["--max-steps", "0"], "--max-steps=0"),
    ("steps-word", ["--max-steps", "ten"], "--max-steps='ten'"),
    ("tokens-neg", ["--max-tokens", "-5"], "--max-tokens=-5"),
    ("minutes-zero", ["--max-minutes", "0"], "--max-minutes=0.0"),
    ("minutes-inf", ["--max-minutes", "inf"], "--max-minutes=inf"),
    ("beta1-one", ["--beta1", "1.0"], "--beta1=1.0 must be in [0, 1)"),
    ("beta2-neg", ["--beta2", "-0.1"], "--beta2=-0.1"),
    ("min-lr-ratio", ["--min-lr-ratio", "2"], "--min-lr-ratio=2.0 must be in [0, 1]"),
    ("decay-neg", ["--weight-decay", "-0.1"], "--weight-decay=-0.1"),
    ("clip-nan", ["--grad-clip", "nan"], "--grad-clip=nan"),
    ("warmup-neg", ["--warmup-steps", "-1"], "--warmup-steps=-1"),
    ("dtype", ["--dtype", "fp8"], "--dtype='fp8' is unknown"),
    ("task", ["--task", "nope"], "--task='nope' is unknown"),
    ("preset", ["--preset", "huge"], "invalid choice: 'huge'"),
    ("attention", ["--attention", "flash"], "attention='flash'"),
    ("set-type", ["--set", "n_layer=zero"], "n_layer='zero' is not an integer"),
    ("set-unknown", ["--set", "n_head=3"], "unknown GPTConfig field 'n_head' (did you mean 'n_heads'?)"),
    ("set-bool", ["--set", "use_mlp=maybe"], "use_mlp='maybe' is not a boolean"),
    ("set-no-equals", ["--set", "noequals"], "--set 'noequals': expected FIELD=VALUE"),
    ("opt-type", ["--opt", "lr=fast"], "--opt lr='fast' is not a number"),
    ("opt-unknown", ["--opt", "learning_rate=1"], "unknown TrainConfig field 'learning_rate'"),
    ("opt-empty-name", ["--opt", "=3"], "--opt '=3': expected FIELD=VALUE"),
    ("opt-json", ["--opt", "task_options=[1"], "task_options='[1' is not valid JSON"),
    ("config-dir", ["--config", "dir.json"], "is a folder; expected a TrainConfig JSON file"),
    ("config-missing", ["--config", "missing.json"], "does not exist"),
    ("config-bad-json", ["--config", "bad.json"], "is not valid JSON"),
    ("config-list", ["--config", "list.json"], "must hold a JSON object; got list"),
    ("config-lr-word", ["--config", "fast.json"], "lr='fast' is not a number"),
    ("config-model-str", ["--config", "model.json"], "model='big' is not valid JSON"),
    ("config-neg", ["--config", "neg.json"], "batch_size=-4"),
    ("config-unknown", ["--config", "unknown.json"], "unknown TrainConfig field(s) 'learning_rate'; valid fields"),
    ("early-stop-half", ["--early-stop-metric", "valid/accuracy"], "must be given together"),
    ("early-stop-inf", ["--early-stop-metric", "x", "--early-stop-value", "inf"], "--early-stop-value=inf"),
    ("ckpt-minutes-neg", ["--checkpoint-minutes", "-1"], "--checkpoint-minutes=-1.0"),
    ("keep-zero", ["--keep-checkpoints", "0"], "--keep-checkpoints=0"),
    ("seed-neg", ["--seed", "-3"], "--seed=-3"),
    ("budget-change", ["--on-budget-change", "stretch"], "--on-budget-change='stretch' is unknown"),
    ("integrator-standard", ["--integrator", "leapfrog"], "do not apply to attention='standard'"),
    ("n-steps-standard", ["--n-steps", "3"], "['n_steps'] do not apply to attention='standard'"),
    ("bool-value", ["--compile=maybe"], "ignored explicit argument"),
    ("n-steps-word", ["--n-steps", "x"], "--n-steps=x is not an integer"),
    ("unknown-flag", ["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ("int-overflow", ["--eval-interval", "1e400"], "is not an integer"),
    ("no-resume", [], "already holds checkpoints; pass --resume"),
    ("resume-lr", ["--resume", "--lr", "0.5"], "cannot resume"),
    ("resume-model", ["--resume", "--set", "n_layer=2"], "n_layer: checkpoint 1 vs run 2"),
    ("resume-budget", ["--resume", "--max-steps", "12"], "different budget"),
    ("resume-accum", ["--resume", "--grad-accum", "2"], "grad_accum: 1 vs 2"),
    ("resume-batch", ["--resume", "--batch-size", "2"], "global batch of 4 sequences"),
    ("resume-ckpt-dir", ["--resume", "--out-dir", "CKPT"], "is a checkpoint folder inside the run"),
]


@pytest.mark.parametrize("extra, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_invocation_is_one_line_exit_2_and_leaves_the_run_alone(setup, capsys, extra, message):
    run, files = setup["run"], setup["files"]
    extra = [str(files[a]) if a in files else str(run / "ckpt-00000006") if a == "CKPT" else a for a in extra]
    before = snapshot(run)
    capsys.readouterr()
    out = [] if "--out-dir" in extra else ["--out-dir", str(run)]
    assert main(["train", *without(setup["base"], extra), *out, *extra]) == 2
    assert message in one_line_error(capsys)
    assert snapshot(run) == before


def test_fuzz_table_size():
    assert len(BAD) >= 40 and len({b[0] for b in BAD}) == len(BAD)


def test_6_typed_overrides_in_cli_json_and_api(setup):
    args = build_parser("train").parse_args(
        [
            "train",
            "--attention",
            "coupled",
            "--set",
            "use_mlp=False",
            "--set",
            "shared_across_heads=False",
            "--set",
            "n_layer=2",
            "--opt",
            "compile=false",
            "--opt",
            "min_lr_ratio=0.5",
            "--no-tensorboard",
            "--max-minutes",
            "none",
        ]
    )
    cfg = train_config_from_args(args)
    assert cfg.model["use_mlp"] is False and cfg.model["shared_across_heads"] is False and cfg.model["n_layer"] == 2
    assert cfg.compile is False and cfg.min_lr_ratio == 0.5 and cfg.tensorboard is False and cfg.max_minutes is None
    assert cfg.gpt_config().use_mlp is False and cfg.gpt_config().qk_map.shared_across_heads is False
    data = json.loads(setup["files"]["mlp.json"].read_text())
    assert TrainConfig.from_dict({**data, "max_steps": "7"}).model["use_mlp"] is False
    assert TrainConfig(max_steps="7", lr="0.01", compile="yes").max_steps == 7


def test_8_repeated_seeds_are_an_error(setup, capsys):
    assert main(["compare", *setup["base"], "--out-dir", str(setup["root"] / "cmp"), "--seeds", "0,0"]) == 2
    assert "repeats seed(s) [0]" in one_line_error(capsys)
    assert not (setup["root"] / "cmp").exists()


def test_9_write_failures_are_one_line(setup, capsys, monkeypatch):
    import torch

    from coupled_qk.training import checkpoint_format as ckpt

    def full_disk(*a, **k):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
            "data/0: file write failed"
        )

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    out = setup["root"] / "full"
    assert main(["train", *setup["base"], "--out-dir", str(out)]) == 2
    line = one_line_error(capsys)
    assert "cannot write" in line and "MiB free" in line and "PytorchStreamWriter" in line
    assert not list(out.glob(".ckpt-*")) and not (out / "latest").exists()
    monkeypatch.setattr(ckpt.torch, "save", torch.save)

    from coupled_qk.files import atomic_write

    def numpy_full(f):
        raise OSError("90918 requested and 6144 written")

    with pytest.raises(OSError, match=r"cannot write .*tokens\.bin \(90918 requested and 6144 written\); .* MiB free"):
        atomic_write(setup["root"] / "tokens.bin", numpy_full)
    assert not list(setup["root"].glob(".tokens.bin*"))


def test_9_debug_shows_the_traceback(setup):
    with pytest.raises(ValueError, match="lr='fast'"):
        main(["--debug", "train", *setup["base"], "--out-dir", str(setup["root"] / "dbg"), "--lr", "fast"])


def test_8_4_train_help_documents_every_option(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for name in train_flags(resume=True):
        assert "--" + name.replace("_", "-") in text
    assert fields - set(train_flags(resume=True)) == {"preset", "model", "task_options"}
    assert "--preset" in text and "--set FIELD=VALUE" in text and "task_options" in text
    parser = build_parser("train")
    sub = next(a for a in parser._actions if a.dest == "command").choices["train"]
    for action in sub._actions:
        assert action.help and action.help.strip(), action.option_strings
        if action.dest in fields:
            assert "(default: " in action.help, action.option_strings
    assert "--checkpoint-minutes FLOAT|none minutes of training between checkpoints" in text
    assert "(default: 15.0)" in text


def _below_range(field) -> str | None:
    """A value under the field's declared lower bound, as a command-line string (``None``: no lower bound)."""
    lo = field.metadata.get("range", (None, None))[0]
    if lo is None:
        return None
    return str(lo) if field.metadata.get("lo_open") else str(lo - 1)


@pytest.mark.parametrize(
    "name", [f.name for f in dataclasses.fields(TrainConfig) if f.name in train_flags() and _below_range(f) is not None]
)
def test_a_flag_out_of_its_range_is_named_as_the_flag(name, tmp_path, capsys):
    """A range error of a training flag names the flag the user typed (``--max-steps=0``), not the
    ``TrainConfig`` field, before any folder is made; every flag with a declared lower bound, from the
    declarations."""
    field = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    flag = "--" + name.replace("_", "-")
    assert main(["train", f"{flag}={_below_range(field)}", "--out-dir", str(tmp_path / "run")]) == 2
    message = one_line_error(capsys)
    assert f"{flag}=" in message and "TrainConfig" not in message, message
    assert not (tmp_path / "run").exists()
