"""The Hugging Face wrapper's forward and generate arguments are checked once per call, as ``GPT``'s
(``hf/inputs.py``: ``check_inputs``, ``check_labels``, ``check_hf_generate_args``, used by ``hf/modeling.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402

V, BLOCK = 53, 24


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=V, block_size=BLOCK, n_layer=1, d_model=16, n_heads=2, attention="coupled"))
    return CoupledQKForCausalLM.from_gpt(gpt.eval()).eval()


IDS = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "kw,error,message",
    [
        (dict(labels=IDS.float()), ValueError, "labels must hold integer token ids; got dtype torch.float32"),
        (dict(labels=IDS[:, :4]), ValueError, r"labels has shape \(2, 4\); expected input_ids' shape \(2, 5\)"),
        (dict(labels=IDS.tolist()), TypeError, "labels must be a torch.Tensor"),
        (dict(labels=IDS + V), ValueError, rf"labels: token ids must be in \[0, {V}\) or -100"),
        (dict(logits_to_keep=-1), ValueError, "logits_to_keep=-1 must be >= 0"),
        (dict(logits_to_keep=1.5), TypeError, "logits_to_keep=1.5 must be an int"),
        (dict(use_cache="False"), TypeError, "use_cache='False' must be True, False or None"),
        (dict(return_dict="no"), TypeError, "return_dict='no' must be True, False or None"),
        (dict(output_hidden_states=1), TypeError, "output_hidden_states=1 must be True, False or None"),
        (dict(input_ids=IDS.float()), ValueError, "input_ids must hold integer token ids; got dtype torch.float32"),
    ],
)
def test_bad_forward_arguments_are_named(lm, kw, error, message):
    with pytest.raises(error, match=message), torch.no_grad():
        lm(**{"input_ids": IDS, **kw})


def test_good_forward_arguments_still_work(lm):
    labels = IDS.clone()
    labels[0, :2] = -100  # ignored targets are allowed
    with torch.no_grad():
        out = lm(input_ids=IDS, labels=labels, logits_to_keep=0, use_cache=False, return_dict=True)
        ref = lm.model(IDS)
    assert torch.equal(out.logits, ref)
    manual = torch.nn.functional.cross_entropy(ref[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, manual)


@pytest.mark.parametrize(
    "kw,error,message",
    [
        (
            dict(max_new_tokens=BLOCK),
            ValueError,
            rf"prompt length 5 \+ max_new_tokens={BLOCK} = {BLOCK + 5} exceeds "
            rf"block_size={BLOCK}",
        ),
        (dict(max_length=BLOCK + 1), ValueError, f"exceeds block_size={BLOCK}"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens=-1 must be >= 0"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens=2.0 must be an int"),
        (
            dict(max_new_tokens=2, do_sample=True, temperature=float("nan")),
            ValueError,
            "temperature=nan must be finite",
        ),
        (dict(max_new_tokens=2, do_sample=True, top_p=1.5), ValueError, r"top_p=1.5 must be in \(0, 1\]"),
        (dict(max_new_tokens=2, do_sample=True, top_k=0), ValueError, "top_k=0 must be >= 1"),
        (dict(max_new_tokens=2, repetition_penalty=0.0), ValueError, r"repetition_penalty=0.0 must be in \(0, inf\]"),
        (dict(max_new_tokens=2, use_cache="yes"), TypeError, "use_cache='yes' must be True or False"),
        (
            dict(max_new_tokens=2, attention_mask=torch.ones(2, 4, dtype=torch.long)),
            ValueError,
            r"attention_mask has shape \(2, 4\)",
        ),
        (dict(max_new_tokens=2, attention_mask=torch.zeros(2, 5, dtype=torch.long)), ValueError, "attention_mask"),
    ],
)
def test_bad_generate_arguments_are_named_before_any_token(lm, kw, error, message, monkeypatch):
    calls = []
    monkeypatch.setattr(type(lm), "forward", lambda self, *a, **k: calls.append(1))
    with pytest.raises(error, match=message):
        lm.generate(IDS, **kw)
    assert calls == []  # refused before the model ran


def test_bad_prompt_ids_are_named(lm):
    with pytest.raises(ValueError, match=rf"input_ids: token ids must be in \[0, {V}\)"):
        lm.generate(IDS + V, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids has a zero-sized dimension"):
        lm.generate(IDS[:, :0], max_new_tokens=2)


def test_a_prompt_that_fills_the_context_exactly_generates(lm):
    out = lm.generate(IDS, max_new_tokens=BLOCK - 5, do_sample=False)
    assert out.shape == (2, BLOCK)
    assert torch.equal(out, lm.model.generate(IDS, BLOCK - 5, temperature=0))


def test_ids_out_of_the_vocabulary_are_refused_by_gpt(lm):
    with pytest.raises(ValueError, match=rf"token ids must be in \[0, {V}\)"):
        lm(input_ids=IDS + V)


@pytest.mark.parametrize("name", ["num_beams", "num_return_sequences", "num_beam_groups"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_counts_transformers_divides_by_are_named_before_any_token(lm, name, value, monkeypatch):
    """``num_beams=0`` was a ZeroDivisionError from inside transformers: every count it divides by is checked."""
    calls = []
    monkeypatch.setattr(type(lm), "forward", lambda self, *a, **k: calls.append(1))
    with pytest.raises((TypeError, ValueError), match=f"{name}=.* must be an int >= 1"):
        lm.generate(IDS, max_new_tokens=2, **{name: value})
    assert calls == []
