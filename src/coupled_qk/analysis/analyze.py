"""Attention diagnostics of checkpoints on real text (docs/METHOD.md section 7): the orchestration.

:func:`analyze_checkpoints` loads each checkpoint and its tokenizer, takes the same windows of a corpus split,
runs :func:`coupled_qk.analysis.capture.analyze_model` and writes ``analysis.json``
(:mod:`coupled_qk.analysis.report`), PNG figures (:mod:`coupled_qk.analysis.plots`) and ``summary.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from coupled_qk.analysis.capture import analyze_model, token_windows
from coupled_qk.analysis.conventions import CONVENTIONS, MAP_METRICS
from coupled_qk.analysis.report import dumps, summary_markdown
from coupled_qk.checks.values import positive_int
from coupled_qk.training.run_folder import OpenedRun, open_run

__all__ = [
    "MAP_METRICS",
    "CONVENTIONS",
    "analyze_model",
    "token_windows",
    "analyze_checkpoints",
    "summary_markdown",
]


def _default_labels(folders: list[Path]) -> list[str]:
    """The shortest trailing parts of the run folders' paths that tell the runs apart (``standard/seed0`` and
    ``coupled/seed0`` for ``runs/x/standard/seed0`` and ``runs/x/coupled/seed0``), ``#2``... for true repeats."""
    runs = [Path(f).resolve() for f in folders]
    depth = 1
    while depth < 6 and len({r.parts[-depth:] for r in runs}) < len(set(runs)):
        depth += 1
    labels = ["/".join(r.parts[-depth:]) for r in runs]
    out, seen = [], {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def run_text_source(runs: Sequence[OpenedRun], corpus: str | None, data_dir, split_seed: int | None) -> tuple:
    """``(corpus, data_dir, task_options)`` to analyse the checkpoints of ``runs`` on: the given corpus, or else
    the runs' own.

    Without ``corpus`` every run must name the same corpus (and split options) in its config, so the held-out text
    is exactly the one the runs were evaluated on.

    Raises:
        ValueError: no corpus given and a run has no config naming its corpus, or the runs used different corpora.
    """
    if corpus is not None:
        return corpus, data_dir, {"split_seed": split_seed or 0}
    sources = {}
    for run in runs:
        cfg = run.config
        if "corpus" not in cfg:
            raise ValueError(
                f"--corpus is needed: {run.folder.path} has no {run.folder.CONFIG} naming the run's corpus"
            )
        opts = dict(cfg.get("task_options") if cfg.get("task_options") is not None else {})
        opts.pop("final_eval_windows", None)  # unused by analyze, and no part of the split (see _split_options)
        if split_seed is not None:
            opts["split_seed"] = split_seed
        source = (cfg["corpus"], data_dir if data_dir is not None else cfg.get("data_dir"))
        sources.setdefault((*source, json.dumps(_split_options(opts), sort_keys=True)), (*source, opts))
    if len(sources) > 1:
        raise ValueError(
            f"the checkpoints were trained on different corpora or splits ({sorted(sources)}); "
            "pass --corpus to analyse them on the same text"
        )
    return next(iter(sources.values()))


def _split_options(task_options: dict) -> dict:
    """Every split option of a run's ``task_options``, defaults filled in (``{}`` and ``{"split_seed": 0}`` name
    the same split; ``final_eval_windows``, as ``demo --quick`` sets it, is left out).

    Raises:
        ValueError: an unknown option or a value out of range (:class:`coupled_qk.training.tasks.lm.LMOptions`).
    """
    from coupled_qk.training.tasks.lm import LMOptions

    options = dataclasses.asdict(LMOptions.from_options(task_options))
    options.pop("final_eval_windows")  # how much of the splits a final evaluation scored, not which text
    return options


def _warn_changed_text(runs: Sequence[OpenedRun], text_corpus, split: str) -> None:
    """Warn, once per run folder, when the ``split`` of the runs' own corpus read back is not the text the run
    recorded in its ``data.json`` (its SHA-256; :func:`coupled_qk.training.tasks.lm.split_changes`): the corpus was
    edited or appended to since, so the analysed windows are not the run's held-out text. A run that recorded no
    SHA-256 (written before it was recorded) is not checked."""
    from coupled_qk.training.tasks.lm import split_changes

    for folder in dict.fromkeys(run.folder for run in runs):
        changes = split_changes(folder, text_corpus, [split])
        if changes:
            warnings.warn(
                f"the {split} split of {text_corpus.name!r} changed since {folder.path} trained on it "
                f"({folder.data_path} vs now: {'; '.join(changes)}): the analysed text is not "
                "the run's own; restore the corpus to analyse what the run saw",
                UserWarning,
                stacklevel=3,
            )


ANALYSIS_LAYOUT = ("analysis.json", "summary.md", "*.png")
"""What an analysis folder holds; any other file there makes :func:`analyze_checkpoints` refuse the folder."""


def analyze_checkpoints(
    paths: Sequence[str | Path],
    corpus: str | None = None,
    split: str = "valid",
    n_sequences: int = 8,
    seq_len: int | None = None,
    data_dir: str | Path | None = None,
    out_dir: str | Path = "runs/analysis",
    *,
    labels: Sequence[str] | None = None,
    batch_size: int | None = None,
    example_layer: int | None = None,
    example_head: int = 0,
    example_tokens: int = 128,
    split_seed: int | None = None,
    device: str | torch.device = "cpu",
    make_plots: bool = True,
    threads: int | None = None,
) -> dict:
    """Analyse several checkpoints on the same windows of a corpus split and write a report.

    Each path is a run folder (its ``latest`` checkpoint is used) or a checkpoint folder of one
    (:func:`coupled_qk.training.run_folder.open_run`, which refuses a run still training, a GLUE or MQAR run, and
    warns when the runs' own text is analysed without their record of it); the tokenizer is the run's. The text is
    the ``split`` of the
    runs' own corpus, split as in training (:func:`run_text_source`), or of ``corpus`` when given; the windows are the
    first ``n_sequences`` non-overlapping windows of ``seq_len`` tokens from the start of the split
    (:func:`token_windows`). **The windows are the same text for every checkpoint only when the checkpoints
    share a tokenizer** (with different tokenizers the same number of tokens covers different amounts of
    text; ``analysis.json`` records each tokenizer's fingerprint, a hash of the token ids and the number of
    characters covered, and ``"same_tokenizer"``).

    Writes into ``out_dir`` (created): ``analysis.json`` (settings, conventions and, per checkpoint, its
    label, paths, progress state, tokenizer, text coverage, seconds and the :func:`analyze_model` result
    without the example map), the PNG figures of :func:`coupled_qk.analysis.plots.make_figures` (unless
    ``make_plots`` is False) and ``summary.md`` (:func:`summary_markdown`).

    Args:
        paths: one or more checkpoint or run folders.
        corpus: corpus name or path (see :func:`~coupled_qk.data.corpora.load_corpus`); default: the runs' own.
        split: ``"train"``, ``"valid"`` or ``"test"``.
        n_sequences: windows ``B >= 1``.
        seq_len: tokens per window (default: the smallest ``block_size`` of the checkpoints); must not exceed
            any checkpoint's ``block_size``.
        data_dir: data folder for named corpora.
        out_dir: output folder.
        labels: one label per path (default: the run folder names, made unique).
        batch_size: sequences per forward pass (default all; see :func:`analyze_model`).
        example_layer, example_head: the attention map drawn for each checkpoint (default: the middle layer,
            ``n_layer // 2`` of the shallowest model, head 0); example_tokens: its size (top-left square).
        split_seed: seed of the document-level split of corpora split at random (default: the run's).
        device: device for the models.
        make_plots: write the PNG figures.
        threads: heads analysed concurrently on CPU (see :func:`analyze_model`).

    Returns:
        The dict written to ``analysis.json`` plus ``"files"`` (paths of everything written).

    Raises:
        ValueError: no paths, label count mismatch, bad ``split`` / ``n_sequences`` / ``seq_len`` /
            ``batch_size`` / ``threads`` / ``example_tokens``, an ``example_layer`` / ``example_head`` that some
            checkpoint lacks (all checked before any model is loaded), a split with too few tokens (named), a
            tokenizer whose ids exceed a model's vocabulary, a checkpoint with non-finite weights. A failed
            analysis writes nothing (not even an empty ``out_dir``).
        FileNotFoundError: a checkpoint, tokenizer or corpus file is missing.
    """
    from coupled_qk.output_dir import as_output_dir

    # the output is claimed before any work: a folder holding other files, or an earlier analysis without
    # --overwrite, is refused here (docs/RELIABILITY.md, "Outputs")
    out = as_output_dir(out_dir, "out_dir", layout=ANALYSIS_LAYOUT, what="analyze")
    out.claim_existing()
    own_text = corpus is None and split_seed is None
    sizes = {"batch_size": batch_size, "threads": threads, "example_tokens": example_tokens}
    paths, runs, labels, tokenizers, seq_len, example_layer = _checked_inputs(
        paths, split, n_sequences, seq_len, labels, (example_layer, example_head), own_text, sizes
    )
    corpus, text_corpus, task_options = _analysis_corpus(runs, corpus, data_dir, split_seed, split)
    text = (text_corpus.split(split), f"the {split} split of corpus {str(corpus)!r}")
    # the folder is created by the first write: an analysis that fails leaves no empty folder behind
    how = (device, batch_size, (example_layer, example_head), example_tokens, threads)
    entries, examples, n_tokenizers = _analyze_each(
        zip(labels, paths, runs, tokenizers), text, n_sequences, seq_len, how
    )
    report = {
        **_text_settings(corpus, text_corpus, split, task_options, n_sequences, seq_len),
        "same_tokenizer": n_tokenizers == 1,
        "example": {"layer": example_layer, "head": example_head, "sequence": 0},
        "conventions": dict(CONVENTIONS),
        "checkpoints": entries,
    }
    report["files"] = _write_analysis(report, entries, examples, out, make_plots)
    return report


def _analysis_corpus(runs: list[OpenedRun], corpus, data_dir, split_seed: int | None, split: str):
    """``(corpus, text_corpus, task_options)``: the corpus the checkpoints are analysed on (:func:`run_text_source`),
    loaded and split. The runs' own saved split options are read back as they ran (a warning if unused, and one if
    the runs' text changed since); ``split_seed`` is checked."""
    from coupled_qk.training.tasks.lm import run_corpus, saved_run_corpus

    own_text = corpus is None and split_seed is None
    corpus, data_dir, task_options = run_text_source(runs, corpus, data_dir, split_seed)
    text_corpus = (
        saved_run_corpus(runs[0].folder, corpus, data_dir, task_options)
        if own_text
        else run_corpus(corpus, data_dir, task_options, saved=split_seed is None)
    )
    if own_text:
        _warn_changed_text(runs, text_corpus, split)
    return corpus, text_corpus, task_options


def _text_settings(corpus, text_corpus, split: str, task_options: dict, n_sequences: int, seq_len: int) -> dict:
    """The text settings that open ``analysis.json``: corpus, split, task options and windows."""
    return {
        "corpus": str(corpus),
        "corpus_source": text_corpus.source,
        "split": split,
        "split_seed": task_options.get("split_seed", 0),
        "task_options": task_options,
        "n_sequences": n_sequences,
        "seq_len": seq_len,
        "windows": "the first n_sequences non-overlapping windows of seq_len tokens from the start of the split; "
        "the same text for every checkpoint only when the tokenizers are the same",
    }


def _analyze_each(inputs, text: tuple[str, str], n_sequences: int, seq_len: int, how: tuple) -> tuple[list, list, int]:
    """:func:`analyze_model` of each ``(label, path, opened run, tokenizer)`` of ``inputs`` on
    the windows its tokenizer gives of ``text`` (the text and what it is, for errors; tokenized once per
    tokenizer); ``how``: ``(device, batch_size, (example layer, example head), example_tokens, threads)`` of
    :func:`_analyze_checkpoint`. Returns the ``analysis.json`` entries, the example maps and the number of distinct
    tokenizers."""
    windows: dict[str, tuple[torch.Tensor, dict]] = {}
    entries, examples = [], []
    for label, path, run, tok in inputs:
        ckpt = run.checkpoint
        if tok.fingerprint not in windows:
            windows[tok.fingerprint] = _windows_of(*text, tok, n_sequences, seq_len)
        ids, text_info = windows[tok.fingerprint]
        entry, example_map = _analyze_checkpoint(run, ids, *how)
        examples.append(example_map)
        entries.append(
            {
                "label": label,
                "path": str(path),
                "checkpoint": str(ckpt.resolve()),  # absolute: the report names what it was computed on from anywhere
                "run_dir": str(run.folder.path.resolve()),
                "state": entry["state"],
                "tokenizer": {
                    "path": str(run.folder.tokenizer_dir),
                    "name": tok.name,
                    "fingerprint": tok.fingerprint,
                    "vocab_size": tok.vocab_size,
                },
                "text": dict(text_info),
                "seconds": entry["seconds"],
                "analysis": entry["analysis"],
            }
        )
    return entries, examples, len(windows)


def _checked_inputs(paths, split, n_sequences, seq_len, labels, example: tuple, own_text: bool, sizes: dict):
    """The paths (as a list), opened runs, labels, tokenizers, window length and example layer of
    :func:`analyze_checkpoints` (``example``: its layer and head; ``own_text``: the runs' own text is analysed;
    ``sizes``: ``batch_size``, ``threads`` and ``example_tokens``, each ``None`` or an int >= 1), every argument
    checked before any model is loaded (its ``ValueError`` / ``FileNotFoundError``)."""
    from coupled_qk.data.corpora import SPLITS
    from coupled_qk.training.checkpoint_format import Checkpoint

    for name, value in sizes.items():
        if value is not None:
            positive_int(name, value)
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("paths is empty: give at least one checkpoint or run folder")
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 1:
        raise ValueError(f"n_sequences must be an int >= 1; got {n_sequences!r}")
    runs = [open_run(p, "analyze", text=True, data="warn" if own_text else None) for p in paths]
    ckpts = [run.checkpoint for run in runs]
    if labels is None:
        labels = _default_labels([run.folder.path for run in runs])
    labels = [str(label) for label in labels]
    if len(labels) != len(ckpts):
        raise ValueError(f"got {len(labels)} labels for {len(ckpts)} checkpoints: give one label per checkpoint")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be unique; got {labels}")
    configs = [Checkpoint(c).model_config() for c in ckpts]
    tokenizers = [run.tokenizer() for run in runs]
    min_block = min(c.block_size for c in configs)
    if seq_len is None:
        seq_len = min_block
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2 or None; got {seq_len!r}")
    if seq_len > min_block:
        worst = min(range(len(ckpts)), key=lambda i: configs[i].block_size)
        raise ValueError(f"seq_len={seq_len} (--seq-len) exceeds block_size={min_block} of checkpoint {ckpts[worst]}")
    for tok, cfg, ckpt in zip(tokenizers, configs, ckpts):
        if tok.vocab_size > cfg.vocab_size:
            raise ValueError(
                f"the tokenizer of {ckpt} has {tok.vocab_size} ids but the model's vocab_size is {cfg.vocab_size}"
            )
    example_layer, example_head = example
    if example_layer is None:
        example_layer = min(c.n_layer for c in configs) // 2
    _check_example(example_layer, example_head, configs, ckpts)
    return paths, runs, labels, tokenizers, seq_len, example_layer


def _check_example(example_layer, example_head, configs, ckpts) -> None:
    """``ValueError`` unless ``example_layer`` / ``example_head`` are ints indexing a layer / an attention-map head
    of every checkpoint (negative: from the end), naming the option, its value and a checkpoint lacking it."""
    from coupled_qk.models.registry import get_attention

    map_heads = [c.n_heads // get_attention(c.attention).head_group for c in configs]
    for name, value, sizes, what in (
        ("example_layer", example_layer, [c.n_layer for c in configs], "layers"),
        ("example_head", example_head, map_heads, "attention-map heads"),
    ):
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} ({flag}) must be an int")
        i = min(range(len(sizes)), key=sizes.__getitem__)
        if not -sizes[i] <= value < sizes[i]:
            raise ValueError(
                f"{name}={value} ({flag}) is out of range: checkpoint {ckpts[i]} has {sizes[i]} "
                f"{what} (0 .. {sizes[i] - 1}, or negative from the end)"
            )


def _windows_of(text: str, source: str, tok, n_sequences: int, seq_len: int) -> tuple[torch.Tensor, dict]:
    """The token windows of ``text`` for ``tok`` (:func:`token_windows`) and what they cover; a text too short
    is a ``ValueError`` naming ``source`` (what the text is), the tokenizer and the token counts."""
    try:
        ids = token_windows(text, tok, n_sequences, seq_len)
    except ValueError as err:
        raise ValueError(f"{source} is too short for tokenizer {tok.name}: {err}") from None
    covered = len(tok.decode(ids.flatten().tolist()))
    digest = hashlib.sha256(ids.numpy().astype("<i8").tobytes()).hexdigest()
    return ids, {"tokens": int(ids.numel()), "chars_covered": covered, "token_sha256": digest}


def _analyze_checkpoint(
    run: OpenedRun, ids: torch.Tensor, device, batch_size, example: tuple[int, int], example_tokens: int, threads
) -> tuple[dict, object]:
    """The :func:`analyze_model` result (``state``, ``seconds``, ``analysis``) of an opened run's checkpoint and its
    example map."""
    model, state = run.load_model(device)
    t0 = time.perf_counter()
    result = analyze_model(
        model, ids, batch_size=batch_size, example=example, example_tokens=example_tokens, threads=threads
    )
    seconds = time.perf_counter() - t0
    del model
    example_map = result.pop("example")
    return {"state": state, "seconds": seconds, "analysis": result}, example_map


def _write_analysis(report: dict, entries: list, examples: list, out, make_plots: bool) -> dict[str, str]:
    """Write the figures (adding ``report["figures"]``), ``analysis.json`` and ``summary.md`` into the claimed
    output folder ``out`` (:class:`coupled_qk.output_dir.OutputDir`, atomic writes); their paths."""
    files: dict[str, str] = {}
    if make_plots:
        from coupled_qk.analysis.plots import make_figures

        figures = make_figures(entries, examples, out.path)
        for path in figures.values():
            out.record(path)  # recorded as this command's output (coupled_qk.output_dir.RECORD)
        report["figures"] = {k: Path(v).name for k, v in figures.items()}
        files.update({k: str(v) for k, v in figures.items()})
    json_path = out.write_text("analysis.json", dumps(report))
    md_path = out.write_text("summary.md", summary_markdown(report))
    files.update({"analysis.json": str(json_path), "summary.md": str(md_path)})
    return files
