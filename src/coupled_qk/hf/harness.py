"""lm-evaluation-harness for coupled-qk models, offline: local task files and a CLI that knows our models.

``python -m coupled_qk.hf.harness run --model hf --model_args pretrained=HF_DIR,backend=causal --tasks NAME
--include_path TASK_DIR --device cpu`` is the ``lm-eval`` command line (``pip install "coupled-qk[lm-eval]"``)
after ``import coupled_qk``, which registers ``model_type = "coupled_qk"`` with ``AutoModelForCausalLM``.

Generation length (``generate_until`` tasks): lm-eval's ``hf`` model generates up to 256 tokens unless the task
sets ``max_gen_toks``, and stops with an assertion when the context is not longer than that (every ``tiny``
model: context 128). This entry point runs ``--model hf`` (or ``--model coupled_qk``) through
:class:`CoupledQKLM`, lm-eval's ``HFLM`` whose default generation length is :func:`fitting_max_gen_toks`: 256
when the context holds more than 512 tokens, else half the context (a one-line notice says so); ``--model_args
...,max_gen_toks=N`` overrides it. A length set by the task itself is lm-eval's business and is kept.

A retrofitted model's folder (:func:`coupled_qk.hf.retrofit`, ``save_pretrained``) is scored with its coupling:
lm-eval's plain ``from_pretrained`` keeps only the base weights, and :class:`CoupledQKLM` then restores the saved
dynamics (:func:`coupled_qk.hf.retrofit_load.restore_retrofit`).

``python -m coupled_qk.hf.harness make-task perplexity|sst2 FILE TASK_DIR [--name NAME] [--max-docs N]`` writes
a local task (``NAME.yaml`` + ``NAME.jsonl``) that lm-eval reads with ``datasets``' ``json`` loader, so no
dataset is downloaded:

- ``perplexity``: a text file (WikiText layout: `` = Title = `` headings; or paragraphs separated by blank
  lines) as documents for ``loglikelihood_rolling`` (word and byte perplexity, bits per byte), like
  lm-eval's ``wikitext`` task.
- ``sst2``: a ``sentence<TAB>label`` file (GLUE SST-2) as the two-choice task of lm-eval's ``sst2`` (same
  prompt, ``acc``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from coupled_qk.output_dir import OutputDir

_HEADING = re.compile(r"^[ \t]*= [^=].* =[ \t]*$")
"""A WikiText article heading (`` = Title = ``), with or without WikiText's leading and trailing space (a
detokenized or edited file drops them); section headings (`` = = Sub = = ``) do not match."""

PERPLEXITY_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""

SST2_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{sentence}}}}\\nQuestion: Is this sentence positive or negative?\\nAnswer:"
doc_to_target: label
doc_to_choice: ["negative", "positive"]
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""


def text_documents(path: str | Path) -> list[str]:
    """Documents of a text file: WikiText articles (split before each `` = Title = `` line, :data:`_HEADING`: the
    spaces around the heading are optional) when the file has such headings, else paragraphs separated by blank
    lines; empty documents dropped. Line endings ``\\r\\n`` and ``\\r`` read as ``\\n``.

    Raises:
        FileNotFoundError: no such file. ValueError: the file holds no text.
    """
    path = Path(path)
    lines = _read_text(path, "text file").splitlines(keepends=True)
    if any(_HEADING.match(line.rstrip("\n")) for line in lines):
        docs, current = [], []
        for line in lines:
            if _HEADING.match(line.rstrip("\n")) and current:
                docs.append("".join(current))
                current = []
            current.append(line)
        docs.append("".join(current))
    else:
        docs = re.split(r"\n\s*\n", "".join(lines))
    docs = [d.strip("\n") for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"text file {path} holds no text")
    return docs


def make_task(
    kind: str,
    source: str | Path,
    out_dir: str | Path,
    name: str | None = None,
    max_docs: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the local lm-eval task ``<out_dir>/<name>.yaml`` and its data ``<name>.jsonl``.

    Args:
        kind: ``"perplexity"`` (a text file) or ``"sst2"`` (a ``sentence<TAB>label`` file with labels 0/1).
        source: the input file (read in place, e.g. under the offline data folder).
        out_dir: folder for the task (pass it to lm-eval as ``--include_path``).
        name: task name (default ``coupled_qk_<kind>_<file stem>``).
        max_docs: keep only the first ``max_docs`` documents / examples (``None``: all).
        overwrite: replace this task's files left by an earlier call (the folder may hold only ``*.jsonl``
            and ``*.yaml`` files: :class:`coupled_qk.output_dir.OutputDir`).

    Returns:
        The YAML path.

    Raises:
        ValueError: unknown ``kind``, bad ``max_docs`` or ``name``, a malformed SST-2 line (naming the line),
            no data, an output folder holding other files, or this task's files already there without
            ``overwrite``.
        FileNotFoundError: ``source`` does not exist.
    """
    from coupled_qk.checks.values import choice, positive_int

    choice("kind", kind, ("perplexity", "sst2"))
    if max_docs is not None:
        positive_int("max_docs", max_docs)
    source = Path(source).expanduser()
    name = name if name is not None else f"coupled_qk_{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', source.stem)}"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise ValueError(f"name={name!r} must be a task name of letters, digits, '_', '-' and '.'")
    if kind == "perplexity":
        rows = [{"text": d} for d in text_documents(source)]
    else:
        rows = _sst2_rows(source)
    rows = rows[:max_docs] if max_docs else rows
    out = OutputDir(
        out_dir, "out_dir", overwrite=overwrite, layout=("*.jsonl", "*.yaml"), what="make-task"
    )  # a task folder: the tasks' JSONL and YAML files, nothing else
    for f in (f"{name}.jsonl", f"{name}.yaml"):  # both refused before either is written
        out.claim(f, check_only=True)
    data = out.write_text(f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)).resolve()
    template = PERPLEXITY_YAML if kind == "perplexity" else SST2_YAML
    return out.write_text(f"{name}.yaml", template.format(name=name, data=json.dumps(str(data))))


def _read_text(path: Path, what: str) -> str:
    """The UTF-8 text of the file ``path`` (``what`` names it in errors: ``"text file"``, ``"SST-2 file"``); a
    leading byte order mark is not text and is dropped (as :func:`coupled_qk.data.corpora.read_text` does).

    Raises:
        FileNotFoundError: no such file. ValueError: a folder, or a file that is not UTF-8 (naming the file).
    """
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; expected a file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _sst2_rows(path: Path) -> list[dict]:
    rows = []
    for i, line in enumerate(_read_text(path, "SST-2 file").splitlines(), 1):
        if not line.strip() or (i == 1 and line.lower().startswith("sentence\t")):
            continue
        sentence, sep, label = line.rpartition("\t")
        if not sep or label.strip() not in ("0", "1"):
            raise ValueError(f"{path}:{i}: expected 'sentence<TAB>0|1'; got {line[:80]!r}")
        rows.append({"sentence": sentence.strip(), "label": int(label)})
    if not rows:
        raise ValueError(f"SST-2 file {path} holds no examples")
    return rows


LM_EVAL_MAX_GEN_TOKS = 256
"""lm-eval's default generation length (``HFLM.max_gen_toks``)."""

MODEL_NAMES = ("hf", "hf-auto", "huggingface", "coupled_qk")
"""``--model`` values this entry point runs through :class:`CoupledQKLM`."""


def fitting_max_gen_toks(max_length: int, default: int = LM_EVAL_MAX_GEN_TOKS) -> int:
    """The default generation length for a model whose context holds ``max_length`` tokens: ``default`` (lm-eval's
    256) when that leaves at least as many tokens of context, else half the context, so that lm-eval's
    ``max_length - max_gen_toks > 0`` holds and prompts keep half the window.

    Raises:
        ValueError: ``max_length < 2`` (no room for a prompt and a generated token).
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length={max_length!r} must be an integer >= 2 (a prompt token and a generated one)")
    return min(default, max_length // 2)


_LM_CLASS = None


def lm_class():
    """:class:`CoupledQKLM` (defined on first use, as it needs ``lm_eval``), registered with lm-eval's model
    registry as ``coupled_qk``.

    ``CoupledQKLM`` is lm-eval's ``HFLM`` with one more model argument, ``max_gen_toks`` (default
    :func:`fitting_max_gen_toks` of the model's context, with a one-line notice on stderr when that differs from
    lm-eval's 256). Raises ``ValueError`` for ``max_gen_toks`` that is not a positive integer smaller than the
    model's context. A retrofitted folder gets its coupling back after lm-eval's load (``ValueError`` when
    ``pretrained`` is not a local folder, where its coupling weights would be read); a tokenizer that encodes
    text to no tokens (a folder without tokenizer files) is a ``ValueError``.
    """
    global _LM_CLASS
    if _LM_CLASS is not None:
        return _LM_CLASS
    from lm_eval.api.registry import model_registry
    from lm_eval.models.huggingface import HFLM

    class CoupledQKLM(HFLM):
        def __init__(self, *args, max_gen_toks=None, **kwargs):
            super().__init__(*args, **kwargs)
            context, n = self.max_length, max_gen_toks
            if isinstance(n, str) and n.strip().isdigit():
                n = int(n)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 < n < context):
                raise ValueError(
                    f"max_gen_toks={n!r} must be a positive integer smaller than the model's "
                    f"context of {context} tokens"
                )
            self._gen_toks, self._noticed = n, n is not None

        def _create_model(self, pretrained, *args, subfolder: str = "", **kwargs):
            super()._create_model(pretrained, *args, subfolder=subfolder, **kwargs)
            _restore_retrofit(self._model, pretrained, subfolder)

        def _create_tokenizer(self, pretrained, tokenizer, *args, **kwargs):
            super()._create_tokenizer(pretrained, tokenizer, *args, **kwargs)
            _check_tokenizer(self.tokenizer, tokenizer or pretrained)

        @property
        def max_gen_toks(self) -> int:
            if self._gen_toks is None:
                self._gen_toks = fitting_max_gen_toks(self.max_length)
            if not self._noticed and self._gen_toks != LM_EVAL_MAX_GEN_TOKS:
                print(
                    f"coupled-qk: max_gen_toks={self._gen_toks} (half the model's context of {self.max_length} "
                    f"tokens; lm-eval's default {LM_EVAL_MAX_GEN_TOKS} does not fit); choose with --model_args "
                    "...,max_gen_toks=N",
                    file=sys.stderr,
                )
            self._noticed = True
            return self._gen_toks

    if "coupled_qk" not in model_registry:
        model_registry.register("coupled_qk")(CoupledQKLM)
    _LM_CLASS = CoupledQKLM
    return CoupledQKLM


def _check_tokenizer(tokenizer, source) -> None:
    """Refuse a tokenizer that encodes text to no tokens: ``transformers`` builds such an empty one for a model
    folder without tokenizer files, and lm-eval then scored every document as certain (perplexity 1, exit 0).

    Raises:
        ValueError: naming ``source`` (the folder or ``tokenizer=`` argument) and the vocabulary size.
    """
    if not tokenizer.encode("The cat sat.", add_special_tokens=False):
        raise ValueError(
            f"the tokenizer of {source!r} encodes text to no tokens (vocabulary of {len(tokenizer)}); "
            "the folder lacks its tokenizer files (tokenizer.json, or vocab.json and merges.txt): "
            "save the tokenizer there or pass --model_args ...,tokenizer=PATH"
        )


def _restore_retrofit(model, pretrained, subfolder: str = "") -> None:
    """Give ``model``, just loaded by lm-eval's ``from_pretrained``, back the coupling of a retrofitted folder
    (:func:`coupled_qk.hf.retrofit_load.restore_retrofit`); a plain load drops it and would score the base model.

    Raises:
        ValueError: the retrofitted model is not a local folder (its coupling weights are read from there).
    """
    from coupled_qk.hf.retrofit import RETROFIT_KEY
    from coupled_qk.hf.retrofit_load import restore_retrofit

    config = getattr(model, "config", None)
    if not getattr(config, RETROFIT_KEY, None) or any(hasattr(m, "qk_dynamics") for m in model.modules()):
        return
    folder = Path(str(pretrained)).expanduser() / (subfolder or "")
    if not folder.is_dir():
        raise ValueError(
            f"pretrained={pretrained!r} is a retrofitted model (config.json has '{RETROFIT_KEY}'); "
            "its coupling weights are read from a local folder, so pass the folder's path"
        )
    restore_retrofit(model, folder)
    print(
        f"coupled-qk: {folder} is a retrofitted model; its coupling weights (the qk_dynamics entries that a "
        "load report may list as UNEXPECTED) are loaded",
        file=sys.stderr,
    )


def _run_through_our_model(argv: list[str]) -> list[str]:
    """``argv`` with ``--model hf`` (and its aliases) replaced by ``coupled_qk`` (:class:`CoupledQKLM`)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--model" and i + 1 < len(out) and out[i + 1] in MODEL_NAMES:
            out[i + 1] = "coupled_qk"
        elif arg.startswith("--model=") and arg.split("=", 1)[1] in MODEL_NAMES:
            out[i] = "--model=coupled_qk"
    return out


def main(argv: list[str] | None = None) -> int:
    """``make-task ...`` writes a local task; anything else runs the lm-eval command line with our models
    registered. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["make-task"]:
        p = argparse.ArgumentParser(
            prog="python -m coupled_qk.hf.harness make-task",
            description="write a local lm-eval task (YAML + JSONL) from an offline file",
        )
        p.add_argument("kind", choices=["perplexity", "sst2"])
        p.add_argument("source", help="text file (perplexity) or sentence<TAB>label file (sst2)")
        p.add_argument("out_dir", help="task folder, for lm-eval's --include_path")
        p.add_argument("--name", default=None)
        p.add_argument("--max-docs", type=int, default=None)
        p.add_argument("--overwrite", action="store_true", help="replace this task's files from an earlier run")
        a = p.parse_args(argv[1:])
        try:
            path = make_task(a.kind, a.source, a.out_dir, a.name, a.max_docs, overwrite=a.overwrite)
        except (ValueError, OSError) as exc:
            print(f"make-task: error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path} (task {path.stem}); use: --include_path {path.parent} --tasks {path.stem}")
        return 0
    import coupled_qk  # noqa: F401  (registers the models with the transformers Auto classes)
    from coupled_qk.hf.registration import register

    register()
    try:
        from lm_eval.__main__ import cli_evaluate

        lm_class()
    except ModuleNotFoundError as exc:
        print(f'lm-eval is not installed ({exc}); pip install "coupled-qk[lm-eval]"', file=sys.stderr)
        return 2
    sys.argv = ["lm-eval", *_run_through_our_model(argv)]
    try:
        cli_evaluate()
    except (ValueError, OSError) as exc:  # a bad model argument (max_gen_toks=0, ...) or a model folder that is
        # missing or lacks its weights: one line, as our commands print it
        print(f"lm-eval: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
