"""Bad input to the studies' command line and the record reader: one line naming the argument or file, exit code
2, no traceback, nothing trained or written (fast: no run is trained)."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.studies import get_study
from coupled_qk.study.grid import best_loss
from coupled_qk.study.verify import read_record

CELL = "toy-converged-main"


def _claims(capsys, *args) -> tuple[int, str]:
    from coupled_qk.cli import main

    try:
        code = main(["claims", *args])
    except SystemExit as exc:  # argparse's own type errors
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--shard", "1/2"], "--shard does not apply to the converged protocol"),
        (["--shard", "banana"], "--shard does not apply to the converged protocol"),
        (["--defer-wt2"], "--defer-wt2 does not apply to the converged protocol"),
    ],
)
@pytest.mark.parametrize("plan", [True, False])
def test_flags_a_converged_protocol_would_ignore_are_refused(tmp_path, capsys, extra, message, plan):
    code, err = _claims(
        capsys,
        "--protocol",
        "toy-converged",
        "--out-dir",
        str(tmp_path / "out"),
        "--run-root",
        str(tmp_path / "runs"),
        *(["--plan"] if plan else []),
        *extra,
    )
    assert code == 2 and message in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("protocol", ["toy-converged", "smoke"])
@pytest.mark.parametrize(
    "mode, extra",
    [
        ("--plan", ["--report-only"]),
        ("--plan", ["--max-runs", "1"]),
        ("--plan", ["--commit-records"]),
        ("--report-only", ["--max-runs", "2"]),
        ("--report-only", ["--commit-records"]),
    ],
)
def test_training_flags_with_a_mode_that_trains_nothing_are_refused(tmp_path, capsys, protocol, mode, extra):
    code, err = _claims(
        capsys,
        "--protocol",
        protocol,
        "--out-dir",
        str(tmp_path / "out"),
        "--run-root",
        str(tmp_path / "runs"),
        mode,
        *extra,
    )
    assert code == 2 and f"{mode} trains nothing; {extra[0]}" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("report_only", [True, False])
def test_an_out_dir_that_is_a_file_is_refused_before_any_run(tmp_path, capsys, report_only):
    """It used to train the first run (minutes to hours) and then fail writing its record ("Not a directory")."""
    (tmp_path / "afile").write_text("x")
    code, err = _claims(
        capsys,
        "--protocol",
        "toy-converged",
        "--out-dir",
        str(tmp_path / "afile"),
        "--run-root",
        str(tmp_path / "runs"),
        "--cache-dir",
        str(tmp_path / "cache"),
        *(["--report-only"] if report_only else ["--max-runs", "1"]),
    )
    assert code == 2 and "--out-dir=" in err and "is a file; expected a folder" in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _record(**fields) -> dict:
    return {"protocol": "toy-converged", "cell": CELL, "variant": "coupled", "seed": 1, "final": {}, **fields}


@given(
    st.sampled_from(["protocol", "cell", "variant", "seed", "final"]),
    st.sampled_from([None, "", 3, -1, 1.0, True, [], ["a"], {}, "x"]),
)
def test_a_record_field_of_the_wrong_kind_is_named_by_verify(tmp_path_factory, key, value):
    good = {"protocol": str, "cell": str, "variant": str, "final": dict}
    if (key == "seed" and type(value) is int and value >= 0) or (key in good and type(value) is good[key] and value):
        return  # a well-formed value
    if key == "final" and value == {}:
        return
    path = tmp_path_factory.mktemp("v") / "out" / "runs" / "toy-converged" / CELL / "coupled" / "seed1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record(**{key: value})))
    with pytest.raises(ValueError, match=f"is not a run record: {key}="):
        read_record(path)


def test_a_malformed_record_beside_others_is_named_not_a_traceback(tmp_path, capsys):
    runs = tmp_path / "out" / "runs" / "toy-converged" / CELL
    (runs / "coupled").mkdir(parents=True)
    (runs / "coupled" / "seed1.json").write_text(json.dumps({"protocol": "toy-converged"}))
    with pytest.raises(ValueError, match=r"coupled/seed1\.json is not a run record \(it lacks \['cell'"):
        get_study("toy-converged").read(tmp_path / "out")
    code, err = _claims(
        capsys, "--protocol", "toy-converged", "--out-dir", str(tmp_path / "out"), "--report-only", "--no-figures"
    )
    assert code == 2 and "is not a run record" in err and "Traceback" not in err, err


@given(
    st.one_of(
        st.sampled_from([[], 3, "x", None, {}]),
        st.fixed_dictionaries(
            {"cell": st.just("c"), "variant": st.just("v")},
            optional={
                "seed": st.one_of(st.none(), st.booleans(), st.integers(-3, -1), st.floats(0, 5), st.text(max_size=2))
            },
        ),
    )
)
def test_every_record_reader_names_a_file_that_parses_but_is_not_a_record(tmp_path_factory, rec):
    """The kind enters through one function (records.read_record_file, through the one reader, Study.read): the
    report's reading and the runner's name the file; a file that is not JSON is skipped by the runner (which trains
    the run again) and named by the report's reader."""
    out = tmp_path_factory.mktemp("out")
    smoke = get_study("smoke")
    bad = out / "runs" / "smoke" / smoke.cells[0].name / "standard" / "seed0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps(rec))
    for damaged in ("raise", "skip"):
        with pytest.raises(ValueError, match=r"seed0\.json is not a run record"):
            smoke.read(out, damaged=damaged)
    bad.write_text("{not json")  # damaged: the runner trains the run again, a report names the file
    assert smoke.read(out, damaged="skip").counted == {}
    with pytest.raises(ValueError, match=r"seed0\.json is a damaged run record"):
        smoke.read(out)


@pytest.mark.parametrize(
    "rec",
    [
        {},
        {"final": {}},
        {"final": None},
        {"best": {"metric": "valid/loss"}},
        {"best": {"metric": "valid/loss", "value": "5"}},
        {"final": {"valid/loss": None}},
    ],
)
def test_a_record_without_a_validation_loss_has_no_best_loss(rec):
    with pytest.raises(ValueError, match="has no best validation loss"):
        best_loss({"cell": "c", "variant": "v", "seed": 0, **rec})
    assert best_loss({"final": {"valid/loss": 5}}) == 5.0 and math.isclose(
        best_loss({"best": {"metric": "valid/loss", "value": 4.5}, "final": {}}), 4.5
    )


@pytest.mark.parametrize("layout", ["empty", "other corpus"])
def test_the_pubmed_plan_says_its_data_is_missing_and_how_to_point_at_it(tmp_path, capsys, layout):
    data = tmp_path / "data"
    (data / ("wiki-vital" if layout == "other corpus" else "")).mkdir(parents=True, exist_ok=True)
    from coupled_qk.cli import main

    assert (
        main(
            [
                "claims",
                "--protocol",
                "cpu-converged-pubmed",
                "--plan",
                "--data-dir",
                str(data),
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"data: {data}/pubmed/abstracts.txt MISSING (pass --data-dir" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "protocol, record",
    [
        ("cpu-short", "gqa-tiny/coupled/seed0.json"),
        ("cpu-converged", "cpu-converged-main/coupled/seed0.json"),
    ],
)
@pytest.mark.parametrize("damage", ["truncate", "zero", "binary"])
def test_report_only_names_a_damaged_record_instead_of_counting_the_run_as_never_made(
    tmp_path, capsys, protocol, record, damage
):
    """A record cut short (or zeroed, or not UTF-8) was skipped: ``claims --report-only`` exited 0 with a report of
    one run fewer (cpu-short: "152 run records", its GQA comparisons "in progress: 5 of 6 runs"), naming no file.
    Now one line naming the file and what to do; nothing is written."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "docs" / "results" / "claims" / "runs" / protocol
    out = tmp_path / "out"
    shutil.copytree(src, out / "runs" / protocol)
    bad = out / "runs" / protocol / record
    text = bad.read_bytes()
    bad.write_bytes({"truncate": text[:100], "zero": b"", "binary": b"\xff\xfe" + text[2:]}[damage])
    code, err = _claims(capsys, "--protocol", protocol, "--out-dir", str(out), "--report-only", "--no-figures")
    assert code == 2 and f"{bad} is a damaged run record" in err and "Traceback" not in err, err
    assert "restore the file" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in out.iterdir()) == ["runs"]
