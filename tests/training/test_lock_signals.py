"""A signal before the training loop's own handler (while the task is built: the corpus tokenised) leaves no
stale ``.lock``: the lock releases itself on SIGTERM/SIGHUP/SIGINT from the moment it is taken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, sys, time
from coupled_qk.training import loop
from coupled_qk.training.config import TrainConfig

def slow_task(cfg, run_dir, runtime):  # stands for a long tokenisation, before the loop's signal handler
    print("building the task", flush=True)
    time.sleep(120)

loop._build_task = slow_task
loop.train(TrainConfig.from_dict(json.loads(sys.argv[1])))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_while_the_task_is_built_leaves_no_stale_lock(tiny_cfg, signum):
    cfg = tiny_cfg()
    run = Path(cfg.out_dir)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg.to_dict())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "building the task", child.stderr.read()
        assert (run / ".lock").is_file()  # held while the task is built
        child.send_signal(signum)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signum  # still ended by the signal (the exit status a shell or torchrun sees)
    assert not (run / ".lock").exists()


def test_the_default_signal_actions_are_back_once_the_lock_is_released(tmp_path):
    from coupled_qk.training.run_folder import RunFolder

    # the default actions for the test (a test runner may have installed handlers), restored afterwards
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with RunFolder(tmp_path / "a").lock(), RunFolder(tmp_path / "b").lock():
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        assert not (tmp_path / "a" / ".lock").exists()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
