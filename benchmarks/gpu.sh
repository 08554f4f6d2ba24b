#!/usr/bin/env bash
# One GPU, run unchanged from the repository root of a checkout (nothing installed, no network):
#
#   bash benchmarks/gpu.sh [extra gpu_smoke.py options, e.g. --data DIR]
#
# 1. The budgeted smoke run (benchmarks/gpu_smoke.py): environment, CUDA-vs-CPU parity of every variant, the
#    SDPA kernel each variant uses, cached and greedy decoding, a host-sync audit, 20 training steps with
#    checkpoint/resume/eval/generate at 60m, bf16 train-step tokens/s, ratios and MFU at 60m and 350m, peak
#    memory, compiled vs eager, compiled static-cache generate through transformers. Every stage has its own
#    time limit and a failing stage never stops the next;
#    BUDGET_S (default 480) bounds the whole run. Results: $OUT_DIR/results.{json,md} (default
#    benchmarks/results/gpu-smoke).
# 2. Only with EXTENDED=1 (about 20-40 more minutes, beyond a 15-minute device loan): the longer benchmark set of
#    issue 12 (eager and compiled train-step ratios at 60m/150m/350m, decoding tokens/s), each command under its
#    own `timeout` (EXTENDED_TIMEOUT_S, default 900) and a failure never stopping the next.
#
# Data: the smoke run's `train` stage needs the data bundle (python3 benchmarks/gpu_smoke.py --make-data
# benchmarks/smoke-data) or the shared data folder; without one that stage is skipped and says why.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${OUT_DIR:-benchmarks/results/gpu-smoke}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PY" benchmarks/gpu_smoke.py --budget-s "${BUDGET_S:-480}" --out "$OUT" "$@"
status=$?

if [ "${EXTENDED:-0}" = "1" ]; then
  V=all  # the registry's default variant set (coupled-qk bench --help lists it)
  T=${EXTENDED_TIMEOUT_S:-900}
  cli() { timeout "$T" "$PY" -c 'import sys; from coupled_qk.cli import main; sys.exit(main(sys.argv[1:]))' "$@" \
            || { echo "gpu.sh: failed or timed out (status $?): $*"; status=1; }; }
  for preset in 60m 150m 350m; do
    for c in "" --compile; do
      cli bench --preset "$preset" --variants "$V" --batch-size 16 --repeats 20 --warmup 3 --device cuda \
        --dtype bf16 $c --out-dir "$OUT/extended"
    done
  done
  cli bench --preset 60m --set block_size=640 --mode decode --prefixes 128,512 --decode-batch-sizes 1,8 \
    --new-tokens 64 --repeats 10 --variants "$V" --device cuda --out-dir "$OUT/extended"
  for preset in 60m 350m; do
    cli bench --preset "$preset" --mode memory --batch-size 16 --variants "$V" --device cuda --dtype bf16 \
      --out-dir "$OUT/extended"
  done
fi
echo "gpu.sh: results in $OUT"
exit $status
