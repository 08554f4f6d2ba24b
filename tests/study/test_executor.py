"""The executor of training runs: plan order, reuse only with the same settings, resume, time guard, reports, and
the dry run that says what it would do (the same checks, locks seen)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from coupled_qk.study.executor import (
    RESULT_NEUTRAL_FIELDS,
    PlannedRun,
    Report,
    check_reusable,
    execute,
    plan_lines,
    planned_state,
    run_experiment,
    setting_differences,
    write_report,
)
from coupled_qk.training.config import TrainConfig, saved_value
from coupled_qk.training.run_folder import RunFolder
from coupled_qk.training.tasks import TASK_FIELDS, TASKS, unread_fields


def _cfg(tmp_path, name, **kw):
    return TrainConfig(max_steps=4, out_dir=str(tmp_path / name), **kw)


class FakeTrain:
    """Writes what train() writes at the end (results.json with the config) and records each call."""

    def __init__(self, stop_reason="completed", sleep=0.0, checkpoint=False, train_seconds=0.0):
        self.calls, self.stop_reason, self.sleep, self.checkpoint = [], stop_reason, sleep, checkpoint
        self.train_seconds = train_seconds

    def __call__(self, cfg):
        self.calls.append(cfg)
        time.sleep(self.sleep)
        run = RunFolder(cfg.out_dir)
        results = {
            "config": cfg.to_dict(),
            "final": {"valid/loss": float(cfg.seed)},
            "steps": cfg.max_steps,
            "stop_reason": self.stop_reason,
            "train_seconds": self.train_seconds,
        }
        if self.checkpoint:
            run.path.mkdir(parents=True, exist_ok=True)
            run.latest_path.write_text("ckpt-00000001\n")
        run.write_results(results)
        return results


def test_runs_then_reuses_in_plan_order(tmp_path):
    plan = [PlannedRun(_cfg(tmp_path, f"s{s}", seed=s), f"seed {s}", {"seed": s}) for s in (2, 0, 1)]
    train = FakeTrain()
    lines = []
    records = execute(plan, train_fn=train, log=lines.append)
    assert [c.seed for c in train.calls] == [2, 0, 1] and all(c.resume is False for c in train.calls)
    assert [r.status for r in records] == ["ran"] * 3 and [r.keys["seed"] for r in records] == [2, 0, 1]
    assert [r.final["valid/loss"] for r in records] == [2.0, 0.0, 1.0] and all(r.finished for r in records)
    assert lines[0] == f"== seed 2 -> {tmp_path / 's2'}"
    # the same plan again trains nothing; a result-neutral change (device, out_dir moves, ...) still reuses
    moved = [PlannedRun(dataclasses.replace(r.config, device="cpu", progress=False), r.label, r.keys) for r in plan]
    again = execute(moved, train_fn=train, log=lines.append)
    assert len(train.calls) == 3 and [r.status for r in again] == ["reused"] * 3 and again[0].seconds is None
    assert lines[-1] == f"== seed 1: reusing the finished run in {tmp_path / 's1'}"
    # any other setting is refused before a single run is trained, naming the field and both values
    changed = [PlannedRun(dataclasses.replace(r.config, lr=5e-3), r.label) for r in plan]
    with pytest.raises(ValueError, match=r"s2 holds a finished run with different settings \(lr: 0.001 vs 0.005\)"):
        execute(changed, train_fn=train, log=lines.append)
    assert len(train.calls) == 3


def test_a_run_saved_with_the_old_field_name_dynamics_position_is_reused(tmp_path):
    """GPTConfig.dynamics_position became map_position: a finished run that stored the old name in its model
    overrides has the same settings as a plan using the new name (read with a DeprecationWarning)."""
    planned = _cfg(tmp_path, "a", model={"attention": "coupled", "map_position": "post_rope"})
    saved = planned.to_dict()
    saved["model"] = {"attention": "coupled", "dynamics_position": "post_rope"}
    with pytest.warns(DeprecationWarning, match="map_position"):
        assert setting_differences(saved, planned) == {}
    saved["model"] = {"attention": "coupled", "dynamics_position": "pre_rope"}
    with pytest.warns(DeprecationWarning):
        assert set(setting_differences(saved, planned)) == {"model"}


def test_setting_differences_ignore_only_result_neutral_fields(tmp_path):
    base = _cfg(tmp_path, "a", task_options={"split_seed": 1})
    saved = base.to_dict()
    for name in RESULT_NEUTRAL_FIELDS:
        saved[name] = "something else"
    saved["task_options"] = {"split_seed": 1, "cache_dir": "/elsewhere"}
    assert setting_differences(saved, base) == {}
    saved["task_options"] = {"split_seed": 2}
    saved["max_steps"] = 5
    assert setting_differences(saved, base) == {
        "task_options": ({"split_seed": 2}, {"split_seed": 1}),
        "max_steps": (5, 4),
    }
    with pytest.raises(ValueError, match="max_steps: 5 vs 4"):
        check_reusable(saved, base, "here")
    assert "max_steps" not in RESULT_NEUTRAL_FIELDS and "seed" not in RESULT_NEUTRAL_FIELDS


def test_resume_and_partial_folders(tmp_path):
    resumable = RunFolder(tmp_path / "resumable")
    resumable.path.mkdir()
    resumable.latest_path.write_text("ckpt-00000002\n")
    (resumable.path / "metrics.jsonl").write_text('{"step": 1}\n')
    partial = RunFolder(tmp_path / "partial")
    partial.path.mkdir()
    (partial.path / "config.json").write_text("{}")
    (partial.path / "mine.txt").write_text("user file")
    train = FakeTrain()
    execute(
        [PlannedRun(_cfg(tmp_path, "resumable"), "r"), PlannedRun(_cfg(tmp_path, "partial"), "p")],
        train_fn=train,
        log=lambda s: None,
    )
    assert [c.resume for c in train.calls] == [True, False]
    assert (resumable.path / "metrics.jsonl").is_file()  # a resumed run keeps its files
    assert sorted(p.name for p in partial.path.iterdir()) == ["mine.txt", "results.json"]
    with pytest.raises(ValueError, match="uses a run folder twice"):
        execute([PlannedRun(_cfg(tmp_path, "x"), "a"), PlannedRun(_cfg(tmp_path, "x"), "b")], train_fn=train)


def test_time_guard_interrupts_and_skips(tmp_path):
    plan = [PlannedRun(_cfg(tmp_path, f"r{i}"), f"r{i}") for i in range(3)]
    train = FakeTrain(stop_reason="max_minutes", sleep=1.3, checkpoint=True)
    lines = []
    records = execute(plan, train_fn=train, log=lines.append, max_minutes=0.02, describe=lambda r: r.status)
    assert [r.status for r in records] == ["interrupted", "skipped", "skipped"]
    assert 0 < train.calls[0].max_minutes <= 0.02 and records[1].results == {} and records[1].seconds == 0.0
    first = RunFolder(tmp_path / "r0")
    assert not first.is_finished() and first.interrupted_results_path.is_file() and first.has_checkpoint()
    assert lines[-2:] == ["== r2: skipped (--max-minutes 0.02 reached)", "skipped"]
    # the next invocation resumes the interrupted run, with the time it already trained added to its budget
    (first.path / "ckpt-00000002").mkdir()
    first.latest_path.write_text("ckpt-00000002\n")
    (first.path / "ckpt-00000002" / "state.json").write_text(json.dumps({"step": 2, "train_seconds": 60.0}))
    train2 = FakeTrain(stop_reason="completed")
    records = execute(plan[:1], train_fn=train2, log=lines.append, max_minutes=0.5)
    assert records[0].status == "ran" and train2.calls[0].resume is True
    assert 1.0 < train2.calls[0].max_minutes <= 1.5  # 1 minute already trained + at most 0.5 left
    with pytest.raises(ValueError, match="max_minutes=0"):
        execute(plan, train_fn=train2, max_minutes=0)


@pytest.mark.parametrize(
    "stopped_by, trained_s, planned, status",
    [
        ("stop_after_steps", 1.0, dict(), "ran"),  # a stopping point, not a setting: continued
        ("stop_after_steps", 1.0, dict(stop_after_steps=1), "ran"),  # each invocation advances by as many steps
        ("stop_after_steps", 1.0, dict(stop_after_steps=7), "ran"),
        ("max_minutes", 1.2, dict(), "ran"),  # no time limit now: finish it
        ("max_minutes", 1.2, dict(max_minutes=0.5), "ran"),  # more time than it trained
        ("max_minutes", 1.2, dict(max_minutes=0.02), "reused"),  # the same limit, already spent: as it is
        ("completed", 1.0, dict(stop_after_steps=3), "reused"),  # finished: the stopping point changes nothing
        ("patience", 1.0, dict(), "reused"),  # the run's own rule ended it
    ],
)
def test_a_run_stopped_early_is_continued_unless_the_plan_stops_it_there(
    tmp_path, stopped_by, trained_s, planned, status
):
    """`compare --max-minutes` then `compare` reused the cut-short runs, and a folder made with --stop-after-steps 1
    was "a finished run with different settings (stop_after_steps: 1 vs None)" for ever."""
    first = _cfg(
        tmp_path,
        "r",
        max_minutes=0.02 if stopped_by == "max_minutes" else None,
        stop_after_steps=1 if stopped_by == "stop_after_steps" else None,
    )
    execute(
        [PlannedRun(first, "r")],
        train_fn=FakeTrain(stopped_by, checkpoint=True, train_seconds=trained_s),
        log=lambda s: None,
    )
    train, lines = FakeTrain(checkpoint=True), []
    cfg = dataclasses.replace(first, **{"max_minutes": None, "stop_after_steps": None, **planned})
    seen = []

    def train_and_look(c):  # what the folder holds while the run is being continued
        seen.append(sorted(p.name for p in RunFolder(c.out_dir).path.iterdir()))
        return train(c)

    state = planned_state(PlannedRun(cfg, "r"))  # what a --dry-run says: the runner's decision, nothing moved
    assert state == (
        f"continue (stopped at step 4 by {stopped_by})"
        if status == "ran"
        else f"reuse ({'stopped early by max_minutes' if stopped_by == 'max_minutes' else 'finished'})"
    )
    assert RunFolder(cfg.out_dir).is_finished()
    [record] = execute([PlannedRun(cfg, "r")], train_fn=train_and_look, log=lines.append)
    assert record.status == status, lines
    if status == "ran":
        assert train.calls[0].resume is True and lines[0].startswith(
            f"== r: continuing the run in {tmp_path / 'r'}, stopped at step 4 by {stopped_by}"
        )
        assert "results.json" not in seen[0] and "results.interrupted.json" in seen[0]  # unfinished meanwhile
    else:
        assert not train.calls and record.results["stop_reason"] == stopped_by
        assert lines == [
            f"== r: reusing the {'run stopped early (max_minutes)' if stopped_by == 'max_minutes' else 'finished run'}"
            f" in {tmp_path / 'r'}"
        ]


def test_a_run_stopped_early_without_a_checkpoint_is_reused_as_it_is(tmp_path):
    cfg = _cfg(tmp_path, "r", stop_after_steps=1)
    execute([PlannedRun(cfg, "r")], train_fn=FakeTrain("stop_after_steps"), log=lambda s: None)
    train = FakeTrain()
    [record] = execute(
        [PlannedRun(dataclasses.replace(cfg, stop_after_steps=None), "r")], train_fn=train, log=lambda s: None
    )
    assert record.status == "reused" and not train.calls and record.results["stop_reason"] == "stop_after_steps"


def test_reports_are_written_and_a_missing_plot_library_keeps_the_numbers(tmp_path):
    def broken(path):
        raise ImportError("no matplotlib here")

    lines = []
    written = write_report(
        tmp_path / "out",
        Report(json={"a.json": {"x": 1}}, text={"a.md": "| t |\n"}, plots={"a.png": broken}),
        lines.append,
    )
    assert [p.name for p in written] == ["a.json", "a.md"]
    assert json.loads((tmp_path / "out" / "a.json").read_text()) == {"x": 1}
    assert lines == ["plot a.png skipped: no matplotlib here"]

    plan = [PlannedRun(_cfg(tmp_path, f"s{s}", seed=s), f"s{s}", {"seed": s}) for s in (0, 1)]

    def analyze(records, wall):
        assert wall >= 0
        return Report(json={"summary.json": {"losses": [r.final["valid/loss"] for r in records]}})

    records, report = run_experiment(plan, analyze, tmp_path / "exp", train_fn=FakeTrain(), log=lambda s: None)
    assert json.loads((tmp_path / "exp" / "summary.json").read_text()) == {"losses": [0.0, 1.0]}
    assert report.json["summary.json"]["losses"] == [0.0, 1.0] and len(records) == 2


@pytest.mark.parametrize(
    "text, wrong",
    [
        ("[]", "holds a JSON list"),
        ('{"config": 5}', "its 'config' is a int"),
        ('{"final": []}', "its 'final' is a list"),
    ],
)
def test_a_results_file_of_another_kind_is_named_not_a_traceback(tmp_path, text, wrong):
    """``compare`` (any runner of several runs) over a run whose ``results.json`` parses but is not a run's results
    (``[]``, a ``config`` that is not an object) was ``AttributeError: 'list' object has no attribute 'get'``. Now
    one ``ValueError`` naming the file and what to do; nothing is trained."""
    plan = [PlannedRun(_cfg(tmp_path, "r0"), "r0")]
    execute(plan, train_fn=FakeTrain(), log=lambda s: None)
    results = RunFolder(tmp_path / "r0").results_path
    results.write_text(text)
    train = FakeTrain()
    with pytest.raises(ValueError, match=f"{results} is not a run's results \\({wrong}, expected an object\\): delete"):
        execute(plan, train_fn=train, log=lambda s: None)
    assert train.calls == [] and results.read_text() == text


def test_a_resumed_run_is_announced_with_its_step(tmp_path):
    """`glue`/`compare` after Ctrl-C printed "== label -> folder" as for a new run: nothing said it resumed."""
    cfg = _cfg(tmp_path, "r")
    ckpt = tmp_path / "r" / "ckpt-00000021"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"")
    (tmp_path / "r" / "latest").write_text("ckpt-00000021\n")
    train, lines = FakeTrain(), []
    [record] = execute([PlannedRun(cfg, "r")], train_fn=train, log=lines.append)
    assert train.calls[0].resume is True and record.config.resume is True
    assert lines == [f"== r -> {tmp_path / 'r'} (resuming from its checkpoint at step 21)"]


def test_a_finished_run_in_another_precision_is_refused_naming_both(tmp_path, monkeypatch):
    """dtype auto resolves by machine and --compile (both result-neutral settings): a run trained in fp32 is not
    reused by a plan that would train in bf16 (a compiled run on a CPU with native bf16, faked here)."""
    from coupled_qk.training import distributed

    class PrecisionTrain(FakeTrain):
        def __call__(self, cfg):
            results = super().__call__(cfg)
            results["precision"] = distributed.planned_precision(cfg.device, cfg.dtype, cfg.compile)
            RunFolder(cfg.out_dir).write_results(results)
            return results

    train = PrecisionTrain()
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: False)
    plan = [PlannedRun(_cfg(tmp_path, "a", device="cpu"), "a")]
    execute(plan, train_fn=train, log=lambda m: None)
    assert RunFolder(tmp_path / "a").read_results()["precision"] == "fp32"
    compiled = [PlannedRun(dataclasses.replace(plan[0].config, compile=True), "a")]
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: False)
    assert [r.status for r in execute(compiled, train_fn=train, log=lambda m: None)] == ["reused"]  # no native bf16
    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    with pytest.raises(
        ValueError,
        match=r"trained in fp32 .*this plan trains in bf16 .*compile=True.*the run had "
        r"compile=False",
    ):
        execute(compiled, train_fn=train, log=lambda m: None)
    assert len(train.calls) == 1
    assert planned_state(compiled[0]).startswith("refused: ") and "trained in fp32" in planned_state(compiled[0])
    assert [r.status for r in execute(plan, train_fn=train, log=lambda m: None)] == ["reused"]  # eager: fp32
    assert planned_state(plan[0]) == "reuse (finished)"


def test_the_dry_run_sees_a_run_another_process_trains(tmp_path):
    """A run folder whose lock another process holds is refused by the dry run as by execute(), naming the holder
    (it was "new"); the probe creates nothing and leaves the lock to its holder; a lock file left by a dead process
    is not held."""
    from study_helpers import held_elsewhere

    from coupled_qk.training.lock import RunLockedError

    run = PlannedRun(_cfg(tmp_path, "a"), "a")
    assert planned_state(run) == "new" and not run.run_dir.path.exists()
    with held_elsewhere(run.run_dir.path):
        assert planned_state(run).startswith("refused: being written by pid 4242 on node7")
        other = PlannedRun(_cfg(tmp_path, "b"), "b")
        assert plan_lines([run, other])[-1] == "  2 runs: 1 refused, 1 new"
        with pytest.raises(RunLockedError, match="being written by pid 4242 on node7"):
            execute([run], train_fn=lambda cfg: pytest.fail("trained a run another process writes"), log=lambda s: None)
    assert planned_state(run) == "new" and run.run_dir.holder() is None  # left behind, nobody holds it
    assert sorted(p.name for p in run.run_dir.path.iterdir()) == [".lock"]


def test_results_record_the_precision_and_old_results_fall_back_to_the_dtype():
    from coupled_qk.study.executor import recorded_precision

    assert recorded_precision({"precision": "bf16", "config": {"dtype": "auto"}}) == "bf16"
    assert recorded_precision({"config": {"dtype": "fp16"}}) == "fp16"
    assert recorded_precision({"config": {"dtype": "auto"}}) is None


def test_a_study_folder_of_another_run_is_set_aside_and_a_users_folder_refused(tmp_path, monkeypatch):
    """One "same run?" rule for records and folders: a study's run folder holding a finished run in another
    precision (or with other settings) is renamed aside and kept, so the run is trained again whether or not the
    old folder exists; the executor still refuses such a folder where the user named it (compare's)."""
    from coupled_qk.study.run import set_aside_other_run
    from coupled_qk.training import distributed

    monkeypatch.setattr(distributed, "cpu_supports_bf16", lambda: True)
    cfg = _cfg(tmp_path, "seed0", device="cpu")
    folder = tmp_path / "seed0"
    RunFolder(folder).write_results({"config": cfg.to_dict(), "final": {}, "precision": "fp32"})
    assert set_aside_other_run(folder, cfg) is None  # eager on this CPU: fp32, the same run
    compiled = dataclasses.replace(cfg, compile=True)  # bf16 here
    with pytest.raises(ValueError, match="trained in fp32"):
        execute([PlannedRun(compiled, "a")], train_fn=FakeTrain(), log=lambda m: None)
    aside = set_aside_other_run(folder, compiled)
    assert aside == tmp_path / "seed0.other-1" and (aside / "results.json").is_file() and not folder.exists()
    RunFolder(folder).write_results({"config": {**cfg.to_dict(), "lr": 9.0}, "final": {}})
    assert set_aside_other_run(folder, cfg) == tmp_path / "seed0.other-2"  # other settings: the next free name


AGREE = """
import os, sys
import torch.distributed as dist
from coupled_qk.study.executor import agreed_holder
from coupled_qk.training.run_folder import RunFolder

dist.init_process_group("gloo")
run = RunFolder(sys.argv[1])
lock = run.lock()
if dist.get_rank() == 0:
    lock.acquire()  # rank 0 trains the run: its lock, not another process's
dist.barrier()
print("own:", agreed_holder(run), flush=True)
dist.barrier()
lock.release()  # removes .lock
dist.barrier()
print("released", flush=True)
input()  # the test holds the lock now, as another process
print("other:", agreed_holder(run), flush=True)
dist.destroy_process_group()
"""


def test_the_ranks_of_a_torchrun_group_agree_on_who_writes_a_run(tmp_path):
    """Under torchrun rank 0 alone takes a run's lock; a rank asking afterwards saw rank 0 as another writer, left
    the run and deserted rank 0's collectives (a study under torchrun hung). Every rank takes rank 0's answer: none
    while rank 0 holds the lock itself, the other writer when another process holds it."""
    import os
    import socket
    import subprocess
    import sys

    from study_helpers import held_elsewhere

    folder = tmp_path / "run"
    folder.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, str(folder)],
            env={**env, "RANK": str(r)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        assert [p.stdout.readline().strip() for p in ranks] == ["own: None", "own: None"]
        assert [p.stdout.readline().strip() for p in ranks] == ["released", "released"]  # before the test holds it
        with held_elsewhere(folder):
            for p in ranks:
                p.stdin.write("\n")
                p.stdin.flush()
            lines = [p.stdout.readline().strip() for p in ranks]
        assert all(line.startswith("other: pid 4242 on node7") for line in lines), lines
    finally:
        for p in ranks:
            p.communicate(timeout=60)
    assert [p.returncode for p in ranks] == [0, 0]


OTHER_VALUES = {
    "corpus": "pubmed",
    "data_dir": "elsewhere",
    "tokenizer": "gpt2",
    "cache_dir": "elsewhere",
    "eval_batches": 20,
    "full_eval": True,
}
"""A value other than the default for every field of ``TASK_FIELDS``."""


@pytest.mark.parametrize("task", list(TASKS))
def test_the_fingerprint_moves_exactly_with_the_fields_the_reuse_decision_compares(task):
    """One "same run?" rule: for every registered task and every field only some tasks read, a record saved with
    another value of the field is another run for the reuse decision (``setting_differences``) exactly when the
    fingerprint of the settings changes; the fields the task does not read (MQAR's ``eval_batches``, its old
    default 20) change neither, those it reads (a language model's) change both."""
    from coupled_qk.study.records import fingerprint, settings_of

    assert set(OTHER_VALUES) == set(TASK_FIELDS)
    planned = TrainConfig(task=task, max_steps=3)
    for name, value in OTHER_VALUES.items():
        assert getattr(planned, name) != value
        saved = dataclasses.replace(planned)
        object.__setattr__(saved, name, value)  # as a record made by older code or defaults stores it
        same = not setting_differences(settings_of(saved), planned)
        assert same == (fingerprint(saved) == fingerprint(planned)), (task, name)
        if name not in RESULT_NEUTRAL_FIELDS:
            assert same == (name in unread_fields(task)), (task, name)
    assert unread_fields("lm") == frozenset() and "eval_batches" in unread_fields("mqar")


def _other(value):
    """A value a saved config may hold instead of ``value``: another of its kind, or the same number as the other
    numeric kind (``3`` vs ``3.0``: another JSON text), or a tuple for a list."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, dict):
        return {**value, "split_seed": 7}
    if isinstance(value, list):
        return tuple(value)
    return 5  # None: a value where the field was unset


@st.composite
def saved_and_planned(draw):
    """A planned ``TrainConfig`` of any registered task and a config a record may store for it: today's
    settings, those of older code (fields it predates absent, values of the old defaults), or another run's."""
    task = draw(st.sampled_from(sorted(TASKS)))
    model = draw(st.sampled_from([{}, {"attention": "coupled"}, {"attention": "coupled", "map_position": "post_rope"}]))
    planned = TrainConfig(
        task=task,
        max_steps=draw(st.sampled_from([3, 4])),
        lr=draw(st.sampled_from([1e-3, 2e-3])),
        seed=draw(st.integers(0, 2)),
        stop_after_steps=draw(st.sampled_from([None, 2])),
        model=model,
        task_options=draw(st.sampled_from([{}, {"split_seed": 1}])) if task == "lm" else {},
    )
    saved = json.loads(json.dumps(planned.to_dict()))  # as a record stores it
    for name in draw(st.lists(st.sampled_from(sorted(saved)), unique=True, max_size=4)):
        action = draw(st.sampled_from(["drop", "other", "default", "old name"]))
        if action == "drop":
            del saved[name]
        elif action == "other":
            saved[name] = _other(saved[name])
        elif action == "default":
            saved[name] = saved_value({}, name)
        elif name == "model" and "map_position" in saved["model"]:
            saved["model"] = {"attention": "coupled", "dynamics_position": saved["model"]["map_position"]}
    if draw(st.booleans()) and isinstance(saved.get("task_options"), dict):
        saved["task_options"] = {**saved["task_options"], "cache_dir": "elsewhere"}
    return saved, planned


@settings(max_examples=300, deadline=None)
@given(saved_and_planned())
def test_verify_says_same_settings_exactly_when_reuse_would_reuse(pair):
    """For any stored config and planned run, ``--verify``'s fingerprint row (:func:`coupled_qk.study.verify.compare`
    on the stored record and the re-run's) says "equal" exactly when the reuse decision
    (:func:`~coupled_qk.study.records.same_run_problem`) takes the stored run for the planned one: the rule is one."""
    import warnings

    from coupled_qk.study.records import same_run_problem, settings_of
    from coupled_qk.study.verify import compare

    saved, planned = pair
    stored, new = {"config": saved, "final": {}}, {"config": settings_of(planned), "final": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # dynamics_position, read as map_position
        a, b = compare(stored, new)["fields"]["fingerprint"]
        reused = same_run_problem(stored, planned, here=False) is None
    event("the same run" if reused else "another run")
    assert isinstance(a, str) and isinstance(b, str)
    assert (a == b) == reused, (a, b, same_run_problem(stored, planned, here=False))


def test_verify_takes_a_record_written_with_the_old_fingerprint_for_the_same_run():
    """An MQAR record written before the fingerprint left out the fields its task does not read: its ``config`` holds
    ``eval_batches=20`` (the old default) and lacks the fields added since, its ``fingerprint`` string hashes every
    stored setting (the old form). Reuse takes it, so ``--verify`` says its settings are equal; another ``lr`` is
    another run for both."""
    import hashlib

    from coupled_qk.study.records import fingerprint, same_run_problem, settings_of
    from coupled_qk.study.verify import compare, format_comparison

    planned = TrainConfig(task="mqar", max_steps=1000, lr=1e-3, model={"attention": "coupled"})
    config = {k: v for k, v in settings_of(planned).items() if k not in ("full_eval", "best_mode", "min_delta")}
    config["eval_batches"] = 20
    old = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    stored = {"fingerprint": old, "config": config, "final": {"valid/loss": 0.5}}
    new = {"fingerprint": fingerprint(planned), "config": settings_of(planned), "final": {"valid/loss": 0.5}}
    assert old != new["fingerprint"]  # the stored string is of the old form
    assert same_run_problem(stored, planned, here=False) is None
    result = compare(stored, new)
    a, b = result["fields"]["fingerprint"]
    assert a == b == fingerprint(planned)
    result.update(match=True, tolerance=1e-4, record="x")
    assert [line.split()[-1] for line in format_comparison(result).splitlines() if line.startswith("fingerprint")] == [
        "equal"
    ]
    other = {**stored, "config": {**config, "lr": 2e-3}}
    assert same_run_problem(other, planned, here=False) is not None
    assert len(set(compare(other, new)["fields"]["fingerprint"])) == 2


OLD_COMMIT = "b378b51dceae3ec2d17068cd789e3adfec7d4bdf"
NEW_COMMIT = "c4bff33" + "0" * 33
REVISIONS = {  # (the record's git_commit, the re-run's): the code changed, or one side does not know its code
    "other code": (OLD_COMMIT, NEW_COMMIT),
    "record names none": (None, NEW_COMMIT),
    "re-run names none": (OLD_COMMIT, None),
}
FIRST_LOSS = {  # relative change of the re-run's first stored training loss -> the words the note must hold
    "agree": (1e-7, "agree"),
    "differ": (1e-2, "differ"),
    "absent": (None, None),
}


def verify_pair(stored_commit, new_commit, first_change, valid_delta=1e-3) -> tuple[dict, dict]:
    """A stored record and a re-run of the same settings whose valid/loss differs by ``valid_delta``, with the code
    revisions given; the re-run's first stored training loss is the record's times ``1 + first_change`` (no curve
    at all where ``first_change`` is ``None``)."""
    from coupled_qk.study.records import settings_of

    config = settings_of(TrainConfig(task="mqar", max_steps=1000, lr=1e-3, model={"attention": "coupled"}))
    stored = {"config": config, "tokens": 1024000, "steps": 1000, "final": {"valid/loss": 0.19951062965393065}}
    new = {**stored, "final": {"valid/loss": 0.19951062965393065 + valid_delta}}
    if first_change is not None:
        stored["curve"] = {"train": [[51200, 2.5713255405426025], [102400, 1.57]]}
        new["curve"] = {"train": [[51200, 2.5713255405426025 * (1 + first_change)], [102400, 1.2]]}
    for rec, commit in ((stored, stored_commit), (new, new_commit)):
        if commit is not None:
            rec["git_commit"] = commit
    return stored, new


@pytest.mark.parametrize("first", FIRST_LOSS)
@pytest.mark.parametrize("revisions", REVISIONS)
def test_verify_says_a_mismatch_was_re_trained_with_other_code(revisions, first):
    """A mismatch re-trained with another (or an unknown) code revision than the record's keeps its MISMATCH line and
    adds one that names both revisions (7 digits, ``unknown`` where missing) and says the difference may come from
    changes since the record; where both records store a first training loss, the line says whether those agree
    (the same start: rounding amplified) or differ (another start). The revisions never change the match."""
    from coupled_qk.study.verify import compare, format_comparison, is_match

    stored_commit, new_commit = REVISIONS[revisions]
    change, words = FIRST_LOSS[first]
    stored, new = verify_pair(stored_commit, new_commit, change)
    result = compare(stored, new)
    assert result["revision"] == (stored_commit, new_commit)
    assert is_match(result, 1e-4) is False and is_match(result, 2e-3) is True  # decided by valid/loss alone
    result.update(match=False, tolerance=1e-4, record="x")
    lines = format_comparison(result).splitlines()
    shown = [c[:7] if c else "unknown" for c in (stored_commit, new_commit)]
    assert lines[-2].startswith("MISMATCH: valid/loss differs by +0.001 (tolerance 0.0001)")
    assert f"({shown[0]} -> {shown[1]})" in lines[-1] and "not only from a fault" in lines[-1]
    assert [line.split()[2:4] for line in lines if line.startswith("code revision")] == [shown]
    first_rows = [line for line in lines if line.startswith("first train/loss")]
    if words is None:
        assert not first_rows and "training losses" not in lines[-1]
    else:
        a = 2.5713255405426025
        assert f"first stored training losses {words} (at 51200 tokens" in lines[-1]
        stored_loss, new_loss, delta = (float(x) for x in first_rows[0].split()[2:5])
        assert (stored_loss, new_loss) == (pytest.approx(a, rel=1e-9), pytest.approx(a * (1 + change), rel=1e-9))
        assert delta == pytest.approx(a * change, rel=5e-3)  # shown to 3 significant digits
    result.update(match=True)
    assert format_comparison(result).splitlines()[-1].startswith("MATCH")  # a match needs no words on the code


@pytest.mark.parametrize("first", FIRST_LOSS)
def test_verify_of_the_same_code_reads_as_before(first):
    """With the record's own code revision, a mismatch's verdict is the MISMATCH line alone, as before the revisions
    were shown; the revision row says ``equal``."""
    from coupled_qk.study.verify import compare, format_comparison

    stored, new = verify_pair(OLD_COMMIT, OLD_COMMIT, FIRST_LOSS[first][0])
    result = compare(stored, new)
    result.update(match=False, tolerance=1e-4, record="x")
    lines = format_comparison(result).splitlines()
    assert lines[-1] == "MISMATCH: valid/loss differs by +0.001 (tolerance 0.0001); re-run record: x"
    assert [line.split()[2:] for line in lines if line.startswith("code revision")] == [["b378b51", "b378b51", "equal"]]


HOST = {"cpu": "Intel(R) Xeon(R) Processor", "machine": "x86_64", "system": "Linux", "python": "3.11.7",
        "torch": "2.13.0+cpu", "threads": 1}  # fmt: skip
SHA = "7e5de7cc19adb609f2b1771decc6245edaa96a3148145755ac8d74069e499f9c"


@pytest.mark.parametrize("revisions", [*REVISIONS, "same code"])
@pytest.mark.parametrize("weights", ["same", "other", "record names none"])
@pytest.mark.parametrize("hosts", ["same", "other", "record names none"])
def test_verify_reads_the_initial_weights_and_the_host_where_records_store_them(revisions, weights, hosts):
    """Records that store the SHA-256 of their initial weights and their hosts: the table shows both; on a mismatch
    the checksum, where both records have one, says exactly whether the runs started alike (and replaces the
    first-loss reading), and another host is named with the note that bitwise equality was not promised there.
    None of it changes the match."""
    from coupled_qk.study.verify import compare, format_comparison, is_match

    stored_commit, new_commit = REVISIONS.get(revisions, (OLD_COMMIT, OLD_COMMIT))
    stored, new = verify_pair(stored_commit, new_commit, 1e-2)
    new["initial_weights_sha256"] = SHA
    stored["initial_weights_sha256"] = {"same": SHA, "other": "0" + SHA[1:], "record names none": None}[weights]
    new["hosts"] = [HOST]
    stored["hosts"] = {"same": [HOST], "other": [HOST, {**HOST, "threads": 2}], "record names none": None}[hosts]
    result = compare(stored, new)
    assert is_match(result, 1e-4) is False and is_match(result, 2e-3) is True
    result.update(match=False, tolerance=1e-4, record="x")
    lines = format_comparison(result).splitlines()
    verdict = lines.index("MISMATCH: valid/loss differs by +0.001 (tolerance 0.0001); re-run record: x")
    notes, table = " ".join(lines[verdict + 1 :]), lines[:verdict]
    row = [line.split()[3:] for line in table if line.startswith("initial weights (sha256)")]
    assert row == [{"same": [SHA[:12], SHA[:12], "equal"], "other": ["0" + SHA[1:12], SHA[:12], "DIFFERENT"],
                    "record names none": ["unknown", SHA[:12], "unknown"]}[weights]]  # fmt: skip
    shown = "Intel(R) Xeon(R) Processor, torch 2.13.0+cpu, 1 thread"
    host_rows = [line[28:] for line in table if line.startswith("host")]
    assert (
        host_rows
        == {
            "same": [f"{shown} (equal)"],
            "other": [f"{shown[:-8]}2 threads", f"{shown} (other host)"],
            "record names none": ["unknown", f"{shown} (unknown)"],
        }[hosts]
    )
    assert ("bitwise the same (SHA-256)" in notes) == (weights == "same")
    assert ("initial weights differ (SHA-256)" in notes) == (weights == "other")
    first_loss_read = "first stored training losses differ" in notes
    assert first_loss_read == (weights == "record names none" and revisions != "same code")
    assert ("re-trained on another host (record: " + shown[:-8] + "2 threads; re-run: " + shown in notes) == (
        hosts == "other"
    )
    result.update(match=True)
    assert format_comparison(result).splitlines()[-1].startswith("MATCH")
