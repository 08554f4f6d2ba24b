#!/usr/bin/env bash
# One round of the CPU speed checks of issue 12 (train step at tiny and 60m, cached decoding), written to
# benchmarks/results/issue12/<label>/. A speed target counts as met when it holds in 3 separate rounds:
#   bash benchmarks/cpu_round.sh round1 && bash benchmarks/cpu_round.sh round2 && bash benchmarks/cpu_round.sh round3
# Run it on an otherwise idle machine (the ratios are interleaved and paired, but other processes still
# widen them). About 6 minutes per round on a 2-core VM.
#
# glibc's malloc returns large freed blocks to the system, so every training step pays page faults that make
# step times swing by +-15% at 60m on this VM; these settings keep the memory mapped (every variant alike,
# steps ~25% faster). jemalloc or tcmalloc do the same. COUPLED_QK_DEFAULT_MALLOC=1 keeps glibc's defaults.
set -euo pipefail
if [[ "${COUPLED_QK_DEFAULT_MALLOC:-0}" != 1 ]]; then
  export MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=1073741824
fi
label=${1:?usage: bash benchmarks/cpu_round.sh LABEL [train|decode]}
parts=${2:-train decode}
out=benchmarks/results/issue12/$label
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
