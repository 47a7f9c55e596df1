"""`python -m swiftkv.cli ...` (what `torchrun -m swiftkv.cli distill ...` runs)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
