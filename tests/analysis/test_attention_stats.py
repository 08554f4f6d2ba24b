"""Tests for coupled_qk.analysis.attention_stats against values known by hand or computed independently (numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coupled_qk.analysis.attention_stats import (
    attention_entropy,
    effective_rank,
    effective_rank_from_singular_values,
    normalized_attention_entropy,
    rank_collapse_residual,
    relative_update,
    row_entropy,
    singular_values,
    sink_mass,
    spectral_gap,
    spectral_gap_from_singular_values,
    summarize_attention,
    summarize_differential_attention,
)

F64 = torch.float64


def uniform_causal(T: int, dtype=F64) -> torch.Tensor:
    i = torch.arange(T, dtype=F64)
    A = torch.tril(torch.ones(T, T, dtype=F64)) / (i + 1)[:, None]
    return A.to(dtype)


def first_column(T: int, dtype=F64) -> torch.Tensor:
    A = torch.zeros(T, T, dtype=dtype)
    A[:, 0] = 1
    return A


def random_causal(*lead: int, T: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = scale * torch.randn(*lead, T, T, generator=g, dtype=F64)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, -math.inf).softmax(dim=-1)


def random_orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def np_effective_rank(s: np.ndarray) -> float:
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


# ----------------------------------------------------------------------------------------------------------
# uniform causal attention
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [2, 5, 16])
def test_uniform_causal_entropy(T):
    A = uniform_causal(T)
    H = row_entropy(A)
    assert H.shape == (T,) and H.dtype == F64
    expected = torch.log(torch.arange(1, T + 1, dtype=F64))
    torch.testing.assert_close(H, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(attention_entropy(A), expected.mean(), rtol=0, atol=1e-12)
    assert normalized_attention_entropy(A).item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("T", [1, 4, 33])
def test_uniform_causal_spectrum_matches_numpy(T):
    A = uniform_causal(T)
    a = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    s_np = np.linalg.svd(a, compute_uv=False)
    s = singular_values(A)
    np.testing.assert_allclose(s.numpy(), s_np, rtol=1e-10, atol=1e-12)
    assert torch.all(s[:-1] >= s[1:])
    assert effective_rank(A).item() == pytest.approx(np_effective_rank(s_np), rel=1e-10)
    ratio, rel = spectral_gap(A)
    if T == 1:
        assert ratio.item() == math.inf and rel.item() == 1.0
    else:
        assert ratio.item() == pytest.approx(s_np[0] / s_np[1], rel=1e-10)
        assert rel.item() == pytest.approx((s_np[0] - s_np[1]) / s_np[0], rel=1e-10)


# ----------------------------------------------------------------------------------------------------------
# identity and all-on-first-column maps
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [2, 7])
def test_identity_attention(T):
    A = torch.eye(T)
    assert attention_entropy(A).item() == 0.0
    assert normalized_attention_entropy(A).item() == 0.0
    assert effective_rank(A).item() == pytest.approx(T, abs=1e-12)
    assert sink_mass(A).item() == 0.0
    assert sink_mass(A, include_first_row=True).item() == pytest.approx(1 / T, abs=1e-15)
    ratio, rel = spectral_gap(A)
    assert ratio.item() == pytest.approx(1.0) and rel.item() == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("T", [2, 6, 64])
def test_all_mass_on_first_column(T):
    A = first_column(T)
    assert sink_mass(A).item() == 1.0
    assert sink_mass(A, include_first_row=True).item() == 1.0
    assert attention_entropy(A).item() == 0.0
    s = singular_values(A)
    assert s[0].item() == pytest.approx(math.sqrt(T), rel=1e-12)
    assert effective_rank(A).item() == 1.0
    ratio, rel = spectral_gap(A)
    assert ratio.item() == math.inf
    assert rel.item() == 1.0


def test_spectral_gap_conventions_from_singular_values():
    s = torch.tensor([[3.0, 0.0, 0.0], [2.0, 1.0, 0.5], [0.0, 0.0, 0.0], [2.0, 2.0, 1.0]])
    ratio, rel = spectral_gap_from_singular_values(s)
    assert ratio[0].item() == math.inf and rel[0].item() == 1.0
    assert ratio[1].item() == 2.0 and rel[1].item() == 0.5
    assert math.isnan(ratio[2].item()) and math.isnan(rel[2].item())
    assert ratio[3].item() == 1.0 and rel[3].item() == 0.0
    # a single singular value: sigma2 absent -> treated as 0
    r1, g1 = spectral_gap_from_singular_values(torch.tensor([5.0]))
    assert r1.item() == math.inf and g1.item() == 1.0
    # order does not matter
    r2, g2 = spectral_gap_from_singular_values(torch.tensor([1.0, 0.5, 2.0]))
    assert r2.item() == 2.0 and g2.item() == 0.5
    # sigma2 below the relative threshold counts as zero; with rtol=0 it does not
    tiny = torch.tensor([1.0, 1e-17])
    assert spectral_gap_from_singular_values(tiny)[0].item() == math.inf
    assert spectral_gap_from_singular_values(tiny, rtol=0.0)[0].item() == pytest.approx(1e17)


def test_effective_rank_conventions():
    assert effective_rank_from_singular_values(torch.zeros(4)).item() == 0.0
    assert effective_rank(torch.zeros(3, 3)).item() == 0.0
    assert effective_rank_from_singular_values(torch.tensor([2.0, 2.0, 0.0])).item() == pytest.approx(2.0)


# ----------------------------------------------------------------------------------------------------------
# known spectrum
# ----------------------------------------------------------------------------------------------------------


def test_known_spectrum_reproduced():
    g = torch.Generator().manual_seed(1)
    s_true = torch.tensor([5.0, 3.0, 2.0, 1.0, 0.5, 0.25], dtype=F64)
    n = s_true.numel()
    U, V = random_orthogonal(n, g), random_orthogonal(n, g)
    A = U @ torch.diag(s_true) @ V.T
    torch.testing.assert_close(singular_values(A), s_true, rtol=1e-12, atol=1e-12)
    p = s_true / s_true.sum()
    closed_form = math.exp(-float((p * p.log()).sum()))
    assert effective_rank(A).item() == pytest.approx(closed_form, rel=1e-12)
    ratio, rel = spectral_gap(A)
    assert ratio.item() == pytest.approx(5 / 3, rel=1e-12)
    assert rel.item() == pytest.approx(0.4, rel=1e-12)


def test_known_rank_deficient_spectrum():
    g = torch.Generator().manual_seed(2)
    s_true = torch.tensor([4.0, 4.0, 4.0, 0.0, 0.0], dtype=F64)
    U, V = random_orthogonal(5, g), random_orthogonal(5, g)
    A = U @ torch.diag(s_true) @ V.T
    assert effective_rank(A).item() == pytest.approx(3.0, rel=1e-12)


# ----------------------------------------------------------------------------------------------------------
# rank collapse and relative update
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["fro", "l1inf"])
def test_rank_one_output_has_zero_residual(norm):
    x = torch.tensor([1.5, -2.0, 0.25, 7.0], dtype=F64)
    X = torch.ones(9, 1, dtype=F64) * x
    assert rank_collapse_residual(X, norm=norm).item() == pytest.approx(0.0, abs=1e-15)
    assert rank_collapse_residual(torch.zeros(3, 4), norm=norm).item() == 0.0


def test_rank_collapse_known_values():
    # zero column means: the nearest 1 x^T is 0, so the relative residual is exactly 1
    X = torch.tensor([[1.0, 2.0], [-1.0, -2.0]], dtype=F64)
    assert rank_collapse_residual(X).item() == pytest.approx(1.0)
    # X = [[2, 0], [0, 0]]: column mean (1, 0), residual [[1, 0], [-1, 0]], ||.||_F = sqrt(2), ||X||_F = 2
    X = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=F64)
    assert rank_collapse_residual(X).item() == pytest.approx(math.sqrt(2) / 2)
    # l1inf: median of column 0 is 1 -> residual [[1, 0], [-1, 0]]: ||.||_1 = 2, ||.||_inf = 1 -> sqrt(2);
    # ||X||_1 = 2, ||X||_inf = 2 -> 2
    assert rank_collapse_residual(X, norm="l1inf").item() == pytest.approx(math.sqrt(2) / 2)
    # odd T: median is the middle value; X column (0, 0, 3), median 0 -> residual = X -> ratio 1
    X = torch.tensor([[0.0], [0.0], [3.0]], dtype=F64)
    assert rank_collapse_residual(X, norm="l1inf").item() == pytest.approx(1.0)


def test_rank_collapse_invalid_norm():
    with pytest.raises(ValueError, match="norm"):
        rank_collapse_residual(torch.randn(3, 4), norm="nuc")


def test_relative_update_known_values():
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0]], dtype=F64)  # row norms 5 and 1
    x_new = x + torch.tensor([[0.0, 0.5], [0.0, 2.0]], dtype=F64)  # changes 0.5 and 2
    assert relative_update(x_new, x).item() == pytest.approx((0.1 + 2.0) / 2, rel=1e-9)
    assert relative_update(x, x).item() == 0.0
    z = torch.zeros(2, 3)
    assert relative_update(z, z).item() == 0.0
    assert relative_update(torch.ones(2, 3), z, eps=0.0).item() == math.inf
    out = relative_update(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4))
    assert out.shape == (2, 3) and out.dtype == F64


def test_relative_update_errors():
    with pytest.raises(ValueError, match=r"x_new and x must have the same shape"):
        relative_update(torch.randn(2, 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match=r"x_new must have at least 2 dimensions"):
        relative_update(torch.randn(3), torch.randn(3))
    with pytest.raises(ValueError, match="eps"):
        relative_update(torch.randn(2, 3), torch.randn(2, 3), eps=-1.0)


# ----------------------------------------------------------------------------------------------------------
# batching, dtypes, summaries
# ----------------------------------------------------------------------------------------------------------


def every_metric(A, X, Xn) -> dict:
    """Every diagnostic of attention maps ``A`` and hidden states ``X`` (``Xn``: ``X`` after an update)."""
    return {
        "entropy": attention_entropy(A),
        "normalized_entropy": normalized_attention_entropy(A),
        "effective_rank": effective_rank(A),
        "gap_ratio": spectral_gap(A)[0],
        "gap_relative": spectral_gap(A)[1],
        "sink": sink_mass(A),
        "sink_all": sink_mass(A, include_first_row=True),
        "svals": singular_values(A),
        "res_fro": rank_collapse_residual(X),
        "res_l1inf": rank_collapse_residual(X, norm="l1inf"),
        "update": relative_update(Xn, X),
    }


def test_batched_equals_loop():
    T = 12
    A = random_causal(2, 3, T=T, seed=3)
    X = torch.randn(2, 3, T, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    Xn = X + 0.1 * torch.randn(2, 3, T, 8, generator=torch.Generator().manual_seed(5), dtype=F64)
    batched = every_metric(A, X, Xn)
    for b in range(2):
        for h in range(3):
            a, x, xn = A[b, h], X[b, h], Xn[b, h]
            single = every_metric(a, x, xn)
            for key, val in single.items():
                torch.testing.assert_close(batched[key][b, h], val, rtol=1e-12, atol=1e-12, msg=key)
    for key in ("entropy", "effective_rank", "sink", "res_fro", "update"):
        assert batched[key].shape == (2, 3) and batched[key].dtype == F64
    assert batched["svals"].shape == (2, 3, T)


def test_summarize_matches_individual_functions():
    A = random_causal(4, 2, T=10, seed=6)
    out = summarize_attention(A)
    assert set(out) == {
        "entropy",
        "normalized_entropy",
        "sink_mass",
        "singular_values",
        "effective_rank",
        "spectral_gap_ratio",
        "spectral_gap_relative",
    }
    ratio, rel = spectral_gap(A)
    expected = {
        "entropy": attention_entropy(A),
        "normalized_entropy": normalized_attention_entropy(A),
        "sink_mass": sink_mass(A),
        "singular_values": singular_values(A),
        "effective_rank": effective_rank(A),
        "spectral_gap_ratio": ratio,
        "spectral_gap_relative": rel,
    }
    for key, val in expected.items():
        torch.testing.assert_close(out[key], val, rtol=1e-12, atol=1e-12, msg=key)
        assert out[key].dtype == F64
    out_all = summarize_attention(A, include_first_row=True)
    torch.testing.assert_close(out_all["sink_mass"], sink_mass(A, include_first_row=True))


def test_summarize_uniform_causal():
    T = 8
    out = summarize_attention(uniform_causal(T))
    assert out["normalized_entropy"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["entropy"].item() == pytest.approx(float(np.log(np.arange(1, T + 1)).mean()), abs=1e-12)
    # uniform causal sink mass, excluding row 0: mean_{i=1..T-1} 1/(i+1)
    assert out["sink_mass"].item() == pytest.approx(float(np.mean(1 / np.arange(2, T + 1))), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    A64 = random_causal(2, T=16, seed=7)
    A = A64.to(dtype)
    out = summarize_attention(A)
    for val in out.values():
        assert val.dtype == F64
    # low-precision input is computed exactly on its float64 image
    torch.testing.assert_close(out["effective_rank"], effective_rank(A.to(F64)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out["entropy"], attention_entropy(A64), rtol=0, atol=0.05)
    X = torch.randn(2, 5, 3).to(dtype)
    assert rank_collapse_residual(X).dtype == F64


def test_bidirectional_maps():
    T = 5
    A = torch.full((T, T), 1.0 / T, dtype=F64)
    assert normalized_attention_entropy(A, causal=False).item() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="causal"):
        normalized_attention_entropy(A)
    with pytest.raises(ValueError, match="causal"):
        summarize_attention(A)
    out = summarize_attention(A, causal=False)
    assert out["normalized_entropy"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["effective_rank"].item() == 1.0


def test_differential_attention_summary():
    A1 = random_causal(2, 3, T=9, seed=8)
    A2 = random_causal(2, 3, T=9, seed=9, scale=0.5)
    lam = 0.8
    out = summarize_differential_attention(A1, A2, lam)
    s1 = summarize_attention(A1)
    s2 = summarize_attention(A2)
    for key in s1:
        torch.testing.assert_close(out[f"a1/{key}"], s1[key])
        torch.testing.assert_close(out[f"a2/{key}"], s2[key])
    signed = A1 - lam * A2
    s_np = np.linalg.svd(signed.numpy(), compute_uv=False)
    np.testing.assert_allclose(out["signed/singular_values"].numpy(), s_np, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out["signed/effective_rank"], effective_rank(signed))
    torch.testing.assert_close(out["signed/spectral_gap_ratio"], spectral_gap(signed)[0])
    signed_keys = {k for k in out if k.startswith("signed/")}
    assert signed_keys == {
        "signed/singular_values",
        "signed/effective_rank",
        "signed/spectral_gap_ratio",
        "signed/spectral_gap_relative",
    }
    # per-(batch, head) lambda broadcasts over the leading dims
    lam_t = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    out_t = summarize_differential_attention(A1, A2, lam_t)
    torch.testing.assert_close(
        out_t["signed/effective_rank"][1, 2], effective_rank(A1[1, 2] - 0.6 * A2[1, 2]), rtol=1e-6, atol=1e-6
    )
    # A1 == A2 and lambda = 1: the signed map is zero -> effective rank 0, gap nan
    z = summarize_differential_attention(A1, A1, 1.0)
    assert torch.all(z["signed/effective_rank"] == 0)
    assert torch.all(torch.isnan(z["signed/spectral_gap_ratio"]))


def test_differential_attention_errors():
    A = random_causal(2, T=4)
    with pytest.raises(ValueError, match="A1 and A2 must have the same shape"):
        summarize_differential_attention(A, A[..., :3, :3], 0.5)
    with pytest.raises(ValueError, match="lam"):
        summarize_differential_attention(A, A, torch.ones(3))
    with pytest.raises(ValueError, match="lam"):
        summarize_differential_attention(A, A, float("nan"))
    with pytest.raises(TypeError, match="lam"):
        summarize_differential_attention(A, A, "0.5")
    with pytest.raises(ValueError, match="A2"):
        summarize_differential_attention(A, 2 * A, 0.5)


# ----------------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        row_entropy,
        attention_entropy,
        normalized_attention_entropy,
        singular_values,
        effective_rank,
        spectral_gap,
        sink_mass,
        summarize_attention,
    ],
)
def test_map_shape_validation(fn):
    with pytest.raises(ValueError, match=r"A must have at least 2 dimensions.*\(5,\)"):
        fn(torch.ones(5))
    with pytest.raises(ValueError, match=r"A must be square.*\(2, 3, 4\)"):
        fn(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="finite"):
        fn(torch.full((3, 3), float("nan")))
    with pytest.raises(TypeError, match="A must be a torch.Tensor"):
        fn(np.eye(3))


def test_row_sum_validation():
    A = uniform_causal(4)
    bad = A.clone()
    bad[2, 0] += 0.1
    for fn in (row_entropy, attention_entropy, normalized_attention_entropy, summarize_attention):
        with pytest.raises(ValueError, match=r"every row of A must sum to 1.*0\.1.*\(4, 4\)"):
            fn(bad)
    neg = torch.tensor([[1.0, 0.0], [1.5, -0.5]])
    with pytest.raises(ValueError, match="non-negative"):
        row_entropy(neg)
    # within a user tolerance it passes; metrics without a row-sum requirement never check
    row_entropy(bad, atol=0.2)
    effective_rank(bad)
    sink_mass(bad)
    # a float32 softmax passes the default tolerance
    row_entropy(random_causal(3, T=64, seed=10).float())


def test_small_T_validation():
    one = torch.ones(2, 1, 1)
    with pytest.raises(ValueError, match="T >= 2"):
        normalized_attention_entropy(one)
    with pytest.raises(ValueError, match="T >= 2"):
        sink_mass(one)
    with pytest.raises(ValueError, match="T >= 2"):
        summarize_attention(one)
    assert torch.all(sink_mass(one, include_first_row=True) == 1.0)
    assert torch.all(attention_entropy(one) == 0.0)
    assert torch.all(effective_rank(one) == 1.0)


def test_output_validation_for_X():
    with pytest.raises(ValueError, match=r"X must have at least 2 dimensions.*\(4,\)"):
        rank_collapse_residual(torch.ones(4))
    with pytest.raises(ValueError, match=r"X must have non-empty"):
        rank_collapse_residual(torch.ones(3, 0))
    with pytest.raises(ValueError, match=r"s must be non-negative"):
        effective_rank_from_singular_values(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="rtol"):
        effective_rank(torch.eye(3), rtol=-1.0)


def test_inputs_are_detached():
    A = random_causal(T=6).requires_grad_(True)
    out = summarize_attention(A)
    assert all(not v.requires_grad for v in out.values())


# ----------------------------------------------------------------------------------------------------------
# the reference points written next to the numbers (analyze reported "effective rank 55.1" alone)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [2, 7, 128])
def test_reference_scales_are_the_values_of_the_extreme_maps(T):
    """The references of reference_scale are what the diagnostics give for uniform causal attention (entropy, sink
    mass, normalised entropy 1), for the identity map (effective rank T: its maximum) and for all mass on key 0
    (sink mass 1, normalised entropy 0)."""
    from coupled_qk.analysis.conventions import reference_scale

    uniform = summarize_attention(uniform_causal(T).unsqueeze(0))
    assert reference_scale("entropy", T) == f"uniform: {uniform['entropy'].item():.3f} nats"
    assert reference_scale("sink_mass", T) == f"uniform: {uniform['sink_mass'].item():.3f}, 1 = all on key 0"
    assert uniform["normalized_entropy"].item() == pytest.approx(1.0)
    assert reference_scale("normalized_entropy", T) == "1 = uniform, 0 = one key"
    identity = summarize_attention(torch.eye(T, dtype=F64).unsqueeze(0))
    assert identity["effective_rank"].item() == pytest.approx(T)
    assert reference_scale("effective_rank", T) == reference_scale("signed/effective_rank", T) == f"max {T} = window"
    first = summarize_attention(first_column(T).unsqueeze(0))
    assert first["sink_mass"].item() == 1.0 and first["normalized_entropy"].item() == pytest.approx(0.0)
    assert reference_scale("dt", T) is None
    with pytest.raises(ValueError, match="seq_len=1"):
        reference_scale("entropy", 1)
