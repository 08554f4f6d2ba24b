"""``export_run``: a coupled-qk training run -> a Hugging Face folder (weights, config, tokenizer).

The folder then loads offline with ``AutoModelForCausalLM.from_pretrained(folder)`` (after
``import coupled_qk``) and ``AutoTokenizer.from_pretrained(folder)`` (plain ``transformers``).
"""

from __future__ import annotations

from pathlib import Path

from coupled_qk.data.tokenizers import EOT, Tokenizer
from coupled_qk.hf.modeling import CoupledQKForCausalLM
from coupled_qk.training.checkpoint import load_checkpoint_model, resolve_checkpoint


def hf_tokenizer(tokenizer: Tokenizer, model_max_length: int):
    """A ``transformers`` fast tokenizer with the same ids as ``tokenizer`` (``<|endoftext|>``, when present,
    is the BOS, EOS and padding token, as for GPT-2); no BOS/EOS is added when encoding."""
    from transformers import PreTrainedTokenizerFast

    special = {} if tokenizer.eot_id is None else dict(bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=EOT)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.hf, model_max_length=model_max_length, **special)


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
        FileNotFoundError: no checkpoint at ``run_dir``. FileExistsError: ``hf_dir`` is not empty and
        ``overwrite`` is false. ValueError: the tokenizer's vocabulary does not fit the model.
    """
    ckpt = resolve_checkpoint(run_dir)
    hf_dir = Path(hf_dir).expanduser()
    if hf_dir.exists() and (not hf_dir.is_dir() or any(hf_dir.iterdir())) and not overwrite:
        raise FileExistsError(f"{hf_dir} exists and is not an empty folder; choose another or pass overwrite "
                              "(--overwrite)")
    model, state = load_checkpoint_model(ckpt)
    tok_dir = ckpt.parent / "tokenizer"
    tokenizer = Tokenizer.load(tok_dir) if (tok_dir / "tokenizer.json").is_file() else None
    special = {}
    if tokenizer is not None:
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(f"the run's tokenizer ({tok_dir}) has {tokenizer.vocab_size} ids but the model only "
                             f"{model.config.vocab_size}")
        if tokenizer.eot_id is not None:
            special = dict(bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id, pad_token_id=tokenizer.eot_id)
    hf_model = CoupledQKForCausalLM.from_gpt(model, **special)
    hf_dir.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(hf_dir)
    if tokenizer is not None:
        hf_tokenizer(tokenizer, model.config.block_size).save_pretrained(hf_dir)
    return {"hf_dir": str(hf_dir), "checkpoint": str(ckpt), "step": state.get("step"),
            "attention": model.config.attention, "tokenizer": None if tokenizer is None else tokenizer.name}
