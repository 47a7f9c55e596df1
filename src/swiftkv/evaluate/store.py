"""Results cache: every scored request is stored under the model that produced it, so a re-run (or an
interrupted run resumed) with the same model and task recomputes nothing, and a teacher scored once
serves every student compared with it.

One SQLite file; several processes may share it (SQLite serialises the writes).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from ..files import cache_root

# Bump when the way a result is computed changes, so old entries stop matching.
PROTOCOL = "v1"


def default_path() -> Path:
    return cache_root() / "eval" / "results.sqlite"


def request_key(*parts: str) -> str:
    return hashlib.sha256("\x1f".join((PROTOCOL, *parts)).encode()).hexdigest()


class ResultStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=60)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS results (model TEXT, key TEXT, value TEXT, PRIMARY KEY (model, key))"
        )

    def get_many(self, model: str, keys: Iterable[str]) -> dict[str, object]:
        keys = list(dict.fromkeys(keys))
        found = {}
        for start in range(0, len(keys), 500):  # SQLite limits the number of bound parameters
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT key, value FROM results WHERE model = ? AND key IN ({marks})", (model, *chunk)
            )
            found.update((key, json.loads(value)) for key, value in rows)
        return found

    def put_many(self, model: str, items: dict[str, object]) -> None:
        with self.db:  # one transaction per call: a crash loses at most the batch in flight
            self.db.executemany(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?)",
                [(model, key, json.dumps(value)) for key, value in items.items()],
            )

    def close(self) -> None:
        self.db.close()
