#!/bin/bash
# The shipped students, round 2: 1,000,000 train tokens each with the `swiftkv` recipe after the
# round-3 study made R13 (teacher replies cut at 64 tokens) its winner. Resumable: rerun after an
# interruption (finished steps skip themselves).
#  1. teacher replies for both runs (one process writes the cache: the N = 15 run, 2 threads, stopped
#     after its first step); starts from the study's 821 replies of 64 tokens (replies-64.jsonl);
#  2. the N = 22 lstsq conversion;
#  3. both students side by side at one thread each (the fastest use of 2 cores, docs/distillation.md).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=/work/main/.venv/bin/swiftkv
cd /work/runs
[ -f replies-final64.jsonl ] || cp replies-64.jsonl replies-final64.jsonl
distill() {  # N, then extra arguments
  local n=$1 out=final64-n$1; shift
  [ -f $out/config.json ] && return
  local res=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  /usr/bin/time -a -o $out-wall.txt $SK distill n$n-lstsq --recipe swiftkv --reply-tokens 64 --tokens 1M \
    --heldout-tokens 16384 --seq-len 1024 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0 \
    --teacher-data replies-final64.jsonl --reply-engine vllm --out $out --json $out.json $res "$@" \
    >> $out.log 2>&1
}
date >> final64-times.txt
[ -f final64-n15.ckpt/checkpoint.pt ] || [ -f final64-n15/config.json ] || distill 15 --stop-after 1
date >> final64-times.txt
[ -f n22-lstsq/config.json ] || $SK convert smollm2-135m-instruct n22-lstsq --num-key-value-layers 22 --init lstsq > convert22.log 2>&1
date >> final64-times.txt
OMP_NUM_THREADS=1 distill 15 & OMP_NUM_THREADS=1 distill 22 & wait
date >> final64-times.txt
