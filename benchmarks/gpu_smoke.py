#!/usr/bin/env python3
"""One prepared, budgeted smoke run of coupled-qk on one GPU (issue 28), runnable unchanged from a checkout.

    PYTHONPATH=src python3 benchmarks/gpu_smoke.py --budget-s 480 --out DIR [--data DATA]
    PYTHONPATH=src python3 benchmarks/gpu_smoke.py --device cpu --quick --out DIR          # the CI stand-in
    python3 benchmarks/gpu_smoke.py --make-data BUNDLE [--data-src ../shared/data]         # the data bundle

Needs only torch, numpy, safetensors and tokenizers (``tqdm`` is replaced by a stub when missing); nothing is
installed, downloaded or compiled ahead. Each stage runs in its own Python process with its own time limit
(the stage's limit, cut to what is left of ``--budget-s``): a stage that fails, crashes the CUDA context or
runs out of time is recorded and the next stage starts. Stages that cannot run (no CUDA, no data, no budget
left) are reported as skipped with the reason. After every stage ``DIR/results.json`` and ``DIR/results.md``
are rewritten (``DIR/stages/<stage>.json`` and ``.log`` hold each stage's full record and output), so a run
killed from outside still leaves its finished stages behind. The exit status is 1 when a stage failed or
timed out, else 0.

Stages (``--stages`` selects; default all, in this order):

- ``env``: torch, CUDA, cuDNN, GPU, bf16 support, the SDPA backends enabled and available, TF32, packages,
  the data files found.
- ``parity``: every named variant, fp32 on the device against a float64 CPU reference (loss and gradients;
  TF32 off) and bf16 autocast on the device against the same reference (a looser tolerance).
- ``sdpa``: which SDPA kernel each variant's train step and decode step actually call (profiler op names);
  on CUDA every variant must reach a fast kernel (flash or cuDNN), not the math or the efficient fallback.
- ``decode``: cached decoding equals the full forward for every variant, and (CUDA) greedy decoding on the
  device gives the same tokens as on the CPU.
- ``sync``: (CUDA) ``torch.cuda.set_sync_debug_mode("warn")`` over one training step (forward, backward,
  gradient clipping, fused AdamW) and one cached decoding step: host synchronisations are counted and listed.
- ``train``: the real training loop on the data (WikiText-style corpus ``wiki-vital`` with the GPT-2
  tokenizer): a run of N steps, and the same run stopped at N/2, checkpointed and resumed to N (the losses of
  both must agree), the final WikiText-2 valid/test evaluation, and greedy generation from the saved run.
- ``bench``: bf16 train-step time of every paper variant against ``standard`` (interleaved, medians), tokens/s,
  ratios and MFU against the H200's dense bf16 peak, at the 60m and 350m presets; and standard at 60m with the
  vocabulary padded to a multiple of 64 against unpadded.
- ``memory``: peak train-step memory (bf16 autocast) and KV-cache bytes at 60m and 350m.
- ``compile``: ``torch.compile`` against eager for standard and coupled at 60m: compile time, interleaved step
  times, the loss of both, and Dynamo's graph, graph-break and recompile counts.
- ``hf``: ``transformers``' ``generate`` with a static cache, which compiles the decoding step on a GPU by
  default: one graph without breaks, the dynamic cache's tokens, first (compiling) and second call times
  (skipped without ``transformers``).

``--quick`` shrinks every stage (tiny shapes, few steps, the paper-scale presets replaced by ``tiny``) and
on a CPU compiles with Dynamo's ``eager`` backend (tracing only: no C++ toolchain needed); it is what CI
runs (``tests/test_gpu_smoke.py``), so the script cannot rot.

Data (``--data``): a folder in the layout of the project's shared data folder, either that folder itself or
the few-MB bundle that ``--make-data`` writes (``wiki-vital/train.txt``: the first ``--train-mb`` MB of the
training text, cut at an article boundary; ``wikitext-2/valid.txt`` and ``test.txt``;
``tokenizer/gpt2/vocab.json`` and ``merges.txt``; ``MANIFEST.json`` with sizes and SHA-256). Default:
``$COUPLED_QK_DATA``, else ``../shared/data`` next to the checkout, else ``benchmarks/smoke-data``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
import types
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H200_BF16_DENSE_TFLOPS = 989.0
"""Peak dense bf16 tensor-core throughput of an H100/H200 SXM (NVIDIA datasheet: 1,979 TFLOP/s with 2:4
sparsity, half of it dense); the MFU denominator."""

PAPER_VARIANTS = ("coupled", "coupled_leapfrog", "uncoupled_mlp", "differential", "coupled_differential")
DATA_FILES = (
    "wiki-vital/train.txt",
    "wikitext-2/valid.txt",
    "wikitext-2/test.txt",
    "tokenizer/gpt2/vocab.json",
    "tokenizer/gpt2/merges.txt",
)
FAST_KERNELS = ("flash", "cudnn")


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage: its function, time limits (seconds; full run and ``--quick``), the least time worth starting
    it with, and whether it needs CUDA or the data."""

    name: str
    limit_s: float
    quick_limit_s: float
    min_s: float = 10.0
    needs_cuda: bool = False
    needs_data: bool = False


STAGES = (
    Stage("env", 30, 30),
    Stage("parity", 45, 40),
    Stage("sdpa", 25, 30),
    Stage("decode", 30, 40),
    Stage("sync", 25, 20, needs_cuda=True),
    Stage("train", 100, 90, min_s=30, needs_data=True),
    Stage("bench", 110, 40, min_s=30),
    Stage("memory", 40, 30),
    Stage("compile", 150, 60, min_s=30),
    Stage("hf", 90, 40, min_s=20),
)
SELFTEST = (Stage("_fail", 30, 30), Stage("_sleep", 15, 15, min_s=1))  # the runner's own tests (never by default)


# --------------------------------------------------------------------------------------------- the runner


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def resolve_data(arg: str | None) -> tuple[Path | None, str]:
    """The data folder (``--data``, ``$COUPLED_QK_DATA``, ``../shared/data``, ``benchmarks/smoke-data``) and how
    it was found; ``(None, reason)`` when no candidate holds every file of :data:`DATA_FILES`."""
    if arg:
        candidates = [("--data", Path(arg))]
    else:
        candidates = (
            [("$COUPLED_QK_DATA", Path(os.environ["COUPLED_QK_DATA"]))]
            if os.environ.get("COUPLED_QK_DATA", "").strip()
            else []
        )
        candidates += [
            ("../shared/data", REPO.parent / "shared" / "data"),
            ("benchmarks/smoke-data", REPO / "benchmarks" / "smoke-data"),
        ]
    tried = []
    for how, path in candidates:
        missing = [f for f in DATA_FILES if not (path / f).is_file()]
        if not missing:
            return path.resolve(), how
        tried.append(f"{path} ({how}; missing {', '.join(missing)})")
    return None, "no data folder: " + "; ".join(tried)


def run_all(args) -> int:
    """The parent: run each selected stage in a child process within the budget; write the results."""
    out = Path(args.out)
    (out / "stages").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    data, data_how = resolve_data(args.data)
    names = [s for s in args.stages.split(",") if s] if args.stages else [s.name for s in STAGES]
    known = {s.name: s for s in STAGES + SELFTEST}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--stages: unknown stage(s) {unknown}; expected some of {[s.name for s in STAGES]}")
    summary = dict(
        started=_now(),
        device=device,
        quick=args.quick,
        budget_s=args.budget_s,
        data=str(data) if data else None,
        data_found_by=data_how,
        command=" ".join(sys.argv),
        stages=[],
    )
    print(f"gpu_smoke: device {device}, budget {args.budget_s:.0f} s, data {data or data_how}", flush=True)
    for name in names:
        st = known[name]
        left = args.budget_s - (time.monotonic() - t0)
        rec = dict(name=name, status="skipped", reason=None, seconds=0.0, limit_s=None)
        if st.needs_cuda and device != "cuda":
            rec["reason"] = "no CUDA"
        elif st.needs_data and data is None:
            rec["reason"] = data_how + " (pass --data; --make-data builds a bundle)"
        elif left < st.min_s:
            rec["reason"] = (
                f"budget: {left:.0f} s left of --budget-s {args.budget_s:.0f}, the stage needs {st.min_s:.0f}"
            )
        else:
            limit = min(st.quick_limit_s if args.quick else st.limit_s, left)
            rec.update(_run_child(args, name, device, data, limit, out))
        summary["stages"].append(rec)
        summary["elapsed_s"] = round(time.monotonic() - t0, 1)
        print(
            f"gpu_smoke: {name}: {rec['status']}"
            + (f" ({rec['reason']})" if rec["reason"] else "")
            + f" in {rec['seconds']:.1f} s",
            flush=True,
        )
        _write_json(out / "results.json", summary)
        (out / "results.md").write_text(results_markdown(summary))
    summary["finished"] = _now()
    _write_json(out / "results.json", summary)
    (out / "results.md").write_text(results_markdown(summary))
    if not args.keep_work:
        shutil.rmtree(out / "work", ignore_errors=True)
    bad = [s["name"] for s in summary["stages"] if s["status"] in ("failed", "timeout")]
    print(
        f"gpu_smoke: done in {summary['elapsed_s']:.0f} s; results in {out / 'results.md'}"
        + (f"; failed or timed out: {', '.join(bad)}" if bad else ""),
        flush=True,
    )
    return 1 if bad else 0


def _run_child(args, name: str, device: str, data: Path | None, limit: float, out: Path) -> dict:
    """Run stage ``name`` in a child process with a hard time limit; its record (or what it saved before it
    was stopped) comes back through ``stages/<name>.json``."""
    path, log = out / "stages" / f"{name}.json", out / "stages" / f"{name}.log"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--device", device, "--out", str(out)]
    if args.quick:
        cmd.append("--quick")
    if data is not None:
        cmd += ["--data", str(data)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.monotonic()
    status, reason = None, None
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True
        )
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            status, reason, rc = "timeout", f"stopped after its limit of {limit:.0f} s", None
    seconds = round(time.monotonic() - start, 1)
    rec = json.loads(path.read_text()) if path.is_file() else {}
    if status is None:
        status = rec.get("status") or "failed"
        if rc != 0 and status == "ok":
            status = "failed"
        if not rec:
            reason = f"the stage process exited with status {rc} and wrote no record (see stages/{name}.log)"
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            rec = dict(error="\n".join(tail))
        else:
            reason = rec.get("reason")
    return dict(
        status=status,
        reason=reason,
        seconds=seconds,
        limit_s=round(limit, 1),
        result=rec.get("result"),
        error=rec.get("error"),
        checks=rec.get("checks"),
        md=rec.get("md"),
    )


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def results_markdown(summary: dict) -> str:
    """The run as markdown: one table row per stage, then each stage's own lines and failed checks."""
    lines = [
        "# GPU smoke run",
        "",
        f"- started {summary['started']}; device {summary['device']}; quick {summary['quick']}; budget "
        f"{summary['budget_s']:.0f} s; elapsed {summary.get('elapsed_s', 0):.0f} s",
        f"- data: {summary['data'] or summary['data_found_by']}",
        f"- command: `{summary['command']}`",
        "",
        "| stage | status | seconds | limit s | note |",
        "|---|---|---:|---:|---|",
    ]
    for s in summary["stages"]:
        failed = [k for k, v in (s.get("checks") or {}).items() if not v]
        note = s.get("reason") or (f"failed checks: {', '.join(failed)}" if failed else "")
        if not note and s.get("error"):
            note = s["error"].strip().splitlines()[-1][:200]
        lines.append(
            f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s.get('limit_s') or ''} | "
            f"{note.replace('|', '/')} |"
        )
    for s in summary["stages"]:
        if s.get("md") or s.get("error"):
            lines += ["", f"## {s['name']} ({s['status']})", ""]
            lines += s.get("md") or []
            if s.get("error"):
                lines += ["", "```", s["error"].strip()[-3000:], "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- the stage process


class Ctx:
    """What a stage gets: the device, quick mode, the data folder, a work folder, and ``save()`` to keep
    partial results (they survive a timeout)."""

    def __init__(self, name: str, device: str, quick: bool, data: Path | None, out: Path):
        import torch

        self.name, self.quick, self.data, self.out = name, quick, data, out
        self.device = torch.device(device)
        if quick and self.device.type == "cpu":
            torch.set_num_threads(1)  # tiny shapes: no gain from threads, and no spin-waiting on a busy machine
        self.work = out / "work" / name
        self.work.mkdir(parents=True, exist_ok=True)
        self.result: dict = {}
        self.checks: dict[str, bool] = {}
        self.md: list[str] = []
        self.record = dict(status="running", result=self.result, checks=self.checks, md=self.md)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        return bool(ok)

    def save(self) -> None:
        _write_json(self.out / "stages" / f"{self.name}.json", self.record)

    def log(self, *a) -> None:
        print(*a, flush=True)


def run_stage(name: str, device: str, quick: bool, data: str | None, out: str) -> int:
    """The child: run one stage, write its record (status ``ok`` unless it raised or a check failed)."""
    _stub_tqdm_if_missing()
    out_p = Path(out)
    ctx = Ctx(name, device, quick, Path(data) if data else None, out_p)
    ctx.save()
    try:
        reason = globals()[f"stage_{name.lstrip('_')}"](ctx)
        failed = [k for k, v in ctx.checks.items() if not v]
        ctx.record.update(status="failed" if failed else "ok", reason=reason)
    except Exception:  # noqa: BLE001 - recorded; the parent goes on with the next stage
        ctx.record.update(status="failed", error=traceback.format_exc())
    ctx.save()
    return 0 if ctx.record["status"] == "ok" else 1


def _stub_tqdm_if_missing() -> None:
    """``coupled_qk.progress`` imports ``tqdm``; a bare torch environment may lack it. The stages show no bars,
    so a stand-in with the used interface is enough (the ``env`` stage reports it)."""
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:

        class _Bar:
            def __init__(self, *a, total=None, initial=0, **k):
                self.total, self.n = total, initial

            def update(self, n=1):
                self.n += n

            def set_postfix(self, *a, **k):
                pass

            def set_description(self, *a, **k):
                pass

            def close(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

            @staticmethod
            def write(s, *a, **k):
                print(s)

        mod, auto = types.ModuleType("tqdm"), types.ModuleType("tqdm.auto")
        mod.tqdm = auto.tqdm = _Bar
        mod.auto, mod.__stub__ = auto, True
        sys.modules["tqdm"], sys.modules["tqdm.auto"] = mod, auto


def _tiny_config(**kw):
    from coupled_qk import GPTConfig

    base = dict(vocab_size=512, block_size=64, n_layer=2, d_model=64, n_heads=4, n_kv_heads=2)
    return GPTConfig(**{**base, **kw})


def _variant_config(base, name: str):
    from coupled_qk.models.specs import variant_overrides

    return base.replace(**variant_overrides(name))


def _sharp_model(base, name: str):
    """An eval-mode ``GPT`` of variant ``name`` (seed 0) with its matrices scaled by 5: well separated logits, so
    that greedy decoding on two devices or two cache kinds is unlikely to meet a tie."""
    import torch

    from coupled_qk import GPT

    torch.manual_seed(0)
    model = GPT(_variant_config(base, name)).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("weight") and p.dim() == 2:
                p.mul_(5.0)
    return model


QUICK_VARIANTS = ("standard", "coupled", "coupled_differential", "invertible_differential")
"""``--quick``: one variant per kind of map and scoring rule (the full run takes every named variant)."""


def _variants(ctx) -> list[str]:
    """Every named variant (:func:`coupled_qk.models.registry.variant_names`), or :data:`QUICK_VARIANTS`."""
    from coupled_qk.models.registry import variant_names

    return list(QUICK_VARIANTS) if ctx.quick else variant_names()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------ stages


def stage_env(ctx: Ctx):
    import numpy
    import torch

    r = ctx.result
    r.update(
        python=sys.version.split()[0],
        platform=platform.platform(),
        torch=torch.__version__,
        numpy=numpy.__version__,
        cuda_build=torch.version.cuda,
        cpu_threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
    )
    for mod in ("safetensors", "tokenizers", "tqdm", "transformers"):
        try:
            m = __import__(mod)
            r[mod] = "stub (not installed)" if getattr(m, "__stub__", False) else getattr(m, "__version__", "?")
        except ImportError:
            r[mod] = None
    with contextlib.suppress(Exception):
        r["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    r["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(i)
        r.update(
            gpu=p.name,
            gpu_count=torch.cuda.device_count(),
            capability=f"{p.major}.{p.minor}",
            gpu_memory_gib=round(p.total_memory / 2**30, 1),
            sm_count=p.multi_processor_count,
            bf16=torch.cuda.is_bf16_supported(),
            cudnn=torch.backends.cudnn.version(),
        )
        sdpa = {}
        for backend in ("flash", "mem_efficient", "math", "cudnn"):
            fn = getattr(torch.backends.cuda, f"{backend}_sdp_enabled", None)
            sdpa[f"{backend}_enabled"] = fn() if fn else None
        for what, fn_name in (
            ("flash_available", "is_flash_attention_available"),
            ("cudnn_available", "is_cudnn_attention_available"),
        ):
            fn = getattr(torch.backends.cuda, fn_name, None)
            sdpa[what] = fn() if fn else None
        r["sdpa"] = sdpa
        from coupled_qk.training.distributed import pick_device

        pick_device("cuda")  # the library's choice: TF32 for fp32 matmuls
        r["tf32_matmul_after_pick_device"] = torch.backends.cuda.matmul.allow_tf32
        ctx.check("tf32_enabled_by_pick_device", torch.backends.cuda.matmul.allow_tf32)
        with contextlib.suppress(Exception):
            r["nvidia_smi"] = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=15,
            ).stdout.strip()
    if ctx.device.type == "cuda":
        ctx.check("cuda_available", torch.cuda.is_available())
    if ctx.data is not None:
        r["data_files"] = {f: (ctx.data / f).stat().st_size for f in DATA_FILES if (ctx.data / f).is_file()}
    ctx.md += [
        f"- torch {r['torch']} (CUDA build {r['cuda_build']}), Python {r['python']}, numpy {r['numpy']}, "
        f"safetensors {r['safetensors']}, tokenizers {r['tokenizers']}, tqdm {r['tqdm']}",
        f"- GPU: {r.get('gpu', 'none')} x{r.get('gpu_count', 0)}, capability {r.get('capability')}, "
        f"{r.get('gpu_memory_gib')} GiB, bf16 {r.get('bf16')}, cuDNN {r.get('cudnn')}",
        f"- SDPA: {r.get('sdpa')}",
        f"- commit {r.get('git_commit')}",
    ]


def _loss_and_grads(model, idx, targets, autocast_dtype=None):
    import torch

    model.zero_grad(set_to_none=True)
    dev = next(model.parameters()).device
    ctx = torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx:
        loss = model.loss(idx, targets)
    loss.backward()
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach().to("cpu", torch.float64)), grads


def _grad_errors(grads: dict, ref: dict) -> tuple[float, float, str]:
    """``(||g - g_ref|| / ||g_ref|| over all parameters, the worst single parameter's error, its name)``; a
    parameter without a gradient counts as an error of 1."""
    num = den = 0.0
    worst, worst_name = 0.0, ""
    for n, r in ref.items():
        g = grads.get(n)
        diff = float((g - r).norm()) if g is not None else float(r.norm())
        num, den = num + diff**2, den + float(r.norm()) ** 2
        e = diff / max(float(r.norm()), 1e-30)
        if e > worst:
            worst, worst_name = e, n
    return (num / max(den, 1e-300)) ** 0.5, worst, worst_name


def stage_parity(ctx: Ctx):
    import torch

    from coupled_qk import GPT
    from coupled_qk.training.distributed import enable_tf32

    enable_tf32(ctx.device, False)  # strict fp32 here; the library turns TF32 on for CUDA runs
    base = _tiny_config(block_size=32 if ctx.quick else 64)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, base.vocab_size, (2, base.block_size), generator=gen)
    targets = torch.randint(0, base.vocab_size, (2, base.block_size), generator=gen)
    bf16_ok = ctx.device.type == "cpu" or torch.cuda.is_bf16_supported()
    ctx.md += [
        f"Loss and gradients against a float64 CPU reference, model {base.n_layer} x {base.d_model} "
        f"(heads {base.n_heads}/{base.n_kv_heads}), batch 2 x {base.block_size}. Gradient error: "
        "||g - g_ref|| / ||g_ref|| over all parameters (worst single parameter in brackets).",
        "",
        "| variant | fp32 loss rel. err | fp32 grad err | bf16 loss rel. err | bf16 grad err |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in _variants(ctx):
        cfg = _variant_config(base, name)
        torch.manual_seed(0)
        ref_model = GPT(cfg).double()
        with torch.no_grad():  # non-trivial dynamics and differential parameters
            for n, p in ref_model.named_parameters():
                if n.endswith(".dt") or "lambda_" in n:
                    p.add_(0.1 * torch.randn_like(p))
        ref_loss, ref_grads = _loss_and_grads(ref_model, idx, targets)
        model = copy.deepcopy(ref_model).float().to(ctx.device)
        x, y = idx.to(ctx.device), targets.to(ctx.device)
        loss32, g32 = _loss_and_grads(model, x, y)
        e32, w32, wn32 = _grad_errors(g32, ref_grads)
        row = dict(
            ref_loss=ref_loss,
            fp32_loss_rel=abs(loss32 - ref_loss) / abs(ref_loss),
            fp32_grad=e32,
            fp32_grad_worst=w32,
            fp32_grad_worst_param=wn32,
        )
        ctx.check(f"{name}: fp32 loss", row["fp32_loss_rel"] < 1e-5)
        ctx.check(f"{name}: fp32 grads", e32 < 1e-4 and w32 < 1e-3)
        if bf16_ok:
            loss16, g16 = _loss_and_grads(model, x, y, torch.bfloat16)
            e16, w16, wn16 = _grad_errors(g16, ref_grads)
            row.update(
                bf16_loss_rel=abs(loss16 - ref_loss) / abs(ref_loss),
                bf16_grad=e16,
                bf16_grad_worst=w16,
                bf16_grad_worst_param=wn16,
            )
            ctx.check(f"{name}: bf16 loss", row["bf16_loss_rel"] < 2e-2)
            ctx.check(f"{name}: bf16 grads", e16 < 0.1)
        ctx.result[name] = row
        ctx.md.append(
            f"| {name} | {row['fp32_loss_rel']:.1e} | {e32:.1e} [{w32:.1e}] | "
            f"{row.get('bf16_loss_rel', float('nan')):.1e} | {row.get('bf16_grad', float('nan')):.1e} "
            f"[{row.get('bf16_grad_worst', float('nan')):.1e}] |"
        )
        ctx.save()


def _sdpa_kernels(fn) -> list[str]:
    """Names of the SDPA implementations that ``fn()`` dispatched to (from the profiler's aten op names)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    found = set()
    for e in prof.events():
        n = e.name
        if "_scaled_dot_product" not in n and "flash_attention" not in n and "efficient_attention" not in n:
            continue
        if "backward" in n:
            continue
        if "flash_attention_for_cpu" in n:
            found.add("cpu_flash")
        elif "flash" in n:
            found.add("flash")
        elif "cudnn" in n:
            found.add("cudnn")
        elif "efficient" in n:
            found.add("efficient")
        elif "math" in n:
            found.add("math")
    return sorted(found)


def stage_sdpa(ctx: Ctx):
    import torch

    from coupled_qk import GPT, GPTConfig

    if ctx.quick or not ctx.cuda:
        base = _tiny_config(block_size=32)
        batch = 2
    else:  # the 60m shapes (head width 64, context 512) with two blocks
        base = GPTConfig.from_preset("60m", n_layer=2)
        batch = 4
    dtype = torch.bfloat16 if ctx.cuda else None
    ctx.md += [
        f"Kernels behind `F.scaled_dot_product_attention` ({'bf16 autocast' if dtype else 'fp32'}, "
        f"model {base.n_layer} x {base.d_model}, head width {base.d_head}, batch {batch} x "
        f"{base.block_size}); decode = one cached step after a prefill.",
        "",
        "| variant | train step | decode step |",
        "|---|---|---|",
    ]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, base.vocab_size, (batch, base.block_size + 1), generator=gen).to(ctx.device)
    for name in _variants(ctx):
        torch.manual_seed(0)
        model = GPT(_variant_config(base, name)).to(ctx.device).train()
        amp = torch.autocast(ctx.device.type, dtype=dtype) if dtype else contextlib.nullcontext()

        def train_step(model=model, amp=amp):
            with amp:
                loss = model.loss(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            _sync(ctx.device)

        train_step()  # warm-up
        train = _sdpa_kernels(train_step)
        model.eval()
        with torch.no_grad():
            cache = model.new_cache()
            model.next_token_logits(tokens[:1, :8], cache)

        def decode_step(model=model, amp=amp, cache=cache):
            with torch.no_grad(), amp:
                model.next_token_logits(tokens[:1, :1], cache)
            _sync(ctx.device)

        decode = _sdpa_kernels(decode_step)
        ctx.result[name] = dict(train=train, decode=decode)
        if ctx.cuda:
            ctx.check(f"{name}: fast train kernel", bool(train) and set(train) <= set(FAST_KERNELS))
        ctx.md.append(f"| {name} | {', '.join(train) or '-'} | {', '.join(decode) or '-'} |")
        ctx.save()
        del model


def stage_decode(ctx: Ctx):
    import torch

    from coupled_qk.training.distributed import enable_tf32

    enable_tf32(ctx.device, False)
    base = _tiny_config(block_size=48)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, base.vocab_size, (2, 12), generator=gen)
    seq = torch.randint(0, base.vocab_size, (2, 24), generator=gen)
    n_new = 8 if ctx.quick else 24
    ctx.md += [
        "Cached decoding (prefill 12 tokens, then 12 single-token steps) against the full forward, fp32: "
        "max |difference| / max |logit|. Greedy: "
        f"{n_new} new tokens after a 12-token prompt, batch 2, on the device and on the CPU.",
        "",
        "| variant | cache vs full | greedy device = CPU |",
        "|---|---:|---|",
    ]
    for name in _variants(ctx):
        cpu_model = _sharp_model(base, name)
        model = copy.deepcopy(cpu_model).to(ctx.device)
        x = seq.to(ctx.device)
        with torch.no_grad():
            full = model(x)
            cache = model.new_cache()
            parts = [model(x[:, :12], cache)] + [model(x[:, i : i + 1], cache) for i in range(12, 24)]
            cached = torch.cat(parts, dim=1)
        err = float((cached - full).abs().max() / full.abs().max())
        row = dict(cache_vs_full=err)
        ctx.check(f"{name}: cache = full", err < 1e-4)
        if ctx.cuda:
            g_dev = model.generate(prompt.to(ctx.device), n_new, temperature=0.0).cpu()
            g_cpu = cpu_model.generate(prompt, n_new, temperature=0.0)
            same = (g_dev == g_cpu).all(dim=0)
            row.update(
                greedy_equal=bool(same.all()),
                greedy_first_mismatch=None if same.all() else int((~same).nonzero()[0]) - prompt.shape[1],
            )
            ctx.check(f"{name}: greedy device = CPU", row["greedy_equal"])
            greedy = "yes" if row["greedy_equal"] else f"no (from new token {row['greedy_first_mismatch']})"
        else:
            greedy = "skipped: no CUDA"
        ctx.result[name] = row
        ctx.md.append(f"| {name} | {err:.1e} | {greedy} |")
        ctx.save()


def stage_sync(ctx: Ctx):
    import torch

    from coupled_qk import GPT, GPTConfig
    from coupled_qk.ops.losses import next_token_loss

    base = GPTConfig.from_preset("tiny" if ctx.quick else "60m", n_layer=2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, base.vocab_size, (4, base.block_size + 1), generator=gen).to(ctx.device)
    ctx.md += [
        "Host synchronisations (`torch.cuda.set_sync_debug_mode('warn')`) in one training step (bf16 "
        "autocast forward, backward, `clip_grad_norm_`, fused AdamW; the loop's one deliberate "
        "`loss.item()` per step excluded) and in one cached decoding step (after the prefill and a "
        "first step).",
        "",
        "| variant | train step syncs | decode step syncs | where |",
        "|---|---:|---:|---|",
    ]
    for name in ("standard", "coupled", "differential", "coupled_differential"):
        torch.manual_seed(0)
        model = GPT(_variant_config(base, name)).to(ctx.device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step(model=model, opt=opt):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        torch.cuda.synchronize()
        where = {}
        counts = {}
        model.eval()
        with torch.no_grad():
            cache = model.new_cache()
            nxt = model.next_token_logits(tokens[:1, :16], cache).argmax(-1, keepdim=True)
            nxt = model.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        for phase in ("train", "decode"):
            if phase == "train":
                model.train()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    if phase == "train":
                        step()
                    else:
                        with torch.no_grad():
                            model.eval()
                            nxt = model.next_token_logits(nxt, cache).argmax(-1, keepdim=True)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
            counts[phase] = len(syncs)
            for w in syncs:
                key = f"{phase}: {Path(w.filename).name}:{w.lineno}"
                where[key] = where.get(key, 0) + 1
            torch.cuda.synchronize()
        ctx.result[name] = dict(train_syncs=counts["train"], decode_syncs=counts["decode"], where=where)
        ctx.check(f"{name}: no sync in the train step", counts["train"] == 0)
        ctx.check(f"{name}: no sync in the decode step", counts["decode"] == 0)
        ctx.md.append(
            f"| {name} | {counts['train']} | {counts['decode']} | "
            f"{'; '.join(f'{k} x{v}' for k, v in where.items()) or '-'} |"
        )
        ctx.save()
        del model, opt


def _quick_corpus(ctx: Ctx) -> Path:
    """A small train/valid/test folder (quick mode): slices of the data's training text and WikiText-2."""
    folder = ctx.work / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for split, src, n in (
        ("train", "wiki-vital/train.txt", 60_000),
        ("valid", "wikitext-2/valid.txt", 12_000),
        ("test", "wikitext-2/test.txt", 12_000),
    ):
        text = (ctx.data / src).read_text(encoding="utf-8")[:n]
        (folder / f"{split}.txt").write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
    return folder


def stage_train(ctx: Ctx):
    import torch

    from coupled_qk.training.config import TrainConfig
    from coupled_qk.training.loop import train
    from coupled_qk.training.pretrained import load_run
    from coupled_qk.training.run_folder import RunFolder

    steps = 6 if ctx.quick else 20
    common = dict(
        corpus=str(_quick_corpus(ctx)) if ctx.quick else "wiki-vital",
        data_dir=str(ctx.data),
        tokenizer="gpt2",
        cache_dir=str(ctx.work / "cache"),
        preset="tiny" if ctx.quick else "60m",
        model=dict(attention="coupled", **(dict(n_layer=2, d_model=64, block_size=64) if ctx.quick else {})),
        batch_size=4 if ctx.quick else 16,
        max_steps=steps,
        warmup_steps=2,
        lr=6e-4,
        eval_interval=steps,
        eval_batches=2 if ctx.quick else 8,
        log_interval=1,
        checkpoint_minutes=None,
        keep_checkpoints=1,
        device=ctx.device.type,
        tensorboard=False,
        progress=False,
        seed=0,
    )
    t = time.perf_counter()
    full = train(TrainConfig(**common, out_dir=str(ctx.work / "full")))
    ctx.result["full"] = dict(
        seconds=time.perf_counter() - t,
        final=full["final"],
        steps=full["steps"],
        tokens=full["tokens"],
        params=full["params"],
        stop_reason=full["stop_reason"],
    )
    ctx.save()
    t = time.perf_counter()
    half = TrainConfig(**common, out_dir=str(ctx.work / "resumed"), stop_after_steps=steps // 2)
    first = train(half)
    resumed = train(dataclasses.replace(half, stop_after_steps=None, resume=True))
    ctx.result["resumed"] = dict(
        seconds=time.perf_counter() - t,
        first_stop=first["stop_reason"],
        first_steps=first["steps"],
        final=resumed["final"],
        steps=resumed["steps"],
    )
    la = {r["step"]: r["train/loss"] for r in RunFolder(ctx.work / "full").read_metrics() if "train/loss" in r}
    lb = {r["step"]: r["train/loss"] for r in RunFolder(ctx.work / "resumed").read_metrics() if "train/loss" in r}
    diffs = [abs(la[s] - lb[s]) / abs(la[s]) for s in sorted(la) if s in lb]
    ctx.result["loss_rel_diff_max"] = max(diffs) if diffs else None
    # CPU runs repeat bit for bit; CUDA kernels (atomics in attention backward) may differ in the last bits
    tol = 0.0 if ctx.device.type == "cpu" else 2e-3
    ctx.check("resume continues the same run", len(diffs) == steps and max(diffs) <= tol)
    ctx.check("stopped at half", first["stop_reason"] == "stop_after_steps" and first["steps"] == steps // 2)
    ppl = {k: v for k, v in resumed["final"].items() if "perplexity" in k}
    ctx.check("finite evaluation", bool(ppl) and all(v == v and v < float("inf") for v in ppl.values()))
    ctx.save()
    run = load_run(ctx.work / "resumed", ctx.device)
    prompt = run.encode(" = Valkyria Chronicles = \n", ctx.device)
    out = run.model.generate(prompt, 16 if ctx.quick else 48, temperature=0.0)
    new = out[0, prompt.shape[1] :]
    ctx.result["generated"] = run.tokenizer.decode(new)
    ctx.check("generated ids in the vocabulary", int(new.max()) < run.model.config.vocab_size)
    tps = [r["tokens_per_s"] for r in RunFolder(ctx.work / "full").read_metrics() if "tokens_per_s" in r]
    ctx.result["tokens_per_s_median"] = float(sorted(tps)[len(tps) // 2]) if tps else None
    f = resumed["final"]
    ctx.md += [
        f"{common['preset']} preset, coupled attention, batch {common['batch_size']} x block, {steps} steps "
        f"({full['tokens']:,} tokens), dtype auto ({'bf16 autocast' if ctx.cuda else 'fp32'}).",
        f"- uninterrupted: {ctx.result['full']['seconds']:.1f} s including the final evaluation; median "
        f"{ctx.result['tokens_per_s_median'] or 0:,.0f} tokens/s",
        f"- stopped at step {first['steps']}, resumed to {resumed['steps']}: largest relative train-loss "
        f"difference to the uninterrupted run {ctx.result['loss_rel_diff_max']:.2e} (tolerance {tol:g})",
        "- final evaluation: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(f.items()) if isinstance(v, float)),
        f"- greedy generation ({len(new)} tokens): `{ctx.result['generated'][:200]!r}`",
    ]
    del run
    if ctx.cuda:
        torch.cuda.empty_cache()


def stage_bench(ctx: Ctx):
    import torch

    from coupled_qk import GPTConfig
    from coupled_qk.experiments.bench.cost_curve import train_step_flops
    from coupled_qk.experiments.bench.train import run_bench

    plan = (
        [("micro", dict(batch_size=2, repeats=3, warmup=1), ("coupled",))]
        if ctx.quick
        else [
            ("60m", dict(batch_size=16, repeats=10, warmup=2), PAPER_VARIANTS),
            ("350m", dict(batch_size=16, repeats=6, warmup=2), PAPER_VARIANTS),
        ]
    )
    dtype = "bf16" if ctx.cuda else "fp32"
    ctx.md += [
        f"Train step (forward, backward, AdamW), {dtype}{' autocast' if ctx.cuda else ''}, eager; "
        "interleaved round-robin, medians; ratio = median / standard's median in the same run; MFU = "
        f"model FLOPs (`train_step_flops`) x tokens/s / {H200_BF16_DENSE_TFLOPS:g} TFLOP/s (dense bf16 "
        "peak of an H200 SXM).",
        "",
        "| preset | variant | median ms | p10-p90 ms | tokens/s | ratio | MFU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for preset, kw, variants in plan:
        base = _tiny_config(block_size=32) if preset == "micro" else GPTConfig.from_preset(preset)
        res = run_bench(base, variants=list(variants), device=ctx.device, dtype=dtype, log=ctx.log, **kw)
        out = {}
        for name, v in res["variants"].items():
            from coupled_qk.experiments.bench.train import variant_configs

            cfg = variant_configs(base, [name], {})[name]
            s = res["settings"]
            flops = train_step_flops(cfg, s["batch_size"], s["seq_len"])["step"]
            mfu = flops / (v["median_ms"] / 1000) / (H200_BF16_DENSE_TFLOPS * 1e12) if ctx.cuda else None
            out[name] = dict(
                median_ms=v["median_ms"],
                p10_ms=v["p10_ms"],
                p90_ms=v["p90_ms"],
                tokens_per_s=v["tokens_per_s"],
                ratio=v["ratio"],
                mfu=mfu,
                params=v.get("params"),
            )
            ctx.md.append(
                f"| {preset} | {name} | {v['median_ms']:.1f} | {v['p10_ms']:.1f}-{v['p90_ms']:.1f} | "
                f"{v['tokens_per_s']:,.0f} | {v['ratio']:.3f} | "
                f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} |"
            )
        ctx.result[preset] = dict(
            settings={k: res["settings"][k] for k in ("batch_size", "seq_len", "repeats", "warmup", "dtype")},
            variants=out,
        )
        ctx.save()
        if ctx.cuda:
            torch.cuda.empty_cache()
    _vocab_padding_timing(ctx, dtype)


def _vocab_padding_timing(ctx: Ctx, dtype: str) -> None:
    """Standard attention's train step with the vocabulary padded to a multiple of 64 against unpadded
    (``GPTConfig.vocab_pad_multiple``; 60m: 50,257 -> 50,304 rows), interleaved, medians."""
    import numpy as np
    import torch

    from coupled_qk import GPT, GPTConfig
    from coupled_qk.devices import TORCH_DTYPES
    from coupled_qk.experiments.bench.train import TrainStepRunner

    if ctx.quick:
        base, batch, repeats = _tiny_config(vocab_size=500, block_size=32), 2, 3
    else:
        base, batch, repeats = GPTConfig.from_preset("60m"), 16, 10
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, base.vocab_size, (batch, base.block_size + 1), generator=gen).to(ctx.device)
    configs = {"unpadded": base, "padded": base.replace(vocab_pad_multiple=64)}
    autocast = None if dtype == "fp32" else TORCH_DTYPES[dtype]
    runners = {
        k: TrainStepRunner(k, lambda c=c: GPT(c), tokens[:, :-1], tokens[:, 1:], ctx.device, 0, autocast)
        for k, c in configs.items()
    }
    for r in runners.values():
        r.first_step()
    times = {k: [] for k in runners}
    for i in range(repeats):
        for k in ("unpadded", "padded") if i % 2 == 0 else ("padded", "unpadded"):
            times[k].append(runners[k].timed_step()[0])
    med = {k: float(np.median(v)) for k, v in times.items()}
    ctx.result["vocab_padding"] = dict(
        rows={k: c.padded_vocab_size for k, c in configs.items()},
        median_ms=med,
        times_ms=times,
        ratio=med["padded"] / med["unpadded"],
    )
    ctx.md += [
        "",
        f"Vocabulary padding (standard, batch {batch} x {base.block_size}, {repeats} interleaved steps): "
        f"{configs['unpadded'].padded_vocab_size:,} rows {med['unpadded']:.1f} ms, "
        f"{configs['padded'].padded_vocab_size:,} rows {med['padded']:.1f} ms, ratio "
        f"{med['padded'] / med['unpadded']:.3f}.",
    ]
    ctx.save()


def stage_memory(ctx: Ctx):
    import torch

    from coupled_qk import GPTConfig
    from coupled_qk.experiments.bench.decode import run_memory

    plan = (
        [("micro", dict(batch_size=2), ("coupled",))]
        if ctx.quick
        else [("60m", dict(batch_size=16), PAPER_VARIANTS), ("350m", dict(batch_size=16), PAPER_VARIANTS)]
    )
    dtype = "bf16" if ctx.cuda else "fp32"
    ctx.md += [
        f"Peak memory of one train step above the resident weights, gradients and AdamW state ({dtype}); "
        "KV cache after a 1 x block_size prefill.",
        "",
        "| preset | variant | resident MiB | step peak MiB | ratio | KV cache MiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for preset, kw, variants in plan:
        base = _tiny_config(block_size=32) if preset == "micro" else GPTConfig.from_preset(preset)
        res = run_memory(base, variants=list(variants), device=ctx.device, dtype=dtype, **kw)
        ctx.result[preset] = res["variants"]
        for name, v in res["variants"].items():
            ctx.md.append(
                f"| {preset} | {name} | {v['resident_bytes'] / 2**20:.0f} | {v['train_peak_bytes'] / 2**20:.0f}"
                f" | {v['train_ratio']:.3f} | {v['kv_cache_bytes'] / 2**20:.1f} |"
            )
        ctx.save()
        if ctx.cuda:
            torch.cuda.empty_cache()


def stage_compile(ctx: Ctx):
    import numpy as np
    import torch

    from coupled_qk import GPT, GPTConfig

    backend = "inductor" if ctx.cuda or not ctx.quick else "eager"
    base = _tiny_config(block_size=32) if ctx.quick else GPTConfig.from_preset("60m")
    batch, seq = (2, 32) if ctx.quick else (16, base.block_size)
    repeats = 3 if ctx.quick else 10
    dtype = torch.bfloat16 if ctx.cuda else None
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, base.vocab_size, (batch, seq + 1), generator=gen).to(ctx.device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    ctx.md += [
        f"`torch.compile(model.loss, backend={backend!r})` against eager, {'bf16 autocast' if dtype else 'fp32'},"
        f" {base.n_layer} x {base.d_model}, batch {batch} x {seq}; {repeats} interleaved eager/compiled "
        "train steps (forward, backward, AdamW) after the compiling step; Dynamo counters of the "
        "compiled steps (a recompile after the first call is a fault).",
        "",
        "| variant | compile s | eager ms | compiled ms | speed-up | loss eager / compiled | graphs | "
        "graph breaks | recompiles |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name in ("standard", "coupled"):
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        torch.manual_seed(0)
        model = GPT(_variant_config(base, name)).to(ctx.device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        compiled = torch.compile(model.loss, backend=backend)

        def step(fn, opt=opt):
            amp = torch.autocast(ctx.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
            _sync(ctx.device)
            t = time.perf_counter()
            with amp:
                loss = fn(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(ctx.device)
            return time.perf_counter() - t, float(loss.detach())

        with torch.no_grad(), torch.autocast(ctx.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            loss_e = float(model.loss(x, y))
        compile_s, loss_c = step(compiled)
        graphs_after_first = int(counters["stats"].get("unique_graphs", 0))
        step(model.loss)
        times = {"eager": [], "compiled": []}
        for i in range(repeats):
            order = ("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")
            for mode in order:
                times[mode].append(step(model.loss if mode == "eager" else compiled)[0])
        graphs = int(counters["stats"].get("unique_graphs", 0))
        breaks = int(sum(counters["graph_break"].values()))
        recompiles = graphs - graphs_after_first
        me, mc = (float(np.median(times[m])) * 1000 for m in ("eager", "compiled"))
        ctx.result[name] = dict(
            backend=backend,
            compile_s=compile_s,
            eager_ms=me,
            compiled_ms=mc,
            speedup=me / mc,
            loss_eager=loss_e,
            loss_compiled_first=loss_c,
            graphs=graphs,
            graph_breaks=breaks,
            recompiles=recompiles,
            graph_break_reasons=sorted(counters["graph_break"])[:10],
        )
        tol = 5e-2 if dtype else 1e-4
        ctx.check(f"{name}: compiled loss = eager loss", abs(loss_c - loss_e) <= tol * abs(loss_e))
        ctx.md.append(
            f"| {name} | {compile_s:.1f} | {me:.1f} | {mc:.1f} | {me / mc:.2f}x | {loss_e:.4f} / "
            f"{loss_c:.4f} | {graphs} | {breaks} | {recompiles} |"
        )
        ctx.save()
        del model, opt, compiled
        if ctx.cuda:
            torch.cuda.empty_cache()
    return None if backend == "inductor" else "quick CPU mode: Dynamo's eager backend (tracing only)"


def stage_hf(ctx: Ctx):
    """``transformers``' ``generate`` with a static cache, compiled as ``generate`` compiles it on a GPU (its
    default ``CompileConfig``: ``mode="reduce-overhead"``); on the CPU through ``compile_config`` (``--quick``:
    Dynamo's eager backend). The decoding step must be one graph without breaks and give the dynamic cache's
    tokens."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed: nothing to check"
    import torch
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    from coupled_qk.hf import CoupledQKForCausalLM
    from coupled_qk.training.distributed import enable_tf32

    enable_tf32(ctx.device, False)
    base = _tiny_config(block_size=64)
    n_new = 8 if ctx.quick else 24
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(1, base.vocab_size, (2, 12), generator=gen)
    mask = torch.ones_like(x)
    x[0, :5], mask[0, :5] = 0, 0  # left padding
    x, mask = x.to(ctx.device), mask.to(ctx.device)
    config = None
    if not ctx.cuda:
        config = CompileConfig(backend="eager" if ctx.quick else "inductor", mode=None)
        config._compile_all_devices = True
    ctx.md += [
        '`generate(cache_implementation="static")`, '
        f"compiled ({'default CompileConfig' if ctx.cuda else config.backend}), "
        f"{n_new} new tokens after a left-padded 12-token prompt, batch 2, fp32: Dynamo graphs and breaks of "
        "the decoding step, tokens against the dynamic cache, wall time of the first (compiling) and a "
        "second call.",
        "",
        "| variant | graphs | breaks | tokens = dynamic cache | first s | second s | dynamic cache s |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name in (
        ("standard", "coupled") if ctx.quick else ("standard", "coupled", "coupled_leapfrog", "coupled_differential")
    ):
        torch._dynamo.reset()
        counters.clear()
        model = _sharp_model(base, name)
        lm = CoupledQKForCausalLM.from_gpt(model, pad_token_id=0).to(ctx.device)
        kw = dict(attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)
        times = []
        for static in (False, True, True):
            _sync(ctx.device)
            t = time.perf_counter()
            out = lm.generate(
                x,
                **kw,
                **(
                    dict(cache_implementation="static", compile_config=config) if static else dict(disable_compile=True)
                ),
            )
            _sync(ctx.device)
            times.append(time.perf_counter() - t)
            if not static:
                dynamic = out
            else:
                same = torch.equal(out.cpu(), dynamic.cpu())
        graphs, breaks = int(counters["stats"].get("unique_graphs", 0)), int(sum(counters["graph_break"].values()))
        ctx.result[name] = dict(
            graphs=graphs,
            graph_breaks=breaks,
            tokens_equal=same,
            first_s=times[1],
            second_s=times[2],
            dynamic_s=times[0],
            compiled=hasattr(lm, "_compiled_call"),
            graph_break_reasons=sorted(counters["graph_break"])[:5],
        )
        ctx.check(f"{name}: compiled", hasattr(lm, "_compiled_call"))
        ctx.check(f"{name}: one graph, no break", graphs == 1 and breaks == 0)
        ctx.check(f"{name}: tokens = dynamic cache", same)
        ctx.md.append(
            f"| {name} | {graphs} | {breaks} | {'yes' if same else 'no'} | {times[1]:.1f} | {times[2]:.2f} "
            f"| {times[0]:.2f} |"
        )
        ctx.save()
    return None if ctx.cuda or not ctx.quick else "quick CPU mode: Dynamo's eager backend (tracing only)"


def stage_fail(ctx: Ctx):
    ctx.result["before"] = 1
    ctx.save()
    raise RuntimeError("self-test: this stage fails on purpose")


def stage_sleep(ctx: Ctx):
    ctx.result["slept"] = "started"
    ctx.save()
    time.sleep(600)


# ------------------------------------------------------------------------------------------ data bundle


def make_data(src: Path, dst: Path, train_mb: float = 1.0) -> dict:
    """Write the smoke run's data bundle: the first ``train_mb`` MB of ``wiki-vital/train.txt`` (cut before an
    article heading ``' = Title = '``), WikiText-2 ``valid.txt`` / ``test.txt`` and the GPT-2 tokenizer files,
    in ``src``'s layout, plus ``MANIFEST.json`` (bytes and SHA-256 of each file) and the data README's
    licence notes. Returns the manifest.

    Raises:
        FileNotFoundError: naming the first file of :data:`DATA_FILES` missing under ``src``.
        ValueError: ``train_mb`` not positive.
    """
    if not train_mb > 0:
        raise ValueError(f"--train-mb={train_mb} must be > 0")
    for f in DATA_FILES:
        if not (src / f).is_file():
            raise FileNotFoundError(f"--data-src {src}: expected file {src / f} does not exist")
    manifest = {}
    for f in DATA_FILES:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        if f == "wiki-vital/train.txt":
            text = (src / f).read_text(encoding="utf-8")
            limit = int(train_mb * 1_000_000)
            cut = text.rfind("\n = ", 0, limit) if len(text) > limit else len(text)
            (dst / f).write_text(text[: cut + 1 if cut > 0 else limit], encoding="utf-8")
        else:
            shutil.copyfile(src / f, dst / f)
        data = (dst / f).read_bytes()
        manifest[f] = dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    for extra in ("README.md", "tokenizer/gpt2/LICENSE"):
        if (src / extra).is_file():
            shutil.copyfile(src / extra, dst / (extra if extra != "README.md" else "SOURCE-README.md"))
    _write_json(dst / "MANIFEST.json", dict(source=str(src), train_mb=train_mb, files=manifest))
    return manifest


# ------------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="results folder (created)")
    p.add_argument("--budget-s", type=float, default=480.0, help="total seconds for all stages (default 480)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="default: cuda if available")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few steps (the CI mode)")
    p.add_argument("--data", help="data folder (the shared layout or a --make-data bundle)")
    p.add_argument("--stages", help=f"comma-separated subset of {','.join(s.name for s in STAGES)} (default all)")
    p.add_argument("--keep-work", action="store_true", help="keep DIR/work (training runs, caches)")
    p.add_argument("--make-data", metavar="BUNDLE", help="write the data bundle into BUNDLE and exit")
    p.add_argument(
        "--data-src",
        default=str(REPO.parent / "shared" / "data"),
        help="--make-data: the shared data folder (default ../shared/data next to the checkout)",
    )
    p.add_argument("--train-mb", type=float, default=1.0, help="--make-data: MB of training text (default 1)")
    p.add_argument("--stage", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.make_data:
        manifest = make_data(Path(args.data_src), Path(args.make_data), args.train_mb)
        total = sum(v["bytes"] for v in manifest.values())
        print(f"wrote {len(manifest)} files ({total / 1e6:.1f} MB) to {args.make_data}")
        return 0
    if not args.out:
        p.error("--out is required")
    if not args.budget_s > 0:
        p.error(f"--budget-s={args.budget_s} must be > 0")
    if args.stage:
        return run_stage(args.stage, args.device, args.quick, args.data, args.out)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: CUDA is not available (use --device cpu --quick for the CPU stand-in)")
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
