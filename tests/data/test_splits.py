"""The document-level split of the converged studies (``splits.document_split``): a bad argument or a corpus too
small is one ``ValueError`` naming it, raised before anything is written; a good one writes exactly its folder."""

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coupled_qk.data.splits import document_split

N_DOCS = 40
FIXTURE_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def data(tmp_path) -> Path:
    """A data folder with a 40-abstract PubMed file and a wiki-vital file without WikiText headings."""
    root = tmp_path / "data"
    (root / "pubmed").mkdir(parents=True)
    (root / "pubmed" / "abstracts.txt").write_text("".join(f"abstract {i} text\n\n" for i in range(N_DOCS)))
    (root / "wiki-vital").mkdir()
    (root / "wiki-vital" / "train.txt").write_text("plain text\n\nwithout headings\n")
    return root


def _refused(data: Path, tmp_path: Path, match: str, **kw) -> None:
    """``document_split`` with ``kw`` raises a ValueError matching ``match`` and writes nothing (not even next to
    ``out_root``)."""
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    args = dict(
        data_dir=data,
        out_root=base / "derived",
        name="split",
        source="pubmed",
        valid_docs=5,
        test_docs=10,
        train_fraction=0.5,
    )
    with pytest.raises(ValueError, match=match):
        document_split(**{**args, **kw})
    assert list(base.iterdir()) == []


def test_a_good_split_writes_its_folder_only(data, tmp_path):
    out = document_split(
        data, tmp_path / "derived", "split", source="pubmed", valid_docs=5, test_docs=10, train_fraction=0.5
    )
    assert out == tmp_path / "derived" / "split"
    assert sorted(p.name for p in out.iterdir()) == ["source.txt", "test.txt", "train.txt", "valid.txt"]
    assert [p.name for p in (tmp_path / "derived").iterdir()] == ["split"]
    counts = {s: (out / f"{s}.txt").read_text().count("abstract ") for s in ("train", "valid", "test")}
    assert counts == {"valid": 5, "test": 10, "train": round(0.5 * (N_DOCS - 15))}


# names the pattern [A-Za-z0-9_.-]+ refuses, and the two it admits that point outside out_root ("." and "..")
BAD_NAMES = st.sampled_from([".", "..", "", "a/b", "../x", "/abs", "a b", "é"]) | st.text(
    min_size=1, max_size=8
).filter(lambda s: any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in s))


@FIXTURE_SETTINGS
@given(BAD_NAMES)
def test_a_name_that_leaves_out_root_or_is_not_folder_safe_is_refused(data, tmp_path, name):
    _refused(data, tmp_path, "name=", name=name)


@FIXTURE_SETTINGS
@given(
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not (0 < f <= 1) or not math.isfinite(f))
    | st.sampled_from([0, -1, 2, True, "0.5", None])
)
def test_a_training_fraction_outside_0_1_or_not_a_number_is_refused(data, tmp_path, fraction):
    _refused(data, tmp_path, "train_fraction=", train_fraction=fraction)


@FIXTURE_SETTINGS
@given(st.sampled_from(["valid_docs", "test_docs"]), st.integers(max_value=0) | st.sampled_from([True, 2.0, "3", None]))
def test_a_document_count_that_is_not_a_positive_integer_is_refused(data, tmp_path, arg, count):
    _refused(data, tmp_path, f"{arg}=", **{arg: count})


@FIXTURE_SETTINGS
@given(st.integers(1, 3 * N_DOCS), st.integers(1, 3 * N_DOCS))
def test_more_documents_than_the_corpus_holds_is_refused(data, tmp_path, valid_docs, test_docs):
    if N_DOCS - valid_docs - test_docs >= 2:  # room for a training document at fraction 0.5
        return
    _refused(data, tmp_path, f"pubmed has {N_DOCS} documents: too few", valid_docs=valid_docs, test_docs=test_docs)


@pytest.mark.parametrize("source", ["pubmeds", "PubMed", "", None, ["pubmed"]])
def test_an_unknown_source_is_refused(data, tmp_path, source):
    _refused(data, tmp_path, "source=", source=source)


def test_a_wiki_vital_file_without_headings_is_named(data, tmp_path):
    _refused(data, tmp_path, r"wiki-vital/train\.txt: text holds no ' = Title = ' heading", source="wiki-vital")


@pytest.mark.parametrize("arg", ["data_dir", "out_root"])
@pytest.mark.parametrize("value", [None, "", 3, ["data"]])
def test_a_folder_argument_that_is_not_a_path_is_refused(data, tmp_path, arg, value):
    _refused(data, tmp_path, f"{arg}=", **{arg: value})
