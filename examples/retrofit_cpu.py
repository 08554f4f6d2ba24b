"""Retrofit experiment at CPU scale (issue 11, item 5): a walk-through built on the library.

Takes a ``standard`` model trained by this project (``coupled-qk train ... --set position=learned``),
exports it to a Hugging Face ``GPT2LMHeadModel`` (:func:`coupled_qk.hf.gpt2_export.gpt_to_gpt2`, checked to
give the same logits), then continues training it for the same token batches per seed

  (a) as is, and
  (b) retrofitted with coupled QK dynamics from ``dt = 0`` (:func:`coupled_qk.hf.retrofit`),

and reports validation perplexity per seed and the paired difference (b - a) with a 95% t-interval.

    OMP_NUM_THREADS=1 python examples/retrofit_cpu.py --run runs/base-standard \
        --seeds 0 1 2 --steps 40 --out docs/results/retrofit-cpu

Seeds may run as separate processes (``--seeds 0``, ``--seeds 1`` ... with the same ``--out``); each writes
``rows-seed<S>.json`` and rebuilds ``results.json`` / ``README.md`` from all rows present. Each row records the
settings it ran with (every option below and the retrofit's options as saved in the model's config, e.g.
``freeze_base`` and ``layers``); a process whose settings differ from the rows already in ``--out`` is refused
before training, naming the option (rows of different settings would be averaged together).

What comes from the library (nothing here re-implements it):

- data: the base run's corpus and tokenizer through :class:`coupled_qk.training.tasks.lm.LMTask`; the batches of
  seed ``S`` are the task's own :meth:`~coupled_qk.training.tasks.lm.LMTask.train_batch` with the data seed
  ``data_seed + S`` (a pure function of seed and step, the same batches for both arms);
- the learning-rate schedule: the training loop's :func:`coupled_qk.training.loop.lr_at` (linear warmup, cosine
  decay to a tenth of the peak);
- the loss: :func:`coupled_qk.ops.losses.next_token_loss` (the loop's float32 cross-entropy);
- the evaluation: :func:`coupled_qk.training.perplexity.evaluate_perplexity`;
- the statistics: :func:`coupled_qk.study.stats.paired_difference` (paired t interval);
- the model: :func:`coupled_qk.hf.gpt2_export.gpt_to_gpt2` and :func:`coupled_qk.hf.retrofit`.

The continued training itself is the few lines of :func:`train` rather than :func:`coupled_qk.training.loop.train`:
the loop trains the library's own ``GPT`` from a ``TrainConfig`` with one learning rate for every parameter,
while this experiment trains a ``transformers`` model and gives the new coupling parameters (``dt`` and the
coupling network) their own learning rate (``--coupling-lr``) and no weight decay. Tested by
``tests/examples/test_retrofit_cpu.py``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from coupled_qk.hf import retrofit
from coupled_qk.hf.gpt2_export import gpt_to_gpt2
from coupled_qk.hf.retrofit import coupling_parameters, step_sizes
from coupled_qk.ops.losses import next_token_loss
from coupled_qk.study.stats import paired_difference
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.loop import lr_at
from coupled_qk.training.perplexity import evaluate_perplexity
from coupled_qk.training.run_folder import RunFolder, load_checkpoint_model
from coupled_qk.training.tasks.lm import LMTask


class Logits(torch.nn.Module):
    """``(B, T)`` ids -> ``(B, T, vocab)`` logits of a transformers causal LM (for evaluate_perplexity)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, x):
        return self.hf(x).logits


def schedule_scale(cfg: TrainConfig, step: int, steps: int, warmup: int) -> float:
    """The training loop's learning-rate factor at ``step`` of ``steps``: :func:`coupled_qk.training.loop.lr_at`
    with peak 1, ``warmup`` linear warmup steps and cosine decay to ``0.1`` (each group's ``base_lr`` times it)."""
    return lr_at(step, dataclasses.replace(cfg, lr=1.0, warmup_steps=warmup, min_lr_ratio=0.1), steps)


def param_groups(model, lr, coupling_lr, weight_decay):
    """AdamW groups: matrices with ``weight_decay``, vectors without (as the loop's ``build_optimizer``), and the
    retrofit's coupling parameters (:func:`coupled_qk.hf.retrofit.coupling_parameters`) at ``coupling_lr`` without
    weight decay. Each group keeps its peak learning rate as ``base_lr``."""
    new = {id(p) for p in coupling_parameters(model)}
    groups = {"decay": [], "no_decay": [], "coupling": []}
    for p in model.parameters():
        if id(p) in new:
            groups["coupling"].append(p)
        else:
            groups["decay" if p.dim() >= 2 else "no_decay"].append(p)
    out = [
        {"params": groups["decay"], "weight_decay": weight_decay, "base_lr": lr},
        {"params": groups["no_decay"], "weight_decay": 0.0, "base_lr": lr},
    ]
    if groups["coupling"]:
        out.append({"params": groups["coupling"], "weight_decay": 0.0, "base_lr": coupling_lr})
    return out


def train(model, task, args, seed):
    """Continue training ``model`` (a ``transformers`` causal LM) for ``args.steps`` steps of ``args.batch_size``
    windows of the task's training split; returns ``(model in eval mode, per-step training losses in nats)``.

    The batches are ``task.train_batch`` (the task's data seed must be ``args.data_seed + seed``), the schedule
    :func:`schedule_scale`, the loss :func:`~coupled_qk.ops.losses.next_token_loss`; AdamW ``betas=(0.9, 0.95)``,
    gradient norm clipped at 1.
    """
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model, args.lr, args.coupling_lr, args.weight_decay), betas=(0.9, 0.95))
    model.train()
    losses = []
    for step in range(args.steps):
        scale = schedule_scale(task.cfg, step, args.steps, args.warmup)
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * scale
        x, y = task.train_batch(step, 0, 0, 1, args.batch_size, "cpu")
        loss = next_token_loss(model(x).logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return model.eval(), losses


def evaluate(model, task, args) -> dict:
    """Validation perplexity of ``model`` over the first ``args.eval_windows`` windows (``evaluate_perplexity``)."""
    return evaluate_perplexity(
        Logits(model), task.tokens["valid"], task.block_size, batch_size=args.batch_size, max_windows=args.eval_windows
    )


def paired(a: list[float], b: list[float]) -> dict:
    """``b - a`` per seed with its 95% t interval (:func:`coupled_qk.study.stats.paired_difference`), as
    ``{"n", "mean", "sd", "ci95": [low, high]}`` (``{"n", "mean", "ci95": None}`` for one seed)."""
    d = paired_difference(a, b, conf=0.95)
    if d["n"] < 2:
        return {"n": d["n"], "mean": d["mean"], "ci95": None}
    return {"n": d["n"], "mean": d["mean"], "sd": d["sd"], "ci95": [d["low"], d["high"]]}


def check_resume(out: Path, settings: dict) -> None:
    """``ValueError`` naming the first option whose value in an existing ``rows-seed*.json`` of ``out`` differs
    from ``settings`` (rows written before rows recorded their settings are not checked)."""
    for path in sorted(out.glob("rows-seed*.json")):
        old = json.loads(path.read_text()).get("settings")
        if old is None:
            continue
        for key in sorted(set(old) | set(settings)):
            if old.get(key) != settings.get(key):
                raise ValueError(
                    f"{path} was computed with {key}={old.get(key)!r} but this run has "
                    f"{key}={settings.get(key)!r}; rows of different settings cannot be combined: use "
                    f"another --out or the same settings"
                )


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main` (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run folder of a standard model trained with position=learned")
    p.add_argument("--data-dir", default=None, help="offline data folder (default: the run's / COUPLED_QK_DATA)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--coupling-lr", type=float, default=1e-2, help="learning rate of dt and the coupling network")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--integrator", default="euler")
    p.add_argument("--freeze-base", action="store_true", help="retrofit arm: train only dt and the coupling network")
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=None,
        help="retrofit arm: indices of the layers to retrofit (default: every layer)",
    )
    p.add_argument("--data-seed", type=int, default=1000, help="batch order seed offset (same for both arms)")
    p.add_argument("--eval-windows", type=int, default=400, help="validation windows of block_size tokens")
    p.add_argument("--out", required=True)
    return p


def main(argv=None):
    """Command line: see the module docstring and ``--help``. Writes ``rows-seed<S>.json``, ``results.json`` and
    ``README.md`` into ``--out``.

    Raises:
        RuntimeError: the ``dt = 0`` retrofit changed the exported model's logits.
    """
    p = parser()
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    run = Path(args.run)
    cfg = TrainConfig.from_dict({**(RunFolder(run).read_config() or {}), "resume": True, "out_dir": str(run)})
    if args.data_dir:
        cfg.data_dir = args.data_dir
    task = LMTask(cfg, run_dir=run)  # the start and final evaluations read its valid split
    gpt, state = load_checkpoint_model(run)
    base = gpt_to_gpt2(gpt)
    x = torch.from_numpy(np.asarray(task.tokens["valid"][: 4 * task.block_size], dtype=np.int64)).view(4, -1)
    with torch.no_grad():
        export_diff = float((base(x).logits - gpt(x)).abs().max())
    t0 = time.time()
    options = dict(integrator=args.integrator, dt_init=0.0, freeze_base=args.freeze_base, layers=args.layers)
    try:
        rf0 = retrofit(copy.deepcopy(base), **options)
    except ValueError as exc:
        p.error(str(exc))
    with torch.no_grad():
        if not torch.equal(rf0(x).logits, base(x).logits):
            raise RuntimeError("the dt=0 retrofit changed the model's logits")
    out = Path(args.out)
    settings = {
        **{k: v for k, v in vars(args).items() if k not in ("out", "seeds")},
        "retrofit": dict(rf0.config.coupled_qk_retrofit),
    }
    try:
        check_resume(out, settings)
    except ValueError as exc:
        p.error(str(exc))
    start = evaluate(base, task, args)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        row = {"seed": seed, "start_valid_perplexity": start["perplexity"], "settings": settings}
        seed_task = LMTask(dataclasses.replace(cfg, seed=args.data_seed + seed), run_dir=run)  # its batches
        for arm in ("as_is", "retrofit"):
            model = copy.deepcopy(base)
            if arm == "retrofit":
                torch.manual_seed(seed)  # coupling-network init
                retrofit(model, **options)
            ts = time.time()
            model, losses = train(model, seed_task, args, seed)
            ev = evaluate(model, task, args)
            row[arm] = {
                "valid_perplexity": ev["perplexity"],
                "valid_loss": ev["loss"],
                "final_train_loss": float(np.mean(losses[-10:])),
                "seconds": time.time() - ts,
            }
            if arm == "retrofit":
                dts = torch.cat(step_sizes(model))
                row[arm]["dt_abs_mean"], row[arm]["dt_abs_max"] = float(dts.abs().mean()), float(dts.abs().max())
            print(json.dumps({"seed": seed, "arm": arm, **row[arm]}), flush=True)
        (out / f"rows-seed{seed}.json").write_text(json.dumps(row, indent=2))
    header = {
        "command": "OMP_NUM_THREADS=1 python examples/retrofit_cpu.py " + " ".join(argv or sys.argv[1:]),
        "base_run": str(run), "base_state": state, "base_model": gpt.config.to_dict(),
        "data": task.describe(), "export_max_abs_logit_diff": export_diff,
        "tokens_per_arm": args.steps * args.batch_size * task.block_size,
        "eval_tokens": start["n_tokens"], "start_valid_perplexity": start["perplexity"],
        "settings": {k: v for k, v in settings.items() if k != "run"},
        "machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread per process "
                   f"({os.cpu_count()} CPUs on the machine)",
        "seconds_this_process": time.time() - t0,
    }  # fmt: skip
    summarize(out, header)


def summarize(out: Path, header: dict) -> dict:
    """Combine every ``rows-seed*.json`` in ``out`` (seeds may run as separate processes) into
    ``results.json`` and ``README.md``."""
    rows = sorted((json.loads(p.read_text()) for p in out.glob("rows-seed*.json")), key=lambda r: r["seed"])
    ppl_a = [r["as_is"]["valid_perplexity"] for r in rows]
    ppl_b = [r["retrofit"]["valid_perplexity"] for r in rows]
    result = {
        **header, "rows": rows,
        "ppl_diff_retrofit_minus_as_is": paired(ppl_a, ppl_b),
        "rel_diff_percent": paired([0.0] * len(rows), [100 * (b / a - 1) for a, b in zip(ppl_a, ppl_b)]),
    }  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=2))
    (out / "README.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(r: dict) -> str:
    """The ``README.md`` of a ``results.json`` dict: setup, one row per seed, the paired difference."""
    d, rel = r["ppl_diff_retrofit_minus_as_is"], r["rel_diff_percent"]

    def ci(x):
        return "n/a" if x["ci95"] is None else f"[{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}]"

    m = r["base_model"]
    lines = [
        "# Retrofit experiment (CPU scale)",
        "",
        f"Base: `{r['base_run']}`, a `standard` GPT ({m['n_layer']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, learned positions, vocab {m['vocab_size']}, context {m['block_size']}) trained by "
        f"`coupled-qk train` for {r['base_state'].get('tokens')} tokens on {r['data']['corpus']}, exported to a "
        f"transformers `GPT2LMHeadModel` (max |logit diff| {r['export_max_abs_logit_diff']:.1e}).",
        f"Each arm continues training for {r['tokens_per_arm']:,} tokens (same batches per seed; lr "
        f"{r['settings']['lr']}, coupling lr {r['settings']['coupling_lr']}). Validation perplexity over the first "
        f"{r['eval_tokens']:,} validation tokens (non-overlapping windows); before continued training: "
        f"{r['start_valid_perplexity']:.3f} (identical for the dt=0 retrofit).",
        "",
        "| seed | as is | retrofit (dt=0 start) | difference | mean abs dt |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        a, b = row["as_is"]["valid_perplexity"], row["retrofit"]["valid_perplexity"]
        lines.append(f"| {row['seed']} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {row['retrofit']['dt_abs_mean']:.4f} |")
    lines += [
        "",
        f"Paired difference (retrofit - as is), n = {d['n']}: {d['mean']:+.3f} perplexity, 95% t-interval {ci(d)}; "
        f"relative {rel['mean']:+.2f}% {ci(rel)}.",
        "",
        f"Command: `{r['command']}`  ",
        f"Machine: {r['machine']}; {r['seconds_this_process'] / 60:.1f} minutes for the last process.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
