"""Split options (``split_seed``, ``valid_fraction``, ``test_fraction``, ``min_split_words``) decide random
splits only: for a corpus with fixed splits they would be ignored, so they are refused there at a non-default
value (``data/corpora.py::check_split_options``), and a saved run's options warn instead.

The rule is checked against what the loader actually does: on a corpus split at random every option changes the
split (or its record), on a corpus with fixed splits none does."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupled_qk.data import corpora
from coupled_qk.data.corpora import SPLIT_OPTIONS, load_corpus
from coupled_qk.training.tasks.lm import run_corpus

DOCS = [f"Document {i} says {' '.join(['word'] * (5 + i % 7))}.\nA second line of document {i}." for i in range(60)]

OTHER_VALUES = {
    "seed": st.integers(1, 10**6),
    "valid_fraction": st.sampled_from([0.05, 0.1, 0.2]),
    "test_fraction": st.sampled_from([0.05, 0.1, 0.2]),
    "min_split_words": st.sampled_from([0, 50, 200]),
}
"""Non-default values of every split option (drawn; a test fails if an option is added without any)."""


def _random_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("random") / "docs.txt"
    path.write_text("\n\n".join(DOCS) + "\n")
    return path


def _given_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("given")
    for split, docs in (("train", DOCS[:40]), ("valid", DOCS[40:50]), ("test", DOCS[50:])):
        (folder / f"{split}.txt").write_text("\n\n".join(docs) + "\n")
    return folder


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return {"random": _random_file(tmp_path_factory), "given": _given_folder(tmp_path_factory)}


def test_every_option_has_test_values():
    assert set(OTHER_VALUES) == set(SPLIT_OPTIONS)


def _texts(corpus) -> tuple:
    return corpus.train, corpus.valid, corpus.test, {k: v for k, v in corpus.source.items() if k != "path"}


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(sorted(SPLIT_OPTIONS)))
def test_an_option_is_read_exactly_where_the_splits_are_random(sources, data, arg):
    value = data.draw(OTHER_VALUES[arg], label=arg)
    for kind, path in sources.items():
        base = corpora._load_corpus(str(path))  # unchecked: what the loader reads
        other = corpora._load_corpus(str(path), **{arg: value})
        read = _texts(base) != _texts(other)
        assert read == (kind == "random"), (kind, arg, value)
        assert (base.source["split"] == "given") == (kind == "given")


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(sorted(SPLIT_OPTIONS)))
def test_a_fixed_split_corpus_refuses_a_non_default_option_naming_it(sources, data, arg):
    value = data.draw(OTHER_VALUES[arg], label=arg)
    option, default = SPLIT_OPTIONS[arg]
    with pytest.raises(
        ValueError,
        match=rf"split option {option}={value} \(--{option.replace('_', '-')}, "
        rf"task_options\.{option}\) does not apply to corpus .*fixed",
    ) as info:
        load_corpus(str(sources["given"]), **{arg: value})
    assert "\n" not in str(info.value)
    load_corpus(str(sources["given"]), **{arg: default})  # the default is fine
    assert load_corpus(str(sources["random"]), **{arg: value}).source["split"] == "document-level random"
    with pytest.warns(UserWarning, match=f"{option}={value} .*a saved run's option"):
        load_corpus(str(sources["given"]), unused_split_options="warn", **{arg: value})


def test_run_corpus_refuses_new_options_and_reads_saved_ones_with_a_warning(sources):
    folder = str(sources["given"])
    with pytest.raises(ValueError, match="split_seed=3 .*does not apply to corpus"):
        run_corpus(folder, None, {"split_seed": 3})
    with pytest.warns(UserWarning, match="split_seed=3"):
        assert run_corpus(folder, None, {"split_seed": 3}, saved=True).source["split"] == "given"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_corpus(folder, None, {"split_seed": 0, "valid_fraction": 0.01}, saved=True)  # defaults: silent
