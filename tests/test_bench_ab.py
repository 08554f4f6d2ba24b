"""The revision A/B benchmark (``python benchmarks/measure.py --against``/``--tracked``): its statistics and flagging on
synthetic timings with known changes, the tracked file, the command's refusals, and one smoke run of two tiny
cells against HEAD (worker processes, a temporary worktree)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coupled_qk.cli import main
from coupled_qk.experiments.bench.machine import machine_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ab  # noqa: E402  (benchmarks/measure.py: the command)
import ab_measure as measure  # noqa: E402
from ab_tracked import accepted_state, load_tracked, settings_of, write_tracked  # noqa: E402

CELL = "decode-eager-b1"


def synthetic(n=15, change=1.0, standard_change=1.0, noise=0.02, drift=0.2, seed=0, old_variants=None) -> dict:
    """An A/B result of one cell: standard ~1 ms and coupled 1.10x of it in the old revision; the new revision's
    standard times ``standard_change`` and coupled's ratio ``change`` of those. Every repeat shares a machine
    drift (lognormal, ``drift``) between the two revisions and variants, plus independent ``noise`` per call."""
    rng = np.random.default_rng(seed)
    machine = rng.lognormal(0.0, drift, n)

    def call(mean):
        return list(mean * machine * rng.lognormal(0.0, noise, n))

    old = {"standard": call(1e-3), "coupled": call(1.1e-3)}
    new = {"standard": call(1e-3 * standard_change), "coupled": call(1.1e-3 * standard_change * change)}
    if old_variants is not None:
        old = {v: t for v, t in old.items() if v in old_variants}
    times = {side: {clock: {CELL: t} for clock in ("step", "wall", "cpu")} for side, t in (("old", old), ("new", new))}
    revisions = {
        side: dict(src="/x", commit=c * 40, dirty=False, label=c * 7, unsupported={})
        for side, c in (("old", "a"), ("new", "b"))
    }
    settings = dict(
        preset="tiny",
        base={},
        variants={"standard": {"attention": "standard"}, "coupled": {"attention": "coupled"}},
        cells=[measure.cell_spec(CELL, 128)],
        repeats=n,
        threads=1,
        seed=0,
        clock="step",
        threshold=measure.THRESHOLD,
    )
    return dict(
        settings=settings,
        machine=machine_info(torch.device("cpu")),
        revisions=revisions,
        times=times,
        load=[1.0, 1.0],
        date="2026-01-01 00:00 UTC",
        elapsed_s=1.0,
    )


def verdicts(result) -> dict:
    return {r["variant"]: r["verdict"] for r in measure.compare(result)}


@pytest.mark.parametrize("seed", range(5))
def test_an_unchanged_revision_is_not_flagged_despite_machine_drift(seed):
    assert verdicts(synthetic(seed=seed)) == {"standard": "same", "coupled": "same"}


@pytest.mark.parametrize("seed", range(5))
def test_a_variant_made_slower_is_flagged_and_standard_is_not(seed):
    rows = measure.compare(synthetic(change=1.10, seed=seed))
    assert {r["variant"]: r["verdict"] for r in rows} == {"standard": "same", "coupled": "slower"}
    coupled = next(r for r in rows if r["variant"] == "coupled")
    assert coupled["change"]["low"] <= 1.10 <= coupled["change"]["high"]  # the interval holds the true change
    assert coupled["old"]["median"] == pytest.approx(1.10, abs=0.03)
    assert measure.slower_cells(rows) == [f"{CELL} / coupled"]


def test_a_slowdown_of_every_variant_is_seen_in_standards_own_time():
    """Extra work per decoding step in every model leaves the ratios to standard as they were; standard's row,
    the time of the two revisions paired per repeat, flags it."""
    assert verdicts(synthetic(standard_change=1.12)) == {"standard": "slower", "coupled": "same"}


def test_faster_and_within_threshold():
    assert verdicts(synthetic(change=0.90))["coupled"] == "faster"
    assert verdicts(synthetic(change=1.015, noise=0.002))["coupled"] == "same"  # real, but under 1 + threshold


def test_too_few_repeats_flag_nothing_and_a_missing_variant_is_not_compared():
    assert verdicts(synthetic(n=5, change=1.5)) == {"standard": "n/a", "coupled": "n/a"}
    rows = measure.compare(synthetic(old_variants=["standard"]))
    coupled = next(r for r in rows if r["variant"] == "coupled")
    assert coupled["old"] is None and coupled["change"] is None and coupled["verdict"] == "n/a"


def test_change_is_paired_per_repeat():
    old = {"standard": [1.0, 2.0], "coupled": [1.1, 2.2]}
    new = {"standard": [2.0, 1.0], "coupled": [2.4, 1.2]}  # the machine swapped speeds, coupled 1.2x of standard
    assert measure.change(old, new, "coupled") == pytest.approx([1.2 / 1.1, 1.2 / 1.1])
    assert measure.change(old, new, "standard") == pytest.approx([2.0, 0.5])


def test_markdown_names_revisions_machine_and_what_got_slower():
    result = synthetic(change=1.10)
    text = measure.ab_markdown(
        result, measure.compare(result), measure.THRESHOLD, "step", accepted={CELL: {"coupled": 1.08}}
    )
    assert "bbbbbbb against aaaaaaa" in text and "- machine:" in text and f"Slower: {CELL} / coupled" in text
    assert "| accepted |" in text and "1.080x" in text
    assert "Ratios to standard at bbbbbbb" in text


def test_cell_names():
    assert measure.cell_spec("train-b8", 64) == dict(name="train-b8", kind="train", batch=8, seq=64)
    spec = measure.cell_spec("decode-compiled-b2", 128)
    assert spec["compiled"] and spec["batch"] == 2 and spec["prompt"] + spec["new_tokens"] == 116
    assert measure.cell_spec("decode-eager-b1", 40)["new_tokens"] == 24  # fits a short context
    for bad in ("decode-b1", "train-b0", "decode-eager", "decode-eager-b1x"):
        with pytest.raises(ValueError, match="unknown cell"):
            measure.cell_spec(bad, 128)
    with pytest.raises(ValueError, match="block_size=8"):
        measure.cell_spec("decode-eager-b1", 8)


def test_an_unknown_revision_is_named():
    with pytest.raises(ValueError, match="--against='no-such-revision' is not a revision"):
        with measure.checkout(measure.this_source().parent, "no-such-revision"):
            pass


def test_refusals(capsys, tmp_path):
    out = ["--out-dir", str(tmp_path)]
    assert ab.main(["--accept", "--against", "HEAD", *out]) == 2
    assert "--accept records the ratios of a --tracked run" in capsys.readouterr().err
    for neither_or_both in ([], ["--against", "HEAD", "--tracked"]):
        assert ab.main([*neither_or_both, *out]) == 2
        assert "give one of --against REV" in capsys.readouterr().err
    assert ab.main(["--against", "HEAD", "--n-steps", "2", *out]) == 2
    assert "--n-steps would be ignored" in capsys.readouterr().err
    assert ab.main(["--against", "HEAD", "--cells", "decode-eager-b1,nope", *out]) == 2
    assert "--cells=decode-eager-b1,nope: unknown cell 'nope'" in capsys.readouterr().err
    tracked = tmp_path / "tracked.json"
    write_tracked(tracked, tracked_file())
    assert ab.main(["--tracked", str(tracked), "--variants", "coupled", *out]) == 2
    assert "--variants=coupled does not apply with --tracked" in capsys.readouterr().err
    assert not any(p.name != "tracked.json" for p in tmp_path.iterdir())  # refused before anything was written
    assert main(["bench", "--against", "HEAD", *out]) == 2  # the library's bench has no revision A/B
    assert "unrecognized arguments: --against HEAD" in capsys.readouterr().err


def tracked_file(**changes) -> dict:
    data = dict(
        revision="HEAD",
        preset="tiny",
        variants=["standard", "coupled"],
        cells=["decode-eager-b1"],
        threads=1,
        clock="step",
        threshold=0.03,
        repeats=9,
        accepted={CELL: {"standard": {"median": 1.2}, "coupled": {"median": 1.07}}},
    )
    return {**data, **changes}


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(clock="sundial"), "clock 'sundial'"),
        (dict(variants=["coupled"]), "lack 'standard'"),
        (dict(cells=["decode-b1"]), "unknown cell"),
        (dict(repeats=3), "repeats 3"),
        (dict(threshold=1.5), "threshold 1.5"),
        (dict(preset="huge"), "preset 'huge'"),
    ],
)
def test_a_broken_tracked_file_is_refused_naming_the_field(tmp_path, changes, message):
    path = tmp_path / "t.json"
    write_tracked(path, tracked_file(**changes))
    with pytest.raises(ValueError, match=message):
        load_tracked(path)
    path.write_text(json.dumps({k: v for k, v in tracked_file().items() if k != "accepted"}))
    with pytest.raises(ValueError, match=r"missing field\(s\) \['accepted'\]"):
        load_tracked(path)


def test_tracked_runs_the_files_cells_against_its_revision_and_accept_records_them(tmp_path, monkeypatch):
    path = tmp_path / "tracked.json"
    write_tracked(path, tracked_file(revision="abc1234"))
    seen = {}

    def fake_run_ab(against, settings, log=None, accept=False):
        seen.update(against=against, settings=settings, accept=accept)
        result = synthetic(change=1.10)
        result["settings"] = {**result["settings"], **settings}
        return result

    monkeypatch.setattr(ab, "run_ab", fake_run_ab)
    assert ab.main(["--tracked", str(path), "--repeats", "11", "--out-dir", str(tmp_path / "o")]) == 1
    assert seen["against"] == "abc1234" and seen["settings"]["repeats"] == 11 and not seen["accept"]
    assert [c["name"] for c in seen["settings"]["cells"]] == ["decode-eager-b1"]
    assert "Slower: decode-eager-b1 / coupled" in (tmp_path / "o" / "tracked-tiny-cpu.md").read_text()
    repeats = load_tracked(path)["repeats"]
    assert ab.main(["--tracked", str(path), "--accept", "--repeats", "7", "--out-dir", str(tmp_path / "p")]) == 0
    saved = load_tracked(path)
    assert saved["revision"] == "b" * 40 and seen["accept"] and seen["settings"]["repeats"] == 7
    assert saved["repeats"] == repeats != 7  # one run's --repeats does not become the file's setting
    assert saved["accepted"][CELL]["coupled"]["median"] == pytest.approx(1.21, abs=0.04)


def test_accept_refuses_uncommitted_changes():
    result = synthetic()
    result["revisions"]["new"].update(dirty=True, label="bbbbbbb+changes")
    with pytest.raises(ValueError, match="uncommitted changes"):
        accepted_state(result, measure.compare(result))


def test_an_accepted_state_round_trips(tmp_path):
    result = synthetic(change=1.10)
    state = accepted_state(result, measure.compare(result))
    assert state["revision"] == "b" * 40 and state["cells"] == [CELL] and state["variants"] == ["standard", "coupled"]
    assert state["accepted"][CELL]["standard"]["median"] == pytest.approx(1.0, abs=0.1)  # ms
    assert state["accepted"][CELL]["coupled"]["median"] == pytest.approx(1.21, abs=0.04)
    write_tracked(tmp_path / "t.json", state)
    settings = settings_of(load_tracked(tmp_path / "t.json"))
    assert settings["variants"] == {
        "standard": {"attention": "standard"},
        "coupled": {"attention": "coupled", "integrator": "euler"},
    }
    assert settings["repeats"] == 15 and settings["clock"] == "step" and settings["cells"][0]["name"] == CELL


def test_smoke_two_tiny_cells_against_head(monkeypatch):
    """Both revisions' workers build, warm up and time both cells; the run's temporary worktree is gone afterwards
    (its own: another run's, or one left by a ``kill -9``, may exist beside it)."""
    src = measure.this_source()
    trees, checkout = [], measure.checkout

    @contextlib.contextmanager
    def recorded(*args, **kwargs):
        with checkout(*args, **kwargs) as old:
            trees.append(old.parent)
            yield old

    monkeypatch.setattr(measure, "checkout", recorded)
    settings = dict(
        preset="tiny",
        base=dict(vocab_size=64, block_size=32, n_layer=1, d_model=16, n_heads=2),
        variants={"standard": {"attention": "standard"}, "coupled": {"attention": "coupled", "integrator": "euler"}},
        cells=[measure.cell_spec("decode-eager-b1", 32), measure.cell_spec("train-b2", 32)],
        repeats=1,
        threads=1,
        seed=0,
        clock="step",
        threshold=measure.THRESHOLD,
    )
    result = measure.run_ab("HEAD", settings)
    for side in ("old", "new"):
        for clock in ("step", "wall", "cpu"):
            for cell in ("decode-eager-b1", "train-b2"):
                times = result["times"][side][clock][cell]
                assert set(times) == {"standard", "coupled"} and all(len(t) == 1 and t[0] > 0 for t in times.values())
        train = result["times"][side]
        # a train cell's step clock is the fastest of the repeat's steps, its first (the wall clock) included
        assert all(s[0] <= w[0] for s, w in zip(train["step"]["train-b2"].values(), train["wall"]["train-b2"].values()))
    assert result["revisions"]["new"]["src"] == str(src)
    assert {r["verdict"] for r in measure.compare(result)} == {"n/a"}  # one repeat: no interval, nothing flagged
    worktrees = subprocess.run(["git", "-C", str(src), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(trees) == 1 and str(trees[0]) not in worktrees and not trees[0].exists()


def test_the_committed_tracked_file_loads():
    path = measure.this_source().parent / "benchmarks" / "tracked.json"
    if not path.is_file():
        pytest.skip("no benchmarks/tracked.json next to this source tree (an installed copy)")
    settings = settings_of(load_tracked(path))
    assert "standard" in settings["variants"] and settings["repeats"] >= 6
