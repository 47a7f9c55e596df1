#!/bin/bash
# Distillation training throughput on this machine, alone: N = 15 and 22, fp32 and bf16, 1 and 2
# threads, the study's step (seq 1024, 2 blocks, MSE term on). Each JSON also holds the compute
# bound: FLOPs per trained token over the measured matmul peak in that dtype and thread count.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=$ROOT/.venv/bin/swiftkv
cd $RUNS
for n in 15 22; do
  for dtype in float32 bfloat16; do
    for threads in 1 2; do
      OMP_NUM_THREADS=$threads $SK distill n$n-lstsq --recipe swiftkv --targets human --dtype $dtype \
        --seq-len 1024 --batch-size 2 --micro-batch 1 --speed 3 --json speed-n$n-$dtype-t$threads.json \
        > speed-n$n-$dtype-t$threads.log 2>&1
    done
  done
done
python3 - <<'PY'
import json
for n in (15, 22):
    for dtype in ("float32", "bfloat16"):
        for t in (1, 2):
            r = json.load(open(f"speed-n{n}-{dtype}-t{t}.json"))
            b = r["compute_bound"]
            print(f"| {n} | {dtype} | {t} | {r['shared']['tokens_per_s']} | {b['matmul_peak_flops'] / 1e9:.0f} | "
                  f"{b['flops_per_token'] / 1e9:.2f} | {b['bound_tokens_per_s']} | {b['fraction_of_bound']:.2f} |")
PY
