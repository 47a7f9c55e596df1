#!/bin/bash
# The serving measurements of README/docs/serving.md, alone on the machine, in this order:
# offline bench (dtype auto), the mixed-step profile, the MoE prefill ratio, the online benchmark (16 requests per rate,
# 4 rates from 0.25x to 2x the baseline's prefill-bound capacity: a full 64 x 6 run takes hours on
# 2 cores), then the offline prefill and TTFT in the dtype auto did not pick (the dtype comparison). Each step
# skips itself when its output exists.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=${SK:-$ROOT/.venv/bin/swiftkv}
OUT=${OUT:-$ROOT/docs/bench}
MODEL=smollm2-135m-instruct-swiftkv50 BASE=smollm2-135m-instruct
{ lscpu | grep "Model name"; grep -ow "avx512_bf16\|amx_bf16" /proc/cpuinfo | sort -u; } > $OUT/cpu.txt
[ -f $OUT/auto/bench.json ] || $SK bench $MODEL --baseline $BASE --out $OUT/auto > $OUT/auto.log 2>&1
[ -f $OUT/profile/profile.json ] || $SK bench $MODEL --baseline $BASE --profile --out $OUT/profile > $OUT/profile.log 2>&1
# The MoE prefill ratio: a random Qwen3-30B-A3B-shaped model (24 layers, 48 experts), one engine at a time (~14 GiB
# each, ~24 min on 2 cores).
[ -f $OUT/moe/bench-moe.json ] || $SK bench --moe --moe-layers 24 --moe-experts 48 --moe-one-at-a-time \
  --out $OUT/moe > $OUT/moe.log 2>&1
[ -f $OUT/online/online.png ] || $SK bench $MODEL --baseline $BASE --online --num-requests 16 \
  --rate-multipliers 0.25,0.5,1,2 --out $OUT/online > $OUT/online.log 2>&1
# The other dtype: bf16 where auto chose fp32 (no native bf16), fp32 where auto chose bf16; prefill
# and TTFT only (the dtype question is a compute question; emulated bf16 makes the 10:1 run ~25 min).
if grep -q "avx512_bf16\|amx_bf16" $OUT/cpu.txt; then OTHER=float32; else OTHER=bfloat16; fi
[ -f $OUT/$OTHER/bench.json ] || $SK bench $MODEL --baseline $BASE --dtype $OTHER --workloads prefill,ttft \
  --out $OUT/$OTHER > $OUT/$OTHER.log 2>&1
