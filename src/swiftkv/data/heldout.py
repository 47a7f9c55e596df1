"""The evaluation's held-out chat: ShareGPT records from `sharegpt.HELDOUT_START` on (the last 500
complete records), which no training or calibration run reads. Used by `swiftkv eval` (teacher-forced
agreement, greedy prompts) and by the distillation recipe study.
"""

from __future__ import annotations

import json

from ..files import cache_root, write_atomic
from . import sharegpt
from .chat import Messages


def heldout_conversations() -> list[Messages]:
    """Chat `messages` of the held-out records that have an assistant reply (cached after the first
    call: streaming the 125 MB file takes seconds)."""
    path = cache_root() / "eval" / f"sharegpt-heldout-{sharegpt.HELDOUT_START}.json"
    if not path.is_file():
        conversations = [m for m in (sharegpt.messages_of(r) for _, r in sharegpt.records("heldout")) if m]
        write_atomic(path, json.dumps(conversations))
    return json.loads(path.read_text())
