"""Progress reporting: plain log lines without a terminal, silence when switched off."""

import io

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
