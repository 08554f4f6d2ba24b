"""Options that ``eval``, ``analyze``, ``claims`` and ``glue`` would silently ignore in some situation are refused in
one line (their ``_ignored_options`` tables, :mod:`coupled_qk.commands.ignored`). Each table is checked against what
the command actually reads or passes on, with its work mocked (nothing is evaluated, trained or analysed): an option
the table calls ignored is never read in that situation, and one it calls used is."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.cli import build_parser, main
from coupled_qk.commands import analyze, claims, glue, ignored
from coupled_qk.commands import eval as eval_cmd


class Reads(argparse.Namespace):
    """Parsed arguments that record which attributes the command reads."""

    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return object.__getattribute__(self, name)


def _parse(command: str, argv: list[str]) -> Reads:
    return build_parser(command).parse_args([command, *argv], namespace=Reads())


def _refusal(command_module, args) -> str | None:
    try:
        ignored.refuse_ignored_options(args, command_module.add_arguments, command_module._ignored_options())
    except ValueError as e:
        return str(e)
    return None


def _dests(module) -> dict[str, str]:
    return {o: ignored.option_defaults(module.add_arguments)[o][0] for o in module._ignored_options()}


# ------------------------------------------------------------------------------------------------------------- eval


def _eval_outcome(argv, tmp_path, monkeypatch, check=True):
    result = {"tokenizer": "t", "valid": {"perplexity": 2.0, "n_tokens": 3}}
    monkeypatch.setattr("coupled_qk.training.evaluate.evaluate_checkpoint", lambda *a: result)
    if not check:
        monkeypatch.setattr(ignored, "refuse_ignored_options", lambda *a: None)
    target = tmp_path / "old.json"
    target.write_text("old")
    try:
        eval_cmd.run(_parse("eval", ["run", "--splits", "valid", *argv]))
    except ValueError as e:
        return type(e).__name__, str(e).split(" ")[0]
    finally:
        monkeypatch.undo()
    return "written" if target.read_text() != "old" else "kept"


@pytest.mark.parametrize("json_given", [False, True])
def test_eval_overwrite_is_refused_exactly_where_it_changes_nothing(json_given, tmp_path, monkeypatch):
    base = ["--json", str(tmp_path / "old.json")] if json_given else []
    effect = _eval_outcome(base, tmp_path, monkeypatch, check=False) != _eval_outcome(
        [*base, "--overwrite"], tmp_path, monkeypatch, check=False
    )
    assert effect == json_given
    refused = _refusal(eval_cmd, _parse("eval", ["run", *base, "--overwrite"]))
    assert (refused is not None) == (not json_given)
    if refused:
        assert refused.startswith("--overwrite does not apply with no --json")


# ---------------------------------------------------------------------------------------------------------- analyze


def test_analyze_example_map_is_read_only_by_the_figures(tmp_path):
    """What the table rests on: without figures the example maps are never touched."""
    from coupled_qk.analysis.analyze import _write_analysis
    from coupled_qk.output_dir import OutputDir

    class Untouchable:
        def __getattribute__(self, name):
            raise AssertionError("the example maps were read without figures")

    report = {"checkpoints": [], "example": {}}
    try:
        _write_analysis(report, [], Untouchable(), OutputDir(tmp_path / "out"), make_plots=False)
    except (KeyError, TypeError, ValueError):  # an empty report's summary may fail; the examples were not read
        pass


@given(
    st.booleans(),
    st.sampled_from(["cpu", "meta"]),
    st.lists(st.sampled_from(["--example-layer=1", "--example-head=1", "--threads=1"]), unique=True),
)
def test_analyze_refuses_an_option_iff_its_situation_does_not_use_it(no_plots, device, options):
    argv = ["ckpt", *(["--no-plots"] if no_plots else []), *options]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("coupled_qk.training.distributed.pick_device", lambda d: torch.device(device))
        got = _refusal(analyze, _parse("analyze", argv))
    unused = [
        o for o in options if (o.startswith("--example") and no_plots) or (o == "--threads=1" and device != "cpu")
    ]
    assert (got is not None) == bool(unused), (argv, got)
    if got:
        assert any(got.startswith(o) for o in unused)


def test_analyze_passes_the_options_it_keeps(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(
        "coupled_qk.analysis.analyze.analyze_checkpoints",
        lambda *a, **k: seen.update(k) or (_ for _ in ()).throw(KeyboardInterrupt),
    )
    args = _parse(
        "analyze", ["ckpt", "--example-layer=1", "--example-head=1", "--threads=1", "--out-dir", str(tmp_path / "a")]
    )
    with pytest.raises(KeyboardInterrupt):
        analyze.run(args)
    assert (seen["example_layer"], seen["example_head"], seen["threads"], seen["make_plots"]) == (1, 1, 1, True)


# ------------------------------------------------------------------------------------------------------------- glue

TASKS = ["sst2", "cola", "rte", "mrpc"]


@given(
    st.lists(st.sampled_from(TASKS), min_size=1, unique=True), st.lists(st.sampled_from(TASKS), min_size=1, unique=True)
)
def test_glue_per_task_subsets_name_only_fine_tuned_tasks(chosen, subset_tasks):
    seen = {}
    argv = ["glue", "run", "--task", ",".join(chosen), "--max-train-examples", ",".join(f"{t}=5" for t in subset_tasks)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            "coupled_qk.training.run_folder.open_run",
            lambda path, *a, **k: SimpleNamespace(folder=SimpleNamespace(glue_dir=f"{path}/glue")),
        )
        mp.setattr("coupled_qk.output_dir.OutputDir", lambda *a, **k: "out")
        mp.setattr(
            "coupled_qk.experiments.glue.finetune.run_glue",
            lambda *a, **k: seen.update(k) or (_ for _ in ()).throw(KeyboardInterrupt),
        )
        try:
            glue.run(build_parser("glue").parse_args(argv))
            refused = None
        except ValueError as e:
            refused = str(e)
        except KeyboardInterrupt:
            refused = None
    assert (refused is not None) == (not set(subset_tasks) <= set(chosen)), (argv, refused)
    if refused is None:  # every task=N pair reaches a task that is fine-tuned (run_glue reads it per task)
        assert set(seen["max_train_examples"]) <= set(chosen)


# ----------------------------------------------------------------------------------------------------------- claims


def _claims_reads(argv, monkeypatch) -> set[str]:
    """The attributes ``claims`` reads for ``argv`` with the table's check off and every study action mocked (each
    mock reads what the action it replaces reads)."""
    import coupled_qk.commands.study as study_cmd
    import coupled_qk.study.verify as ver

    monkeypatch.setattr(ignored, "refuse_ignored_options", lambda *a: None)
    monkeypatch.setattr(ver, "read_record", lambda p: ({"protocol": args.protocol}, None))
    monkeypatch.setattr(study_cmd, "verify", lambda *a, **k: 0)
    monkeypatch.setattr(study_cmd, "claim_report_dir", lambda *a, **k: None)
    monkeypatch.setattr(
        study_cmd, "train", lambda s, a, *rest: (a.run_root, a.data_dir, a.cache_dir, a.max_runs, a.defer_wt2)
    )
    monkeypatch.setattr(study_cmd, "write", lambda s, out, a, c: (a.glue_json, a.no_figures) and 0)
    args = _parse("claims", argv)
    try:
        claims.run(args)
    finally:
        monkeypatch.undo()
    return args.__dict__["_read"]


@pytest.mark.parametrize(
    "situation",
    [
        ["--protocol", "smoke", "--verify", "r.json"],
        ["--protocol", "smoke"],
        ["--protocol", "toy-converged"],
        ["--protocol", "toy-converged", "--verify", "r.json"],
    ],
)
def test_claims_table_matches_what_each_situation_reads(situation, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    situation = [*situation, "--run-root", str(tmp_path / "runs"), "--data-dir", str(tmp_path)]
    reads = _claims_reads(situation, monkeypatch)
    args = _parse("claims", situation)
    for option, dest in _dests(claims).items():
        used = all(rule.when(args) for rule in claims._ignored_options()[option])
        assert (dest in reads) == used, f"{option} in {situation}: read={dest in reads}, table says used={used}"


def test_claims_refusals_are_one_line(tmp_path, capsys):
    assert main(["claims", "--protocol", "smoke", "--tolerance", "0", "--plan"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "coupled-qk claims: error: --tolerance=0.0 does not apply with no --verify (nothing is re-trained to "
        "compare with a record): --tolerance is for --verify's comparison"
    ]
    assert main(["claims", "--protocol", "toy-converged", "--verify", "r.json", "--out-dir", str(tmp_path)]) == 2
    assert "--out-dir=" in capsys.readouterr().err
    assert main(["claims", "--protocol", "toy-converged", "--overwrite", "--plan"]) == 2
    assert "--overwrite does not apply with a converged --protocol" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_eval_refusal_is_one_line(capsys):
    assert main(["eval", "no-run", "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "coupled-qk eval: error: --overwrite does not apply with no --json (eval writes no file without "
        "it): --overwrite is for replacing an existing --json file"
    ]
