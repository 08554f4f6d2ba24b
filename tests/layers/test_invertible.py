"""InvertibleQKCoupling: identity at init, float64 reference, exact inverse, log-determinant, bounds, errors."""

import math

import pytest
import torch

from coupled_qk.models.maps.invertible import InvertibleQKCoupling, bounded_scale, default_hidden

SETTINGS = [
    dict(shared_across_heads=True, n_alternations=1),
    dict(shared_across_heads=False, n_alternations=1),
    dict(shared_across_heads=True, n_alternations=3),
    dict(shared_across_heads=False, n_alternations=2, hidden=5, scale_max=0.5),
]


def perturb(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Training-like perturbation: every parameter (the zero-initialised last layers too) moves randomly."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(std * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def qk(shape, dtype=torch.float64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))


def reference(module: InvertibleQKCoupling, q: torch.Tensor, k: torch.Tensor):
    """Float64 recomputation with explicit per-head loops and matrix products (no module methods)."""
    q, k = q.double().clone(), k.double().clone()
    d, c = module.d_head, module.scale_max
    log_det = torch.zeros(q.shape[:-1], dtype=torch.float64)

    def net(n, x, h):
        w1, b1, w2, b2 = (p.double() for p in (n.w_in, n.b_in, n.w_out, n.b_out))
        if n.n_heads is not None:
            w1, b1, w2, b2 = w1[h], b1[h], w2[h], b2[h]
        z = x @ w1.T + b1
        out = (z / (1 + torch.exp(-z))) @ w2.T + b2
        return c * torch.tanh(out[..., :d] / c), out[..., d:]

    for h in range(q.shape[1]):
        qh, kh = q[:, h], k[:, h]
        for n_q, n_k in zip(module.q_nets, module.k_nets):
            s1, t1 = net(n_q, kh, h)
            qh = qh * torch.exp(s1) + t1
            s2, t2 = net(n_k, qh, h)
            kh = kh * torch.exp(s2) + t2
            log_det[:, h] += s1.sum(-1) + s2.sum(-1)
        q[:, h], k[:, h] = qh, kh
    return q, k, log_det


@pytest.mark.parametrize("setting", SETTINGS)
def test_identity_at_initialisation_is_exact(setting):
    torch.manual_seed(0)
    m = InvertibleQKCoupling(8, 3, **setting)
    q, k = qk((2, 3, 5, 8), torch.float32)
    q2, k2 = m(q, k)
    assert torch.equal(q2, q) and torch.equal(k2, k)
    assert torch.equal(m.log_det(q, k), torch.zeros(2, 3, 5))


def test_gradients_reach_the_zero_initialised_layers():
    torch.manual_seed(0)
    m = InvertibleQKCoupling(8, 2)
    q, k = qk((2, 2, 4, 8), torch.float32)
    q.requires_grad_(True)
    q2, k2 = m(q, k)
    (q2 * torch.randn_like(q2)).sum().add((k2 * torch.randn_like(k2)).sum()).backward()
    for net in (m.q_nets[0], m.k_nets[0]):
        assert net.w_out.grad.abs().max() > 0 and net.b_out.grad.abs().max() > 0
        assert torch.equal(net.w_in.grad, torch.zeros_like(net.w_in))  # no signal through a zero last layer yet
    assert q.grad.abs().max() > 0


@pytest.mark.parametrize("setting", SETTINGS)
def test_forward_matches_float64_reference(setting):
    torch.manual_seed(0)
    m = InvertibleQKCoupling(6, 3, **setting).double()
    perturb(m)
    q, k = qk((2, 3, 4, 6))
    q2, k2, ld = m.forward_and_log_det(q, k)
    rq, rk, rld = reference(m, q, k)
    torch.testing.assert_close(q2, rq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k2, rk, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ld, rld, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(q2, q) and not torch.allclose(k2, k)  # the perturbation made it non-trivial
    f_q, f_k = m(q, k)
    assert torch.equal(f_q, q2) and torch.equal(f_k, k2)


@pytest.mark.parametrize("setting", SETTINGS)
def test_inverse_recovers_inputs_to_float64_precision(setting):
    torch.manual_seed(0)
    m = InvertibleQKCoupling(8, 4, **setting).double()
    perturb(m, seed=3, std=0.5)
    q, k = qk((3, 4, 7, 8))
    q2, k2 = m(q, k)
    assert (q2 - q).abs().max() > 0.1  # far from the identity
    q1, k1 = m.inverse(q2, k2)
    torch.testing.assert_close(q1, q, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(k1, k, rtol=1e-11, atol=1e-11)
    q3, k3 = m(*m.inverse(q, k))  # and the other way round
    torch.testing.assert_close(q3, q, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(k3, k, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("setting", SETTINGS)
def test_log_det_matches_slogdet_of_autograd_jacobian_and_tokens_do_not_mix(setting):
    torch.manual_seed(0)
    b, h, t, d = 2, 2, 3, 4
    m = InvertibleQKCoupling(d, h, **setting).double()
    perturb(m, seed=5, std=0.5)
    q, k = qk((b, h, t, d))

    def f(x):
        q2, k2 = m(x[0], x[1])
        return torch.stack([q2, k2])

    jac = torch.autograd.functional.jacobian(f, torch.stack([q, k]))  # (2, b, h, t, d, 2, b, h, t, d)
    jac = jac.permute(1, 2, 3, 0, 4, 6, 7, 8, 5, 9).reshape(b * h * t, 2 * d, b * h * t, 2 * d)
    log_det = m.log_det(q, k).reshape(-1)
    for i in range(b * h * t):
        sign, logabs = torch.linalg.slogdet(jac[i, :, i])
        assert sign.item() == 1.0
        assert math.isclose(logabs.item(), log_det[i].item(), rel_tol=1e-10, abs_tol=1e-10)
        others = torch.cat([jac[i, :, :i], jac[i, :, i + 1 :]], dim=1)
        assert torch.count_nonzero(others) == 0  # each (batch, head, position) is mapped on its own
    assert log_det.abs().max() > 0.1


def test_scale_is_bounded_even_for_huge_weights():
    m = InvertibleQKCoupling(8, 2, n_alternations=2, scale_max=0.7).double()
    perturb(m, seed=1, std=50.0)
    q, k = qk((2, 2, 6, 8))
    q2, k2, ld = m.forward_and_log_det(q, k)
    assert torch.isfinite(q2).all() and torch.isfinite(k2).all()
    assert ld.abs().max() <= 2 * 2 * 8 * 0.7
    raw, _ = m.q_nets[0](k)
    scale = bounded_scale(raw, 0.7)
    assert raw.abs().max() > 10 and 0.69 < scale.abs().max() <= 0.7  # saturates at the bound, never beyond


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("n_alt", [1, 2])
def test_parameter_count(shared, n_alt):
    d, h, hidden = 64, 8, default_hidden(64)
    m = InvertibleQKCoupling(d, h, n_alternations=n_alt, shared_across_heads=shared)
    per_net = d * hidden + hidden + hidden * 2 * d + 2 * d
    assert hidden == 40
    assert sum(p.numel() for p in m.parameters()) == 2 * n_alt * per_net * (1 if shared else h)


def test_bfloat16_under_autocast_and_dtype_mismatch_error():
    m = InvertibleQKCoupling(8, 2)
    perturb(m)
    q, k = qk((1, 2, 3, 8), torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q2, k2 = m(q, k)
    assert q2.shape == q.shape and torch.isfinite(q2.float()).all()
    with pytest.raises(ValueError, match="dtype"):
        m(q, k)


def test_bad_arguments_raise_value_errors_naming_them():
    for kwargs, name in [
        (dict(d_head=0, n_heads=2), "d_head"),
        (dict(d_head=4, n_heads=2.0), "n_heads"),
        (dict(d_head=4, n_heads=2, hidden=0), "hidden"),
        (dict(d_head=4, n_heads=2, n_alternations=0), "n_alternations"),
        (dict(d_head=4, n_heads=2, scale_max=0.0), "scale_max"),
        (dict(d_head=4, n_heads=2, scale_max=float("inf")), "scale_max"),
        (dict(d_head=4, n_heads=2, shared_across_heads="no"), "shared_across_heads"),
    ]:
        with pytest.raises(ValueError, match=name):
            InvertibleQKCoupling(**kwargs)
    m = InvertibleQKCoupling(4, 2)
    with pytest.raises(ValueError, match="shape"):
        m(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="differ"):
        m(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="2 heads"):
        m(torch.zeros(1, 3, 3, 4), torch.zeros(1, 3, 3, 4))


def test_per_head_networks_differ_per_head_and_shared_ones_do_not():
    torch.manual_seed(0)
    q, k = qk((1, 1, 5, 4))
    q, k = q.expand(1, 3, 5, 4).contiguous(), k.expand(1, 3, 5, 4).contiguous()  # same input in every head
    for shared in (True, False):
        m = InvertibleQKCoupling(4, 3, shared_across_heads=shared).double()
        perturb(m)
        q2, _ = m(q, k)
        # shared: equal up to float64 rounding (the BLAS kernel may split heads differently with the thread
        # count); per head: different networks move the same input by clearly different amounts
        gap = (q2[:, 0] - q2[:, 1]).abs().max().item()
        assert (gap < 1e-12) if shared else (gap > 1e-3), (shared, gap)


# --------------------------------------------------------------------------------------------------
# inside the model, through the registry
# --------------------------------------------------------------------------------------------------


def gpt(attention, **kw):
    from coupled_qk import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=61, block_size=24, n_layer=2, d_model=32, n_heads=4, attention=attention, **kw)
    return GPT(cfg).eval()


@pytest.mark.parametrize("base, attention", [("standard", "invertible"), ("differential", "invertible_differential")])
def test_model_at_initialisation_equals_its_base_attention_exactly(base, attention):
    ref, model = gpt(base, n_kv_heads=2), gpt(attention, n_kv_heads=2)
    perturb(ref, seed=2, std=0.05)
    missing, unexpected = model.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and missing and all(".qk_map." in name for name in missing)
    idx = torch.randint(0, 61, (2, 24))
    with torch.no_grad():
        assert torch.equal(model(idx), ref(idx))


@pytest.mark.parametrize("base, attention", [("standard", "invertible"), ("differential", "invertible_differential")])
def test_model_causality_and_kv_cache_parity_with_trained_like_coupling(base, attention):
    model = gpt(attention, n_kv_heads=2, qk_map={"n_alternations": 2})
    perturb(model, seed=4, std=0.1)
    idx = torch.randint(0, 61, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 61, (2, 8))
    with torch.no_grad():
        full, other = model(idx), model(changed)
        cache = model.new_cache()
        parts = [model(idx[:, :9], cache)] + [model(idx[:, t : t + 1], cache) for t in range(9, 20)]
        plain_model = gpt(base, n_kv_heads=2)
        plain_model.load_state_dict(model.state_dict(), strict=False)
        plain = plain_model(idx)
    torch.testing.assert_close(full[:, :12], other[:, :12], rtol=0, atol=1e-6)
    assert (full[:, 12:] - other[:, 12:]).abs().max() > 1e-3
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert (plain - full).abs().max() > 1e-2  # the coupling is far from the identity here


@pytest.mark.parametrize("preset", ["tiny", "60m", "150m", pytest.param("350m", marks=pytest.mark.slow)])
def test_parameter_overhead_per_preset(preset):
    from coupled_qk import GPTConfig, coupling_parameter_overhead

    cfg = GPTConfig.from_preset(preset, attention="invertible")
    d, h = cfg.d_head, default_hidden(cfg.d_head)
    out = coupling_parameter_overhead(cfg)
    assert out["extra"] == cfg.n_layer * 2 * (3 * d * h + h + 2 * d)
    if preset == "60m":  # the paper's "about 0.3%"
        assert 0.29 < out["overhead_percent"] < 0.31
    diff = coupling_parameter_overhead(GPTConfig.from_preset(preset, attention="invertible_differential"))
    assert diff["extra"] - out["extra"] == cfg.n_layer * 6 * d  # the same coupling on top of differential


def test_registry_options_and_errors():
    from coupled_qk import GPTConfig
    from coupled_qk.models.specs import parse_variants, variant_overrides

    assert parse_variants("invertible,invertible-differential") == ["invertible", "invertible_differential"]
    over = variant_overrides('invertible+qk_map={"n_alternations": 2, "scale_max": 0.5}')
    cfg = GPTConfig(**over)
    assert (cfg.qk_map.n_alternations, cfg.qk_map.scale_max) == (2, 0.5)
    assert GPTConfig(attention="invertible", dynamics_hidden=8).qk_map.hidden == 8
    with pytest.raises(ValueError, match="dt_init"):
        GPTConfig(attention="invertible", dt_init=0.3)
    with pytest.raises(ValueError, match="n_alternations"):
        GPTConfig(attention="invertible", qk_map={"n_alternations": 0})
    with pytest.raises(ValueError, match="scale_max"):
        GPTConfig(attention="invertible_differential", qk_map={"scale_max": -1.0})
