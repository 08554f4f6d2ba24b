"""The transformers contract, run over every registered attention variant (in the spirit of transformers'
common model tests): what any ``AutoModelForCausalLM`` user relies on must hold for each of them.

The variants come from the registry (``models/registry.py``): every named variant plus every registered
attention that no variant names, so a newly registered variant is covered without editing this file. Each check
compares against an independent reference: the plain ``GPT`` forward, a float64 recomputation of the loss, the
unpadded / uncached / unbatched / unchecked computation of the same thing.
"""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    DynamicCache,
    StaticCache,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402
from coupled_qk.models.registry import ATTENTIONS, VARIANTS, load_plugins  # noqa: E402

load_plugins()  # the drop-in maps and plugins, before the tables are read

V = 53
CASES = {
    **VARIANTS,
    **{a: dict(attention=a) for a in ATTENTIONS if a not in {v["attention"] for v in VARIANTS.values()}},
}
"""Every named variant, plus every registered attention no variant names (read from the registry)."""

variants = pytest.mark.parametrize("variant", sorted(CASES))


def tiny_lm(variant: str, seed: int = 0, **kw) -> CoupledQKForCausalLM:
    """A 2-layer, 32-wide model of ``variant`` with grouped-query attention (4 query heads, 2 key/value heads),
    wrapped for transformers, in eval mode. ``dt_init`` is raised for maps that have it, so the map is far from
    the identity and a bug in it shows."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=V, block_size=40, n_layer=2, d_model=32, n_heads=4, n_kv_heads=2)
    cfg = GPTConfig(**{**fields, **CASES[variant], **kw})
    if cfg.qk_map is not None and hasattr(cfg.qk_map, "dt_init") and "dt_init" not in kw:
        cfg = cfg.replace(dt_init=0.5)
    return CoupledQKForCausalLM.from_gpt(GPT(cfg), pad_token_id=0).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def close(a, b, **kw):
    torch.testing.assert_close(a, b, **{"atol": 2e-5, "rtol": 1e-4, **kw})


# --------------------------------------------------------------------------------------------------------------
# saving and loading
# --------------------------------------------------------------------------------------------------------------


@variants
def test_sharded_safetensors_round_trip(tmp_path, variant):
    lm = tiny_lm(variant)
    lm.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file(), shards
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = ids(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, lm(x).logits)
    assert loaded.model.lm_head.weight is loaded.model.tok_emb.weight  # the head is tied again, not a copy


@variants
def test_from_pretrained_dtype(tmp_path, variant):
    lm = tiny_lm(variant)
    lm.save_pretrained(tmp_path)
    half = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    x = ids(2, 9)
    with torch.no_grad():
        ref, out = lm(x).logits, half(x).logits
    assert out.dtype == torch.bfloat16
    close(out.float(), ref, atol=0.05, rtol=0.05)  # bfloat16 keeps ~3 significant digits
    assert (out.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


# --------------------------------------------------------------------------------------------------------------
# resizing the vocabulary
# --------------------------------------------------------------------------------------------------------------


@variants
def test_resize_token_embeddings_keeps_config_tie_and_old_logits(tmp_path, variant):
    lm = tiny_lm(variant)
    x = ids(2, 9)
    with torch.no_grad():
        before = lm(x).logits
    lm.resize_token_embeddings(V + 7)
    for n in (lm.config.vocab_size, lm.model.config.vocab_size, lm.model.tok_emb.weight.shape[0]):
        assert n == V + 7
    assert lm.model.lm_head.weight is lm.model.tok_emb.weight
    with torch.no_grad():
        after = lm(x).logits
        assert after.shape == (2, 9, V + 7)
        assert torch.equal(after[..., :V], before)  # old rows untouched: old tokens score as before
        lm(torch.full((1, 3), V + 6))  # the new ids are accepted
    lm.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.vocab_size == loaded.model.config.vocab_size == V + 7
    assert loaded.model.lm_head.weight is loaded.model.tok_emb.weight
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, after)
    loaded.resize_token_embeddings(V - 3)  # shrinking drops the last rows
    assert loaded.model.config.vocab_size == V - 3 and loaded.model.lm_head.weight is loaded.model.tok_emb.weight
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\)"):
        loaded(torch.full((1, 2), V - 3))


def test_resize_rejects_bad_sizes():
    lm = tiny_lm("coupled")
    with pytest.raises(ValueError, match="new_num_tokens=0 must be a positive integer"):
        lm.resize_token_embeddings(0)


# --------------------------------------------------------------------------------------------------------------
# masks, caches, batches
# --------------------------------------------------------------------------------------------------------------


@variants
def test_left_and_right_padding_equal_the_unpadded_sequence(variant):
    lm = tiny_lm(variant)
    seq = ids(1, 7)
    with torch.no_grad():
        ref = lm(seq).logits
        for side in ("left", "right"):
            pad = torch.zeros(1, 4, dtype=torch.long)
            x = torch.cat([pad, seq] if side == "left" else [seq, pad], 1)
            mask = torch.cat([pad, torch.ones_like(seq)] if side == "left" else [torch.ones_like(seq), pad], 1)
            out = lm(x, attention_mask=mask).logits
            close(out[:, 4:] if side == "left" else out[:, :7], ref)


@variants
def test_cached_steps_equal_the_full_forward(variant):
    lm = tiny_lm(variant)
    x = ids(2, 10)
    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        parts = [lm(x[:, :6], cache=cache).logits, lm(x[:, 6:8], cache=cache).logits]
        parts += [lm(x[:, t : t + 1], cache=cache).logits for t in (8, 9)]
        full = lm(x, use_cache=False).logits
    close(torch.cat(parts, 1), full)


@variants
def test_batched_equals_one_by_one(variant):
    lm = tiny_lm(variant)
    x = ids(3, 9)
    with torch.no_grad():
        batched = lm(x).logits
        single = torch.cat([lm(x[i : i + 1]).logits for i in range(3)])
    close(batched, single)


@variants
def test_beam_search_cached_equals_uncached(variant):
    lm = tiny_lm(variant)
    x = ids(2, 5)
    beams = [lm.generate(x, max_new_tokens=5, num_beams=3, do_sample=False, use_cache=c) for c in (True, False)]
    assert torch.equal(*beams)


# --------------------------------------------------------------------------------------------------------------
# static cache and torch.compile
# --------------------------------------------------------------------------------------------------------------


def _left_padded(lengths, seed=3):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    x = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, n in enumerate(lengths):
        x[i, width - n :], mask[i, width - n :] = torch.randint(1, V, (n,), generator=g), 1
    return x, mask


@variants
def test_static_cache_generates_what_the_dynamic_cache_generates(variant):
    lm = tiny_lm(variant)
    x, mask = _left_padded((4, 9, 6))
    dynamic = lm.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
    static = lm.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False, cache_implementation="static")
    assert torch.equal(static, dynamic)


def test_static_cache_beam_search():
    lm = tiny_lm("coupled_leapfrog")
    x, mask = _left_padded((4, 9))
    beams = lm.generate(
        x, attention_mask=mask, max_new_tokens=5, num_beams=2, do_sample=False, cache_implementation="static"
    )
    assert torch.equal(beams, lm.generate(x, attention_mask=mask, max_new_tokens=5, num_beams=2, do_sample=False))


def test_static_cache_steps_equal_full_forward_and_overflow_is_named():
    lm = tiny_lm("coupled_differential")
    x = ids(2, 10)
    cache = StaticCache(config=lm.config, max_cache_len=10)
    with torch.no_grad():
        parts = [lm(x[:, :6], cache=cache).logits] + [lm(x[:, t : t + 1], cache=cache).logits for t in (6, 7, 8)]
        close(torch.cat(parts, 1), lm(x[:, :9], use_cache=False).logits)
        with pytest.raises(ValueError, match="max_cache_len=10 positions; 9 are cached and 2 more"):
            lm(ids(2, 2), cache=cache)
        lm(x[:, 9:], cache=cache)  # the last slot (a fixed-shape step, cache_view.StaticStep)
        with pytest.raises(ValueError, match="max_cache_len=10 positions; 10 are cached and 1 more"):
            lm(ids(2, 1), cache=cache)


@pytest.mark.parametrize("variant", ["coupled", "coupled_differential", "invertible"])
def test_static_single_token_steps_take_either_mask_width_and_equal_the_dynamic_cache(variant):
    """A decoding step over a filled static cache runs with fixed shapes (``cache_view.StaticStep``): the mask may
    be ``(B, T_past + 1)`` (as for any cache) or ``(B, max_cache_len)`` (zeros after the new token, what
    ``generate`` passes); both give the dynamic cache's logits, left padding and ``position_ids`` included."""
    lm = tiny_lm(variant)
    x, mask = _left_padded((3, 8, 5))
    nxt = ids(3, 3, seed=1)
    with torch.no_grad():
        dynamic, static = DynamicCache(config=lm.config), StaticCache(config=lm.config, max_cache_len=16)
        ref, out = (
            [lm(x, attention_mask=mask, cache=dynamic).logits[:, -1]],
            [lm(x, attention_mask=mask, cache=static).logits[:, -1]],
        )
        for t in range(3):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
            ref.append(lm(nxt[:, t : t + 1], attention_mask=mask, cache=dynamic).logits[:, -1])
            wide = torch.nn.functional.pad(mask, (0, 16 - mask.shape[1])) if t % 2 else mask
            positions = (mask.cumsum(-1) - 1)[:, -1:] if t == 2 else None
            out.append(lm(nxt[:, t : t + 1], attention_mask=wide, position_ids=positions, cache=static).logits[:, -1])
    close(torch.stack(out), torch.stack(ref))


def test_static_single_token_step_names_a_bad_mask_or_positions():
    lm = tiny_lm("coupled")
    with torch.no_grad():
        cache = StaticCache(config=lm.config, max_cache_len=12)
        lm(ids(2, 4), cache=cache)
        for bad in (torch.ones(2, 4), torch.ones(2, 13), torch.ones(3, 5)):
            with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T_past \+ 1\) = \(2, 5\)"):
                lm(ids(2, 1), attention_mask=bad, cache=cache)
        with pytest.raises(ValueError, match=r"attention_mask must hold only 0 \(padding\) and 1"):
            lm(ids(2, 1), attention_mask=torch.full((2, 5), 2), cache=cache)
        with pytest.raises(ValueError, match=r"position_ids must have shape \(2, 1\)"):
            lm(ids(2, 1), position_ids=torch.zeros(2, 2, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match=r"position_ids must be in \[0, block_size=40\)"):
            lm(ids(2, 1), position_ids=torch.full((2, 1), 40), cache=cache)
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 53\)"):
            lm(torch.full((2, 1), V), cache=cache)
        assert int(cache.get_seq_length()) == 4  # nothing was written by the refused steps


COMPILE_CASES = sorted(
    {a.scoring if a.qk_map is None else name for name, a in ATTENTIONS.items() if a.scoring == "differential"}
)
"""One attention per registered query-key map (and none), with differential scoring, the layout with the most
cases (sub-head pairs, grouped values, per-query-head keys): compiling costs tens of seconds per model on CPU."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", COMPILE_CASES)
def test_compiled_static_cache_decoding_is_one_graph_and_matches_eager(variant):
    """``generate`` compiles the decoding step when the cache is static (``torch.compile`` of the forward; on CPU
    when asked through ``compile_config``). The step must be one graph, with ``fullgraph=True`` (no graph
    break) and no recompilation as the cache fills (nothing reads the cached length as a Python number:
    ``cache_view.StaticStep``), and produce eager's tokens exactly. The ``eager`` dynamo backend keeps this
    affordable on CPU: it checks what Dynamo captures; Inductor lowers the same graph further."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    torch._dynamo.reset()
    counters.clear()
    lm = tiny_lm(variant)
    x, mask = _left_padded((4, 7))
    eager = lm.generate(x, attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation="static")
    config = CompileConfig(backend="eager", mode=None, fullgraph=True)
    config._compile_all_devices = True
    compiled = lm.generate(
        x, attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation="static", compile_config=config
    )
    assert hasattr(lm, "_compiled_call")  # the compiled path really ran
    assert torch.equal(compiled, eager)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert counters["stats"]["calls_captured"] > 0


# --------------------------------------------------------------------------------------------------------------
# training: gradient checkpointing and Trainer with gradient accumulation
# --------------------------------------------------------------------------------------------------------------


def _grads(lm, x, mask, labels, saved=None):
    """Parameter gradients of the loss; ``saved`` (a list) receives the bytes autograd keeps for backward."""
    lm.zero_grad()
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm(x, attention_mask=mask, labels=labels).loss
    loss.backward()
    if saved is not None:
        saved.append(total[0])
    return {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


@variants
def test_gradient_checkpointing_gives_the_same_gradients(variant):
    lm = tiny_lm(variant).train()
    x, mask = _left_padded((5, 9, 7))
    labels = x.masked_fill(mask == 0, -100)
    saved = []
    ref = _grads(lm, x, mask, labels, saved)
    lm.activation_checkpointing_enable()
    assert lm.is_activation_checkpointing and lm.model.gradient_checkpointing
    calls = []
    func = lm.model._gradient_checkpointing_func
    lm.model._gradient_checkpointing_func = lambda *a, **k: calls.append(1) or func(*a, **k)
    got = _grads(lm, x, mask, labels, saved)
    assert len(calls) == lm.config.n_layer  # one checkpoint per block
    assert saved[1] < 0.5 * saved[0], saved  # the blocks' activations are no longer kept for backward
    assert got.keys() == ref.keys()
    for name in ref:
        close(got[name], ref[name], atol=1e-6, rtol=1e-5)
    lm.activation_checkpointing_disable()
    assert not lm.model.gradient_checkpointing


def _rows(n_rows, width, seed=1):
    """Right-padded rows of uneven real length, labels ``-100`` at padding."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_rows):
        n = int(torch.randint(3, width + 1, (1,), generator=g))
        x = torch.zeros(width, dtype=torch.long)
        x[:n] = torch.randint(1, V, (n,), generator=g)
        mask = (torch.arange(width) < n).long()
        rows.append(dict(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)))
    return rows


class _Grads(TrainerCallback):
    """Copies the accumulated gradients right before the optimizer step."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.checkpointing = self.model.model.gradient_checkpointing


def _trainer_grads(variant, rows, batch, accumulation, out_dir, **training_args):
    lm = tiny_lm(variant).train()
    grab = _Grads(lm)
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        **training_args,
    )
    Trainer(model=lm, args=args, train_dataset=rows, data_collator=default_data_collator, callbacks=[grab]).train()
    return grab


def _reference_grads(variant, rows):
    """float64 mean next-token cross-entropy over every real target of all rows: one batch, no Trainer."""
    lm = tiny_lm(variant).train()
    batch = default_data_collator(rows)
    logits = lm(batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    targets = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    return {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


@variants
def test_trainer_gradient_accumulation_equals_one_large_batch(tmp_path, variant):
    """One optimizer step of ``Trainer`` with accumulation 4 over 4 micro-batches of 2 right-padded rows of
    uneven length has the gradient of the mean loss over all 8 rows (float64, no Trainer)."""
    rows = _rows(8, 12)
    assert len({int(r["attention_mask"].sum()) for r in rows}) > 2  # uneven padding
    ref = _reference_grads(variant, rows)
    accumulated = _trainer_grads(variant, rows, 2, 4, tmp_path).grads
    assert accumulated.keys() == ref.keys()
    for name in ref:
        close(accumulated[name], ref[name].float(), atol=1e-6, rtol=1e-4)


def test_trainer_accumulation_equals_trainer_on_the_large_batch(tmp_path):
    """Also with ``TrainingArguments(gradient_checkpointing=True)``, which Trainer turns on in the model."""
    rows = _rows(8, 12, seed=5)
    accumulated = _trainer_grads("coupled", rows, 2, 4, tmp_path / "acc", gradient_checkpointing=True)
    assert accumulated.checkpointing
    accumulated = accumulated.grads
    large = _trainer_grads("coupled", rows, 8, 1, tmp_path / "one").grads
    for name in large:
        close(accumulated[name], large[name], atol=1e-6, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------
# output options
# --------------------------------------------------------------------------------------------------------------


@variants
def test_output_hidden_states_and_return_dict(variant):
    lm = tiny_lm(variant)
    x = ids(2, 7)
    with torch.no_grad():
        out = lm(x, output_hidden_states=True)
        trace = list(lm.model.trace(x))  # the eager path, block by block: an independent recomputation
        states = out.hidden_states
        assert len(states) == lm.config.n_layer + 1
        close(states[0], trace[0].input)
        for i in range(1, lm.config.n_layer):
            close(states[i], trace[i - 1].output)
        close(states[-1], lm.model.ln_f(trace[-1].output))
        close(lm.model.lm_head(states[-1]), out.logits)
        assert lm(x).hidden_states is None
        as_tuple = lm(x, labels=x, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[1], out.logits)
        with pytest.raises(ValueError, match="output_attentions=True is not supported.*GPT.trace"):
            lm(x, output_attentions=True)
