#!/usr/bin/env bash
# One round of issue 29's compiled-path checks at the 60m preset (CPU, one thread), written to
# benchmarks/results/fastpath/rounds-60m/<label>-{train,decode}/. A target counts as met when it holds in 3 rounds:
#   bash benchmarks/fastpath_60m_round.sh r1 && bash benchmarks/fastpath_60m_round.sh r2 && bash benchmarks/fastpath_60m_round.sh r3
# train: one training step (batch 1 x 512) of standard, coupled, leapfrog and the GPT-2 peer, compiled fp32 and bf16.
# decode: cached greedy decoding at batch 1 and 8, prefixes 128 and 512, eager and compiled (the train part of
# that command is a token 1 x 32 batch, only there because fastpath always times a step).
# REPEATS=9 bash ... sets the interleaved repeats of the train part (default 5, as rounds r1-r3).
# The bf16 mode only where the CPU computes bf16 natively (fastpath refuses it elsewhere). Rounds r1-r6 exported
# glibc's MALLOC_* settings here; every coupled-qk command now tunes malloc itself (src/coupled_qk/allocator.py).
set -euo pipefail
train_modes=compiled-fp32
if grep -qwE 'avx512_bf16|amx_bf16|bf16' /proc/cpuinfo 2>/dev/null; then train_modes=compiled-fp32,compiled-bf16; fi
label=${1:?usage: bash benchmarks/fastpath_60m_round.sh LABEL [train|decode]}
parts=${2:-train decode}
out=benchmarks/results/fastpath/rounds-60m
if [[ $parts == *train* ]]; then
coupled-qk bench --mode fastpath --preset 60m --variants coupled,coupled_leapfrog --modes "$train_modes" \
  --peers gpt2 --batch-size 1 --seq-len 512 --repeats "${REPEATS:-5}" --warmup 2 --threads 1 --no-decode --out-dir "$out/$label-train" --overwrite
fi
if [[ $parts == *decode* ]]; then
coupled-qk bench --mode fastpath --preset 60m --variants coupled,coupled_leapfrog --modes compiled-fp32 \
  --set block_size=640 --batch-size 1 --seq-len 32 --repeats 5 --warmup 1 --threads 1 --prefixes 128,512 --decode-batch-sizes 1,8 \
  --new-tokens 16 --out-dir "$out/$label-decode" --overwrite
fi
