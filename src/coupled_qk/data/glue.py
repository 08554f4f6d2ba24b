"""GLUE classification data (SST-2, CoLA, RTE, MRPC): loaders for the standard files, input formatting, metrics.

Files (GLUE / original releases; the layout of ``../shared/data/glue``, or a user's own copy)::

    SST-2/train.tsv, dev.tsv, test.tsv   sentence<TAB>label, header row. train + dev = the GLUE training set
                                          (67,349); test.tsv is the labelled GLUE dev set (872). A standard
                                          GLUE copy (train.tsv 67,349 rows, dev.tsv 872) works too: see below.
    CoLA/raw/in_domain_train.tsv          source<TAB>label<TAB>original label<TAB>sentence, no header (8,551)
    CoLA/raw/in_domain_dev.tsv, out_of_domain_dev.tsv   GLUE dev = both (527 + 516 = 1,043)
    CoLA/train.tsv, dev.tsv               GLUE's own copy (same columns; dev = both devs), read where raw/ is absent
    RTE/train.tsv, dev.tsv                sentence1<TAB>sentence2<TAB>label<TAB>idx; 0 = entailment (2,490 / 277)
    MRPC/train.tsv, dev.tsv               Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String (3,668 / 408)

SST-2, RTE and MRPC files start with a header row; their columns are found by its names (``sentence``,
``sentence1``/``sentence2``, ``#1 String``/``#2 String``, ``label``/``Quality``), so GLUE's own RTE layout
(``index sentence1 sentence2 label``, labels ``entailment``/``not_entailment`` read as 0/1) works too. A first row
without those names (a file without a header) is refused rather than dropped as a header.

Splits: ``"train"`` is the GLUE training set, ``"dev"`` the labelled GLUE dev set (the GLUE test sets are
unlabelled and not offered). Rows are read with ``csv`` and ``QUOTE_NONE`` (quotes are text, as in GLUE).

Input formatting (GPT, Radford et al. 2018, section 3.3, with the run's own tokenizer): a single sentence is
``tokens(s) <|endoftext|>``, a pair ``tokens(s1) <|endoftext|> tokens(s2) <|endoftext|>``; the final
``<|endoftext|>`` is the token a last-token classifier reads. Sequences longer than the model's context are
truncated longest-segment-first (the separators are kept) and every truncation is counted.

Metrics (scikit-learn): accuracy (SST-2, RTE), Matthews correlation (CoLA), F1 of the positive class and
accuracy (MRPC), as in GLUE (Wang et al. 2019).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from coupled_qk.data.paths import default_data_dir
from coupled_qk.extras import MissingExtra

GLUE_TASKS = ("sst2", "cola", "rte", "mrpc")
SPLITS = ("train", "dev")
# task -> (folder, number of classes, headline metric, all metrics)
TASK_INFO = {
    "sst2": ("SST-2", 2, "accuracy", ("accuracy",)),
    "cola": ("CoLA", 2, "mcc", ("mcc", "accuracy")),
    "rte": ("RTE", 2, "accuracy", ("accuracy",)),
    "mrpc": ("MRPC", 2, "f1", ("f1", "accuracy")),
}
# task -> (first sentence, second sentence or None, label): the header names of its columns (not CoLA: no header)
COLUMNS = {
    "sst2": ("sentence", None, "label"),
    "rte": ("sentence1", "sentence2", "label"),
    "mrpc": ("#1 String", "#2 String", "Quality"),
}
# label names some copies write instead of the integers (GLUE's own RTE files: 0 = entailment)
LABEL_NAMES = {"rte": {"entailment": "0", "not_entailment": "1"}}


@dataclasses.dataclass
class GlueSplit:
    """One labelled split: ``texts_a[i]`` (and ``texts_b[i]`` for pair tasks) with integer ``labels[i]``.

    Attributes:
        task: one of :data:`GLUE_TASKS`.
        split: ``"train"`` or ``"dev"``.
        texts_a: first (or only) sentences, ``list[str]`` of length N.
        texts_b: second sentences for pair tasks (RTE, MRPC), else ``None``.
        labels: int64 array ``(N,)`` with values in ``[0, num_classes)``.
        files: the files read, for results records.
    """

    task: str
    split: str
    texts_a: list[str]
    texts_b: list[str] | None
    labels: np.ndarray
    files: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subsample(self, n: int, seed: int) -> GlueSplit:
        """The first ``n`` rows of a seeded permutation (all rows when ``n >= len``), order kept sorted."""
        if n >= len(self):
            return self
        keep = np.sort(np.random.default_rng(seed).permutation(len(self))[:n])
        b = None if self.texts_b is None else [self.texts_b[i] for i in keep]
        return GlueSplit(self.task, self.split, [self.texts_a[i] for i in keep], b, self.labels[keep], self.files)


def check_task(task: str) -> str:
    """Return ``task`` lower-cased; ``ValueError`` naming it and the known tasks otherwise."""
    name = str(task).lower().replace("-", "")
    if name not in GLUE_TASKS:
        raise ValueError(f"GLUE task {task!r} is unknown; expected one of {GLUE_TASKS}")
    return name


def _read_tsv(path: Path, header: bool) -> list[list[str]]:
    if not path.is_file():
        raise FileNotFoundError(f"GLUE file {path} is missing (see the data README for the expected layout)")
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[1:] if header else rows


def _labels(values: list[str], path: Path) -> np.ndarray:
    try:
        labels = np.array([int(v) for v in values], dtype=np.int64)
    except ValueError as exc:
        raise ValueError(f"{path}: labels must be integers ({exc})") from None
    if len(labels) == 0:
        raise ValueError(f"{path} has no labelled rows; expected at least one example")
    if labels.min() < 0 or labels.max() > 1:
        raise ValueError(
            f"{path}: labels must be 0 or 1 (an unlabelled test file?); got {sorted(set(labels.tolist()))}"
        )
    return labels


def _text(value: str, path: Path, line: int) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"{path} row {line}: the sentence is empty; expected text in every row")
    return text


def _single(paths: list[Path], text_col: int, label_col: int, header: bool, ncols: int):
    texts, labels = [], []
    for path in paths:
        rows = _read_tsv(path, header)
        for i, row in enumerate(rows):
            if len(row) != ncols:
                raise ValueError(f"{path} row {i + 1 + header}: expected {ncols} tab-separated fields, got {len(row)}")
            texts.append(_text(row[text_col], path, i + 1 + header))
            labels.append(row[label_col])
    return texts, _labels(labels, paths[0])


def _by_header(paths: list[Path], task: str):
    """``(texts_a, texts_b or None, labels)`` of files whose first row names the columns (:data:`COLUMNS`): the
    columns are found by name, so their order and further named columns do not matter. A first row without the
    expected names (a file without a header, another layout) is refused: it was read as a header and dropped."""
    wanted = [c for c in COLUMNS[task] if c is not None]
    texts_a, texts_b, labels = [], [], []
    for path in paths:
        rows = _read_tsv(path, header=False)
        header = [h.strip() for h in rows[0]] if rows else []
        missing = [c for c in wanted if c not in header]
        if missing:
            first = [f[:30] + ("..." if len(f) > 30 else "") for f in rows[0]] if rows else "(empty file)"
            raise ValueError(
                f"{path}: the first row {first} is not a header naming the "
                f"columns {wanted} (missing {missing}); expected a tab-separated header row, then one "
                "labelled example per row"
            )
        cols = [header.index(c) for c in wanted]
        for line, row in enumerate(rows[1:], 2):
            if len(row) != len(header):
                raise ValueError(
                    f"{path} row {line}: expected {len(header)} tab-separated fields (as the header "
                    f"{header}), got {len(row)}"
                )
            texts_a.append(_text(row[cols[0]], path, line))
            if len(cols) == 3:
                texts_b.append(_text(row[cols[1]], path, line))
            label = row[cols[-1]].strip()
            labels.append(LABEL_NAMES.get(task, {}).get(label, label))
    return texts_a, (texts_b if len(wanted) == 3 else None), _labels(labels, paths[0])


def load_glue(task: str, split: str, data_dir: str | Path | None = None) -> GlueSplit:
    """Load a labelled GLUE split from ``data_dir`` (default: ``<data>/glue``, see :mod:`coupled_qk.data.paths`).

    Args:
        task: ``"sst2"``, ``"cola"``, ``"rte"`` or ``"mrpc"`` (case and ``-`` ignored).
        split: ``"train"`` (GLUE training set) or ``"dev"`` (labelled GLUE dev set).
        data_dir: the folder holding ``SST-2/``, ``CoLA/``, ``RTE/``, ``MRPC/``.

    Raises:
        ValueError: unknown task or split, a header row without the task's column names, rows with another
            number of fields than the header (or CoLA's 4), an empty sentence, no rows, or labels outside {0, 1}
            (each naming the file, and the row where there is one).
        FileNotFoundError: a file of the split is missing, naming it.
    """
    task = check_task(task)
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; expected one of {SPLITS} (GLUE test labels are not public)")
    root = Path(data_dir) if data_dir is not None else default_data_dir() / "glue"
    folder = root / TASK_INFO[task][0]
    b = None
    if task == "sst2":
        # this copy splits the GLUE training set in train.tsv + dev.tsv and keeps the GLUE dev set in test.tsv;
        # a standard GLUE copy has no test.tsv labels, so its dev.tsv is the dev set
        test = folder / "test.tsv"
        has_labelled_test = test.is_file() and test.open(encoding="utf-8-sig").readline().split() == [
            "sentence",
            "label",
        ]
        if split == "dev":
            paths = [folder / ("test.tsv" if has_labelled_test else "dev.tsv")]
        else:
            paths = [folder / "train.tsv"] + ([folder / "dev.tsv"] if has_labelled_test else [])
        a, _, y = _by_header(paths, task)
    elif task == "cola":
        names = ["in_domain_train.tsv"] if split == "train" else ["in_domain_dev.tsv", "out_of_domain_dev.tsv"]
        paths = [folder / "raw" / n for n in names]
        if not (folder / "raw").is_dir() and (folder / f"{split}.tsv").is_file():  # GLUE's own copy: same columns
            paths = [folder / f"{split}.tsv"]
        a, y = _single(paths, 3, 1, header=False, ncols=4)
    else:
        paths = [folder / f"{split}.tsv"]
        a, b, y = _by_header(paths, task)
    return GlueSplit(task, split, a, b, y, [str(p) for p in paths])


def format_example(tokenizer, text_a: str, text_b: str | None, max_len: int) -> tuple[list[int], bool]:
    """Token ids of one example in the GPT layout (module docstring) and whether it was truncated.

    Args:
        tokenizer: a :class:`coupled_qk.data.tokenizers.Tokenizer` with ``eot_id``.
        text_a, text_b: the sentence(s); ``text_b`` is ``None`` for single-sentence tasks.
        max_len: the most tokens allowed (the model's ``block_size``); at least 2 for single, 4 for pairs.

    Returns:
        ``(ids, truncated)``: ``ids`` a list of ints ending in ``eot_id``, ``len(ids) <= max_len``.

    Raises:
        ValueError: the tokenizer has no ``<|endoftext|>`` token, or ``max_len`` is too small.
    """
    eot = tokenizer.eot_id
    if eot is None:
        raise ValueError(f"tokenizer {tokenizer.name!r} has no <|endoftext|> token, which GLUE formatting needs")
    if text_b is None:
        if max_len < 2:
            raise ValueError(f"max_len={max_len} must be >= 2")
        a = tokenizer.encode(text_a)
        return a[: max_len - 1] + [eot], len(a) > max_len - 1
    if max_len < 4:
        raise ValueError(f"max_len={max_len} must be >= 4 for sentence pairs")
    a, b = tokenizer.encode(text_a), tokenizer.encode(text_b)
    budget = max_len - 2
    truncated = len(a) + len(b) > budget
    while len(a) + len(b) > budget:  # longest segment first, as in BERT's run_classifier
        if len(a) >= len(b):
            a = a[:-1]
        else:
            b = b[:-1]
    return a + [eot] + b + [eot], truncated


def encode_split(split: GlueSplit, tokenizer, max_len: int) -> tuple[list[list[int]], int]:
    """Format every example of ``split``; returns ``(ids per example, number of truncated examples)``."""
    out, n_trunc = [], 0
    for i in range(len(split)):
        ids, cut = format_example(
            tokenizer, split.texts_a[i], None if split.texts_b is None else split.texts_b[i], max_len
        )
        out.append(ids)
        n_trunc += cut
    return out, n_trunc


def glue_metrics(task: str, labels, predictions) -> dict:
    """GLUE metrics of ``predictions`` against ``labels`` (1-D int arrays of equal length N >= 1).

    Returns:
        ``{"accuracy": float}`` plus ``"mcc"`` (CoLA: Matthews correlation, 0 for constant predictions) or
        ``"f1"`` (MRPC: F1 of class 1, 0 when no positive is predicted); all computed with scikit-learn.

    Raises:
        ValueError: unknown task, empty or unequal-length inputs.
        ImportError: scikit-learn is not installed (the ``[glue]`` extra).
    """
    try:
        from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
    except ImportError as exc:  # an optional dependency: the [glue] extra
        raise MissingExtra("GLUE metrics need scikit-learn: pip install 'coupled-qk[glue]'") from exc

    task = check_task(task)
    y, p = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
    if len(y) == 0 or len(y) != len(p):
        raise ValueError(f"labels ({len(y)}) and predictions ({len(p)}) must be non-empty and of equal length")
    out = {"accuracy": float(accuracy_score(y, p))}
    if task == "cola":
        out["mcc"] = float(matthews_corrcoef(y, p))
    if task == "mrpc":
        out["f1"] = float(f1_score(y, p, pos_label=1, zero_division=0.0))
    return out
