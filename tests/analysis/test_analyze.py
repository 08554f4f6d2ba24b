"""Attention diagnostics of models and checkpoints (coupled_qk.analysis.analyze, plots, ``coupled-qk analyze``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coupled_qk.analysis import attention_stats
from coupled_qk.analysis.analyze import MAP_METRICS, analyze_checkpoints, analyze_model, token_windows
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.models.registry import attention_names, get_attention

ATTENTION_VARIANTS = tuple(attention_names())  # plugins and drop-ins included

B, T = 3, 12


def tiny_gpt(attention: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=61, block_size=16, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2, attention=attention)
    qk_map = get_attention(attention).qk_map
    if qk_map is not None and "dt_init" in qk_map.option_names():
        fields["dt_init"] = 0.3
    fields.update(overrides)
    model = GPT(GPTConfig(**fields)).eval()
    with torch.no_grad():  # distinct per-head dt values, so the reported ones can be told apart
        for block in model.blocks:
            dt = getattr(block.attn.qk_map, "dt", None)
            if dt is not None:
                dt.copy_(torch.linspace(0.05, 0.4, dt.numel()) + 0.01 * block.attn.layer_idx)
    return model


def tokens(vocab: int = 61, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_logits_unchanged_and_flags_restored(attention):
    model = tiny_gpt(attention, dropout=0.1)
    idx = tokens()
    with torch.no_grad():
        before = model(idx)
    n_threads = torch.get_num_threads()
    model.train()  # dropout on: analysis must switch it off and then restore training mode
    state = {k: v.clone() for k, v in model.state_dict().items()}
    analyze_model(model, idx, threads=2)
    assert torch.get_num_threads() == n_threads
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    model.eval()
    with torch.no_grad():
        after = model(idx)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_flags_restored_on_error():
    model = tiny_gpt("coupled")
    model.train()
    with pytest.raises(ValueError, match="token ids"):
        analyze_model(model, torch.full((B, T), 999))
    assert all(m.training for m in model.modules())

    def boom(*args):
        raise RuntimeError("boom")

    handle = model.blocks[1].attn.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            analyze_model(model, tokens())
    finally:
        handle.remove()
    assert all(m.training for m in model.modules())


@pytest.mark.parametrize("attention", ATTENTION_VARIANTS)
def test_per_layer_keys_and_shapes(attention):
    model = tiny_gpt(attention)
    res = analyze_model(model, tokens(), example=(-1, 1), example_tokens=8)
    cfg = model.config
    differential = get_attention(attention).scoring == "differential"
    n_map = cfg.n_heads // 2 if differential else cfg.n_heads
    assert res["n_map_heads"] == n_map and res["n_sequences"] == B and res["seq_len"] == T
    assert len(res["layers"]) == cfg.n_layer
    if differential:
        expected = {f"{p}/{m}" for p in ("a1", "a2") for m in MAP_METRICS}
        expected |= {f"signed/{m}" for m in ("effective_rank", "spectral_gap_ratio", "spectral_gap_relative")}
        maps = {"a1", "a2", "signed"}
    else:
        expected, maps = set(MAP_METRICS), {"attn"}
    qk_map = model.blocks[0].attn.qk_map
    qk = set() if qk_map is None else {"q_update", "k_update"} | ({"dt"} if qk_map.dt is not None else set())
    for layer in res["layers"]:
        assert set(layer["heads"]) == expected
        assert all(len(v) == n_map for v in layer["heads"].values())
        assert set(layer["spectrum"]) == maps
        for spectra in layer["spectrum"].values():
            assert len(spectra) == n_map and all(len(s) == T for s in spectra)
            assert all(s[i] >= s[i + 1] - 1e-12 for s in spectra for i in range(T - 1))
        assert set(layer["qk_heads"]) == qk
        assert all(len(v) == cfg.n_heads for v in layer["qk_heads"].values())
        assert 0 <= layer["rank_collapse_residual"] <= 1
        assert ("lambda" in layer) == differential
        scalars = {"rank_collapse_residual", "rank_collapse_residual_l1inf"} | ({"lambda"} if differential else set())
        assert set(layer["mean"]) == expected | qk | scalars
        for key, values in layer["heads"].items():
            assert layer["mean"][key] == pytest.approx(sum(values) / n_map)
    assert set(res["mean"]) == set(res["layers"][0]["mean"])
    for key in expected:
        base = key.rpartition("/")[2]
        vals = [v for layer in res["layers"] for v in layer["heads"][key]]
        if base in ("normalized_entropy", "sink_mass", "spectral_gap_relative"):
            assert all(0 <= v <= 1 + 1e-9 for v in vals), key
        if base == "effective_rank":
            assert all(1 - 1e-9 <= v <= T + 1e-9 for v in vals), key
    if attention.startswith("uncoupled_mlp"):
        assert all(v == 0 for layer in res["layers"] for v in layer["qk_heads"]["k_update"])
    if attention.startswith("invertible"):  # the v2 coupling is exactly the identity at initialisation
        assert all(v == 0 for layer in res["layers"] for k in qk for v in layer["qk_heads"][k])
    elif get_attention(attention).qk_map is not None:  # a map that is not the identity moves q or k of each head
        for layer in res["layers"]:
            heads = zip(layer["qk_heads"]["q_update"], layer["qk_heads"]["k_update"], strict=True)
            assert all(qu + ku > 0 for qu, ku in heads)
    if attention.startswith(("coupled", "uncoupled_mlp")):  # both move the queries
        assert all(v > 0 for layer in res["layers"] for v in layer["qk_heads"]["q_update"])
    ex = res["example"]
    assert (ex["layer"], ex["head"], ex["tokens"]) == (cfg.n_layer - 1, 1, 8)
    assert set(ex["maps"]) == maps and all(m.shape == (8, 8) for m in ex["maps"].values())
    json.dumps({k: v for k, v in res.items() if k != "example"})  # JSON-ready


@pytest.mark.parametrize("attention", ["standard", "differential"])
def test_map_metrics_match_metrics_module(attention):
    model = tiny_gpt(attention)
    idx = tokens()
    res = analyze_model(model, idx)
    with torch.no_grad():  # layer 1's probabilities, recomputed by the layer itself on a plain forward pass
        x, rope = model.embed(idx)
        x = model.blocks[0](x, rope)
        _, rec = model.blocks[1].attn(model.blocks[1].ln_1(x), rope, record=True)
    if attention == "standard":
        ref = attention_stats.summarize_attention(rec.attn)
        for key in MAP_METRICS:
            torch.testing.assert_close(
                torch.tensor(res["layers"][1]["heads"][key], dtype=torch.float64), ref[key].mean(dim=0)
            )
        torch.testing.assert_close(
            torch.tensor(res["layers"][1]["spectrum"]["attn"], dtype=torch.float64),
            ref["singular_values"].mean(dim=0),
            rtol=1e-5,
            atol=0,
        )
    else:
        ref = attention_stats.summarize_differential_attention(rec.attn, rec.attn2, rec.lam)
        for key in ("a1/entropy", "a2/sink_mass", "signed/effective_rank"):
            torch.testing.assert_close(
                torch.tensor(res["layers"][1]["heads"][key], dtype=torch.float64), ref[key].mean(dim=0)
            )
        assert res["layers"][1]["lambda"] == pytest.approx(float(rec.lam))


@pytest.mark.parametrize("attention", ["coupled", "differential"])
def test_rank_collapse_matches_independent_block_outputs(attention):
    model = tiny_gpt(attention)
    idx = tokens()
    res = analyze_model(model, idx)
    inputs, outs = [], []  # block 0 input and every block output, from a plain (sdpa) forward pass
    handles = [model.blocks[0].register_forward_pre_hook(lambda m, args: inputs.append(args[0]))]
    handles += [b.register_forward_hook(lambda m, args, out: outs.append(out)) for b in model.blocks]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    expected_input = attention_stats.rank_collapse_residual(inputs[0]).mean()
    assert res["rank_collapse_input"]["fro"] == pytest.approx(float(expected_input), rel=1e-10)
    for layer, out in zip(res["layers"], outs):
        assert layer["rank_collapse_residual"] == pytest.approx(
            float(attention_stats.rank_collapse_residual(out).mean()), rel=1e-6
        )
        assert layer["rank_collapse_residual_l1inf"] == pytest.approx(
            float(attention_stats.rank_collapse_residual(out, norm="l1inf").mean()), rel=1e-6
        )


@pytest.mark.parametrize("attention", ["coupled", "uncoupled_mlp", "coupled_differential"])
def test_dt_reported_equals_parameter(attention):
    model = tiny_gpt(attention)
    res = analyze_model(model, tokens())
    for layer, block in zip(res["layers"], model.blocks):
        param = block.attn.qk_map.dt
        assert layer["qk_heads"]["dt"] == param.detach().double().tolist()
        assert layer["mean"]["dt"] == pytest.approx(float(param.detach().double().mean()))


def test_relative_update_post_rope_compares_rotated_states():
    model = tiny_gpt("coupled", map_position="post_rope", dt_init=0.0)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qk_map.dt.zero_()  # dynamics = identity: the update must be exactly 0
    res = analyze_model(model, tokens())
    for layer in res["layers"]:
        assert max(layer["qk_heads"]["q_update"]) < 1e-6 and max(layer["qk_heads"]["k_update"]) < 1e-6


def test_batch_size_and_threads_do_not_change_results():
    model = tiny_gpt("coupled_differential")
    idx = tokens()
    full = analyze_model(model, idx, example=(0, 0))
    chunked = analyze_model(model, idx, batch_size=2, example=(0, 0), threads=1)
    for a, b in zip(full["layers"], chunked["layers"]):
        for key, value in a["mean"].items():
            assert b["mean"][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
    for name, m in full["example"]["maps"].items():
        torch.testing.assert_close(torch.from_numpy(chunked["example"]["maps"][name]), torch.from_numpy(m))


def test_input_errors():
    model = tiny_gpt("standard")
    with pytest.raises(ValueError, match="block_size"):
        analyze_model(model, torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="T >= 2"):
        analyze_model(model, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        analyze_model(model, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="example layer"):
        analyze_model(model, tokens(), example=(5, 0))
    with pytest.raises(ValueError, match="batch_size"):
        analyze_model(model, tokens(), batch_size=0)
    with pytest.raises(TypeError, match="coupled_qk GPT"):
        analyze_model(torch.nn.Linear(2, 2), tokens())


@pytest.mark.parametrize(
    "attention,where",
    [
        ("standard", "blocks.1.attn.qkv.weight"),
        ("coupled", "blocks.0.attn.qk_map.dt"),
        ("differential", "blocks.1.attn.scorer.lambda_q1"),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_parameters_are_named(attention, where, value):
    model = tiny_gpt(attention)
    with torch.no_grad():
        model.get_parameter(where).view(-1)[0] = value
    with pytest.raises(ValueError, match=rf"non-finite \(NaN or inf\) parameters: {re.escape(where)} \(1 of "):
        analyze_model(model, tokens())


@pytest.mark.parametrize("attention", ["standard", "differential", "coupled"])
def test_overflowing_activations_name_the_layer(attention):
    """Finite but huge weights of layer 1's projections: the maps of layer 1 overflow, named as such (it used to
    read 'A must be finite' with neither the layer nor the cause)."""
    model = tiny_gpt(attention)
    with torch.no_grad():
        model.blocks[1].attn.qkv.weight.mul_(1e20)
    with pytest.raises(
        ValueError,
        match=r"^layer 1: the attention maps .*hold NaN or inf although every parameter "
        r"is finite \(the activations overflow in torch.float32",
    ):
        analyze_model(model, tokens())


@pytest.mark.parametrize("example", [(0.7, 0), (1, 1.5), (True, 0), (0, False), ("1", 0), (1, None)])
def test_example_must_be_ints(example):
    """A float layer or head is refused, not truncated to another layer (0.7 used to analyse layer 0)."""
    with pytest.raises(ValueError, match=r"example must be a \(layer, head\) pair of ints"):
        analyze_model(tiny_gpt("standard"), tokens(), example=example)
    res = analyze_model(tiny_gpt("standard"), tokens(), example=(np.int64(1), np.int64(-1)))
    assert (res["example"]["layer"], res["example"]["head"]) == (1, 3)


# ----------------------------------------------------------------------------------------------------------
# checkpoints end to end
# ----------------------------------------------------------------------------------------------------------

_WORDS = (
    "the model attends to earlier tokens and the keys move with the queries while the heads "
    "learn where to look in each sentence of the corpus"
).split()


def _corpus_text() -> str:
    gen = torch.Generator().manual_seed(0)
    docs = []
    for d in range(40):
        lines = []
        for _ in range(4):
            idx = torch.randint(0, len(_WORDS), (12,), generator=gen).tolist()
            lines.append(" ".join(_WORDS[i] for i in idx) + f" {d}.")
        docs.append("\n".join(lines))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from coupled_qk.data.tokenizers import train_bpe
    from coupled_qk.training.run_folder import RunFolder

    root = tmp_path_factory.mktemp("analyze")
    text = _corpus_text()
    corpus = root / "corpus.txt"
    corpus.write_text(text)
    tok = train_bpe(text, 300)
    runs = []
    for name, attention in (("std", "standard"), ("cpl", "coupled")):
        model = tiny_gpt(attention, vocab_size=tok.vocab_size)
        run_dir = root / name
        RunFolder(run_dir).save(model.state_dict(), model.config, None, {"step": 1})
        tok.save(run_dir / "tokenizer")
        runs.append(run_dir)
    return root, corpus, runs, tok


def test_token_windows_match_full_encoding(checkpoints):
    _, corpus, _, tok = checkpoints
    text = corpus.read_text()
    ids = token_windows(text, tok, 2, 5)
    assert ids.shape == (2, 5) and ids.dtype == torch.long
    assert ids.flatten().tolist() == tok.encode(text)[:10]
    with pytest.raises(ValueError, match="only"):
        token_windows(text, tok, 10_000, 16)


@pytest.mark.slow
def test_analyze_checkpoints_end_to_end(checkpoints, tmp_path):
    _, corpus, runs, _ = checkpoints
    out = tmp_path / "report"
    ckpt_dir = sorted(runs[1].glob("ckpt-*"))[0]  # a checkpoint folder works as well as a run folder
    report = analyze_checkpoints(
        [runs[0], ckpt_dir],
        str(corpus),
        split="valid",
        n_sequences=2,
        seq_len=8,
        out_dir=out,
        labels=["standard", "coupled"],
        example_layer=-1,
    )
    data = json.loads((out / "analysis.json").read_text())
    assert [e["label"] for e in data["checkpoints"]] == ["standard", "coupled"]
    assert data["same_tokenizer"] is True and data["seq_len"] == 8 and data["n_sequences"] == 2
    assert data["checkpoints"][0]["text"] == data["checkpoints"][1]["text"]
    assert data["checkpoints"][0]["analysis"]["attention"] == "standard"
    coupled = data["checkpoints"][1]["analysis"]
    assert coupled["attention"] == "coupled" and len(coupled["layers"]) == 2
    assert "dt" in coupled["layers"][0]["qk_heads"] and "example" not in coupled
    for name in ("per_layer_metrics", "spectra", "heads_standard", "heads_coupled", "example_maps"):
        path = out / f"{name}.png"
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    summary = (out / "summary.md").read_text()
    assert "| metric | standard | coupled |" in summary
    assert "effective rank" in summary and "learned dt" in summary and "same text" in summary
    assert set(report["files"]) >= {"analysis.json", "summary.md", "per_layer_metrics"}

    # the same analysis run directly on the model with the same windows gives the same numbers
    from coupled_qk.data.corpora import load_corpus
    from coupled_qk.data.tokenizers import Tokenizer
    from coupled_qk.training.run_folder import load_checkpoint_model

    model, _ = load_checkpoint_model(runs[1])
    tok = Tokenizer.load(runs[1] / "tokenizer")
    ids = token_windows(load_corpus(str(corpus)).valid, tok, 2, 8)
    direct = analyze_model(model, ids)
    assert coupled["mean"]["effective_rank"] == pytest.approx(direct["mean"]["effective_rank"])


_COUNTS = ("batch_size", "threads", "example_tokens")


_NOT_INTS = st.one_of(st.floats(allow_nan=True), st.booleans(), st.sampled_from(["1", [1]]))
_BAD = {name: st.one_of(st.integers(-(10**6), 0), _NOT_INTS) for name in _COUNTS}
_BAD["example_layer"] = st.one_of(st.integers(-(10**6), -3), st.integers(2, 10**6), _NOT_INTS)  # 2 layers
_BAD["example_head"] = st.one_of(st.integers(-(10**6), -5), st.integers(4, 10**6), _NOT_INTS)  # 4 heads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_checkpoint_options_checked_before_any_work(checkpoints, monkeypatch, data):
    """Every count and example index is refused, named with its value, before any model is loaded or text read,
    and no output folder is left behind; example_layer/example_head against the checkpoints (2 layers, 4 heads).
    (The same monkeypatch for every example is intended: it only blocks the work.)"""
    from coupled_qk.analysis import analyze as analyze_mod

    name = data.draw(st.sampled_from(sorted(_BAD)))
    value = data.draw(_BAD[name])
    root, corpus, runs, _ = checkpoints

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(analyze_mod, "_analyze_checkpoint", no_work)
    monkeypatch.setattr(analyze_mod, "run_text_source", no_work)
    out = root / "never"
    with pytest.raises(ValueError, match=rf"^{name}={re.escape(repr(value))} "):
        analyze_checkpoints(runs, str(corpus), n_sequences=1, seq_len=8, out_dir=out, **{name: value})
    assert not out.exists()


def test_example_index_checked_against_every_checkpoint(checkpoints, tmp_path):
    """A layer/head that only the shallower checkpoint lacks is named with that checkpoint (it used to fail only
    after the earlier checkpoints had been analysed, naming no option)."""
    root, corpus, runs, tok = checkpoints
    from coupled_qk.training.run_folder import RunFolder

    model = tiny_gpt("differential", vocab_size=tok.vocab_size, n_layer=1)
    RunFolder(tmp_path / "shallow").save(model.state_dict(), model.config, None, {"step": 1})
    tok.save(tmp_path / "shallow" / "tokenizer")
    for option, value, what in (
        ("example_layer", 1, "1 layers"),
        ("example_head", 3, "2 attention-map heads"),
        ("example_head", -3, "2 attention-map heads"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"{option}={value} \(--{option.replace('_', '-')}\) is out of range: "
            rf"checkpoint {re.escape(str(tmp_path / 'shallow'))}.* has {what}",
        ):
            analyze_checkpoints(
                [runs[0], tmp_path / "shallow"],
                str(corpus),
                n_sequences=1,
                seq_len=8,
                out_dir=tmp_path / "out",
                make_plots=False,
                **{option: value},
            )
    assert not (tmp_path / "out").exists()


def test_text_too_short_names_the_split_and_leaves_nothing(checkpoints, tmp_path):
    _, corpus, runs, tok = checkpoints
    with pytest.raises(
        ValueError,
        match=rf"the valid split of corpus {re.escape(repr(str(corpus)))} is too short "
        rf"for tokenizer {tok.name}: the text has only \d+ tokens.* need 1600",
    ):
        analyze_checkpoints(runs, str(corpus), n_sequences=100, seq_len=16, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written, not even the folder


def test_report_states_what_it_was_computed_on_and_repeats_exactly(checkpoints, tmp_path, monkeypatch):
    """Run from another folder with relative paths: analysis.json names the checkpoints absolutely, summary.md the
    corpus, split, random-split seed, windows and checkpoints; a second run gives identical numbers."""
    root, corpus, runs, _ = checkpoints
    monkeypatch.chdir(root)
    reports = []
    for out in ("rep1", "rep2"):
        analyze_checkpoints(
            [runs[0].name, runs[1].name],
            corpus.name,
            n_sequences=2,
            seq_len=8,
            out_dir=tmp_path / out,
            make_plots=False,
            split_seed=3,
        )
        reports.append(json.loads((tmp_path / out / "analysis.json").read_text()))
    for entry, run in zip(reports[0]["checkpoints"], runs):
        assert entry["checkpoint"] == str(sorted(run.resolve().glob("ckpt-*"))[-1])
        assert entry["run_dir"] == str(run.resolve()) and entry["path"] == run.name
    summary = (tmp_path / "rep1" / "summary.md").read_text()
    assert "split `valid` (documents split at random with seed 3): 2 sequences x 8 tokens" in summary
    assert all(f"`{e['checkpoint']}`" in summary for e in reports[0]["checkpoints"])
    for report in reports:
        for entry in report["checkpoints"]:
            entry.pop("seconds")
    assert reports[0] == reports[1]


def test_analyze_command(checkpoints, tmp_path, capsys):
    from coupled_qk.cli import main

    _, corpus, runs, _ = checkpoints
    out = tmp_path / "cli"
    rc = main(
        [
            "analyze",
            str(runs[0]),
            str(runs[1]),
            "--corpus",
            str(corpus),
            "--n-sequences",
            "1",
            "--seq-len",
            "6",
            "--out-dir",
            str(out),
            "--no-plots",
        ]
    )
    assert rc == 0
    assert (out / "summary.md").is_file() and not list(out.glob("*.png"))
    data = json.loads((out / "analysis.json").read_text())
    assert [e["label"] for e in data["checkpoints"]] == ["std", "cpl"]
    assert "summary.md" in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc = main(["analyze", str(runs[0]), "--corpus", str(corpus), "--out-dir", str(out)])  # an earlier report
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    rc = main(
        ["analyze", str(runs[0]), "--corpus", str(corpus), "--seq-len", "99", "--out-dir", str(out), "--overwrite"]
    )
    assert rc == 2 and "block_size" in capsys.readouterr().err
    rc = main(
        ["analyze", str(runs[0]), "--corpus", str(corpus), "--labels", "a,b", "--out-dir", str(out), "--overwrite"]
    )
    assert rc == 2 and "labels" in capsys.readouterr().err
    rc = main(["analyze", str(tmp_path / "nothing"), "--corpus", str(corpus), "--out-dir", str(out), "--overwrite"])
    assert rc == 2 and "no checkpoint" in capsys.readouterr().err
    rc = main(["analyze", str(runs[0]), "--corpus", "", "--out-dir", str(tmp_path / "empty"), "--no-plots"])
    assert rc == 2 and "corpus '' is empty (--corpus)" in capsys.readouterr().err  # was: read the cwd's *.txt
    assert not (tmp_path / "empty").exists()


def test_learned_positions_and_gqa_coupled():
    model = tiny_gpt("coupled", position="learned", n_kv_heads=1)
    res = analyze_model(model, tokens())
    assert all(len(layer["qk_heads"]["k_update"]) == 4 for layer in res["layers"])
    assert all(v > 0 for layer in res["layers"] for v in layer["qk_heads"]["k_update"])


def test_analyze_defaults_to_the_runs_corpus(checkpoints, tmp_path, capsys):
    from coupled_qk.cli import main

    _, corpus, runs, _ = checkpoints
    args = ["--n-sequences", "1", "--seq-len", "6", "--no-plots"]
    assert main(["analyze", str(runs[0]), "--out-dir", str(tmp_path / "a")] + args) == 2
    assert "--corpus is needed" in capsys.readouterr().err
    for run in runs:
        (run / "config.json").write_text(json.dumps({"corpus": str(corpus), "task_options": {"split_seed": 0}}))
    assert main(["analyze", *map(str, runs), "--out-dir", str(tmp_path / "own")] + args) == 0
    assert main(["analyze", *map(str, runs), "--corpus", str(corpus), "--out-dir", str(tmp_path / "given")] + args) == 0
    own, given = (json.loads((tmp_path / d / "analysis.json").read_text()) for d in ("own", "given"))
    assert own["corpus"] == str(corpus)
    assert [e["analysis"]["mean"] for e in own["checkpoints"]] == [e["analysis"]["mean"] for e in given["checkpoints"]]
    (runs[1] / "config.json").write_text(json.dumps({"corpus": "pubmed"}))
    assert main(["analyze", *map(str, runs), "--out-dir", str(tmp_path / "b")] + args) == 2
    assert "different corpora" in capsys.readouterr().err
    assert main(["analyze", str(runs[0]), "--n-sequences", "0"]) == 2
    assert "--n-sequences=0" in capsys.readouterr().err
    for run in runs:
        (run / "config.json").unlink()


def test_runs_of_one_split_analysed_together_whatever_their_eval_subsample(checkpoints, tmp_path, capsys):
    """A `demo` run and a `demo --quick` run (task_options.final_eval_windows) of one corpus, and a run that spells
    out the default split seed, share one text: analysed together without --corpus; another split seed is refused."""
    from coupled_qk.cli import main

    _, corpus, runs, _ = checkpoints
    args = ["--n-sequences", "1", "--seq-len", "6", "--no-plots"]
    options = ({"final_eval_windows": 24}, {"split_seed": 0})
    try:
        for run, opts in zip(runs, options):
            (run / "config.json").write_text(json.dumps({"corpus": str(corpus), "task_options": opts}))
        assert main(["analyze", *map(str, runs), "--out-dir", str(tmp_path / "mixed")] + args) == 0
        report = json.loads((tmp_path / "mixed" / "analysis.json").read_text())
        for run in runs:
            (run / "config.json").write_text(json.dumps({"corpus": str(corpus)}))
        assert main(["analyze", *map(str, runs), "--out-dir", str(tmp_path / "plain")] + args) == 0
        plain = json.loads((tmp_path / "plain" / "analysis.json").read_text())
        assert [e["analysis"]["mean"] for e in report["checkpoints"]] == [
            e["analysis"]["mean"] for e in plain["checkpoints"]
        ]
        (runs[1] / "config.json").write_text(json.dumps({"corpus": str(corpus), "task_options": {"split_seed": 1}}))
        capsys.readouterr()
        assert main(["analyze", *map(str, runs), "--out-dir", str(tmp_path / "other")] + args) == 2
        assert "different corpora or splits" in capsys.readouterr().err
    finally:
        for run in runs:
            (run / "config.json").unlink(missing_ok=True)


def test_default_labels_tell_runs_apart(tmp_path):
    from coupled_qk.analysis.analyze import _default_labels

    a, b = tmp_path / "x" / "standard" / "seed0", tmp_path / "x" / "coupled" / "seed0"
    assert _default_labels([a, b]) == ["standard/seed0", "coupled/seed0"]
    assert _default_labels([a, tmp_path / "y"]) == ["seed0", "y"]
    assert _default_labels([a, a]) == ["seed0", "seed0#2"]
