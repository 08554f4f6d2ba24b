#!/usr/bin/env bash
# One round of the CPU speed checks of issue 12 (train step at tiny and 60m, cached decoding), written to
# benchmarks/results/kernels/<label>/. A speed target counts as met when it holds in 3 separate rounds:
#   bash benchmarks/cpu_round.sh round1 && bash benchmarks/cpu_round.sh round2 && bash benchmarks/cpu_round.sh round3
# Run it on an otherwise idle machine (the ratios are interleaved and paired, but other processes still
# widen them). About 6 minutes per round on a 2-core VM.
#
# Every coupled-qk command tunes glibc's malloc itself (src/coupled_qk/allocator.py: large freed blocks stay
# mapped, so steps do not pay page faults); COUPLED_QK_DEFAULT_MALLOC=1 keeps glibc's defaults, and MALLOC_*
# variables you export are respected. Each result records what was done (machine.allocator).
set -euo pipefail
label=${1:?usage: bash benchmarks/cpu_round.sh LABEL [train|decode]}
parts=${2:-train decode}
out=benchmarks/results/kernels/$label
variants=coupled,coupled_leapfrog
if [[ $parts == *train* ]]; then
coupled-qk bench --preset tiny --variants $variants --repeats 20 --warmup 2 --threads 1 --device cpu --out-dir "$out/threads1"
coupled-qk bench --preset tiny --variants $variants --repeats 20 --warmup 2 --threads 2 --device cpu --out-dir "$out/threads2"
coupled-qk bench --preset 60m --batch-size 2 --variants $variants --repeats 11 --warmup 1 --threads 2 --device cpu --out-dir "$out/threads2"
fi
if [[ $parts == *decode* ]]; then
coupled-qk bench --preset tiny --set block_size=640 --mode decode --prefixes 128,512 --decode-batch-sizes 1,8 \
  --new-tokens 64 --repeats 11 --threads 1 --device cpu --variants $variants --out-dir "$out/threads1"
fi
