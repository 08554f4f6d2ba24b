"""The compiled path (issue 29; issue 28 items 2-4): no recompiles, no graph breaks, a fallback that fires,
regional compilation equal to eager for every registered variant, a static-cache compiled decoding step equal
to eager decoding token for token.

Most tests compile with the ``eager`` / ``aot_eager`` backends: they run the real Dynamo capture (graph breaks,
guards, recompiles) and AOT autograd (the joint forward/backward graph) in seconds, without Inductor's code
generation; Inductor itself is exercised by the tests marked ``slow``.
"""

import copy
import pickle
import warnings

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

from coupled_qk import GPT, GPTConfig
from coupled_qk.layers.kv_cache import KVCache, StaticKVCache
from coupled_qk.layers.scoring import scaled_dot_product
from coupled_qk.models.compiled import compile_regions, uncompile_regions
from coupled_qk.models.generation import static_capacity
from coupled_qk.models.registry import variant_names
from coupled_qk.models.specs import variant_overrides


def tiny(variant="standard", **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, block_size=32, n_layer=2, d_model=32, n_heads=4, **variant_overrides(variant))
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    counters.clear()
    yield
    dynamo.reset()


def broken_backend(gm, example_inputs):
    raise RuntimeError("no compiler here\nsecond line")


def frames():
    return counters["stats"]["unique_graphs"]


# --- issue 28 item 2: RoPE tables built eagerly, no recompile on the second call ---------------------------


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_whole_model_compile_does_not_recompile_on_the_second_call(position):
    model = tiny(position=position)
    compiled = torch.compile(model, backend="eager")
    x = torch.randint(0, 64, (2, 8))
    first = compiled(x)
    assert frames() == 1
    second = compiled(x)
    assert frames() == 1  # before the fix: 2 (the RoPE dict filled inside the first call broke its guards)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, model(x), rtol=1e-6, atol=1e-6)


def test_rope_tables_exist_at_construction_and_follow_the_parameters():
    model = tiny()
    assert list(model._rope) == [torch.device("cpu")]
    model.double()  # a move rebuilds them on the parameters' device (float32 tables, cast where applied)
    assert list(model._rope) == [torch.device("cpu")] and model._rope[torch.device("cpu")][0].dtype == torch.float32
    with torch.device("meta"):
        meta = tiny()
    assert meta._rope == {}  # nothing built on the meta device
    meta.to_empty(device="cpu")
    assert list(meta._rope) == [torch.device("cpu")]
    assert tiny(position="learned")._rope == {}


# --- issue 28 item 3: no graph break at is_causal in cached decoding ---------------------------------------


def test_sdpa_causal_flag_is_never_a_symbolic_bool():
    q = torch.randn(1, 2, 6, 8)
    f = torch.compile(lambda q, k: scaled_dot_product(q, k, k, False)[0], backend="eager", dynamic=True)
    for t_q, t_k in ((6, 6), (3, 3), (1, 6), (1, 4), (2, 6)):  # prefill, decode steps, chunked prefill
        torch.testing.assert_close(
            f(q[:, :, :t_q], q[:, :, :t_k]), scaled_dot_product(q[:, :, :t_q], q[:, :, :t_k], q[:, :, :t_k], True)[0]
        )
    assert dict(counters["graph_break"]) == {}  # before the fix: 'is_causal must be bool, not SymBool'
    ex = dynamo.explain(lambda q, k: scaled_dot_product(q, k, k, False)[0])(q[:, :, :1], q)
    assert ex.graph_break_count == 0


@pytest.mark.slow
def test_cached_decoding_with_dynamic_shapes_has_no_graph_break():
    model = tiny("coupled").eval()
    eager = copy.deepcopy(model)
    model.compile(backend="eager", dynamic=True)
    x = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        cache, eager_cache = model.new_cache(), eager.new_cache()
        out, ref = model(x, cache), eager(x, eager_cache)
        for _ in range(3):  # the second step recompiles with a dynamic cache length
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            nxt = ref[:, -1:].argmax(-1)
            out, ref = model(nxt, cache), eager(nxt, eager_cache)
    assert dict(counters["graph_break"]) == {}
    rope = tuple(t[6:7] for t in model.rope_tables(torch.device("cpu")))
    with torch.no_grad():
        ex = dynamo.explain(eager.blocks[0])(torch.randn(2, 1, 32), rope, cache)
    assert ex.graph_break_count == 0


# --- issue 28 item 4: a compile fallback that fires --------------------------------------------------------


def test_compile_failure_falls_back_to_eager_with_one_warning():
    model = tiny("coupled")
    x = torch.randint(0, 64, (2, 8))
    expected = model(x)
    model.compile(backend=broken_backend)
    assert model.is_compiled
    with pytest.warns(
        RuntimeWarning, match=r"torch.compile failed .*RuntimeError: no compiler here\); the model runs eagerly"
    ):
        out = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not model.is_compiled and "no compiler here" in model.compile_info["error"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        model(x)


def test_compile_failure_falls_back_to_eager_under_gradient_checkpointing_too():
    """With gradient_checkpointing the blocks bypassed the first-call guard: the compiler's error aborted the
    training forward instead of the documented fallback, and a working compile never recorded its first call."""
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    model = tiny("coupled").train()
    model.gradient_checkpointing = True
    expected = model.loss(x, y)
    model.compile(backend=broken_backend)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed .*no compiler here\); the model runs eagerly"):
        loss = model.loss(x, y)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    loss.backward()
    assert not model.is_compiled and "no compiler here" in model.compile_info["error"]
    model.compile(backend="aot_eager")
    torch.testing.assert_close(model.loss(x, y), expected)
    assert model.compile_info["first_call_s"] > 0 and model._compile_state == "ok"


def test_a_failed_first_call_leaves_the_cache_as_it_was():
    model = tiny("standard").eval()
    x = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(x, model.new_cache())
        model.compile(backend=broken_backend)
        cache = model.new_cache()
        with pytest.warns(RuntimeWarning):
            out = model(x, cache)
    assert cache.length == 8
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_the_callers_own_error_is_raised_and_compilation_kept():
    model = tiny("standard").eval().compile(backend="eager")
    with torch.no_grad():
        cache = model.new_cache()
        model(torch.randint(0, 64, (2, 4)), cache)
        with pytest.raises(ValueError, match="do not match the cached"):
            model(torch.randint(0, 64, (3, 1)), cache)  # another batch size than the cache holds
    assert model.is_compiled and "error" not in model.compile_info


# --- regional compilation: equal to eager, names unchanged -------------------------------------------------


@pytest.mark.slow  # 2-10 s per variant (Dynamo capture)
@pytest.mark.parametrize("variant", variant_names())
def test_regional_compile_matches_eager_forward_and_backward(variant):
    eager = tiny(variant)
    compiled = copy.deepcopy(eager).compile(backend="aot_eager", fullgraph=True)
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    le, lc = eager.loss(x, y), compiled.loss(x, y)
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
    le.backward()
    lc.backward()
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert compiled.is_compiled and dict(counters["graph_break"]) == {}
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    assert not any("_orig_mod" in k for k in compiled.state_dict())


def test_regional_compile_shares_one_graph_across_blocks():
    model = tiny("coupled", n_layer=4).compile(backend="eager")
    model(torch.randint(0, 64, (2, 8)))
    assert frames() == 1  # four blocks, one compiled graph: compile time does not grow with depth


def test_compiled_model_state_dict_loads_into_an_eager_one_and_back():
    compiled = tiny("coupled").compile(backend="eager")
    eager = tiny("coupled", n_layer=2)
    with torch.no_grad():
        for p in compiled.parameters():
            p.add_(0.01)
    eager.load_state_dict(compiled.state_dict())
    compiled.load_state_dict(eager.state_dict())
    x = torch.randint(0, 64, (1, 5))
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-6)


def test_compile_regions_finds_the_gpt_inside_a_wrapper_and_uncompiles():
    wrapper = torch.nn.Sequential(tiny())
    assert compile_regions(wrapper, backend="eager") == [wrapper[0]]
    assert wrapper[0].is_compiled and wrapper[0].blocks[0]._compiled_call_impl is not None
    uncompile_regions(wrapper, "test")
    assert not wrapper[0].is_compiled and wrapper[0].blocks[0]._compiled_call_impl is None
    plain = torch.nn.Linear(3, 3)
    assert compile_regions(plain, backend="eager") == [] and plain._compiled_call_impl is not None
    assert list(plain.state_dict()) == ["weight", "bias"]


@pytest.mark.slow
def test_inductor_regional_compile_matches_eager():
    eager = tiny("coupled_leapfrog")
    compiled = copy.deepcopy(eager).compile()
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    le, lc = eager.loss(x, y), compiled.loss(x, y)
    torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
    le.backward()
    lc.backward()
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert compiled.compile_info["first_call_s"] > 0 and "error" not in compiled.compile_info


# --- compiled decoding over a static cache -----------------------------------------------------------------


@pytest.mark.slow  # 2-10 s per variant (Dynamo capture)
@pytest.mark.parametrize("variant", variant_names())
def test_compiled_decoding_matches_eager_token_for_token(variant):
    model = tiny(variant).eval()
    x = torch.randint(0, 64, (2, 5))
    expected = model.generate(x, 10, temperature=0)
    model.compiled_decode_step(backend="eager", fullgraph=True)  # fullgraph: a graph break would be an error
    out = model.generate(x, 10, temperature=0, compile=True)
    assert torch.equal(out, expected)
    assert frames() == 1 and "decode_error" not in model.compile_info
    again = model.generate(x, 10, temperature=0, compile=True)  # the step is cached: no recompile
    assert torch.equal(again, expected) and frames() == 1


@pytest.mark.parametrize("variant", ["coupled", "coupled_leapfrog"])
def test_compiled_decoding_runs_the_unfolded_map(variant):
    """Under compilation the map is not folded (measured slower than the fused unfolded map,
    benchmarks/results/fastpath/compiled-decode-fold-ab.md): the compiled step equals the eager *unfolded*
    step to float rounding, and compiling builds no fold."""
    model = tiny(variant).eval()
    x = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        filled = model.new_cache(16)
        nxt = model.next_token_logits(x, filled).argmax(-1, keepdim=True)
        step = model.compiled_decode_step(backend="eager", fullgraph=True)
        logits = step(nxt, StaticKVCache.from_cache(filled))
        assert all(b.attn._fold is None for b in model.blocks)
        for b in model.blocks:
            b.attn.fold_inference = False
        ref = model.new_cache(16)
        model.next_token_logits(x, ref)
        torch.testing.assert_close(logits, model.next_token_logits(nxt, ref), rtol=1e-6, atol=1e-6)
    assert frames() == 1


@pytest.mark.parametrize("variant", ["coupled", "coupled_differential", "invertible"])
def test_compiled_decoding_of_a_padded_batch_matches_eager(variant):
    """Left-padded prompts of different lengths: the compiled step hides each row's padding and numbers its real
    tokens (``StaticKVCache.key_mask`` / ``positions``), so each row decodes what eager decoding of the padded
    batch, and of its prompt alone, decodes."""
    model = tiny(variant, n_kv_heads=2).eval()
    g = torch.Generator().manual_seed(5)
    lengths = (2, 6, 4)
    x = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, n in enumerate(lengths):
        x[i, 6 - n :], mask[i, 6 - n :] = torch.randint(1, 64, (n,), generator=g), 1
    expected = model.generate(x, 9, temperature=0, attention_mask=mask)
    model.compiled_decode_step(backend="eager", fullgraph=True)
    out = model.generate(x, 9, temperature=0, attention_mask=mask, compile=True)
    assert torch.equal(out, expected) and frames() == 1
    for i, n in enumerate(lengths):  # each row as its prompt alone
        alone = model.generate(x[i : i + 1, 6 - n :], 9, temperature=0, compile=True)
        assert torch.equal(alone[0, n:], out[i, 6:])
    assert frames() == 2  # an unpadded batch is its own graph (no mask), reused by every row


def test_compiled_sampling_matches_eager_sampling():
    model = tiny("coupled").eval()
    x = torch.randint(0, 64, (1, 3))
    expected = model.generate(x, 12, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(3))
    model.compiled_decode_step(backend="eager")
    out = model.generate(x, 12, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(3), compile=True)
    assert torch.equal(out, expected)


def test_compiled_generate_past_the_context_uses_the_compiled_step_while_it_fits():
    """context="slide" with compile=True: the tokens that fit the context go through the compiled step (they used
    to decode eagerly without a word), the rest eagerly; the tokens equal eager decoding."""
    model = tiny("coupled").eval()
    x = torch.randint(0, 64, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = model.generate(x, 40, temperature=0, attention_mask=mask)
    step = model.compiled_decode_step(backend="eager")
    calls = []
    model._decode_step = lambda idx, cache: calls.append(1) or step(idx, cache)
    out = model.generate(x, 40, temperature=0, attention_mask=mask, compile=True)
    assert torch.equal(out, expected)
    assert len(calls) == 32 - 5 - 1  # every token within the context but the prefill's
    with pytest.raises(ValueError, match=r"use_cache must be True \(got False\)"):
        model.generate(x, 40, compile=True, use_cache=False)  # past the context too


def test_static_step_logits_equal_the_dynamic_cache_step():
    model = tiny("coupled_differential").eval()
    for block in model.blocks:
        block.attn.fold_inference = False  # same arithmetic on both sides: compare to float rounding
    x = torch.randint(0, 64, (3, 7))
    with torch.no_grad():
        dyn = model.new_cache(16)
        filled = model.new_cache(16)
        nxt = model.next_token_logits(x, dyn).argmax(-1, keepdim=True)
        model.next_token_logits(x, filled)
        static = StaticKVCache.from_cache(filled)
        for _ in range(6):
            a = model.next_token_logits(nxt, dyn)
            b = model.decode_step(nxt, static)
            static.advance()
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            nxt = a.argmax(-1, keepdim=True)
    assert static.length == dyn.length == 13


def test_compiled_decoding_falls_back_to_eager_with_one_warning():
    model = tiny("coupled").eval()
    x = torch.randint(0, 64, (2, 4))
    expected = model.generate(x, 6, temperature=0)
    model.compiled_decode_step(backend=broken_backend)
    with pytest.warns(RuntimeWarning, match="decoding step failed .*no compiler here"):
        out = model.generate(x, 6, temperature=0, compile=True)
    assert torch.equal(out, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(model.generate(x, 6, temperature=0, compile=True), expected)
    model.compile(backend="eager")  # the blocks' compilation keeps what is known of the kept decoding step
    assert "no compiler here" in model.compile_info["decode_error"] and model.compile_info["backend"] == "eager"


def test_compiled_generate_argument_errors_and_edge_cases():
    model = tiny().eval()
    x = torch.randint(0, 64, (2, 4))
    with pytest.raises(ValueError, match="attention_mask has a row without any real token"):
        model.generate(x, 2, compile=True, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"use_cache must be True \(got False\)"):
        model.generate(x, 2, compile=True, use_cache=False)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model.generate(x, 40, compile=True, context="error")
    assert torch.equal(model.generate(x, 0, compile=True), x)
    model.compiled_decode_step(backend="eager")
    assert model.generate(x, 28, temperature=0, compile=True).shape == (2, 32)  # fills the whole context


def test_model_with_a_compiled_step_pickles_and_deepcopies():
    model = tiny().eval()
    model.compiled_decode_step(backend="eager")
    model.generate(torch.randint(0, 64, (1, 3)), 2, temperature=0, compile=True)
    assert copy.deepcopy(model)._decode_step is None
    assert pickle.loads(pickle.dumps(model))._decode_step is None


@pytest.mark.slow
def test_inductor_compiled_decoding_matches_eager_token_for_token():
    model = tiny("coupled_leapfrog").eval()
    x = torch.randint(0, 64, (2, 5))
    expected = model.generate(x, 10, temperature=0)
    assert torch.equal(model.generate(x, 10, temperature=0, compile=True), expected)
    assert "decode_error" not in model.compile_info and model.compile_info["decode_first_call_s"] > 0
    assert frames() == 1


@pytest.mark.slow
def test_inductor_cpp_wrapper_decoding_matches_eager_token_for_token():
    model = tiny("coupled").eval()
    x = torch.randint(0, 64, (2, 5))
    expected = model.generate(x, 8, temperature=0)
    model.compiled_decode_step(options={"cpp_wrapper": True})
    assert torch.equal(model.generate(x, 8, temperature=0, compile=True), expected)
    assert "decode_error" not in model.compile_info and frames() == 1


def test_compiled_decode_step_with_other_arguments_compiles_a_new_step():
    """A second call with other arguments used to return the kept step, ignoring them (e.g. the README's
    options={"cpp_wrapper": True} after a generate(compile=True)); a call with the defaults still reuses it."""
    model = tiny().eval()
    x = torch.randint(0, 64, (1, 3))
    expected = model.generate(x, 5, temperature=0)
    first = model.compiled_decode_step(backend="eager")
    assert model.compiled_decode_step() is first  # defaults: the kept step (generate and the benchmarks call this)
    assert model.compiled_decode_step(backend="eager") is first
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    second = model.compiled_decode_step(backend=counting)
    assert second is not first and model.compiled_decode_step() is second
    assert torch.equal(model.generate(x, 5, temperature=0, compile=True), expected)
    assert len(graphs) == 1  # the new step is the one generate() used
    with pytest.raises(ValueError, match="cannot both be given"):
        model.compiled_decode_step(mode="max-autotune", options={"cpp_wrapper": True})
    assert model.compiled_decode_step() is second


def test_compiled_decode_step_is_rebuilt_for_another_device_type():
    """mode="auto" is decided by the device type (CUDA graphs on CUDA): a step built before the model moved kept the
    old choice. The kept arguments are reused (the meta device stands in for CUDA here)."""
    model = tiny().eval()
    first = model.compiled_decode_step(backend="eager", options={"x": 1})
    model.to("meta")
    second = model.compiled_decode_step()
    assert second is not first and model.compiled_decode_step() is second
    assert model._decode_settings == dict(
        backend="eager", mode="auto", fullgraph=False, options={"x": 1}, device="meta"
    )


def test_compiled_decode_step_refuses_mode_with_options():
    with pytest.raises(ValueError, match="mode='max-autotune' and options"):
        tiny().compiled_decode_step(mode="max-autotune", options={"cpp_wrapper": True})


# --- StaticKVCache and its capacity ------------------------------------------------------------------------


def test_static_kv_cache_writes_in_place_and_masks_the_rest():
    cache = KVCache(1, 8)
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
    cache.update(0, k, v)
    s = StaticKVCache.from_cache(cache)
    assert s.length == 5 and s.capacity == 8 and s.k[0] is cache._k[0]
    assert torch.equal(s.k[0][..., 5:, :], torch.zeros(2, 3, 3, 4))  # unfilled slots zeroed
    k1, v1 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 6)
    kb, vb = s.update(0, k1, v1)
    assert torch.equal(kb[..., 5:6, :], k1) and torch.equal(vb[..., :5, :], v)
    assert s.attn_mask().tolist() == [[[[True] * 6 + [False] * 2]]]
    s.advance()
    assert s.length == 6


def test_static_kv_cache_errors():
    with pytest.raises(ValueError, match="one key and one value buffer per layer"):
        StaticKVCache([], [], 0)
    with pytest.raises(ValueError, match="capacity 4"):
        StaticKVCache([torch.zeros(1, 1, 4, 2)], [torch.zeros(1, 1, 5, 2)], 0)
    with pytest.raises(ValueError, match=r"position=4 must be in \[0, capacity=4\)"):
        StaticKVCache([torch.zeros(1, 1, 4, 2)], [torch.zeros(1, 1, 4, 2)], 4)
    with pytest.raises(ValueError, match="fixed capacity"):
        StaticKVCache.from_cache(KVCache(1))
    with pytest.raises(ValueError, match="filled to the same length"):
        StaticKVCache.from_cache(KVCache(2, 4))


def test_compiled_step_on_a_full_static_cache_says_so():
    """Stepping past the last slot failed inside the compiled kernel ("index out of bounds: 0 <= tmp7 < 16L" from
    Inductor, an IndexError eagerly); the step now names the full cache, and the cache is left as it was."""
    model = tiny().eval()
    step = model.compiled_decode_step(backend="eager")
    cache = model.new_cache(8)
    with torch.no_grad():
        nxt = model.next_token_logits(torch.randint(0, 64, (1, 6)), cache).argmax(-1, keepdim=True)
        static = StaticKVCache.from_cache(cache)
        for _ in range(2):
            nxt = step(nxt, static).argmax(-1, keepdim=True)
            static.advance()
        assert static.next_slot == static.length == 8
        before = [t.clone() for t in static.k + static.v]
        with pytest.raises(ValueError, match=r"StaticKVCache is full: all capacity=8 slots are written"):
            step(nxt, static)
    assert all(torch.equal(a, b) for a, b in zip(before, static.k + static.v))


@pytest.mark.parametrize(
    "total, block, expected",
    [
        (1, 512, 64),
        (64, 512, 64),
        (65, 512, 128),
        (160, 512, 256),
        (300, 512, 512),
        (512, 512, 512),
        (20, 32, 32),
        (3, 8, 8),
    ],
)
def test_static_capacity(total, block, expected):
    assert static_capacity(total, block) == expected


def test_static_capacity_errors():
    with pytest.raises(ValueError, match=r"total=0 positions must be in \[1, block_size=8\]"):
        static_capacity(0, 8)
    with pytest.raises(ValueError, match="total=9"):
        static_capacity(9, 8)


@pytest.mark.slow  # ~10 Dynamo captures with the eager backend
def test_many_models_and_shapes_never_fall_back_to_eager_silently():
    """Every model's blocks and decoding step are one Python function each to Dynamo, which by default keeps 8
    graphs per function and then runs it eagerly without an error. More than 8 must all compile."""
    with dynamo.config.patch(recompile_limit=8):  # the default, whatever an earlier test raised it to
        models = [tiny(v).eval() for v in ("standard", "coupled", "coupled_leapfrog")]
        for m in models:
            m.compiled_decode_step(backend="eager")
        for m in models:
            for b in (1, 2, 3):
                m.generate(torch.randint(0, 64, (b, 4)), 3, temperature=0, compile=True)
        assert frames() == 9
    dynamo.reset()
    counters.clear()
    with dynamo.config.patch(recompile_limit=8):
        compiled = [
            tiny(v).compile(backend="eager")
            for v in ("standard", "coupled", "coupled_leapfrog", "coupled_symplectic_euler", "uncoupled_mlp")
        ]
        for m in compiled:  # a training-mode and a no-grad graph per variant: 10 graphs of Block.forward
            m(torch.randint(0, 64, (2, 8)))
            with torch.no_grad():
                m(torch.randint(0, 64, (2, 8)))
        assert frames() >= 10 and all(m.is_compiled for m in compiled)
