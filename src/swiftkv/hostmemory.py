"""This process's host memory (Linux): resident now, and the peak since a given moment, so that a step
(writing a model folder) can report what it added above what the process already held."""

from __future__ import annotations

import re
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def status_mib(field: str) -> float | None:
    """A memory line of /proc/self/status (VmRSS: now, VmHWM: the peak) in MiB; None off Linux."""
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def reset_peak() -> float | None:
    """Start measuring the peak afresh (Linux resets VmHWM, and ru_maxrss with it, to the resident size
    when "5" is written to clear_refs); returns the resident MiB now, None where it cannot be reset."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return None
    return status_mib("VmRSS")


def peak_mib() -> float | None:
    return status_mib("VmHWM")
