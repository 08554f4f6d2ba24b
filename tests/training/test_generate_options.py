"""``coupled-qk generate`` refuses the sampling options (``--top-k``, ``--seed``, ``--num-samples``) with
``--temperature 0``, where they would be silently ignored (``commands/generate.py::_ignored_options``): the table is
checked against the decoding itself (a real model, the run loader mocked), not against a second hand-written
table: an option the table calls ignored must change no sample, one it calls used must change them."""

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from coupled_qk.cli import build_parser, main
from coupled_qk.commands import generate, ignored
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.generation import sample_next_token
from coupled_qk.models.gpt import GPT
from coupled_qk.training.pretrained import LoadedRun

V = 64
VALUES = {"--top-k": "1", "--seed": "7", "--num-samples": "3"}  # a value other than the default for each


class Letters:
    """A tokenizer of single characters (enough to decode what a random model samples)."""

    name, vocab_size, eot_id = "letters", V, 0

    def encode(self, text):
        return [ord(c) % V for c in text]

    def decode(self, ids):
        return " ".join(str(int(i)) for i in ids)


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    config = GPTConfig.from_preset("tiny", vocab_size=V, block_size=32, n_layer=1, d_model=16, n_heads=2)
    model = GPT(config).eval()
    return LoadedRun(model, Letters(), Path("ckpt-1"), 1, {})


def _samples(loaded, argv, monkeypatch, capsys, check=True):
    """The set of distinct texts that ``generate`` prints for ``argv``, or its ValueError."""
    monkeypatch.setattr("coupled_qk.training.pretrained.load_run", lambda path, device: loaded)
    if not check:  # what the decoding does with the option when nothing refuses it
        monkeypatch.setattr(ignored, "refuse_ignored_options", lambda *a: None)
    args = build_parser("generate").parse_args(["generate", "run", "--prompt", "ab", "--max-new-tokens", "8", *argv])
    try:
        generate.run(args)
    except ValueError as e:
        return e
    finally:
        monkeypatch.undo()
    lines = capsys.readouterr().out.splitlines()
    return {line for line in lines if not line.startswith(("#", "---"))}


def test_the_table_names_the_sampling_options():
    assert set(generate._ignored_options()) == set(VALUES)


@pytest.mark.parametrize("temperature", ["0", "0.5", "1.0"])
@pytest.mark.parametrize("option", sorted(VALUES))
def test_an_option_is_refused_exactly_where_it_changes_no_sample(loaded, option, temperature, monkeypatch, capsys):
    base = ["--temperature", temperature]
    given_ = [*base, f"{option}={VALUES[option]}"]
    baseline = _samples(loaded, base, monkeypatch, capsys)
    assert isinstance(baseline, set) and len(baseline) == 1
    effect = _samples(loaded, given_, monkeypatch, capsys, check=False) != baseline
    applies = all(
        rule.when(build_parser("generate").parse_args(["generate", "run", *given_]))
        for rule in generate._ignored_options()[option]
    )
    assert effect == applies, f"{option} at --temperature {temperature}: the table says used={applies}"
    got = _samples(loaded, given_, monkeypatch, capsys)
    if applies:
        assert isinstance(got, set)
    else:
        assert isinstance(got, ValueError) and str(got).startswith(
            f"{option}={VALUES[option]} does not apply with --temperature=0"
        )


@given(st.sampled_from(["0", "0.0", "0.7", "2"]), st.lists(st.sampled_from(sorted(VALUES)), unique=True))
def test_any_combination_is_refused_iff_greedy_and_a_sampling_option_is_given(temperature, options):
    argv = ["generate", "missing-run", "--temperature", temperature, *[f"{o}={VALUES[o]}" for o in options]]
    args = build_parser("generate").parse_args(argv)
    try:
        ignored.refuse_ignored_options(args, generate.add_arguments, generate._ignored_options())
        refused = False
    except ValueError as e:
        refused = True
        assert str(e).split("=")[0] in options
    assert refused == (float(temperature) == 0 and bool(options))


@given(st.lists(st.floats(-30, 30), min_size=2, max_size=12), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_greedy_sampling_reads_neither_top_k_nor_the_generator(logits, top_k, seed):
    """What the table rests on: at temperature 0 the sampling rule is the arg-max, whatever top_k and seed."""
    row = torch.tensor([logits])
    chosen = sample_next_token(row, 0.0, top_k, torch.Generator().manual_seed(seed))
    assert torch.equal(chosen, sample_next_token(row, 0.0, None, None))


def test_the_refusal_is_one_line_and_loads_nothing(capsys, tmp_path):
    assert main(["generate", str(tmp_path / "no-run"), "--temperature", "0", "--top-k", "5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "coupled-qk generate: error: --top-k=5 does not apply with --temperature=0 (greedy decoding: the most likely "
        "token at every step, nothing is sampled, so every sample is the same text): --top-k is for sampling, "
        "--temperature > 0"
    ]
