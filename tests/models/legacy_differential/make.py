"""Write the fixture: a checkpoint folder and a Hugging Face export of ``coupled_differential``, with the code on
``PYTHONPATH`` (``PYTHONPATH=<src> python make.py <folder>``; see README.md)."""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from coupled_qk import GPT, GPTConfig
from coupled_qk.hf.modeling import CoupledQKForCausalLM
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training.checkpoint import save_checkpoint
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.model_setup import build_optimizer

out = Path(sys.argv[1])
torch.set_num_threads(1)  # one summation order
torch.manual_seed(0)
cfg = GPTConfig(
    vocab_size=32, block_size=16, n_layer=2, d_model=16, n_heads=4, n_kv_heads=2, attention="coupled_differential"
)
model = GPT(cfg)
opt = build_optimizer(model, TrainConfig(max_steps=2, lr=1e-2))
g = torch.Generator().manual_seed(1)
for _ in range(2):
    x = torch.randint(0, 32, (2, 12), generator=g)
    next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
save_checkpoint(out / "run", model.state_dict(), cfg, opt.state_dict(), {"step": 2}, keep=1)
x = torch.randint(0, 32, (2, 12), generator=g)  # one more step from this state: what a resume must reproduce
next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
opt.step()
opt.zero_grad(set_to_none=True)
idx = torch.arange(10).remainder(32).view(1, 10)
model.eval()
with torch.no_grad():
    logits_after = model(idx)
CoupledQKForCausalLM.from_gpt(model).save_pretrained(out / "hf")
weights = {
    f"step3.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
}
save_file(
    {"batch3": x, "idx": idx, "logits_after_step3": logits_after.contiguous(), **weights},
    str(out / "expected.safetensors"),
)
