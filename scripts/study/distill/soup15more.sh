#!/bin/bash
# Issue 32 item 5 at N = 15, on a CPU with fast bf16 (an AMD EPYC with AVX512-BF16: 871 GFLOP/s bf16, 204 fp32,
# 2 threads): the shipped -swiftkv50 (docs/distill-study/soup15-n15-student: cpu19m 3 : the H200 loan's N = 15
# snapshot 1, rank 128) trained on 2.5M tokens neither parent saw (`--skip-tokens 14893056`: the loan's N = 15
# trained the split's first 14.9M, cpu19m its first 11.5M), from its weights (`--init-from`, a fresh AdamW, rank
# 128 as the soup stores it) at a quarter of the recipe's peak lr (5e-4 / 2.5e-4, cpu19m's), 1% warmup. What it
# measures: whether a soup trained on keeps the soup's gain and adds the tokens'.
#   soup15more.sh n15   (resumable: rerun to continue)
STUDY="$(cd "$(dirname "$0")/../../../docs/distill-study" && pwd)"  # the study's records
export RUN=soup15more-c1r64bfe TOKENS=2500608 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $STUDY/soup15-n15-student --lora-rank 128 --skip-tokens 14893056 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01 --dtype auto"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
