"""The students' compiled layers, carried from one loan to the next.

A fresh GPU machine compiles every layer variant from nothing (`--compile`: Triton kernels on a GPU, each built
by a compiler process), inside the minutes the steps need. So each student keeps what it compiled
(`swiftkv.distill.core.compiled.compiled_artifacts`) in the machine's work folder at every snapshot, the loan bundles
them into one file of OUT when the students are done, and the students of a loan resumed from that OUT
load the bundle before their first step: their layers then compile from cache hits. The cache keys on
the graphs, the torch build and the device, so whatever differs compiles afresh, as without it.

One file, not one per student: a run brings back at most MAX_FILES files (`outputs.py`), and the
snapshots, the replies, the report and the log already take 7.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from swiftkv.distill import load_compiled_artifacts, reason_of
from swiftkv.files import write_atomic

BUNDLE_FILE = "compiled.tar"
# Both students' snapshots (~46 MiB at N = 15 and 22), the replies and the code carried into the next
# run leave about 15 MiB of its upload (stage.TRANSFER_MIB).
BUNDLE_LIMIT = 12 * 2**20


def bundle_artifacts(kept: list[Path], out: Path, say: Callable[[str], None]) -> None:
    """The students' kept artifacts (those that exist) as OUT/compiled.tar, if they fit BUNDLE_LIMIT."""
    present = [path for path in kept if path.is_file()]
    if not present:
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in present:
            tar.add(path, arcname=path.name)
    size = buffer.tell()
    if size > BUNDLE_LIMIT:
        say(
            f"compiled artifacts: {size / 2**20:.1f} MiB, over the {BUNDLE_LIMIT / 2**20:.0f} MiB a loan "
            "brings back; the next loan compiles afresh"
        )
        return
    write_atomic(out / BUNDLE_FILE, buffer.getvalue())
    say(f"compiled artifacts of {len(present)} student(s): {size / 2**20:.1f} MiB in {out / BUNDLE_FILE}")


def load_bundle(path: Path, log: Callable[[str], None]) -> None:
    """Every student's artifacts in a previous loan's bundle, hot-loaded (an absent bundle: nothing; an
    unreadable one: said, and the layers compile from nothing)."""
    if not path.is_file():
        return
    try:
        with tarfile.open(path) as tar:
            kept = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError) as error:
        log(f"--compile: {path} not read ({reason_of(error)}); compiling from nothing")
        return
    for name, data in kept.items():
        load_compiled_artifacts(data, f"{path}:{name}", log)
