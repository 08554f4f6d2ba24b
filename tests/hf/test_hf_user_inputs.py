"""Inputs a transformers user passes, refused or accepted alike by the eager forward (any cache) and by the
fixed-shape decoding step over a filled static cache (``hf/cache_view.py::StaticStep``): the two paths must
never disagree on what is an error, and accepted inputs must give the same logits."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import DynamicCache, StaticCache  # noqa: E402

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402

V = 53


def tiny_lm(**kw) -> CoupledQKForCausalLM:
    torch.manual_seed(0)
    cfg = GPTConfig(
        **{
            **dict(
                vocab_size=V,
                block_size=40,
                n_layer=2,
                d_model=32,
                n_heads=4,
                n_kv_heads=2,
                attention="coupled",
                dt_init=0.5,
            ),
            **kw,
        }
    )
    return CoupledQKForCausalLM.from_gpt(GPT(cfg), pad_token_id=0).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def _step(lm, kind, **step_kw):
    """Logits of one token after a 4-token prompt (batch 2), the step taking ``step_kw``, over a dynamic or a
    static cache (a static cache's single-token step is the fixed-shape ``StaticStep``)."""
    cache = StaticCache(config=lm.config, max_cache_len=12) if kind == "static" else DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(ids(2, 4), cache=cache)
        return lm(ids(2, 1, seed=1), cache=cache, **step_kw).logits


BAD_STEP_INPUTS = {
    "mask of 2s": (dict(attention_mask=torch.full((2, 5), 2)), ValueError, r"only 0 \(padding\) and 1 \(token\)"),
    "mask of halves": (dict(attention_mask=torch.full((2, 5), 0.5)), ValueError, r"only 0 \(padding\) and 1"),
    "mask as a list": (dict(attention_mask=[[1] * 5] * 2), TypeError, "attention_mask must be a torch.Tensor"),
    "float positions": (
        dict(position_ids=torch.full((2, 1), 4.0)),
        ValueError,
        r"position_ids must hold integer positions \(int64 or int32\); got dtype torch.float32",
    ),
    "bool positions": (
        dict(position_ids=torch.ones(2, 1, dtype=torch.bool)),
        ValueError,
        "position_ids must hold integer positions",
    ),
    "positions as a list": (dict(position_ids=[[4], [4]]), TypeError, "position_ids must be a torch.Tensor"),
    "negative positions": (
        dict(position_ids=torch.full((2, 1), -1)),
        ValueError,
        r"position_ids must be in \[0, block_size=40\); got min -1, max -1",
    ),
}


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(BAD_STEP_INPUTS))
def test_a_bad_mask_or_positions_is_refused_alike_over_a_dynamic_and_a_static_cache(case, kind):
    """The static step read ``attention_mask.bool()``, so a mask of 2s or 0.5s decoded silently there while the
    dynamic cache refused it; float positions failed with torch's IndexError, lists with an AttributeError."""
    kw, error, message = BAD_STEP_INPUTS[case]
    with pytest.raises(error, match=message):
        _step(tiny_lm(), kind, **kw)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_one_row_of_position_ids_is_broadcast_over_the_batch(kind):
    """``position_ids`` of shape ``(1, T)`` (what transformers models broadcast over the batch, e.g.
    ``torch.arange(T)[None]``) gives the logits of the same positions given per row; int32 works too."""
    lm = tiny_lm()
    per_row = _step(lm, kind, position_ids=torch.full((2, 1), 4))
    torch.testing.assert_close(_step(lm, kind, position_ids=torch.full((1, 1), 4)), per_row)
    torch.testing.assert_close(_step(lm, kind, position_ids=torch.full((2, 1), 4, dtype=torch.int32)), per_row)
    x = ids(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(lm(x, position_ids=torch.arange(6)[None]).logits, lm(x).logits)
    with pytest.raises(ValueError, match=r"position_ids must have shape \(2, 6\), \(1, 6\) or \(6,\); got \(3, 6\)"):
        lm(x, position_ids=torch.arange(6).expand(3, 6))


@pytest.mark.parametrize(
    "new, pad_to, vocab, rows", [(70, None, 70, 80), (60, 8, 64, 64), (None, None, V, 64), (50, None, 50, 64)]
)
def test_resize_token_embeddings_of_a_padded_vocabulary_saves_and_loads(tmp_path, new, pad_to, vocab, rows):
    """With ``vocab_pad_multiple=16`` the embedding has ``padded_vocab_size`` rows; resizing to 70 left 70 rows
    while config.json asked for 80, so the saved folder could not be loaded (a shape mismatch)."""
    from transformers import AutoModelForCausalLM

    lm = tiny_lm(vocab_pad_multiple=16)
    before = lm.model.tok_emb.weight[:40].clone()
    lm.resize_token_embeddings(new, pad_to_multiple_of=pad_to)
    assert (lm.config.vocab_size, lm.model.config.vocab_size, lm.model.tok_emb.weight.shape[0]) == (vocab, vocab, rows)
    assert lm.model.config.padded_vocab_size == rows and lm.model.lm_head.weight is lm.model.tok_emb.weight
    assert torch.equal(lm.model.tok_emb.weight[:40], before)  # old tokens keep their rows
    lm.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = loaded(x).logits
        torch.testing.assert_close(logits, lm(x).logits)
    assert logits.shape[-1] == vocab


def test_resize_rejects_a_bad_pad_to_multiple_of():
    with pytest.raises(ValueError, match=r"pad_to_multiple_of=2.5 must be a positive integer"):
        tiny_lm().resize_token_embeddings(60, pad_to_multiple_of=2.5)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_labels_of_any_integer_dtype_give_the_int64_loss(dtype):
    """``check_labels`` admits integer labels of any dtype, but cross-entropy took int64 only: int32 labels (what
    a tokenizer or numpy collator may give) failed with torch's "expected target dtype to be Long"."""
    lm = tiny_lm()
    x = ids(2, 6)
    labels = x.clone()
    with torch.no_grad():
        reference = lm(x, labels=labels).loss
        torch.testing.assert_close(lm(x, labels=labels.to(dtype)).loss, reference)
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)  # what the model computes itself
        torch.testing.assert_close(lm(x, labels=labels, shift_labels=shifted.int()).loss, reference)
        with pytest.raises(ValueError, match=r"shift_labels has shape \(2, 5\); expected input_ids' shape \(2, 6\)"):
            lm(x, labels=labels, shift_labels=labels[:, 1:])  # was torch's "Expected input batch_size (12) ..."
        with pytest.raises(ValueError, match=r"shift_labels: token ids must be in \[0, 53\) or -100"):
            lm(x, labels=labels, shift_labels=shifted + 100)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_cache_continued_with_another_batch_size_is_named(kind):
    """A cache filled for 2 sequences and stepped with 3 failed inside torch (index_copy_ / cat about slice
    shapes); the error now names both sizes, and nothing is written."""
    lm = tiny_lm()
    cache = StaticCache(config=lm.config, max_cache_len=12) if kind == "static" else DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(ids(2, 4), cache=cache)
        with pytest.raises(ValueError, match="the cache holds 2 sequences but input_ids has 3 rows"):
            lm(ids(3, 1), cache=cache)
        assert int(cache.get_seq_length()) == 4
        assert lm(ids(2, 1), cache=cache).logits.shape == (2, 1, V)


def test_generate_errors_name_the_arguments_the_user_gave():
    """generate's checks are shared with GPT.generate, whose prompt is ``idx``: the HF wrapper's messages named
    ``idx`` and, for a too large ``max_length``, a ``max_new_tokens`` the user never passed."""
    lm = tiny_lm(block_size=16)
    x = ids(2, 6)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\); expected input_ids's shape \(2, 6\)"):
        lm.generate(x, attention_mask=torch.ones(2, 5, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids is on meta but the model is on cpu"):
        lm.generate(x.to("meta"), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"max_length=30 exceeds block_size=16: prompt length 6 \+ 24 new tokens"):
        lm.generate(x, max_length=30)
    lm.generation_config.max_length = 30
    with pytest.raises(ValueError, match=r"max_length=30 \(the generation config's; pass max_new_tokens\) exceeds"):
        lm.generate(x)
    assert lm.generate(x, max_length=16).shape == (2, 16) and lm.generate(x, max_new_tokens=10).shape == (2, 16)


# transformers says it uses its default length: what this test asks of it
@pytest.mark.filterwarnings("ignore:Using the model-agnostic default `max_length`:UserWarning")
def test_generate_without_a_length_makes_20_tokens_within_the_context():
    """``model.generate(ids)`` with no ``max_new_tokens``/``max_length`` anywhere raised ``TypeError: max_length=None
    must be an int``; transformers' default is 20 new tokens, its ``max_length`` capped at the context
    (``max_position_embeddings``, our ``block_size``), and that is what it does now, greedy as set."""
    lm = tiny_lm(block_size=30)
    assert lm.generation_config.max_length is None and lm.generation_config.max_new_tokens is None
    x = ids(2, 6)
    out = lm.generate(x)
    assert out.shape == (2, 26) and torch.equal(out, lm.generate(x, max_new_tokens=20, do_sample=False))
    assert lm.generate(ids(1, 25)).shape == (1, 30)  # 5 new tokens: the context is full


def test_trainer_resumes_from_its_checkpoint_without_a_missing_weight_warning(tmp_path):
    """Resuming a ``Trainer`` from its checkpoint warned "There were missing keys in the checkpoint model loaded:
    ['model.lm_head.weight']" (the tied head is never stored): now it is re-tied silently, and the resumed model
    holds the checkpoint's weights with the head still the embedding."""
    from unittest import mock

    import transformers.trainer
    from transformers import Trainer, TrainingArguments

    data = [dict(input_ids=row, labels=row) for row in ids(8, 10)]

    def trainer(lm, steps):
        args = TrainingArguments(
            str(tmp_path),
            per_device_train_batch_size=4,
            max_steps=steps,
            save_steps=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            learning_rate=1e-2,
        )
        return Trainer(model=lm, args=args, train_dataset=data)

    trained = tiny_lm().train()
    trainer(trained, 2).train()
    resumed = tiny_lm(dt_init=0.1).train()  # other weights until the checkpoint is loaded
    with mock.patch.object(transformers.trainer.logger, "warning") as warning:
        trainer(resumed, 2).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert not [c for c in warning.call_args_list if "missing keys" in str(c)]
    assert resumed.model.lm_head.weight is resumed.model.tok_emb.weight
    for (name, a), b in zip(trained.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_generate_refuses_out_of_vocabulary_pad_and_end_ids():
    """An out-of-vocabulary ``pad_token_id`` failed only once a row had finished, with "token ids must be in [0, 53);
    got min 5, max 58" naming neither; an out-of-vocabulary ``eos_token_id`` silently never stopped generation."""
    lm = tiny_lm()
    x = ids(2, 6)
    first = int(lm.generate(x, max_new_tokens=1)[0, -1])
    with pytest.raises(ValueError, match=r"pad_token_id=58 is not a token id of this model: ids are in \[0, 53\)"):
        lm.generate(x, max_new_tokens=6, eos_token_id=first, pad_token_id=V + 5)
    with pytest.raises(ValueError, match=r"eos_token_id=\[3, 60\] is not a token id"):
        lm.generate(x, max_new_tokens=3, eos_token_id=[3, 60])
    with pytest.raises(TypeError, match=r"eos_token_id='3' must be an int token id"):
        lm.generate(x, max_new_tokens=3, eos_token_id="3")
    lm.generation_config.pad_token_id = -1
    with pytest.raises(ValueError, match=r"pad_token_id=-1 is not a token id"):
        lm.generate(x, max_new_tokens=3)
    out = lm.generate(x, max_new_tokens=6, eos_token_id=first, pad_token_id=1)  # in range: the finished row pads
    assert out[0, 6] == first and (out[0, 7:] == 1).all()


@pytest.mark.parametrize("flag", ["use_cache", "return_dict", "output_hidden_states"])
def test_config_switches_must_be_booleans(tmp_path, flag):
    """``"use_cache": "false"`` in an edited config.json became ``True`` (``bool("false")``), and ``return_dict`` /
    ``output_hidden_states`` strings were read as true by every forward; now each is refused, naming it, at
    construction, on assignment and when a folder loads."""
    import json

    from transformers import AutoModelForCausalLM

    from coupled_qk.hf import CoupledQKConfig

    with pytest.raises(ValueError, match=rf"CoupledQKConfig.{flag}='false' must be true or false"):
        CoupledQKConfig(**{flag: "false"})
    lm = tiny_lm()
    with pytest.raises(ValueError, match=rf"CoupledQKConfig.{flag}=0 must be true or false"):
        setattr(lm.config, flag, 0)
    assert getattr(lm.config, flag) is (flag != "output_hidden_states")  # unchanged
    lm.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, flag: "false"}))
    with pytest.raises(ValueError, match=rf"{flag}='false'"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, flag: False}))
    assert getattr(AutoModelForCausalLM.from_pretrained(tmp_path).config, flag) is False


def test_continuing_from_a_static_cache_that_generate_made():
    """``generate(cache_implementation="static")`` sizes its cache to this call's length, so continuing from the
    returned cache overflows it: the error says how to size it (``max_cache_len=``), and with that the
    continuation equals one longer call."""
    lm = tiny_lm()
    x = ids(2, 6)
    full = lm.generate(x, max_new_tokens=8, do_sample=False)

    def first(**kw):
        return lm.generate(
            x, max_new_tokens=4, do_sample=False, return_dict_in_generate=True, cache_implementation="static", **kw
        )

    out = first()
    with pytest.raises(
        ValueError,
        match=r"max_cache_len=9 positions; 9 are cached .* cache_implementation='static', "
        r"max_cache_len=N\) sizes the cache it creates",
    ):
        lm.generate(out.sequences, cache=out.past_key_values, max_new_tokens=4, do_sample=False)
    out = first(max_cache_len=20)
    more = lm.generate(out.sequences, cache=out.past_key_values, max_new_tokens=4, do_sample=False)
    assert torch.equal(more, full)


def _grads(model, x, mask):
    model.zero_grad()
    model(x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [True, False])
# peft's gradient_checkpointing_enable (the name its users call) forwards to transformers' deprecated one;
# peft asks transformers' deprecated is_gradient_checkpointing
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_activation_checkpointing_with_either_checkpoint_kind_gives_the_same_gradients(reentrant):
    """``gradient_checkpointing_kwargs={"use_reentrant": True}`` (a common Trainer setting, and peft's default
    advice) failed with torch's "Unexpected keyword arguments: key_mask": the reentrant checkpoint takes no
    keyword arguments. Left padding included, the gradients equal those without checkpointing, LoRA's too."""
    from peft import LoraConfig, get_peft_model

    x = ids(3, 8)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    reference = _grads(tiny_lm().train(), x, mask)
    lm = tiny_lm().train()
    lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    grads = _grads(lm, x, mask)
    assert grads.keys() == reference.keys()
    for name, g in reference.items():
        torch.testing.assert_close(grads[name], g, msg=name)

    def lora():
        return get_peft_model(tiny_lm().train(), LoraConfig(r=4, target_modules=["qkv"], init_lora_weights=False))

    reference = _grads(lora(), x, mask)
    model = lora()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    grads = _grads(model, x, mask)
    assert grads.keys() == reference.keys() and len(grads) == 4  # both layers' LoRA A and B
    for name, g in reference.items():
        torch.testing.assert_close(grads[name], g, msg=name)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_activation_checkpointing_every_n_layers_checkpoints_those_blocks(every):
    """``activation_checkpointing_enable(every_n_layers=n)`` was silently ignored (our blocks are not transformers'
    ``GradientCheckpointingLayer``): every block was checkpointed. Now blocks 0, n, 2n, ... are, with the same
    gradients; 0 is refused."""
    x = ids(2, 8)
    mask = torch.ones_like(x)
    reference = _grads(tiny_lm(n_layer=4).train(), x, mask)
    lm = tiny_lm(n_layer=4).train()
    lm.activation_checkpointing_enable(every_n_layers=every)
    calls = []
    func = lm.model._gradient_checkpointing_func
    lm.model._gradient_checkpointing_func = lambda f, *a, **k: calls.append(f.__self__) or func(f, *a, **k)
    grads = _grads(lm, x, mask)
    assert calls == [lm.model.blocks[i] for i in range(0, 4, every)]
    for name, g in reference.items():
        torch.testing.assert_close(grads[name], g, msg=name)
    lm.activation_checkpointing_disable()
    assert not lm.model.gradient_checkpointing and lm.model.checkpoint_every == 1
    with pytest.raises(ValueError, match="every_n_layers=0 must be a positive integer"):
        lm.activation_checkpointing_enable(every_n_layers=0)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize(
    "typo, meant",
    [
        ("atention_mask", "attention_mask"),
        ("label", "labels"),
        ("position_id", "position_ids"),
        ("input_embeds", "inputs_embeds"),
        ("use_cahce", "use_cache"),
    ],
)
def test_a_misspelt_keyword_is_named_not_ignored(kind, typo, meant):
    lm = tiny_lm()
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{typo}' .*did you mean '{meant}'"):
        lm(ids(2, 4), **{typo: None})
    with pytest.raises(TypeError, match=rf"'{typo}'"):
        _step(lm, kind, **{typo: None})


def test_keywords_of_the_ecosystem_pass_and_zero_token_types_change_nothing():
    lm = tiny_lm()
    x = ids(2, 6)
    with torch.no_grad():
        plain = lm(x).logits
        # unrelated names (ignored as by GPT-2) and all-zero token types (what tokenizers return) change nothing
        same = lm(x, token_type_ids=torch.zeros_like(x), output_attentions=False, some_adapter_flag=True).logits
    torch.testing.assert_close(same, plain, rtol=0, atol=0)
    with pytest.raises(ValueError, match="token_type_ids must be None or all zeros"):
        lm(x, token_type_ids=torch.ones_like(x))
