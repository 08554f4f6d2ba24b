"""Hugging Face wrapper: save/load round trip, logits parity, loss convention, generate."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.models.hf import CoupledQKForCausalLM  # noqa: E402


@pytest.mark.parametrize("attention", ["coupled", "differential"])
def test_round_trip_and_parity(tmp_path, attention):
    torch.manual_seed(0)
    options = {"integrator": "leapfrog"} if attention == "coupled" else {}
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, d_model=32, n_heads=2, attention=attention,
                          **options)).eval()
    hf = CoupledQKForCausalLM.from_gpt(model)
    hf.save_pretrained(tmp_path / "m")
    loaded = CoupledQKForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert loaded.config.to_gpt_config() == model.config
    assert loaded.config.attention == attention and (attention != "coupled" or loaded.config.qk_map["integrator"] == "leapfrog")
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        ref = model(idx)
        out = loaded(input_ids=idx, labels=idx)
    torch.testing.assert_close(out.logits, ref)
    manual = torch.nn.functional.cross_entropy(ref[:, :-1].reshape(-1, 40), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, manual)
    assert loaded.model.lm_head.weight.data_ptr() == loaded.model.tok_emb.weight.data_ptr()
    greedy = loaded.generate(idx[:, :4], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(greedy, model.generate(idx[:, :4], 5, temperature=0))
