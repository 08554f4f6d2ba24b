"""Corpora from the Hugging Face hub through ``datasets`` (optional extra: ``pip install "coupled-qk[datasets]"``).

``--corpus hf:NAME[:CONFIG]`` loads ``datasets.load_dataset(NAME, CONFIG)``: a hub dataset when online (for
example ``hf:Salesforce/wikitext:wikitext-103-raw-v1``), a dataset already in the local ``datasets`` cache,
or a local folder or file that ``datasets`` can read (``hf:/data/my-corpus`` with ``train.txt``,
``validation.txt``, ``test.txt``). Nothing here runs unless a corpus name starts with ``hf:``; every other
corpus keeps loading from local files without ``datasets``.

Splits: ``train``, ``validation`` (or ``valid``/``dev``) and ``test`` as given; a dataset without a validation
or test split has its training rows split at document level exactly as local files are
(:func:`coupled_qk.data.corpora.random_split`). Text: the ``text`` column, else the only string column.
Rows that end with a newline (WikiText on the hub: one line per row) are concatenated as they are, which
restores the original files; other rows (one document or line each) are joined with newlines.
"""

from __future__ import annotations

import os

PREFIX = "hf:"
DEMO_HUB_CORPUS = "hf:Salesforce/wikitext:wikitext-2-raw-v1"
_SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"hf:NAME[:CONFIG]" -> (NAME, CONFIG or None)``; the config is the part after the last ``:`` that
    is not part of a local path (a path that exists is taken whole).

    Raises:
        ValueError: ``spec`` does not start with ``hf:`` or names nothing.
    """
    if not spec.startswith(PREFIX):
        raise ValueError(f"corpus={spec!r} is not a hub corpus; expected 'hf:NAME[:CONFIG]'")
    body = spec[len(PREFIX) :]
    if os.path.exists(body) or ":" not in body:
        name, config = body, None
    else:
        name, config = body.rsplit(":", 1)
    if not name:
        raise ValueError(f"corpus={spec!r} names no dataset; expected 'hf:NAME[:CONFIG]', e.g. {DEMO_HUB_CORPUS!r}")
    return name, config or None


def _text_column(split, spec: str) -> str:
    columns = split.column_names
    if "text" in columns:
        return "text"
    strings = [c for c, f in split.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    if len(strings) == 1:
        return strings[0]
    raise ValueError(f"corpus {spec!r}: no 'text' column and not exactly one string column (columns: {columns})")


def _join_rows(rows: list[str]) -> str:
    nonempty = [r for r in rows if r]
    if nonempty and all(r.endswith("\n") for r in nonempty):
        return "".join(rows)
    return "\n".join(rows) + "\n"


def load_hub_corpus(
    spec: str,
    seed: int = 0,
    valid_fraction: float = 0.01,
    test_fraction: float = 0.01,
    cache_dir: str | None = None,
    min_split_words: int | None = None,
):
    """Load ``hf:NAME[:CONFIG]`` with ``datasets`` as a :class:`coupled_qk.data.corpora.Corpus`.

    Args:
        spec: ``"hf:NAME[:CONFIG]"`` (see the module docstring).
        seed, valid_fraction, test_fraction: document-level split of the training rows when the dataset
            lacks a validation or test split (as :func:`coupled_qk.data.corpora.load_corpus`).
        cache_dir: the ``datasets`` cache folder (default: ``datasets``' own, ``HF_DATASETS_CACHE``).
        min_split_words: words each random evaluation split aims for (default
            :data:`~coupled_qk.data.documents.MIN_SPLIT_WORDS`; see :func:`random_split`).

    Returns:
        A ``Corpus`` named ``spec`` whose ``source`` records the dataset, config, split names and text column.

    Raises:
        ImportError: ``datasets`` is not installed (says how to install it).
        ValueError: bad spec, no train split, no usable text column, or an empty split.
        FileNotFoundError: ``datasets.load_dataset`` failed (an unknown name or config, no network and nothing
            cached), naming the corpus and the error of ``datasets``.
    """
    from coupled_qk.data.documents import (
        MIN_SPLIT_WORDS,
        finish_corpus,
        join_documents,
        random_split,
        split_documents,
    )

    name, config = parse_spec(spec)
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"corpus {spec!r} needs the Hugging Face 'datasets' package: pip install \"coupled-qk[datasets]\""
        ) from exc
    try:
        ds = datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as exc:  # hub, network and config errors of datasets: one line naming the corpus
        raise FileNotFoundError(
            f"corpus {spec!r}: datasets.load_dataset({name!r}, {config!r}) failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); expected a dataset name (and config) on the Hugging "
            "Face hub, or one already in the datasets cache when offline; a local text file or folder needs no "
            "hf: prefix"
        ) from exc
    found = {ours: next((n for n in names if n in ds), None) for ours, names in _SPLIT_NAMES.items()}
    if found["train"] is None:
        raise ValueError(f"corpus {spec!r}: the dataset has no 'train' split (splits: {list(ds)})")
    column = _text_column(ds[found["train"]], spec)
    texts = {ours: _join_rows(ds[n][column]) for ours, n in found.items() if n is not None}
    source = {"hub_dataset": name, "config": config, "text_column": column, "splits": found,
              "datasets_version": datasets.__version__}  # fmt: skip
    if found["valid"] is None or found["test"] is None:
        words = MIN_SPLIT_WORDS if min_split_words is None else min_split_words
        train, valid, test = random_split(
            split_documents(texts["train"]), seed, valid_fraction, test_fraction, spec, words
        )
        texts = {"train": join_documents(train), "valid": join_documents(valid), "test": join_documents(test)}
        source.update(split="document-level random", seed=seed, valid_fraction=valid_fraction,
                      test_fraction=test_fraction, min_split_words=words)  # fmt: skip
    else:
        source["split"] = "given"
    return finish_corpus(spec, texts["train"], texts["valid"], texts["test"], source)


def demo_corpus(data_dir=None) -> tuple[str, str]:
    """The corpus for ``coupled-qk demo``: ``(corpus spec, sentence saying which data is used)``.

    ``wiki-vital`` from the offline data folder when it exists; otherwise WikiText-2 (raw, its real train,
    validation and test splits) from the Hugging Face hub through ``datasets`` when it can be loaded (online,
    or already in the ``datasets`` cache).

    Raises:
        FileNotFoundError: neither is available; the message says what to download and where to point
            ``--data-dir`` / ``COUPLED_QK_DATA``, and why the hub was not used.
    """
    from pathlib import Path

    from coupled_qk.data.paths import DATA_ENV, data_dir_candidates, default_data_dir

    try:
        root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        local_error = (
            None if (root / "wiki-vital" / "train.txt").is_file() else f"{root}/wiki-vital/train.txt is missing"
        )
    except FileNotFoundError as exc:
        root, local_error = None, str(exc)
    if local_error is None:
        return "wiki-vital", f"data: wiki-vital (train) and WikiText-2 valid/test from the offline folder {root}"
    offline = [v for v in _OFFLINE_ENV if os.environ.get(v, "").strip() not in ("", "0")]
    try:
        if offline:
            raise ConnectionError(f"{'/'.join(offline)} is set")
        load_hub_corpus(DEMO_HUB_CORPUS)  # downloads once; datasets caches it for the training run
    except Exception as exc:  # ImportError, ConnectionError, hub errors: report them all the same way
        tried = str(data_dir) if data_dir is not None else ", ".join(str(p.resolve()) for p in data_dir_candidates())
        raise FileNotFoundError(
            f"coupled-qk demo found no training data. Offline: {local_error} (tried {tried}). Hub: WikiText-2 "
            f"could not be loaded with datasets ({type(exc).__name__}: {exc}). Either get the project's data "
            f"folder (wiki-vital/train.txt and wikitext-2/valid.txt, test.txt) and pass --data-dir FOLDER or set "
            f"{DATA_ENV}=FOLDER; or download WikiText-2 (wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens "
            "from https://huggingface.co/datasets/Salesforce/wikitext) into FOLDER and run "
            "'coupled-qk demo --corpus wikitext-2 --data-dir FOLDER'; or go online with "
            'pip install "coupled-qk[datasets]".'
        ) from exc
    return DEMO_HUB_CORPUS, (
        f"data: WikiText-2 (raw; train/validation/test) from the Hugging Face hub ({DEMO_HUB_CORPUS}), "
        f"because the offline data folder is unavailable ({local_error})"
    )
