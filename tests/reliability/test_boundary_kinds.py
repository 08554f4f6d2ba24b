"""Kinds of bad input found by trying the tools as a new user would (docs/RELIABILITY.md, "Found by trying"), each
checked where it enters and held by a generated test: command-line text that is not UTF-8, an allocation larger
than the machine, a GLUE results file of any shape, an MQAR sweep point whose model is invalid, token ids on
another device than the model, claims cells that do not exist.
"""

from __future__ import annotations

import json

import pytest
import reliability_profile  # noqa: F401  (the example budget)
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk import cli
from coupled_qk.cli import main, non_utf8_argument, out_of_memory

NOT_UTF8 = (
    st.binary(min_size=1, max_size=8)
    .filter(lambda b: not _is_utf8(b))
    .map(lambda b: b.decode("utf-8", "surrogateescape"))
)
"""Command-line words as Python receives bytes that are not UTF-8 (lone surrogates)."""


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@given(
    word=NOT_UTF8,
    where=st.sampled_from(["value", "joined", "positional"]),
    command=st.sampled_from(sorted(cli.COMMANDS)),
)
def test_text_that_is_not_utf8_is_one_line_naming_the_option(word, where, command, capsys):
    """Any command, a word that is not UTF-8 as an option value, ``--opt=value`` or a positional: exit 2, one line
    naming it, before parsing (tokenizers, JSON files and reports cannot take it)."""
    argv = {
        "value": [command, "--prompt", word],
        "joined": [command, f"--out-dir={word}"],
        "positional": [command, word],
    }[where]
    assert non_utf8_argument(argv) is not None
    assert main(argv) == 2
    err = _one_line(capsys)
    assert "not valid UTF-8" in err
    assert {"value": "--prompt", "joined": "--out-dir", "positional": "argument 2"}[where] in err


@given(size=st.integers(1, 10**15), kind=st.sampled_from(["cpu", "cuda", "python"]))
def test_an_allocation_failure_is_one_line_saying_what_to_lower(size, kind, monkeypatch, capsys):
    """An allocation the machine cannot hold (torch's CPU or CUDA allocator, or Python's ``MemoryError``), raised
    from any command: exit 2 and one line with the size asked and what to lower; any other RuntimeError keeps its
    traceback (an internal error)."""
    from coupled_qk.commands import describe

    exc = {
        "cpu": RuntimeError(
            f"[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            f"memory: you tried to allocate {size} bytes. Error code 12 (Cannot allocate memory)"
        ),
        "cuda": torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {size % 1000}.00 GiB. GPU 0 has a "
            "total capacity of 79.1 GiB\nmore details"
        ),
        "python": MemoryError(),
    }[kind]

    def run(args):
        raise exc

    monkeypatch.setattr(describe, "run", run)
    assert main(["describe"]) == 2
    err = _one_line(capsys)
    assert "out of memory" in err and "batch size" in err
    assert out_of_memory(RuntimeError("shape mismatch")) is None
    monkeypatch.setattr(describe, "run", lambda args: (_ for _ in ()).throw(RuntimeError("an internal bug")))
    with pytest.raises(RuntimeError, match="internal bug"):
        main(["describe"])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["task", "variant", "seed", "score", "runs", "schema", "models", "x"]), inner, max_size=5
        )
    ),
    max_leaves=12,
)


@given(data=JSON)
def test_a_glue_results_file_of_any_shape_is_read_or_refused_naming_the_option(data, tmp_path_factory):
    """``claims --glue-json FILE`` with any JSON in it: checked rows, or one ``ValueError`` naming ``--glue-json``
    and the file; never a KeyError, TypeError or a row without a finite score."""
    import math

    from coupled_qk.studies.glue_scores import load_glue_rows

    path = tmp_path_factory.mktemp("glue") / "results.json"
    path.write_text(json.dumps(data))
    try:
        rows = load_glue_rows("--glue-json", path)
    except ValueError as exc:
        assert "--glue-json" in str(exc) and "\n" not in str(exc)
        return
    assert all(isinstance(r["seed"], int) and math.isfinite(r["score"]) for r in rows)


@pytest.mark.parametrize(
    "content,expected",
    [(None, "is a folder"), (b"", "not valid JSON"), (b"\xff\xfe", "UTF-8"), (b'{"schema": "other"}', "schema")],
)
def test_glue_results_files_that_cannot_be_read_are_one_line(content, expected, tmp_path):
    from coupled_qk.studies.glue_scores import load_glue_rows

    path = tmp_path / "g.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"--glue-json=.*{expected}"):
        load_glue_rows("--glue-json", path)


@given(
    variant=st.sampled_from(["standard", "coupled", "differential", "uncoupled_mlp", "invertible"]),
    override=st.sampled_from(
        ["", "+n_steps=-1", "+n_steps=2", "+dt_init=nan", "+hidden=0", "+integrator=rk4", "+shared_across_heads=maybe"]
    ),
    d_model=st.integers(1, 130),
)
def test_every_mqar_sweep_point_is_checked_when_planned(variant, override, d_model):
    """``mqar --dry-run`` (and the sweep) builds every point's configuration when it plans, so a variant option out
    of range or a width the heads do not divide is one ValueError naming the point, before any training."""
    from coupled_qk.experiments.mqar.presets import get_preset
    from coupled_qk.experiments.mqar.sweep import plan_sweep, run_config

    preset = get_preset("cpu")
    spec = variant + override
    try:
        plan = plan_sweep(preset, spec, [d_model], [1e-3])
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    for point in plan:  # what was planned builds
        run_config(preset, point.difficulty, point.variant, point.d_model, point.lr, "x")


def test_token_ids_on_another_device_name_idx():
    """``GPT.forward`` and ``GPT.generate`` with ids on another device than the model: a ValueError naming ``idx``
    and the model's device, not torch's message from inside the embedding."""
    from coupled_qk import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=30, block_size=8, n_layer=1, d_model=16, n_heads=2))
    idx = torch.zeros(1, 3, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match=r"idx is on meta but the model is on cpu"):
        model(idx)
    with pytest.raises(ValueError, match=r"idx is on meta but the model is on cpu"):
        model.generate(idx, 2)


@given(cells=st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=3))
def test_claims_cells_are_checked_against_the_protocol(cells, capsys, tmp_path_factory):
    """``claims --cells`` names cells of the protocol, also with ``--report-only`` (where it is refused: nothing
    is trained); an unknown or empty name is one line listing the cells, before any folder is written."""
    out = tmp_path_factory.mktemp("claims") / "report"
    code = main(["claims", "--protocol", "smoke", "--cells", ",".join(cells), "--report-only", "--out-dir", str(out)])
    assert code == 2
    err = _one_line(capsys)
    assert "--cells" in err
    assert not out.exists()


@given(
    which=st.sampled_from(["q", "k"]),
    bad=st.sampled_from([None, [1.0], 3, "q", "meta"]),
    cls=st.sampled_from(["QKDynamics", "QueryMLP", "InvertibleQKCoupling"]),
)
def test_query_key_maps_name_a_non_tensor_or_a_tensor_on_another_device(which, bad, cls):
    """Every query-key map called directly: a non-tensor ``q``/``k`` is a TypeError naming it, a tensor on another
    device a ValueError naming it (not an AttributeError or torch's message from inside a matmul)."""
    import coupled_qk

    module = getattr(coupled_qk, cls)
    m = module(4, 2)
    q = torch.randn(1, 2, 3, 4)
    value = q.to("meta") if bad == "meta" else bad
    args = (value, q) if which == "q" else (q, value)
    with pytest.raises(ValueError if bad == "meta" else TypeError, match=f"^{which} "):
        m(*args)


@given(dt_init=st.one_of(st.floats(min_value=3.5e38, max_value=1e308), st.floats(min_value=-1e308, max_value=-3.5e38)))
def test_a_dt_init_beyond_float32_is_refused_naming_it(dt_init):
    """``dt_init=1e308`` is finite in Python but infinite in the float32 parameter: refused by the config and by
    the module, naming ``dt_init`` (before: torch's overflow RuntimeError)."""
    from coupled_qk import GPTConfig
    from coupled_qk.models.maps.dynamics import QKDynamics
    from coupled_qk.models.maps.query_mlp import QueryMLP

    with pytest.raises(ValueError, match="GPTConfig.qk_map.dt_init"):
        GPTConfig(attention="coupled", qk_map={"dt_init": dt_init})
    for cls in (QKDynamics, QueryMLP):
        with pytest.raises(ValueError, match="dt_init"):
            cls(4, 2, dt_init=dt_init)


@given(
    name=st.sampled_from(["lr", "epochs", "batch_size", "max_train_examples"]),
    value=st.sampled_from([0, 0.0, -1, float("nan"), float("inf"), True, "3"]),
)
def test_glue_finetune_arguments_explicit_zero_is_an_error_not_the_default(name, value):
    """``finetune_config(lr=0)`` used the task's default learning rate (``lr or default``): an explicit zero,
    negative, NaN, inf, bool or string is now one ValueError naming the argument, before the data is read."""
    from coupled_qk.experiments.glue.finetune import finetune_config

    with pytest.raises(ValueError, match=name):
        finetune_config("no-such-run", "sst2", 0, "out", glue_dir="no-such-glue-dir", **{name: value})
