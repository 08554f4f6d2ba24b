"""What a ``transformers`` user tries on a causal LM, checked against what ``GPT2LMHeadModel`` (the reference
semantics) does for the same call: generation modes with and without the cache, the forward API
(``logits_to_keep``, ``inputs_embeds``) and loading. Tiny random models, nothing downloaded."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402
from coupled_qk.models.specs import variant_overrides  # noqa: E402

V = 53


def tiny_lm(variant="coupled", seed=0) -> CoupledQKForCausalLM:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2, **variant_overrides(variant)
    )
    if cfg.qk_map is not None and hasattr(cfg.qk_map, "dt_init"):
        cfg = cfg.replace(dt_init=0.5)
    return CoupledQKForCausalLM.from_gpt(GPT(cfg), pad_token_id=0, eos_token_id=V - 1).eval()


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=V,
        n_positions=40,
        n_layer=2,
        n_embd=32,
        n_head=4,
        pad_token_id=0,
        bos_token_id=V - 1,
        eos_token_id=V - 1,
    )
    return GPT2LMHeadModel(cfg).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V - 1, shape, generator=torch.Generator().manual_seed(seed))


def left_padded():
    x = ids(3, 6)
    x[0, :2], x[2, :4] = 0, 0
    return x, (x != 0).long()


# --------------------------------------------------------------------------------------------------------------
# forward API
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [tiny_lm, gpt2], ids=["coupled_qk", "gpt2"])
def test_logits_to_keep_as_a_tensor_of_positions(model):
    """``transformers``' models take ``logits_to_keep`` as an int (the last n) or a 1-D tensor of positions;
    ours failed on the tensor with "Boolean value of Tensor with more than one value is ambiguous"."""
    lm, x = model(), ids(2, 7)
    with torch.no_grad():
        full = lm(x).logits
        for keep in (torch.tensor([0, 3, 6]), torch.tensor([-1]), torch.tensor([2, 2], dtype=torch.int32)):
            torch.testing.assert_close(lm(x, logits_to_keep=keep).logits, full[:, keep.long()])
        torch.testing.assert_close(lm(x, logits_to_keep=2).logits, full[:, -2:])


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(logits_to_keep=torch.tensor([[0, 1]])), r"logits_to_keep as a tensor must be 1-D integer positions"),
        (dict(logits_to_keep=torch.tensor([0.0])), r"logits_to_keep as a tensor must be 1-D integer positions"),
        (dict(logits_to_keep=torch.tensor([7])), r"logits_to_keep: positions must be in \[-7, 7\).*max 7"),
        (
            dict(logits_to_keep=1, labels=ids(2, 7)),
            r"labels need the logits of every position, but logits_to_keep "
            r"keeps the last 1 of 7 positions; pass logits_to_keep=0",
        ),
        (dict(logits_to_keep=torch.tensor([1]), labels=ids(2, 7)), r"labels need the logits of every position"),
    ],
)
def test_bad_logits_to_keep_is_named(kw, message):
    """A bad tensor, or one that drops positions a loss needs (GPT-2: a batch-size mismatch naming neither)."""
    with pytest.raises(ValueError, match=message), torch.no_grad():
        tiny_lm()(ids(2, 7), **kw)


def test_logits_to_keep_with_labels_keeping_every_position_gives_the_loss():
    lm, x = tiny_lm(), ids(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(lm(x, labels=x, logits_to_keep=7).loss, lm(x, labels=x).loss)


MODELS = {
    "gpt2": gpt2,
    "coupled": tiny_lm,
    "differential": lambda: tiny_lm("differential"),
    "coupled_leapfrog": lambda: tiny_lm("coupled_leapfrog"),
}
"""The reference and variants whose caches differ (coupled keys one per query head; grouped differential values)."""
MODES = {
    "greedy": {},
    "uncached": dict(use_cache=False),
    "beam": dict(num_beams=3, early_stopping=True),
    "static": dict(cache_implementation="static"),
    "sampling": dict(do_sample=True, top_k=5, temperature=0.8, num_return_sequences=2),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inputs_embeds_forward_equals_the_ids_it_embeds(name):
    """``forward(inputs_embeds=...)``: ours refused it ("inputs_embeds is not supported"); GPT-2 gives the
    logits and hidden states of the ids, and gradients reach the embeddings (prompt tuning)."""
    lm, (x, mask) = MODELS[name](), left_padded()
    embeds = lm.get_input_embeddings()(x).detach()
    with torch.no_grad():
        by_ids = lm(x, attention_mask=mask, output_hidden_states=True)
        by_embeds = lm(inputs_embeds=embeds, attention_mask=mask, output_hidden_states=True)
    torch.testing.assert_close(by_embeds.logits, by_ids.logits)
    assert len(by_embeds.hidden_states) == len(by_ids.hidden_states) == 3
    for a, b in zip(by_embeds.hidden_states, by_ids.hidden_states):
        torch.testing.assert_close(a, b)
    embeds.requires_grad_(True)
    lm(inputs_embeds=embeds, attention_mask=mask, labels=x).loss.backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kw,error,message",
    [
        (dict(labels=ids(2, 5)), ValueError, r"labels has shape \(2, 5\); expected inputs_embeds' \(B, T\) \(2, 6\)"),
        (dict(labels=ids(2, 6) + V), ValueError, rf"labels: token ids must be in \[0, {V}\) or -100"),
        (dict(labels=ids(2, 6).float()), ValueError, "labels must hold integer token ids"),
        (
            dict(shift_labels=ids(2, 7), labels=ids(2, 6)),
            ValueError,
            r"shift_labels has shape \(2, 7\); expected inputs_embeds",
        ),
        (dict(labels=ids(2, 6), logits_to_keep=1), ValueError, "labels need the logits of every position"),
    ],
)
def test_labels_with_inputs_embeds_are_checked_as_with_ids(kw, error, message):
    """The targets of embedded tokens were not checked at all (``check_labels`` ran for ``input_ids`` only)."""
    lm = tiny_lm()
    embeds = lm.get_input_embeddings()(ids(2, 6))
    with pytest.raises(error, match=message), torch.no_grad():
        lm(inputs_embeds=embeds, **kw)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", ["coupled", "differential", "gpt2"])
def test_generate_from_inputs_embeds_makes_the_tokens_of_the_ids(name, mode):
    """``generate(inputs_embeds=e)`` returns the new tokens only; ``generate(ids, inputs_embeds=e)`` the ids
    and the new tokens (``transformers``' convention), equal to ``generate(ids)`` in every mode."""
    lm, (x, mask) = MODELS[name](), left_padded()
    embeds = lm.get_input_embeddings()(x).detach()
    out = []
    for kw in (dict(input_ids=x), dict(inputs_embeds=embeds), dict(input_ids=x, inputs_embeds=embeds)):
        torch.manual_seed(3)
        out.append(lm.generate(**kw, attention_mask=mask, max_new_tokens=5, **MODES[mode]))
    by_ids, by_embeds, by_both = out
    assert by_embeds.shape[1] == 5 and torch.equal(by_embeds, by_ids[:, x.shape[1] :])
    assert torch.equal(by_both, by_ids)


@pytest.mark.parametrize(
    "call,kw,error,message",
    [
        (
            "forward",
            dict(input_ids=True, inputs_embeds=True),
            ValueError,
            "pass either input_ids or inputs_embeds, not both",
        ),
        ("forward", dict(), ValueError, r"input_ids \(LongTensor of shape \(B, T\)\) or inputs_embeds"),
        (
            "forward",
            dict(inputs_embeds=torch.zeros(2, 6, 5)),
            ValueError,
            r"inputs_embeds must have shape \(B, T, d_model=32\) with B, T >= 1; got \(2, 6, 5\)",
        ),
        ("forward", dict(inputs_embeds=torch.zeros(2, 0, 32)), ValueError, r"got \(2, 0, 32\)"),
        (
            "forward",
            dict(inputs_embeds=torch.zeros(2, 6, 32, dtype=torch.long)),
            ValueError,
            "inputs_embeds must be a floating tensor",
        ),
        ("forward", dict(inputs_embeds=[[0.0] * 32]), TypeError, "inputs_embeds must be a torch.Tensor"),
        (
            "generate",
            dict(inputs_embeds=torch.zeros(2, 6, 32), max_new_tokens=35),
            ValueError,
            r"prompt length 6 \+ max_new_tokens=35 = 41 exceeds block_size=40",
        ),
        (
            "generate",
            dict(inputs_embeds=torch.zeros(2, 6, 5), max_new_tokens=2),
            ValueError,
            r"inputs_embeds must have shape \(B, T, d_model=32\)",
        ),
        (
            "generate",
            dict(input_ids=True, inputs_embeds=torch.zeros(2, 4, 32), max_new_tokens=2),
            ValueError,
            r"input_ids has shape \(2, 6\) but inputs_embeds \(2, 4, 32\)",
        ),
        (
            "generate",
            dict(inputs_embeds=torch.zeros(2, 6, 32), attention_mask=torch.ones(2, 5), max_new_tokens=2),
            ValueError,
            r"attention_mask has shape \(2, 5\); expected inputs_embeds",
        ),
    ],
)
def test_bad_inputs_embeds_are_named(call, kw, error, message):
    lm, x = tiny_lm(), ids(2, 6)
    kw = {
        k: (x if v is True and k == "input_ids" else lm.get_input_embeddings()(x) if v is True else v)
        for k, v in kw.items()
    }
    with pytest.raises(error, match=message), torch.no_grad():
        lm(**kw) if call == "forward" else lm.generate(**kw)


# --------------------------------------------------------------------------------------------------------------
# None for "the default", as transformers' models read it
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [tiny_lm, gpt2], ids=["coupled_qk", "gpt2"])
def test_none_switches_mean_the_defaults(model):
    """``return_dict=None`` (``peft``'s prompt tuning passes it) gave a tuple; ``generate(use_cache=None)`` was a
    ``TypeError``. Both mean the default, as in GPT-2."""
    lm, x = model(), ids(2, 5)
    with torch.no_grad():
        out = lm(x, return_dict=None)
    assert not isinstance(out, tuple) and torch.equal(out.logits, lm(x).logits)
    assert torch.equal(lm.generate(x, max_new_tokens=3, use_cache=None), lm.generate(x, max_new_tokens=3))


def test_a_none_config_switch_argument_takes_the_config():
    lm, x = tiny_lm(), ids(2, 5)
    lm.config.output_hidden_states, lm.config.return_dict = True, False
    with torch.no_grad():
        out = lm(x, output_hidden_states=None, return_dict=None)
    assert isinstance(out, tuple) and len(out[-1]) == 3


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(num_beams=None, max_new_tokens=3), r"num_beams=None must be an int >= 1 \(or left out"),
        (dict(num_return_sequences=None, max_new_tokens=3), r"num_return_sequences=None must be an int >= 1"),
        (dict(max_length=None), r"max_length=None: pass an int, or max_new_tokens, or leave both out"),
    ],
)
def test_a_none_that_transformers_cannot_take_is_named(kw, message):
    """GPT-2 fails on these inside transformers ("'>' not supported between 'int' and 'NoneType'")."""
    with pytest.raises(TypeError, match=message):
        tiny_lm().generate(ids(2, 5), **kw)
    assert tiny_lm().generate(ids(2, 5), max_new_tokens=3, num_beam_groups=None).shape == (2, 8)  # taken as GPT-2


# --------------------------------------------------------------------------------------------------------------
# generation modes that crop, score or stop (beam search and sampling: test_hf_contract.py)
# --------------------------------------------------------------------------------------------------------------

CACHE_LAYOUTS = ["coupled", "differential", "coupled_leapfrog"]
"""Coupled keys one per query head, grouped differential values, the two-stage integrator."""


@pytest.mark.parametrize("variant", ["coupled", "differential"])
def test_assisted_decoding_and_prompt_lookup_make_the_greedy_tokens(variant):
    """Assisted decoding crops the ``DynamicCache`` after rejected draft tokens and verifies several tokens in one
    forward: with greedy decoding it must make the tokens of plain uncached greedy decoding (batch 1, as
    ``transformers`` requires), with a draft that disagrees, with the model as its own draft, and with prompt
    lookup."""
    lm, draft = tiny_lm(variant), tiny_lm(variant, seed=7)
    x = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    greedy = lm.generate(x, max_new_tokens=8, use_cache=False)
    assert torch.equal(lm.generate(x, max_new_tokens=8, assistant_model=draft), greedy)
    assert torch.equal(lm.generate(x, max_new_tokens=8, assistant_model=lm), greedy)
    assert torch.equal(lm.generate(x, max_new_tokens=8, prompt_lookup_num_tokens=3), greedy)


@pytest.mark.parametrize("variant", CACHE_LAYOUTS)
def test_logits_processors_and_scores_cached_equal_uncached(variant):
    """Left-padded batch: repetition penalty, ``min_new_tokens`` with a list of end ids, ``no_repeat_ngram_size``;
    ``output_scores``/``output_logits`` of cached decoding equal the uncached ones."""
    lm, (x, mask) = tiny_lm(variant), left_padded()
    kw = dict(
        attention_mask=mask,
        max_new_tokens=8,
        repetition_penalty=1.3,
        min_new_tokens=5,
        eos_token_id=[3, 4, 5, 6, 7, 8],
        no_repeat_ngram_size=2,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    cached, uncached = (lm.generate(x, use_cache=c, **kw) for c in (True, False))
    assert torch.equal(cached.sequences, uncached.sequences)
    assert len(cached.scores) == len(cached.logits) == cached.sequences.shape[1] - x.shape[1]
    for a, b in zip(cached.logits + cached.scores, uncached.logits + uncached.scores):
        torch.testing.assert_close(a, b)
    new = cached.sequences[:, x.shape[1] :]
    assert not torch.isin(new[:, :5], torch.arange(3, 9)).any()  # no end id before min_new_tokens


def test_stop_strings_stop_cached_and_uncached_alike():
    """``stop_strings`` (with a tokenizer, here a character-level one built in memory) end each row at its string."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = (string.ascii_lowercase + string.ascii_uppercase + "0")[:V]
    backend = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="0"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Split(Regex("."), behavior="isolated"), decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="0", pad_token="a")
    lm, (x, mask) = tiny_lm(), left_padded()
    plain = lm.generate(x, attention_mask=mask, max_new_tokens=8)
    new = plain[1, x.shape[1] :]
    end = x.shape[1] + int((new == new[2]).nonzero()[0]) + 1  # row 1 ends at the first of its 3rd new token
    out = [
        lm.generate(
            x, attention_mask=mask, max_new_tokens=8, stop_strings=[tok.decode(new[2:3])], tokenizer=tok, use_cache=c
        )
        for c in (True, False)
    ]
    assert torch.equal(*out)
    assert torch.equal(out[0][1, :end], plain[1, :end]) and (out[0][1, end:] == 0).all()  # stopped, then padded


@pytest.mark.parametrize("arg", ["past_key_values", "cache"])
def test_a_legacy_tuple_cache_is_named_with_its_conversion(arg):
    """This ``transformers`` takes no tuple caches (GPT-2: "'tuple' object has no attribute 'get_seq_length'"); ours
    named ``cache`` even when ``past_key_values`` was given, without the way out. The conversion it names works."""
    from transformers import DynamicCache

    lm, (x, mask) = tiny_lm(), left_padded()
    step, step_mask = torch.full((3, 1), 7), torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
    with torch.no_grad():
        legacy = tuple((layer.keys, layer.values) for layer in lm(x, attention_mask=mask).cache.layers)
        with pytest.raises(
            ValueError,
            match=rf"{arg} must be a transformers Cache \(e.g. DynamicCache\); got tuple; "
            rf"legacy \(key, value\) pairs per layer: pass DynamicCache\({arg}\)",
        ):
            lm(step, attention_mask=step_mask, **{arg: legacy})
        logits = lm(step, attention_mask=step_mask, **{arg: DynamicCache(legacy)}).logits
        torch.testing.assert_close(logits, lm(torch.cat([x, step], 1), attention_mask=step_mask).logits[:, -1:])
