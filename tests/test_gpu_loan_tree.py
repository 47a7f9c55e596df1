"""What an upload of the checkout carries beside a stage part (scripts/gpu/loan/stage.py): its tracked and
untracked-not-ignored files, measured as `python -m loan stage` sizes its parts by."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))

from loan.stage import MIB, checkout_files, checkout_mib  # noqa: E402

FILES = {
    "src/swiftkv/model.py": b"code" * 100,
    "src/swiftkv/weights/student/swiftkv.safetensors": b"w" * 5000,
    "docs/history.md": b"# history\n",
    "tests/test_x.py": b"def test(): pass\n",
}


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "repo"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / ".gitignore").write_text(".devdata/\n")
    (root / ".devdata").mkdir()
    (root / ".devdata" / "part1.bin").write_bytes(b"x" * 9000)  # ignored: carried by name, never counted
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=root, check=True)
    (root / "docs" / "new-record.json").write_bytes(b"n" * 700)  # untracked, not ignored: it travels
    (root / "tests" / "test_x.py").unlink()  # tracked but deleted: nothing to carry
    return root


def test_the_checkout_an_upload_carries_is_tracked_and_untracked_not_ignored_files(checkout):
    sent = {str(f) for f in checkout_files(checkout)}
    assert sent == set(FILES) - {"tests/test_x.py"} | {".gitignore", "docs/new-record.json"}
    carried = sum(len(d) for n, d in FILES.items() if n != "tests/test_x.py") + len(".devdata/\n") + 700
    assert checkout_mib(checkout) == pytest.approx(carried / MIB)
