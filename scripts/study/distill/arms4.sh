# Study round 4's arms: `arm_args ARM` prints the distill options of one arm (sourced by study4.sh and
# speed4.sh, so both run the same definitions).
arm_args() {
  case $1 in
    r13) echo "--recipe swiftkv" ;;
    c1r16) echo "--recipe swiftkv --trainable lora --lora-rank 16 --late-lr 1e-3" ;;
    c1r64) echo "--recipe swiftkv --trainable lora --lora-rank 64 --late-lr 1e-3" ;;
    c2) echo "--recipe swiftkv --trainable late --late-lr 2e-4" ;;
    # Issue 32's larger step: c1r64 at 16 blocks per step (8x the study's), both rates scaled by sqrt(8),
    # the usual rule for AdamW when the batch grows; a GPU needs such steps to leave the launch-bound regime.
    c1r64b16) echo "--recipe swiftkv --trainable lora --lora-rank 64 --batch-size 16 --micro-batch 2 --lr 5.7e-3 --late-lr 2.8e-3" ;;
    # The same at 8 blocks per step (4x), both rates x2: the 16-block step missed by 0.032 held-out KL.
    c1r64b8) echo "--recipe swiftkv --trainable lora --lora-rank 64 --batch-size 8 --micro-batch 2 --lr 4e-3 --late-lr 2e-3" ;;
    # 8 blocks at 3x both rates (between the sqrt rule's 2x and the linear rule's 4x): at 2x the 8-block step
    # trailed the control at every held-out point (0.008 KL at 0.82M tokens, 0.015 at 1.64M, 0.010 at 2M).
    c1r64b8x3) echo "--recipe swiftkv --trainable lora --lora-rank 64 --batch-size 8 --micro-batch 2 --lr 6e-3 --late-lr 3e-3 --dtype bfloat16" ;;
    # The 2-block control in bf16 (final5's ran in fp32 on another Xeon): the larger-step arms above ran in bf16.
    c1r64bf) echo "--recipe swiftkv --trainable lora --lora-rank 64 --late-lr 1e-3 --dtype bfloat16" ;;
    # Issue 32 item 5, more tokens on a CPU: the bf16 control over every user turn (first turns hold ~5.4M
    # tokens of ShareGPT's train split, fewer than the 8M this arm trains on).
    c1r64bfe) echo "--recipe swiftkv --trainable lora --lora-rank 64 --late-lr 1e-3 --dtype bfloat16 --prompt-turns every" ;;
    # Students trained on a lent GPU (`swiftkv loan`): only their trainable set matters here, to ship them with
    # `final5.sh loan ship15 ship22` once `swiftkv loan install <files>/n15 --out $RUNS/final5-loan-n15` (and n22) ran.
    loan) echo "--recipe swiftkv-lora" ;;
    c3) echo "--recipe swiftkv --trainable late-norms --late-lr 2e-4" ;;
    # Long prompts in the mix (item 3): a quarter of the written tokens answer 1-2k-token prompts, so a
    # block holds 2048 tokens, one block per step (the same 2048 tokens per step as R13); l0 is the same
    # blocks without long prompts, to tell the block length from the long prompts. Their replies are
    # appended to a copy of the study's reply file, which the other arms keep reading.
    l0) echo "--recipe swiftkv --seq-len 2048 --batch-size 1 --teacher-data replies-64-long.jsonl" ;;
    l1) echo "--recipe swiftkv --seq-len 2048 --batch-size 1 --long-share 0.25 --teacher-data replies-64-long.jsonl" ;;
    *) echo "unknown arm $1" >&2; return 2 ;;
  esac
}
