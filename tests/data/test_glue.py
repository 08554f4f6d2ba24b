"""GLUE loaders on the real files, pair formatting and truncation, metrics against hand-computed values."""

import numpy as np
import pytest

from coupled_qk.data.glue import GLUE_TASKS, GlueSplit, encode_split, format_example, glue_metrics, load_glue
from coupled_qk.data.tokenizers import train_bpe

# rows and label counts of the GLUE train / dev sets (GLUE paper, table 1; the data README's counts)
EXPECTED = {
    ("sst2", "train"): 67_349,
    ("sst2", "dev"): 872,
    ("cola", "train"): 8_551,
    ("cola", "dev"): 527 + 516,
    ("rte", "train"): 2_490,
    ("rte", "dev"): 277,
    ("mrpc", "train"): 3_668,
    ("mrpc", "dev"): 408,
}


@pytest.mark.parametrize(("task", "split"), sorted(EXPECTED))
def test_real_files_rows_and_labels(data_dir, task, split):
    d = load_glue(task, split, data_dir / "glue")
    assert len(d) == len(d.texts_a) == EXPECTED[task, split]
    assert set(np.unique(d.labels)) == {0, 1}
    assert (d.texts_b is not None) == (task in ("rte", "mrpc"))
    assert all(t for t in d.texts_a) and all(t for t in (d.texts_b or ["x"]))


def test_real_files_known_rows(data_dir):
    root = data_dir / "glue"
    sst = load_glue("sst2", "dev", root)
    assert sst.texts_a[0] == "it 's a charming and often affecting journey ." and sst.labels[0] == 1
    assert np.bincount(sst.labels).tolist() == [428, 444]
    mrpc = load_glue("MRPC", "dev", root)  # the BOM of the header and literal quotes are handled
    assert mrpc.texts_b[0].startswith('"The foodservice pie business') and mrpc.labels[0] == 1
    assert np.bincount(mrpc.labels).tolist() == [129, 279]  # F1 majority baseline 81.2, as usual for MRPC
    rte = load_glue("rte", "dev", root)
    assert rte.texts_b[0] == "Christopher Reeve had an accident." and rte.labels[0] == 1  # 1 = not entailment
    cola = load_glue("cola", "dev", root)
    assert cola.texts_a[0] == "The sailors rode the breeze clear of the rocks." and len(cola.files) == 2


def test_unknown_task_split_and_missing_files(tmp_path, data_dir):
    with pytest.raises(ValueError, match="'qnli' is unknown"):
        load_glue("qnli", "train", data_dir / "glue")
    with pytest.raises(ValueError, match="split='test' is unknown"):
        load_glue("rte", "test", data_dir / "glue")
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("sentence1\tsentence2\tlabel\tidx\na\tb\t0\t0\n")
    with pytest.raises(FileNotFoundError, match=r"RTE/dev.tsv is missing"):
        load_glue("rte", "dev", tmp_path)
    (tmp_path / "RTE" / "dev.tsv").write_text("sentence1\tsentence2\tlabel\tidx\na\tb\t-1\t0\n")
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        load_glue("rte", "dev", tmp_path)
    (tmp_path / "RTE" / "dev.tsv").write_text("sentence1\tsentence2\tlabel\tidx\na\tb\t0\n")
    with pytest.raises(ValueError, match=r"row 2: expected 4 tab-separated fields \(as the header .*\), got 3"):
        load_glue("rte", "dev", tmp_path)


def test_subsample_is_seeded_and_sorted(data_dir):
    d = load_glue("rte", "train", data_dir / "glue")
    a, b = d.subsample(100, seed=3), d.subsample(100, seed=3)
    assert len(a) == 100 and a.texts_a == b.texts_a and a.texts_b == b.texts_b
    assert d.subsample(100, seed=4).texts_a != a.texts_a
    index = {t: i for i, t in enumerate(zip(d.texts_a, d.texts_b, strict=True))}
    rows = [index[p] for p in zip(a.texts_a, a.texts_b, strict=True)]
    assert rows == sorted(rows) and [int(d.labels[i]) for i in rows] == a.labels.tolist()
    assert d.subsample(10_000, seed=0) is d


@pytest.fixture(scope="module")
def tok():
    return train_bpe("the cat sat on the mat . a dog ran in the park . " * 50, 300)


def test_single_and_pair_formatting(tok):
    eot = tok.eot_id
    a, b = tok.encode("the cat sat"), tok.encode("a dog ran")
    assert format_example(tok, "the cat sat", None, 64) == (a + [eot], False)
    assert format_example(tok, "the cat sat", "a dog ran", 64) == (a + [eot] + b + [eot], False)
    ids, cut = format_example(tok, "the cat sat", "a dog ran", 64)
    assert tok.decode(ids) == "the cat sat<|endoftext|>a dog ran<|endoftext|>"


def test_truncation_is_longest_first_and_counted(tok):
    eot = tok.eot_id
    long_a, short_b = tok.encode("the cat sat on the mat " * 6), tok.encode("a dog")
    ids, cut = format_example(tok, "the cat sat on the mat " * 6, "a dog", 12)
    assert cut and len(ids) == 12
    assert ids == long_a[:8] + [eot] + short_b + [eot]  # the long segment gave up tokens, the short kept all
    ids, cut = format_example(tok, "the cat sat on the mat " * 6, None, 5)
    assert cut and ids == long_a[:4] + [eot]
    s = GlueSplit("sst2", "train", ["the cat", "the cat sat on the mat " * 6], None, np.array([0, 1]), [])
    rows, n_cut = encode_split(s, tok, 6)
    assert n_cut == 1 and [len(r) for r in rows] == [len(tok.encode("the cat")) + 1, 6]
    with pytest.raises(ValueError, match="max_len=3 must be >= 4"):
        format_example(tok, "a", "b", 3)


def test_metrics_against_hand_computed_values():
    y = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    p = np.array([1, 1, 0, 0, 0, 1, 1, 1])
    # tp=3 fn=1 tn=2 fp=2: accuracy 5/8, precision 3/5, recall 3/4, F1 = 2/3,
    # MCC = (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = 4 / sqrt(5*4*4*3) = 4 / sqrt(240)
    assert glue_metrics("sst2", y, p) == {"accuracy": 0.625}
    m = glue_metrics("mrpc", y, p)
    assert m["accuracy"] == 0.625 and m["f1"] == pytest.approx(2 / 3, abs=1e-12)
    assert glue_metrics("cola", y, p)["mcc"] == pytest.approx(4 / np.sqrt(240), abs=1e-12)
    assert glue_metrics("cola", y, 1 - y)["mcc"] == pytest.approx(-1.0)
    # degenerate cases: constant predictions have MCC 0; no predicted positive has F1 0
    assert glue_metrics("cola", y, np.ones_like(y)) == {"accuracy": 0.5, "mcc": 0.0}
    assert glue_metrics("mrpc", y, np.zeros_like(y))["f1"] == 0.0
    with pytest.raises(ValueError, match="equal length"):
        glue_metrics("rte", y, p[:3])
    with pytest.raises(ValueError, match="unknown"):
        glue_metrics("stsb", y, p)
    assert set(GLUE_TASKS) == {"sst2", "cola", "rte", "mrpc"}
