#!/bin/bash
# The long-prompt QA study (issue 61, item 3): does distilling on prompts shaped like the workload
# (`--long-share S --long-kind passage-qa`: passages + a question about a fact one of them holds) improve the
# shipped students' long-prompt QA without costing the suite's knowledge tasks? For each of N = 15 and N = 22,
# two runs from the student shipped when the study began (`--init-from`, a fresh AdamW; the folders
# docs/distill-study/soup-long15-n15-student and soup22-n22-student, as their mix runs have shipped as -swiftkv50
# and -swiftkv25 since 2026-12-04 and 2026-12-05, their weights restored there from history) of about the same
# steps (blocks of 2048 tokens: 977 on chat replies, 986 on the mix; about 2M tokens), alike in all but the data:
#   chat   the teacher's replies to every user turn of ShareGPT train chats, as the shipped students' last stages
#          (swiftkv-lora at rank 128, lr 5e-4 / late-lr 2.5e-4, 5% warmup, 2048-token blocks, one per step)
#   mix    the same, with QA_SHARE of the written tokens in passage-QA prompts of about 1,000-1,800 tokens
# then each scored as the model cards' numbers were made (fp32, the full suite with --floor, hellaswag and mmlu
# at 2,000 items) plus `--long-qa default` (both lengths); last, the shipped students by the same command.
#
#   STUDY=DIR bash scripts/study_long_qa.sh [STEP...]
#     steps, in order (default all): replies n15-mix n15-chat n22-mix n22-chat shipped15 shipped22
#     (always first) setup: a copy of this checkout's committed src/ under STUDY/code (the code every later step runs, so
#               edits to the checkout never change a study under way), the conversions STUDY/n15-lstsq and
#               STUDY/n22-lstsq, and the reply file seeded with the shipped students' every-turn replies
#     replies   the teacher's replies (vLLM) to the mix's prompts; the chat prompts' are mostly in the seed
#     nNN-ARM   distill (resumable), the long-QA measure alone (qa-nNN-ARM), then the full eval; nNN is n15 or n22,
#               ARM mix or chat
#     shippedNN the students the study began from (soup-long15 and soup22, the -swiftkv50 and -swiftkv25 of then):
#               the long-QA measure alone, then the same eval command
#     qa-STEP   STEP (an arm or shippedNN) up to its long-QA measure, without the full eval: every arm's answer to the
#               study's question first, e.g. `qa-n22-mix qa-n22-chat qa-shipped22 n22-mix n22-chat`
# Every step skips itself when its output exists, so a killed study resumes by running the same command again:
# a distillation from its last --snapshot-every checkpoint, the replies stage from its last written batch, an
# eval from its results cache.
# Environment: STUDY (required; outputs, logs and the swiftkv cache go there), TOKENS (2000896: 2M rounded up to
# whole 2048-token steps, the chat arm's 977 steps), MIX_TOKENS (2224128: a passage-QA prompt is packed whole, so
# the mix's blocks leave about a tenth of their room to filler and cut tails, and it asks for more tokens to train
# about as many steps: 986), QA_SHARE (0.5), PY (the python that has swiftkv's dependencies), EVAL_ARGS (eval
# options after the study's, e.g. a small --limit for a dry run), REPLIES_SEED (reply ids to start from; the
# default, the shipped students' every-turn replies, is restored from the repository's history when missing), QA_SEED
# (the teacher's replies to the mix's passage-QA prompts, appended to the seed), ROOT.
# Bash reads a script as it runs it, so a long study runs a copy: cp scripts/study_long_qa.sh STUDY/ and
#   ROOT=$PWD STUDY=... nohup nice -n 19 bash STUDY/study_long_qa.sh > STUDY/study.log 2>&1 &
set -euo pipefail
ROOT=${ROOT:-"$(cd "$(dirname "$0")/.." && pwd)"}  # the checkout (set it when running a copy of this script)
: "${STUDY:?set STUDY to the folder the study writes to}"
TOKENS=${TOKENS:-2000896}
MIX_TOKENS=${MIX_TOKENS:-2224128}
QA_SHARE=${QA_SHARE:-0.5}
PY=${PY:-$ROOT/.venv/bin/python}
EVAL_ARGS=${EVAL_ARGS:-}
REPLIES_SEED=${REPLIES_SEED:-$ROOT/docs/distill-study/replies-every-ids.jsonl.xz}
QA_SEED=${QA_SEED:-$ROOT/docs/distill-study/long-qa/replies-qa-mix-ids.jsonl.xz}
SEQ_LEN=2048 REPLY_TOKENS=64
REPLIES=$STUDY/replies.jsonl
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_CPU_NUM_OF_RESERVED_CPU=0 SWIFTKV_CACHE=$STUDY/cache PYTHONPATH=$STUDY/code/src
SK="$PY -m swiftkv.cli"
mkdir -p "$STUDY"
cd "$STUDY"

say() { echo "[$(date '+%F %T')] $*"; }
# The split and reply settings every step shares: the shipped students' every-turn split.
SPLIT="--data sharegpt --prompt-turns every --heldout-tokens 16384 --seed 0 --reply-tokens $REPLY_TOKENS"
MIX="--long-share $QA_SHARE --long-kind passage-qa"

setup() {
  if [ ! -f code/COMMIT ]; then
    rm -rf code.tmp && mkdir code.tmp
    git -C "$ROOT" archive HEAD src | tar -x -C code.tmp
    git -C "$ROOT" rev-parse HEAD > code.tmp/COMMIT
    mv code.tmp code
  fi
  say "code: $(cat code/COMMIT)"
  for n in 15 22; do
    [ -f n$n-lstsq/config.json ] && continue
    say "convert N = $n"
    $SK convert smollm2-135m-instruct n$n-lstsq --num-key-value-layers $n --init lstsq > convert$n.log 2>&1
  done
  if [ ! -f "$REPLIES" ]; then
    local listed=${REPLIES_SEED#"$ROOT"/}  # the seed left the tree: restored from history (docs/artifacts.json)
    if [ ! -f "$REPLIES_SEED" ] && grep -qF "\"path\": \"$listed\"" "$ROOT/docs/artifacts.json"; then
      (cd "$ROOT" && "$PY" scripts/restore.py "$listed")
    fi
    if [ -f "$REPLIES_SEED" ]; then xz -dc "$REPLIES_SEED" > "$REPLIES.tmp"; else : > "$REPLIES.tmp"; fi
    # the teacher's replies to the mix's passage-QA prompts, as the replies step wrote them before (1,024; about
    # 25 minutes on 2 cores): a prompt they do not answer (another data code) is written again by that step
    if [ -f "$QA_SEED" ]; then xz -dc "$QA_SEED" >> "$REPLIES.tmp"; fi
    mv "$REPLIES.tmp" "$REPLIES"
    say "replies seeded: $(wc -l < "$REPLIES") records"
  fi
}

replies() {  # the mix's replies (the chat arm's are in the seed: the split's first every-turn prompts)
  [ -f replies.done ] && return
  say "replies: teacher, vLLM"
  $SK replies smollm2-135m-instruct --out "$REPLIES" --tokens "$MIX_TOKENS" $SPLIT $MIX \
    --long-prompt-tokens $((SEQ_LEN - REPLY_TOKENS - 1)) --engine vllm 2>&1 | tee -a replies.log
  touch replies.done
}

evaluate() {  # MODEL NAME: the cards' suite and both long-QA sets, fp32
  [ -f eval-$2/results.json ] && return
  say "eval $2"
  $SK eval "$1" --teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000 --floor --dtype float32 \
    --long-qa default --no-progress --out eval-$2 $EVAL_ARGS 2>&1 | tee -a eval-$2.log
}

long_qa() {  # MODEL NAME: the long-QA measure alone (minutes, where the full suite takes an hour or more), so each
  # arm's answer to the study's question is in before its suite; the same items and settings as the suite's run
  [ -f qa-$2/results.json ] && return
  say "long-QA $2"
  $SK eval "$1" --teacher smollm2-135m-instruct --long-qa default --tasks none --chat-conversations 0 \
    --gen-prompts 0 --long-prompts 0 --floor --dtype float32 --no-progress --out qa-$2 2>&1 | tee -a qa-$2.log
}

start_of() {  # N: the student the study's runs at N start from (the one shipped when it began; its mix run ships since)
  local soup=docs/distill-study/soup-long15-n15-student
  [ "$1" = 22 ] && soup=docs/distill-study/soup22-n22-student
  [ -f "$ROOT/$soup/swiftkv.safetensors" ] || (cd "$ROOT" && "$PY" scripts/restore.py "$soup/swiftkv.safetensors" >&2)
  echo "$ROOT/$soup"
}

arm() {  # N ARM [qa]: distill, the long-QA measure, then (unless qa) the full eval
  local out=n$1-$2 shipped; shipped=$(start_of "$1")
  local data="" tokens=$TOKENS; [ "$2" = mix ] && data=$MIX tokens=$MIX_TOKENS
  if [ ! -f $out/config.json ]; then
    say "distill $out"
    $SK distill n$1-lstsq --recipe swiftkv-lora --lora-rank 128 --init-from $shipped --dtype auto $SPLIT $data \
      --tokens "$tokens" --seq-len $SEQ_LEN --batch-size 1 --micro-batch 1 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.05 \
      --eval-every 100 --checkpoint-every 8 --snapshot-every 600 --teacher-data "$REPLIES" --reply-engine vllm \
      --out $out --json $out.json 2>&1 | tee -a $out.log
  fi
  long_qa $out $out
  [ "${3:-}" = qa ] || evaluate $out $out
}

shipped() {  # N [qa]: the student the runs at N start from, by the same measures as an arm
  local model; model=$(start_of "$1")
  long_qa "$model" shipped$1
  [ "${2:-}" = qa ] || evaluate "$model" shipped$1
}

STEPS=${*:-replies n15-mix n15-chat n22-mix n22-chat shipped15 shipped22}
MEASURED="n15-mix n15-chat n22-mix n22-chat shipped15 shipped22"
for step in $STEPS; do  # every step named right before any work
  case " replies $MEASURED " in *" ${step#qa-} "*) [ "$step" != qa-replies ] && continue ;; esac
  echo "unknown step $step; expected replies, one of $MEASURED, or one of those after qa-" >&2
  exit 2
done
setup
for step in $STEPS; do
  name=${step#qa-} only=""; [ "$name" != "$step" ] && only=qa
  case $name in  # a name checked above
    replies) replies ;;
    shipped*) shipped "${name:7:2}" $only ;;
    *) arm "${name:1:2}" "${name#*-}" $only ;;
  esac
done
say "done: $STEPS"
