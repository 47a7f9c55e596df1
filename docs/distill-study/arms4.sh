# Study round 4's arms: `arm_args ARM` prints the distill options of one arm (sourced by study4.sh and
# speed4.sh, so both run the same definitions).
arm_args() {
  case $1 in
    r13) echo "--recipe swiftkv" ;;
    c1r16) echo "--recipe swiftkv --trainable lora --lora-rank 16 --late-lr 1e-3" ;;
    c1r64) echo "--recipe swiftkv --trainable lora --lora-rank 64 --late-lr 1e-3" ;;
    c2) echo "--recipe swiftkv --trainable late --late-lr 2e-4" ;;
    c3) echo "--recipe swiftkv --trainable late-norms --late-lr 2e-4" ;;
    *) echo "unknown arm $1" >&2; return 2 ;;
  esac
}
