#!/bin/bash
# Study round 4 (issue 25, 2026-11-25): student capacity at the study's equal budget. R13 (the swiftkv
# preset) is the control; each arm adds a student-only trainable set (--trainable) to it. Same budget,
# seed, split and replies as study3.sh. Per arm: the distillation (tok/s, peak RSS), then
# `swiftkv eval --tasks none` (chat, greedy, long prompts, floor) and the knowledge tasks at one limit.
# Run: SWIFTKV_SRC=<worktree>/src ./study4.sh r13 c1r16 c1r64 c2 c3  (each stage skips itself when done;
# STAGES=distill trains the arms only, STAGES=eval evaluates the trained ones)
# On a shared machine: the kernel's autogroup scheduling gives every session an equal share whatever
# its nice value, so niced helpers still halved this run's speed (2026-11-25); as root,
# `echo 0 > /proc/sys/kernel/sched_autogroup_enabled` makes nice work across sessions.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_NUM_OF_RESERVED_CPU=0
export PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}  # a worktree, so edits in main never change a running arm
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
source "$(dirname "$0")/arms4.sh"
cd $RUNS
[ -f n15-lstsq/config.json ] || $SK convert smollm2-135m-instruct n15-lstsq --num-key-value-layers 15 --init lstsq
COMMON="--tokens 262144 --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0"
KNOWLEDGE="--tasks arc_easy,arc_challenge,hellaswag,piqa,winogrande --limit 500 --chat-conversations 0 --gen-prompts 0 --long-prompts 0"
for arm in "$@"; do
  ARGS=$(arm_args "$arm") || exit 2
  if [ ! -f s4-$arm/config.json ] && [ "${STAGES:-all}" != eval ]; then
    RES=""; [ -f s4-$arm.ckpt/checkpoint.pt ] && RES="--resume"
    # The arm's options come last, so that they override the common ones.
    /usr/bin/time -v -a -o time-s4-$arm.txt $SK distill n15-lstsq $COMMON --teacher-data replies-64.jsonl --reply-engine vllm \
      $ARGS --out s4-$arm --json s4-$arm.json $RES > s4-$arm.log 2>&1 || exit 1
  fi
  [ "${STAGES:-all}" = distill ] && continue
  [ -f s4-$arm/config.json ] || continue
  [ -f eval-s4-$arm/results.json ] || $SK eval s4-$arm --teacher smollm2-135m-instruct --tasks none --floor \
      --out eval-s4-$arm --no-progress > eval-s4-$arm.log 2>&1 || exit 1
  [ -f know-s4-$arm/results.json ] || $SK eval s4-$arm --teacher smollm2-135m-instruct $KNOWLEDGE \
      --out know-s4-$arm --no-progress > know-s4-$arm.log 2>&1 || exit 1
done
