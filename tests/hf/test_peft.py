"""LoRA through ``peft`` on the attention projections and the coupling network: trains, saves, reloads, merges."""

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402

V = 53


def tiny_lm(attention: str) -> CoupledQKForCausalLM:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2, attention=attention, dt_init=0.5
    )
    return CoupledQKForCausalLM.from_gpt(GPT(cfg), pad_token_id=0).eval()


def ids(*shape):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(0))


# nn.Linear projections by module name; the coupling network's weights are plain parameters (one matrix per head),
# which peft adapts through target_parameters
LORA = dict(
    r=4,
    lora_alpha=8,
    lora_dropout=0.0,
    target_modules=["qkv", "attn.out_proj"],
    target_parameters=["force.w_in", "force.w_out"],
)


# peft asks transformers' deprecated is_gradient_checkpointing
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_trains_saves_reloads_and_merges(tmp_path):
    base = tiny_lm("coupled")
    x = ids(2, 9)
    with torch.no_grad():
        before = base(x).logits
    w_in = base.model.blocks[0].attn.qk_map.force.w_in.detach().clone()
    model = get_peft_model(base, LoraConfig(**LORA))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    lora_a = [n for n in trainable if "lora_A" in n]
    for part, count in (("attn.qkv.", 2), ("attn.out_proj.", 2), ("qk_map.force.", 4)):  # 2 layers; w_in, w_out
        assert sum(part in n for n in lora_a) == count, (part, trainable)
    assert len(lora_a) == 8
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, before)  # LoRA starts at B = 0: the base model exactly

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    losses = []
    for _ in range(6):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    model.eval()
    with torch.no_grad():
        tuned = model(input_ids=x).logits
    assert not torch.allclose(tuned, before)
    with model.disable_adapter(), torch.no_grad():  # the base weights never moved
        assert torch.equal(model(input_ids=x).logits, before)

    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = PeftModel.from_pretrained(tiny_lm("coupled"), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=x).logits, tuned, atol=1e-5, rtol=1e-5)
    greedy = reloaded.generate(input_ids=x[:, :4], max_new_tokens=5, do_sample=False)  # cached decoding through peft

    merged = reloaded.merge_and_unload()
    assert type(merged) is CoupledQKForCausalLM
    assert not torch.equal(merged.model.blocks[0].attn.qk_map.force.w_in, w_in)  # the coupling network was adapted
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, tuned, atol=1e-5, rtol=1e-5)
    assert torch.equal(merged.generate(x[:, :4], max_new_tokens=5, do_sample=False), greedy)
    merged.save_pretrained(tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()  # a plain model, strict load
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, tuned, atol=1e-5, rtol=1e-5)


# peft's own notices: transformers' deprecated is_gradient_checkpointing, and prompt tuning without position ids
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:Position ids are not supported for parameter efficient tuning:UserWarning")
def test_prompt_tuning_trains_the_virtual_tokens_and_generates():
    """``peft`` prompt tuning feeds ``inputs_embeds`` (virtual tokens before the prompt's embeddings) with
    ``return_dict=None``: it was refused ("inputs_embeds is not supported"), then returned a tuple. The logits
    are the base model's on ``[virtual tokens; prompt]`` and the virtual tokens get gradients. (peft reads the
    head count from ``config.to_dict()``, which holds ``n_heads``: give ``num_attention_heads``.)"""
    from peft import PromptTuningConfig, TaskType

    base = tiny_lm("coupled")
    model = get_peft_model(
        base, PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=3, num_attention_heads=4)
    )
    x = ids(2, 6)
    out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=x)
    virtual = model.prompt_encoder.default.embedding.weight
    with torch.no_grad():
        joined = torch.cat([virtual.expand(2, -1, -1), base.get_input_embeddings()(x)], dim=1)
        torch.testing.assert_close(out.logits, base(inputs_embeds=joined).logits)
    out.loss.backward()
    assert virtual.grad is not None and virtual.grad.abs().sum() > 0
    model.eval()
    cached, uncached = (
        model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False, use_cache=c)
        for c in (True, False)
    )
    assert cached.shape == (2, 10) and torch.equal(cached, uncached)
