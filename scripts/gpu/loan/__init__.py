"""Students trained on a rented GPU: staged here, trained there, brought back and installed here.

Run from scripts/gpu (`cd scripts/gpu && python -m loan STEP ...`, or with scripts/gpu on PYTHONPATH); it
imports swiftkv as any user code does, and swiftkv never imports it. `gpu_students.sh` drives the steps on
the GPU machine. The limits of the machine it was written for (an upload's size, the files a run brings
back) are named settings in stage.py and outputs.py.

stage.py     here, on a CPU: the teacher (split in two parts), the train prompts as token ids, the
             calibration and held-out blocks, written into the two folders the two uploads carry
students.py  on the GPU (or a CPU, as the suite's dry-run): the teacher's replies, the 8B-shaped
             trainer measurement, then every student trained in parallel, snapshots under --out
student.py   one student's process: lstsq init, packed blocks, the trainer's steps, snapshots
             (swiftkv.distill.start.snapshot, cut into files of at most SNAPSHOT_FILE_BYTES)
shape.py     the trainer on a randomly initialised model of a given shape (Llama-3.1-8B)
artifacts.py the students' compiled layers, carried from one run to the next
replies.py   here again: a run's replies merged into the reply file CPU runs and the next stage read
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]  # scripts/gpu: where `loan` and `outputs` import from


def module_command(module: str, *args: str) -> tuple[list[str], dict]:
    """(the command, its environment) that runs `loan.<module>` in a process of its own, wherever this one
    was started from."""
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-m", f"loan.{module}", *args], {**os.environ, "PYTHONPATH": path}
