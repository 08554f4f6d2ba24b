"""Write the fixture: a checkpoint folder and a Hugging Face export of ``coupled_differential``, with the code on
``PYTHONPATH`` (``PYTHONPATH=<src> python make.py <folder>``; see README.md). :func:`train` is the computation
(tests/models/test_legacy_checkpoints.py repeats it with today's code); :func:`write` uses the writers of the
code the fixture was made with (``training/checkpoint.py``, since replaced by the run folder)."""

import sys
from pathlib import Path

import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.model_setup import build_optimizer

CONFIG = dict(
    vocab_size=32, block_size=16, n_layer=2, d_model=16, n_heads=4, n_kv_heads=2, attention="coupled_differential"
)


def train(save_step2=None) -> dict:
    """Two AdamW steps (then ``save_step2(model, config, optimizer)``), a third, and the logits of ``idx``: on one
    CPU thread, from seed 0. Returns the tensors of ``expected.safetensors`` and the model."""
    torch.set_num_threads(1)  # one summation order
    torch.manual_seed(0)
    cfg = GPTConfig(**CONFIG)
    model = GPT(cfg)
    opt = build_optimizer(model, TrainConfig(max_steps=2, lr=1e-2))
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        if step == 2 and save_step2 is not None:
            save_step2(model, cfg, opt)
        x = torch.randint(0, 32, (2, 12), generator=g)
        next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    idx = torch.arange(10).remainder(32).view(1, 10)
    model.eval()
    with torch.no_grad():
        logits = model(idx)
    weights = {f"step3.{k}": v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return {"batch3": x, "idx": idx, "logits_after_step3": logits, **weights}, model


def write(out: Path) -> None:
    """The fixture's files, written with the code of the layout it records."""
    from coupled_qk.training.checkpoint import save_checkpoint
    from safetensors.torch import save_file

    from coupled_qk.hf.modeling import CoupledQKForCausalLM

    def save(model, cfg, opt):
        save_checkpoint(out / "run", model.state_dict(), cfg, opt.state_dict(), {"step": 2}, keep=1)

    expected, model = train(save)
    CoupledQKForCausalLM.from_gpt(model).save_pretrained(out / "hf")
    save_file({k: v.contiguous() for k, v in expected.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
