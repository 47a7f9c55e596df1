#!/bin/bash
# The teacher's greedy replies (64 tokens at most, static writer) to every every-turn train prompt of
# ShareGPT (distill's seed-0 split, 16,384 held-out tokens), written ahead on a CPU so that a GPU loan
# trains instead of writing (issue 32 item 3). Resumable across sessions and machines:
#   SWIFTKV_SRC=<worktree>/src bash scripts/study/distill/every.sh   # rerun to continue; Ctrl-C loses one call
# It seeds $RUNS/replies-every.jsonl from the ids (replies-every-ids.jsonl.xz, itself seeded from the 8M-token
# student's replies-8m; restored from history, docs/artifacts.json), appends the missing replies, and rewrites
# the ids file.
# --tokens 40M is more than the prompts hold (~18M train tokens): the writer stops at the last prompt.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
exec env SWIFTKV_SRC="${SWIFTKV_SRC:-$ROOT/src}" TOKENS=40M REPLIES=replies-every.jsonl \
  REPLY_ENGINE=static bash "$(dirname "$0")/final5.sh" c1r64bfe replies ids
