"""Convert a :class:`coupled_qk.GPT` with learned positions into an equivalent ``transformers`` GPT-2.

Our GPT with ``position="learned"`` is GPT-2's architecture without biases (pre-norm LayerNorm blocks,
exact-GELU MLP, tied embeddings; docs/METHOD.md section 4), so its weights map one to one onto
``GPT2LMHeadModel`` with zero biases and ``activation_function="gelu"``. A ``coupled`` model becomes a
GPT-2 retrofitted with :func:`coupled_qk.hf.retrofit.retrofit` carrying the same dynamics parameters. This
lets the retrofit experiment start from a model trained by this project (no weights can be downloaded here).
"""

from __future__ import annotations

import torch

from coupled_qk.models.gpt import GPT
from coupled_qk.models.maps.dynamics import QKDynamics
from coupled_qk.models.registry import attention_names, get_attention


def convertible(attention: str) -> bool:
    """Whether GPT-2 can express ``attention``: standard scoring with no query-key map, or with the coupled
    dynamics (:class:`~coupled_qk.models.maps.dynamics.QKDynamics`, inserted by
    :func:`~coupled_qk.hf.retrofit.retrofit`); read from the registry (``ValueError`` for an unknown attention)."""
    a = get_attention(attention)
    return a.scoring == "standard" and (a.qk_map is None or a.qk_map.module is QKDynamics)


def gpt_to_gpt2(model: GPT):
    """A ``GPT2LMHeadModel`` computing the same logits as ``model`` (weights copied, in ``model``'s dtype).

    Args:
        model: a :class:`coupled_qk.GPT` with ``position="learned"``, ``attention`` in ``standard`` or
            ``coupled``, ``n_kv_heads == n_heads``, ``d_head * n_heads == d_model`` and the MLP enabled.

    Returns:
        ``transformers.GPT2LMHeadModel`` in eval mode with zero biases (``attn_implementation="sdpa"``).
        A coupled model is retrofitted (``gqa`` irrelevant, ``n_kv_heads == n_heads``) with its dynamics.

    Raises:
        ValueError: naming the first configuration field that GPT-2 cannot express.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    from coupled_qk.hf.retrofit import retrofit

    c = model.config
    checks = [
        ("position", c.position, c.position == "learned", "'learned' (GPT-2 has learned absolute positions)"),
        (
            "attention",
            c.attention,
            convertible(c.attention),
            f"one of {[a for a in attention_names() if convertible(a)]}",
        ),
        ("n_kv_heads", c.n_kv_heads, c.n_kv_heads == c.n_heads, f"n_heads={c.n_heads} (GPT-2 has no GQA)"),
        ("d_head", c.d_head, c.d_head * c.n_heads == c.d_model, f"d_model / n_heads = {c.d_model // c.n_heads}"),
        ("use_mlp", c.use_mlp, c.use_mlp, "True"),
    ]
    for name, value, ok, expected in checks:
        if not ok:
            raise ValueError(
                f"gpt_to_gpt2: GPTConfig.{name}={value!r} cannot be expressed by GPT-2; expected {expected}"
            )
    hf_config = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.d_model, n_layer=c.n_layer, n_head=c.n_heads,
        n_inner=c.d_ff, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )  # fmt: skip
    hf_config._attn_implementation = "sdpa"
    hf = GPT2LMHeadModel(hf_config).to(model.tok_emb.weight.dtype)
    if get_attention(c.attention).qk_map is not None:
        m = c.qk_map  # DynamicsOptions
        retrofit(
            hf, integrator=m.integrator, n_steps=m.n_steps, hidden=m.hidden, force=m.force,
            shared_across_heads=m.shared_across_heads,
        )  # fmt: skip
    t = hf.transformer
    with torch.no_grad():
        for p in hf.parameters():
            p.zero_()  # biases stay zero; every weight is overwritten below
        t.wte.weight.copy_(model.tok_emb.weight[: c.vocab_size])  # without GPTConfig.vocab_pad_multiple rows
        t.wpe.weight.copy_(model.pos_emb.weight)
        t.ln_f.load_state_dict(model.ln_f.state_dict())
        for block, h in zip(model.blocks, t.h, strict=True):
            h.ln_1.load_state_dict(block.ln_1.state_dict())
            h.ln_2.load_state_dict(block.ln_2.state_dict())
            h.attn.c_attn.weight.copy_(block.attn.qkv.weight.t())  # Conv1D stores (in, out)
            h.attn.c_proj.weight.copy_(block.attn.out_proj.weight.t())
            h.mlp.c_fc.weight.copy_(block.mlp.fc.weight.t())
            h.mlp.c_proj.weight.copy_(block.mlp.out_proj.weight.t())
            if get_attention(c.attention).qk_map is not None:
                h.attn.qk_dynamics.load_state_dict(block.attn.qk_map.state_dict())
    hf.tie_weights()
    return hf.to(model.tok_emb.weight.device).eval()
