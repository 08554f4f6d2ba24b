"""Corpora through Hugging Face ``datasets`` (``hf:NAME[:CONFIG]``), exercised on local files only."""

from __future__ import annotations

import json

import pytest

from coupled_qk.data import hub
from coupled_qk.data.corpora import load_corpus, random_split, split_documents

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network: datasets and the hub client in offline mode, their cache under tmp_path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache", raising=False)


TRAIN = "The cat sat on the mat.\nIt was warm.\n\nA second paragraph here.\n"
VALID = "Validation line one.\n\nValidation two.\n"
TEST = "Test text.\n"


def test_parse_spec():
    assert hub.parse_spec("hf:Salesforce/wikitext:wikitext-103-raw-v1") == (
        "Salesforce/wikitext",
        "wikitext-103-raw-v1",
    )
    assert hub.parse_spec("hf:imdb") == ("imdb", None)
    for bad in ("hf:", "wikitext"):
        with pytest.raises(ValueError, match="hf:NAME"):
            hub.parse_spec(bad)


def test_local_text_folder_through_load_corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, text in (("train", TRAIN), ("validation", VALID), ("test", TEST)):
        (folder / f"{split}.txt").write_text(text)
    corpus = load_corpus(f"hf:{folder}")
    # datasets' text builder yields one row per line; joined with newlines they are the files again
    assert (corpus.train, corpus.valid, corpus.test) == (TRAIN, VALID, TEST)
    assert corpus.source["split"] == "given" and corpus.source["text_column"] == "text"
    assert corpus.source["splits"] == {"train": "train", "valid": "validation", "test": "test"}


def test_rows_ending_in_newlines_are_concatenated_as_is(tmp_path):
    # WikiText on the hub: one line per row, each ending in "\n", blank lines as "" rows
    lines = [" = Title = \n", "", " First paragraph . \n", "", " = = Section = = \n", " More text . \n"]
    folder = tmp_path / "wt"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(lines))
        )
    corpus = hub.load_hub_corpus(f"hf:{folder}", cache_dir=str(tmp_path / "c"))
    assert corpus.train == "".join(lines) == corpus.test


def test_train_only_dataset_is_split_by_documents(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    docs = [f"Document number {i} has some words.\nAnd a second line {i}." for i in range(40)]
    (folder / "train.txt").write_text("\n\n".join(docs) + "\n")
    corpus = hub.load_hub_corpus(
        f"hf:{folder}", seed=3, valid_fraction=0.1, test_fraction=0.1, cache_dir=str(tmp_path / "c")
    )
    parts = [split_documents(corpus.split(s)) for s in ("train", "valid", "test")]
    expected = random_split(docs, 3, 0.1, 0.1, f"hf:{folder}")  # the split local files get
    assert parts == [list(e) for e in expected]
    assert sorted(sum(parts, [])) == sorted(docs)
    assert corpus.source["split"] == "document-level random"


def test_demo_uses_the_offline_folder_when_present(tmp_path):
    (tmp_path / "wiki-vital").mkdir()
    (tmp_path / "wiki-vital" / "train.txt").write_text("x\n")
    spec, which = hub.demo_corpus(tmp_path)
    assert spec == "wiki-vital" and str(tmp_path) in which


def test_demo_error_says_what_to_download_when_offline(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        hub.demo_corpus(tmp_path / "absent")
    msg = str(err.value)
    for needle in ("--data-dir", "wiki-vital/train.txt", "wiki.train.tokens", "HF_HUB_OFFLINE", "coupled-qk[datasets]"):
        assert needle in msg


def test_demo_falls_back_to_wikitext2_from_the_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    loaded = []
    monkeypatch.setattr(hub, "load_hub_corpus", lambda spec: loaded.append(spec))  # stands in for the download
    spec, which = hub.demo_corpus(tmp_path / "absent")
    assert spec == loaded[0] == "hf:Salesforce/wikitext:wikitext-2-raw-v1"
    assert "WikiText-2" in which and "hub" in which


def test_unknown_or_unreachable_dataset_names_the_corpus():
    """datasets' own error ('Couldn't reach ... on the Hub (LocalEntryNotFoundError)') named neither the corpus
    option nor what was expected."""
    with pytest.raises(
        FileNotFoundError,
        match=r"corpus 'hf:nobody/no-such-set:cfg': "
        r"datasets.load_dataset\('nobody/no-such-set', 'cfg'\) failed \(.*\); expected a dataset name",
    ):
        load_corpus("hf:nobody/no-such-set:cfg")
