#!/usr/bin/env bash
# GLUE fine-tuning of the standard, coupled and uncoupled_mlp tiny checkpoints on CPU (issue 15, claim C11).
# Run from the repository root with the data at ../shared/data (or COUPLED_QK_DATA). Step 1 and 2 run one
# process per model in parallel; everything is resumable (re-running reuses finished runs).
set -euo pipefail
export OMP_NUM_THREADS=1
PRE=runs/glue-pretrain
# 1. pretraining: tiny preset (4 layers, d_model 128, context 128), wiki-vital, bpe-8192, 131,072 tokens
for v in "standard" "coupled --integrator euler" "uncoupled_mlp"; do
  n=${v%% *}
  coupled-qk train --corpus wiki-vital --tokenizer bpe-8192 --attention $v --max-tokens 131072 --warmup-steps 10 \
    --eval-interval 1000 --eval-batches 20 --checkpoint-interval 16 --no-progress --no-tensorboard \
    --out-dir $PRE/$n/seed0 &
done
wait
# 2. fine-tuning: 3 seeds x 4 tasks per model, on fixed seeded subsets of the training sets (the same rows for
#    every model and seed), 1 epoch, lr 3e-4, batch 32, scored on the full labelled GLUE dev sets
GLUE_ARGS=(--task all --lr 3e-4 --epochs 1 --max-train-examples sst2=1600,cola=1600,rte=320,mrpc=480
           --out-dir runs/glue-cpu --no-progress)
for n in standard coupled uncoupled_mlp; do
  (for seed in 0 1 2; do coupled-qk glue $PRE/$n/seed0 --names $n --seeds $seed "${GLUE_ARGS[@]}"; done) &
done
wait
# 3. summary (reuses every finished fine-tune): results.json, results.md
coupled-qk glue $PRE/standard/seed0 $PRE/coupled/seed0 $PRE/uncoupled_mlp/seed0 \
  --names standard,coupled,uncoupled_mlp --seeds 0,1,2 "${GLUE_ARGS[@]}"
