"""``export_run``: a coupled-qk training run -> a Hugging Face folder (weights, config, tokenizer).

The folder then loads offline with ``AutoModelForCausalLM.from_pretrained(folder)`` (after
``import coupled_qk``) and ``AutoTokenizer.from_pretrained(folder)`` (plain ``transformers``).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path

from transformers.tokenization_utils_base import (
    CHAT_TEMPLATE_FILE,
    FULL_TOKENIZER_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
)
from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from coupled_qk.data.tokenizers import EOT, Tokenizer
from coupled_qk.files import file_mode, fsync_dir, make_temp_dir, write_error
from coupled_qk.hf.modeling import CoupledQKForCausalLM
from coupled_qk.output_dir import as_output_dir
from coupled_qk.training.run_folder import open_run


def hf_tokenizer(tokenizer: Tokenizer, model_max_length: int):
    """A ``transformers`` fast tokenizer with the same ids as ``tokenizer`` (``<|endoftext|>``, when present,
    is the BOS, EOS and padding token, as for GPT-2); no BOS/EOS is added when encoding."""
    from transformers import PreTrainedTokenizerFast

    special = {} if tokenizer.eot_id is None else dict(bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=EOT)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.hf, model_max_length=model_max_length, **special)


EXPORT_LAYOUT = (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_NAME.replace(".", "-*.", 1),  # the shards of a large model: model-00001-of-00002.safetensors
    SAFE_WEIGHTS_INDEX_NAME,
    FULL_TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    CHAT_TEMPLATE_FILE,
)
"""The files of an exported folder (what ``save_pretrained`` of the model and the tokenizer write)."""


def export_run(run_dir: str | Path, hf_dir: str | Path, overwrite: bool = False) -> dict:
    """Write the latest checkpoint of a training run (or a given ``ckpt-*`` folder) as a ``save_pretrained``
    folder: ``config.json`` (flat :class:`~coupled_qk.hf.CoupledQKConfig`), ``model.safetensors``,
    ``generation_config.json`` and the run's tokenizer (``tokenizer.json``, ``tokenizer_config.json``).

    Args:
        run_dir: a run folder (its ``latest`` checkpoint) or a ``ckpt-*`` folder.
        hf_dir: output folder (created).
        overwrite: allow writing into a non-empty ``hf_dir``.

    Returns:
        ``{"hf_dir", "checkpoint", "step", "attention", "tokenizer"}`` (``tokenizer`` is ``None`` when the run
        has none, e.g. an MQAR run: then only the model is written).

    Raises:
        FileNotFoundError: no checkpoint at ``run_dir``, or a language-model run without its tokenizer.
        OutputRefused (a ``ValueError``): ``hf_dir`` holds an earlier export and ``overwrite`` is false, or holds
        files an export does not write (even with ``overwrite``), or is a file. ValueError: a run of another kind
        or state (:func:`~coupled_qk.training.run_folder.open_run`: still training, a GLUE run), or the
        tokenizer's vocabulary does not fit the model. OSError: a failed write (naming the folder and the free
        space).
    """
    # claimed before loading anything: a folder holding other files is refused even with overwrite, and an
    # earlier export is replaced only with overwrite (docs/RELIABILITY.md, "Outputs")
    out = as_output_dir(hf_dir, "hf_dir", overwrite=overwrite, layout=EXPORT_LAYOUT, what="export")
    out.claim_existing()
    hf_dir = out.path
    run = open_run(run_dir, "export")  # the run's state, checked once
    ckpt, tok_dir = run.checkpoint, run.folder.tokenizer_dir
    model, state = run.load_model()
    tokenizer = run.tokenizer() if run.folder.has_tokenizer() else None
    special = {}
    if tokenizer is not None:
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"the run's tokenizer ({tok_dir}) has {tokenizer.vocab_size} ids but the model only "
                f"{model.config.vocab_size}"
            )
        if tokenizer.eot_id is not None:
            special = dict(bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id, pad_token_id=tokenizer.eot_id)
    hf_model = CoupledQKForCausalLM.from_gpt(model, **special)
    hf_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained writes into a hidden temporary folder inside hf_dir; each file is then claimed and renamed
    # into place, so a failure (a full disk) leaves the previous export or nothing, never a mix
    tmp = make_temp_dir(hf_dir, ".export.tmp-")
    try:
        hf_model.save_pretrained(tmp)
        if tokenizer is not None:
            hf_tokenizer(tokenizer, model.config.block_size).save_pretrained(tmp)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        for f in files:
            out.claim(f.name, check_only=True)
        for f in files:
            os.chmod(f, file_mode())  # save_pretrained's safetensors file is 0600 whatever the umask
            os.replace(f, out.claim(f.name))
            out.record(out.path / f.name)
        _remove_stale(hf_dir, {f.name for f in files})
        fsync_dir(hf_dir)
    except OSError as exc:
        raise write_error(hf_dir, exc) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "hf_dir": str(hf_dir),
        "checkpoint": str(ckpt),
        "step": state.get("step"),
        "attention": model.config.attention,
        "tokenizer": None if tokenizer is None else tokenizer.name,
    }


def _remove_stale(hf_dir: Path, written: set[str]) -> None:
    """Delete the files of an earlier export (:data:`EXPORT_LAYOUT`) that this one did not write: with
    ``--overwrite``, exporting a run without a tokenizer over a run's export with one left that run's tokenizer
    beside the new model, which ``AutoTokenizer.from_pretrained`` then loaded."""
    for f in hf_dir.iterdir():
        if f.is_file() and f.name not in written and any(fnmatch.fnmatchcase(f.name, p) for p in EXPORT_LAYOUT):
            f.unlink()
