#!/usr/bin/env bash
# One-GPU benchmark of every variant against standard (issue 12). Run unchanged from the repository root on one
# NVIDIA H100 or H200 with the package installed (pip install -e .):   bash benchmarks/gpu.sh
# Writes under benchmarks/results/gpu/ (override with OUT_DIR=...); PEAK_TFLOPS (default 989, dense bf16 of an
# H100/H200 SXM) sets the MFU denominator. Takes roughly 20-40 minutes.
set -euo pipefail
OUT=${OUT_DIR:-benchmarks/results/gpu}
PEAK=${PEAK_TFLOPS:-989}
V=all  # the registry's default variant set (coupled-qk bench --help lists it); standard is always measured
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

# 1. train-step ratios in bf16 autocast, eager and torch.compile, at 60m / 150m / 350m (batch 16 x 512)
for preset in 60m 150m 350m; do
  coupled-qk bench --preset "$preset" --variants "$V" --batch-size 16 --repeats 20 --warmup 3 \
    --device cuda --dtype bf16 --out-dir "$OUT"
  coupled-qk bench --preset "$preset" --variants "$V" --batch-size 16 --repeats 20 --warmup 3 \
    --device cuda --dtype bf16 --compile --out-dir "$OUT"
done

# 2. tokens/s and model FLOPs utilisation per variant (from the JSON above; FLOPs of train_step_flops)
python - "$OUT" "$PEAK" <<'PY'
import json, sys
from pathlib import Path
from coupled_qk.experiments.cost_curve import mfu_markdown
out, peak = Path(sys.argv[1]), float(sys.argv[2])
results = [json.loads(p.read_text()) for p in sorted(out.glob("bench-*-cuda*.json"))]
(out / "mfu-cuda.md").write_text(mfu_markdown(results, peak))
print((out / "mfu-cuda.md").read_text())
PY

# 3. cached greedy decoding tokens/s after 128- and 512-token prefixes, batch 1 and 8 (fp32 weights)
coupled-qk bench --preset 60m --set block_size=640 --mode decode --prefixes 128,512 --decode-batch-sizes 1,8 \
  --new-tokens 64 --repeats 10 --variants "$V" --device cuda --out-dir "$OUT"

# 4. peak memory of a training step (torch.cuda.max_memory_allocated) and KV-cache bytes at 512 tokens
for preset in 60m 350m; do
  coupled-qk bench --preset "$preset" --mode memory --batch-size 16 --variants "$V" --device cuda --out-dir "$OUT"
done
echo "results in $OUT"
