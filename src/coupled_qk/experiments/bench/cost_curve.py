"""The cost curve (``coupled-qk bench --sweep``): measured train-step overhead vs the FLOP floor.

:func:`train_step_flops` is the arithmetic: the floating-point operations of one training step (forward and
backward) of a :class:`GPTConfig`, so that ``flops(variant) / flops(standard)`` is the overhead a perfectly
efficient implementation would pay (the *floor*). :func:`run_sweep` measures the train-step ratio of each
variant (:func:`coupled_qk.experiments.bench.train.run_bench`, interleaved, paired ratio with a 95% bootstrap
interval) along three axes of a base config, ``d_model``, sequence length and ``n_steps``, and draws one
panel per axis with the floor next to each measurement.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from coupled_qk.experiments.bench.decode import paired_ratio
from coupled_qk.experiments.bench.machine import machine_line
from coupled_qk.experiments.bench.train import run_bench, variant_configs, with_baseline
from coupled_qk.models.config import GPTConfig


def force_evaluations(integrator: str, n_steps: int) -> int:
    """Force-network evaluations of ``n_steps`` steps: ``n`` (Euler, symplectic Euler) or ``n + 1`` (leapfrog
    shares the closing and opening half-kicks; :mod:`coupled_qk.ops.dynamics`); 0 when ``n_steps == 0``."""
    if n_steps == 0:
        return 0
    return n_steps + 1 if integrator == "leapfrog" else n_steps


def train_step_flops(config: GPTConfig, batch_size: int, seq_len: int) -> dict:
    """FLOPs of one training step (forward + backward) of ``config`` on ``batch_size x seq_len`` tokens.

    Counting rules (per token; a multiply-add is 2 FLOPs; backward = 2 x forward, so a step = 3 x forward):

    - projections: ``2 d_model (H + 2 H_kv) d_head`` (q, k, v) + ``2 H d_head d_model`` (output);
    - attention: causal, so query ``t`` scores ``t`` keys; averaged over the ``T`` positions that is
      ``(T + 1) / 2`` keys: ``2 H d_head (T+1)/2`` for ``q k^T`` and the same for ``A v`` (differential
      attention: ``H/2`` heads, two score maps of ``d_head`` and one ``A v`` of width ``2 d_head`` per map);
    - feed-forward ``4 d_model d_ff``; output head ``2 d_model vocab``; embeddings, norms, softmax and
      activation functions are not counted;
    - query-key map: each force evaluation is two matmuls, ``4 d_head hidden`` per head it acts on (``H``, or
      ``H_kv`` with shared keys), and each ``x + dt y`` update costs ``2 d_head`` per head it writes
      (per step one query update on ``H`` heads, and one key update (leapfrog: two half-kicks) on the force's
      heads; the query MLP: one evaluation and one update on the ``H`` query heads). The group mean and key
      repetition of shared keys are not counted.

    Returns:
        ``{"forward": int, "step": int, "map_forward": int}`` (``map_forward``: the map's share of the forward).
    """
    c, t = config, seq_len
    h, hkv, dh = c.n_heads, c.n_kv_heads, c.d_head
    per_layer = 2 * c.d_model * (h + 2 * hkv) * dh + 2 * h * dh * c.d_model
    keys = (t + 1) / 2
    if c.attention.endswith("differential"):
        per_layer += 2 * 2 * (h // 2) * dh * keys + 2 * 2 * (h // 2) * (2 * dh) * keys
    else:
        per_layer += 2 * 2 * h * dh * keys
    if c.use_mlp:
        per_layer += 4 * c.d_model * c.d_ff
    m = c.qk_map
    map_flops = 0.0
    if m is not None:
        hidden = dh if m.hidden is None else m.hidden
        if hasattr(m, "integrator"):
            heads_f = h if getattr(m, "keys_per_query_head", True) else hkv  # heads the force and k-updates act on
            k_updates = (2 if m.integrator == "leapfrog" else 1) * m.n_steps
            map_flops = force_evaluations(m.integrator, m.n_steps) * 4 * dh * hidden * heads_f
            map_flops += 2 * dh * (m.n_steps * h + k_updates * heads_f)
        else:  # the uncoupled query MLP
            map_flops = 4 * dh * hidden * h + 2 * dh * h
    per_token = c.n_layer * (per_layer + map_flops) + 2 * c.d_model * c.vocab_size
    tokens = batch_size * seq_len
    forward = int(round(tokens * per_token))
    return dict(forward=forward, step=3 * forward, map_forward=int(round(tokens * c.n_layer * map_flops)))


def flop_floor(config: GPTConfig, batch_size: int, seq_len: int) -> float:
    """``train_step_flops(config) / train_step_flops(standard twin)``: the arithmetic overhead ratio."""
    std = config.replace(attention="standard")
    return train_step_flops(config, batch_size, seq_len)["step"] / train_step_flops(std, batch_size, seq_len)["step"]


AXES = ("d_model", "seq_len", "n_steps")


def run_sweep(
    base: GPTConfig,
    variants=None,
    d_models=(64, 128, 256),
    seq_lens=(32, 64, 128),
    n_steps=(1, 2, 4),
    batch_size: int = 8,
    repeats: int = 7,
    warmup: int = 2,
    device="cpu",
    seed: int = 0,
    log=None,
) -> dict:
    """Measured train-step ratio and FLOP floor of each variant along ``d_model``, ``seq_len`` and ``n_steps``.

    Each point is one :func:`run_bench` call (all variants interleaved) on ``base`` with one axis changed
    (``d_model`` keeps ``d_head = d_model / n_heads``; ``seq_len`` <= ``block_size``; ``n_steps`` applies to the
    maps that have it, the others are measured at their fixed cost). Returns ``{"mode": "sweep", "settings",
    "machine", "points": [{"axis", "value", "variants": {name: {"ratio": {median, lo, hi}, "floor"}}}]}``.
    """
    t0 = time.perf_counter()
    names = with_baseline(variants)
    log = log or (lambda *a, **k: None)
    points, machine = [], None
    plan = [("d_model", v) for v in d_models] + [("seq_len", v) for v in seq_lens] + [("n_steps", v) for v in n_steps]
    for axis, value in plan:
        cfg, seq, opts = base, min(base.block_size, max(seq_lens)), {}
        if axis == "d_model":
            cfg = base.replace(d_model=value, d_head=None, d_ff=None)
        elif axis == "seq_len":
            seq = value
        else:
            opts = {"n_steps": value}
        sub = names  # map options apply only to the variants whose map has them
        res = run_bench(
            cfg,
            sub,
            batch_size=batch_size,
            seq_len=seq,
            repeats=repeats,
            warmup=warmup,
            device=device,
            seed=seed,
            map_options=opts,
        )
        machine = res["machine"]
        configs = variant_configs(cfg, sub, opts)
        base_times = res["variants"]["standard"]["times_ms"]
        entry = {
            n: dict(ratio=paired_ratio(v["times_ms"], base_times), floor=flop_floor(configs[n], batch_size, seq))
            for n, v in res["variants"].items()
        }
        points.append(dict(axis=axis, value=value, variants=entry))
        log(
            f"  sweep {axis}={value}: "
            + ", ".join(
                f"{n} {e['ratio']['median']:.3f}x (floor {e['floor']:.3f}x)"
                for n, e in entry.items()
                if n != "standard"
            )
        )
    return dict(
        mode="sweep",
        settings=dict(
            variants=names,
            batch_size=batch_size,
            repeats=repeats,
            warmup=warmup,
            device=str(device),
            seed=seed,
            config=base.to_dict(),
        ),
        machine=machine,
        points=points,
        elapsed_s=time.perf_counter() - t0,
    )


def sweep_markdown(result: dict) -> str:
    """Markdown table of :func:`run_sweep`'s result (measured ratio [95% interval] and FLOP floor)."""
    lines = [
        f"# Cost curve: {result.get('preset', '?')} preset on {result['settings']['device']}",
        "",
        f"- command: `{result.get('command', '')}`",
        machine_line(result["machine"]),
        "- ratio = median over interleaved repeats of train-step time / standard's in the same round "
        "[95% bootstrap interval]; floor = FLOP ratio (`train_step_flops`)",
        "",
        "| axis | value | variant | measured ratio | FLOP floor |",
        "|---|---:|---|---:|---:|",
    ]
    for p in result["points"]:
        for n, e in p["variants"].items():
            if n == "standard":
                continue
            r = e["ratio"]
            lines.append(
                f"| {p['axis']} | {p['value']} | {n} | {r['median']:.3f}x [{r['lo']:.3f}, {r['hi']:.3f}] "
                f"| {e['floor']:.4f}x |"
            )
    return "\n".join(lines) + "\n"


def plot_sweep(result: dict, path: str | Path) -> Path:
    """One panel per axis: measured ratio (points with 95% interval bars) and FLOP floor (dashed) per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(AXES), figsize=(5 * len(AXES), 4), sharey=True)
    for ax, axis in zip(axes, AXES):
        pts = [p for p in result["points"] if p["axis"] == axis]
        names = [n for n in (pts[0]["variants"] if pts else {}) if n != "standard"]
        for i, n in enumerate(names):
            xs = [p["value"] for p in pts if n in p["variants"]]
            es = [p["variants"][n] for p in pts if n in p["variants"]]
            med = np.array([e["ratio"]["median"] for e in es])
            err = np.array(
                [[m - e["ratio"]["lo"] for m, e in zip(med, es)], [e["ratio"]["hi"] - m for m, e in zip(med, es)]]
            )
            line = ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=f"{n} measured")
            ax.plot(xs, [e["floor"] for e in es], "--", color=line[0].get_color(), label=f"{n} FLOP floor")
            for x, e in zip(xs, es):
                ax.annotate(
                    f"{e['floor']:.3f}",
                    (x, e["floor"]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(0, -10 - 8 * (i % 2)),
                    ha="center",
                )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        ax.set_title(f"overhead vs {axis}")
    axes[0].set_ylabel("train-step time / standard")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def mfu_markdown(results: list[dict], peak_tflops: float) -> str:
    """Model FLOPs utilisation of train-mode ``bench`` results: ``tokens/s x step FLOPs per token / peak``.

    Args:
        results: ``run_bench`` result dicts (as written to ``bench-*.json``).
        peak_tflops: the accelerator's peak dense throughput in TFLOP/s for the run's dtype (e.g. 989 for bf16
            on an H100/H200 SXM).

    Returns:
        A markdown table: preset, compile, variant, tokens/s, model TFLOP/s and MFU (FLOPs of
        :func:`train_step_flops`, so the map's arithmetic counts as useful work).
    """
    lines = [
        f"# Model FLOPs utilisation (peak {peak_tflops:g} TFLOP/s)",
        "",
        "| preset | compile | variant | tokens/s | TFLOP/s | MFU |",
        "|---|---|---|---:|---:|---:|",
    ]
    for res in results:
        s = res["settings"]
        base = GPTConfig.from_dict(s["config"])
        configs = variant_configs(base, s["variants"], s.get("map_options") or {})
        for n, v in res["variants"].items():
            flops = train_step_flops(configs[n], s["batch_size"], s["seq_len"])["step"] / s["tokens_per_step"]
            tflops = v["tokens_per_s"] * flops / 1e12
            lines.append(
                f"| {res.get('preset', '?')} | {'on' if s['compile'] else 'off'} | {n} | "
                f"{v['tokens_per_s']:,.0f} | {tflops:.1f} | {100 * tflops / peak_tflops:.1f}% |"
            )
    return "\n".join(lines) + "\n"
