"""Progress reporting: plain log lines without a terminal, silence when switched off."""

import io
from pathlib import Path

import pytest
import torch

from coupled_qk import progress as P


def test_line_progress_prints_plain_lines():
    buf = io.StringIO()
    bar = P.LineProgress(total=4, desc="eval valid", unit="windows", interval=0.0, file=buf)
    bar.set_postfix(loss=2.5)
    for _ in range(4):
        bar.update(1)
    bar.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5 and "\r" not in buf.getvalue()
    assert lines[1].startswith("eval valid: 50% 2/4 windows,") and "loss=2.5" in lines[1]
    assert lines[-1].endswith("(done)") and "100% 4/4" in lines[-1]


def test_modes(monkeypatch, capsys):
    with pytest.raises(ValueError, match="progress mode='loud'"):
        P.set_mode("loud")
    monkeypatch.setitem(P._MODE, "mode", "lines")
    assert isinstance(P.progress(3, "x"), P.LineProgress)
    P.announce("hello")
    assert capsys.readouterr().err == "coupled-qk: hello\n"
    monkeypatch.setitem(P._MODE, "mode", "off")
    assert not isinstance(P.progress(3, "x"), P.LineProgress)
    P.announce("hello")
    assert capsys.readouterr().err == ""


def test_perplexity_reports_progress(monkeypatch, capsys):
    from coupled_qk.training.perplexity import evaluate_perplexity

    monkeypatch.setitem(P._MODE, "mode", "lines")
    monkeypatch.setenv("COUPLED_QK_LOG_INTERVAL", "0")

    class Uniform(torch.nn.Module):  # uniform predictions: perplexity = vocabulary size
        def forward(self, x):
            return torch.zeros(*x.shape, 7)

    model = Uniform()
    res = evaluate_perplexity(model, torch.arange(50) % 7, 8, batch_size=2, desc="eval test")
    assert res["perplexity"] == pytest.approx(7.0)
    err = capsys.readouterr().err
    assert "eval test: 100% 7/7 windows" in err


class _Tty:
    """A stream that claims to be a terminal, backed by a real file descriptor."""

    def __init__(self, fd):
        self.fd = fd

    def isatty(self):
        return True

    def fileno(self):
        return self.fd

    def write(self, text):
        return len(text)

    def flush(self):
        pass


@pytest.mark.skipif(not hasattr(__import__("os"), "openpty"), reason="needs a pseudo-terminal")
def test_terminal_reporting_zero_columns_falls_back_to_lines(monkeypatch):
    import fcntl
    import os
    import struct
    import termios

    master, slave = os.openpty()
    try:
        tty = _Tty(slave)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))  # `stty size` -> 0 0
        assert P.terminal_columns(tty) == 0
        monkeypatch.setattr(P.sys, "stderr", tty)
        monkeypatch.setitem(P._MODE, "mode", "auto")
        assert isinstance(P.progress(3, "x"), P.LineProgress)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a real width: a bar
        assert P.terminal_columns(tty) == 80
        bar = P.progress(3, "x")
        assert not isinstance(bar, P.LineProgress)
        bar.close()
    finally:
        os.close(master)
        os.close(slave)


def test_terminal_columns_of_a_non_terminal_is_zero():
    assert P.terminal_columns(io.StringIO()) == 0  # no file descriptor


def test_a_notice_said_once_per_process_is_said_once(monkeypatch, capsys):
    monkeypatch.setattr(P, "_SAID", set())
    monkeypatch.setitem(P._MODE, "mode", "lines")
    for _ in range(3):
        P.announce("same", once=True)
    P.announce("other", once=True)
    P.announce("same")  # without once: always
    assert capsys.readouterr().err == "coupled-qk: same\ncoupled-qk: other\ncoupled-qk: same\n"


def test_the_tensorboard_notice_and_the_data_line_come_once_per_process(tiny_cfg, monkeypatch, capsys):
    """A demo printed "tensorboard is not installed" and the data line once per run (4 times each)."""
    import sys

    from coupled_qk.training.metrics_log import Logger
    from coupled_qk.training.run_folder import RunFolder
    from coupled_qk.training.tasks.lm import LMTask

    monkeypatch.setattr(P, "_SAID", set())
    monkeypatch.setitem(P._MODE, "mode", "lines")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the import fails as without the package
    for seed in (0, 1, 2):
        cfg = tiny_cfg(seed=seed, tensorboard=True, progress=True, out_dir=str(tiny_cfg().out_dir) + f"-{seed}")
        LMTask(cfg)
        Path(cfg.out_dir).mkdir()
        Logger(RunFolder(cfg.out_dir), cfg, True, 0, 8).close()
    err = capsys.readouterr().err
    assert err.count("tensorboard is not installed") == 1 and "pip install 'coupled-qk[tensorboard]'" in err
    assert err.count("coupled-qk: data: train ") == 1


def test_cli_warnings_are_one_line_and_each_text_once():
    """The runs of a comparison warned the same text once per run (each run's set-up resets Python's registry)."""
    from coupled_qk.cli import _WARNED, _one_line_warning

    _WARNED.discard("coupled-qk: warning: a text seen once\n")
    first = _one_line_warning(UserWarning("a text seen once"), UserWarning, "f.py", 1)
    assert first == "coupled-qk: warning: a text seen once\n"
    assert _one_line_warning(UserWarning("a text seen once"), UserWarning, "g.py", 2) == ""


def test_transformers_bars_follow_the_policy(monkeypatch, capsys):
    """transformers' bars (loading weights) wrote carriage-return lines into logs: now drawn only where coupled-qk
    draws bars."""
    pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    import coupled_qk.hf.registration as registration

    registration.register_config()  # what the first use of AutoConfig does after `import coupled_qk`
    for mode, drawn in (("auto", False), ("lines", False), ("off", False), ("bar", True)):
        monkeypatch.setitem(P._MODE, "mode", mode)
        for _ in hf_logging.tqdm(range(3), desc="Loading weights"):  # stderr is captured: no terminal
            pass
        assert ("Loading weights" in capsys.readouterr().err) == drawn, mode
