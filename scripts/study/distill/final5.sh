#!/bin/bash
# The shipped students, round 3 (issue 25): the winner of study round 4 at 2M train tokens per student
# on CPU, then the same full-suite eval command as docs/eval-full with the floor row added.
#
#   final5.sh ARM [STAGE...]     ARM: an arm of arms4.sh (its distill options); STAGES (default all):
#     ids       REPLIES as token ids only, in docs/distill-study as <REPLIES minus .jsonl>-ids.jsonl.xz, to commit
#               (a machine without REPLIES seeds it from there, else from final5's replies)
#     replies   the teacher's replies for 2M tokens (vLLM; appended, so an interrupted run resumes; seeded
#               from docs/distill-study/final5-replies-ids.jsonl.xz on a machine that has none)
#     n15 n22   distill N = 15 / N = 22 (resumable: rerun to continue a run cut by a session's end)
#     ship15 ship22   install the tensors as -swiftkv50 / -swiftkv25, full eval, the Paris answer
# RUN (default final5-ARM) names the run's files; REPLIES (default replies-final5.jsonl, seeded from it when
# it is another file) the reply file; REPLY_ENGINE (default vllm) its writer, e.g. static on a CPU with fast
# bf16, where it writes a few replies per second against vLLM-CPU's one.
# Every stage skips itself when done. STOP_AFTER=k slices a distillation (k steps, checkpointed);
# EVAL_STUDENTS="ALIAS..." names the students a ship stage scores (default: both).
# CONTINUE_FROM=RUN continues that run's distillation of the same N (distill --continue-from RUN-nN.ckpt:
# its trained tensors, then the steps after its own), with PASSES (default 1) passes over the data, so
# TOKENS / PASSES must equal the continued run's TOKENS (e.g. TOKENS=2x with PASSES=2). MORE_ARGS: distill
# options after the arm's, which they override (e.g. a continued run's lower --lr).
# SWIFTKV_SRC=<checkout>/src picks the code (a worktree, so edits never change a running stage); the ship
# stages need a checkout with save_swiftkv_params(base_model=, student_rank=) (def21e0 or later) and install
# the tensors into that checkout's swiftkv/weights/ (commit them from there).
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_NUM_OF_RESERVED_CPU=0
export PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
PY=$ROOT/.venv/bin/python
source "$(dirname "$0")/arms4.sh"
ARM=$1; shift
ARGS=$(arm_args "$ARM") || exit 2
STAGES=${*:-replies n15 ship15 n22 ship22}
# 2M rounded up to whole steps of 2048 tokens, as distill rounds --tokens. An arm with a larger step sets
# TOKENS to whole steps of its own within the replies kept (c1r64b16: 122 x 16 x 1024 = 1,998,848).
TOKENS=${TOKENS:-2000896}
# The teacher's replies as token ids only (key, reply_ids, finished; no ShareGPT text), kept in the repository's
# history (docs/artifacts.json; restored into docs/distill-study when missing) so that a new machine skips the replies
# they hold: the reply cache reads such records as it reads its own.
IDS="$ROOT/docs/distill-study/final5-replies-ids.jsonl.xz"
RUN=${RUN:-final5-$ARM} REPLIES=${REPLIES:-replies-final5.jsonl} REPLY_ENGINE=${REPLY_ENGINE:-vllm}
restore_ids() {  # an ids file of the study's records that left the tree (docs/artifacts.json lists it): from history
  local path=${1#"$ROOT"/}
  [ -f "$1" ] || ! grep -qF "\"path\": \"$path\"" "$ROOT/docs/artifacts.json" || "$PY" "$ROOT/scripts/restore.py" "$path"
}
cd $RUNS
if [ ! -f replies-final5.jsonl ]; then
  restore_ids "$IDS"
  if [ -f "$IDS" ]; then xz -dc "$IDS" > replies-final5.jsonl; else cp replies-64.jsonl replies-final5.jsonl; fi
fi
# Another run's replies as ids only, beside final5's (the ids stage writes it, to commit).
RUN_IDS="$(dirname "$IDS")/${REPLIES%.jsonl}-ids.jsonl.xz"
if [ ! -f "$REPLIES" ]; then
  restore_ids "$RUN_IDS"
  if [ -f "$RUN_IDS" ]; then xz -dc "$RUN_IDS" > "$REPLIES"; else cp replies-final5.jsonl "$REPLIES"; fi
fi
for n in 15 22; do
  [ -f n$n-lstsq/config.json ] || $SK convert smollm2-135m-instruct n$n-lstsq --num-key-value-layers $n --init lstsq \
    > convert$n.log 2>&1 || exit 1
done

replies() {  # the short prompts' replies of the run's split (an arm with --long-share adds its long ones in distill)
  local turns; turns=$(echo "$ARGS" | sed -n 's/.*--prompt-turns \([a-z]*\).*/\1/p')
  $SK replies n15-lstsq --out "$REPLIES" --tokens $TOKENS --heldout-tokens 16384 --seed 0 \
    --reply-tokens 64 --engine "$REPLY_ENGINE" --prompt-turns "${turns:-first}" >> "${REPLIES%.jsonl}.log" 2>&1
}
ids() {  # the reply file as token ids only (no ShareGPT text), to commit: a new machine seeds from it
  $PY -c "import json, sys
for line in open('$REPLIES'):
    try:
        record = json.loads(line)
    except json.JSONDecodeError:  # a torn last line of a writer still running
        continue
    print(json.dumps({k: record[k] for k in ('key', 'reply_ids', 'finished')}))" | xz -9 > "$RUN_IDS.tmp" \
    && mv "$RUN_IDS.tmp" "$RUN_IDS"
}
distill() {  # N
  local out=$RUN-n$1
  [ -f $out/config.json ] && return
  local res="" stop=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  [ -n "$STOP_AFTER" ] && stop="--stop-after $STOP_AFTER"
  local more="--passes ${PASSES:-1} $MORE_ARGS"; [ -n "$CONTINUE_FROM" ] && more="$more --continue-from $CONTINUE_FROM-n$1.ckpt"
  /usr/bin/time -v -a -o $out-time.txt $SK distill n$1-lstsq --tokens $TOKENS --heldout-tokens 16384 --seq-len 1024 \
    --batch-size 2 --micro-batch 1 --eval-every 100 --checkpoint-every 8 --seed 0 --teacher-data "$REPLIES" \
    --reply-engine "$REPLY_ENGINE" $ARGS $more --out $out --json $out.json $res $stop >> $out.log 2>&1
}
ship() {  # N, alias: install the tensors, score both students with the docs/eval-full command plus --floor
  local n=$1 alias=$2 out=$RUN-n$1
  [ -f $out/config.json ] || return 1
  [ -f $RUN-shipped-n$n.txt ] && return
  # A --trainable lora student also stores its later layers' difference from the base as rank factors.
  local rank; rank=$(echo "$ARGS" | sed -n 's/.*--lora-rank \([0-9]*\).*/\1/p')
  $PY -c "import swiftkv; from swiftkv.sources import load_model as L
from swiftkv.model.surgery import save_swiftkv_params as s
s(L('$out'), '$PYTHONPATH/swiftkv/weights/$alias', base='smollm2-135m-instruct', base_model=L('smollm2-135m-instruct'),
  student_rank=${rank:-None})" || return 1
  # fp32 on every CPU: the full-suite rows of docs/eval-full were all scored in fp32 (dtype auto chose it on
  # the machines that ran them), and a row compares with another only at the same dtype.
  # EVAL_STUDENTS: the students scored (default both). Each row is its own student paired with the same
  # teacher, so a CPU too slow for both in one session scores the new one alone and its row compares.
  # shellcheck disable=SC2086
  /usr/bin/time -v $SK eval ${EVAL_STUDENTS:-smollm2-135m-instruct-swiftkv50 smollm2-135m-instruct-swiftkv25} \
    --teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000 --floor --dtype float32 --out eval-$RUN-n$n --no-progress \
    > eval-$RUN-n$n.log 2>&1 || return 1
  $SK generate $alias "What is the capital of France?" > paris-$RUN-n$n.txt 2> paris-$RUN-n$n.err
  date > $RUN-shipped-n$n.txt
}
for stage in $STAGES; do
  case $stage in
    replies) replies || exit 1 ;;
    ids) ids || exit 1 ;;
    n15) distill 15 || exit 1 ;;
    n22) distill 22 || exit 1 ;;
    ship15) ship 15 smollm2-135m-instruct-swiftkv50 || exit 1 ;;
    ship22) ship 22 smollm2-135m-instruct-swiftkv25 || exit 1 ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
