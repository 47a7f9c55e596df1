"""Every model folder swiftkv writes (convert, distill, export) goes through one writer, so each opens
with plain transformers and trust_remote_code=True in a process that never imported swiftkv."""

from __future__ import annotations

import json
import subprocess
import sys

from swiftkv.cli import main
from tests.test_distill_cli import TRAIN_ARGS
from tests.tiny import WORDS, random_chats, save_tiny_folder, save_tiny_teacher, write_jsonl

LOAD = """
import sys
from transformers import AutoModelForCausalLM
assert "swiftkv" not in sys.modules
print(type(AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)).__name__)
"""


def load_in_fresh_process(folder) -> str:
    """The class a new Python process that never imported swiftkv opens `folder` as."""
    done = subprocess.run([sys.executable, "-c", LOAD, str(folder)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_convert_distill_and_export_outputs_load_with_trust_remote_code(tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher", "llama")
    calib = tmp_path / "text.txt"
    calib.write_text(" ".join(WORDS[(7 * i) % len(WORDS)] for i in range(3000)))
    converted, distilled = tmp_path / "converted", tmp_path / "distilled"
    assert (
        main(
            [
                "convert",
                str(teacher),
                str(converted),
                "--num-key-value-layers",
                "3",
                "--init",
                "copy",
                "--calib-data",
                str(calib),
                "--calib-tokens",
                "512",
                "--eval-tokens",
                "256",
            ]
        )
        == 0
    )
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    assert main(["distill", str(converted), "--data", str(data), "--out", str(distilled), *TRAIN_ARGS]) == 0
    assert (distilled / "swiftkv_auto.py").is_file()
    # A SwiftKV folder written by someone else (plain save_pretrained: no auto_map, no shim) gains both on export.
    foreign = save_tiny_folder(tmp_path / "foreign")
    assert main(["export", str(distilled), str(tmp_path / "export-distilled")]) == 0
    assert main(["export", str(foreign), str(tmp_path / "export-foreign")]) == 0
    assert "auto_map" in json.loads((tmp_path / "export-foreign" / "config.json").read_text())
    for folder in (converted, distilled, tmp_path / "export-distilled", tmp_path / "export-foreign"):
        assert load_in_fresh_process(folder) == "LlamaSwiftKVForCausalLM", folder


def test_plain_folders_get_no_shim(tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher", "llama")
    assert main(["export", str(teacher), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "swiftkv_auto.py").exists()
    assert "auto_map" not in json.loads((tmp_path / "out" / "config.json").read_text())


def test_every_family_converts_into_a_folder_that_loads_with_trust_remote_code(tmp_path):
    """The shim the writer adds names each family's classes: a Qwen2, a Qwen3 and a Mistral conversion
    (the latter a llama_swiftkv folder) open in a fresh process too."""
    calib = tmp_path / "text.txt"
    calib.write_text(" ".join(WORDS[(7 * i) % len(WORDS)] for i in range(3000)))
    expected = {
        "qwen2": "Qwen2SwiftKVForCausalLM",
        "qwen3": "Qwen3SwiftKVForCausalLM",
        "mistral": "LlamaSwiftKVForCausalLM",
    }
    for arch, name in expected.items():
        out = tmp_path / f"{arch}-converted"
        assert (
            main(
                [
                    "convert",
                    str(save_tiny_teacher(tmp_path / arch, arch)),
                    str(out),
                    "--num-key-value-layers",
                    "3",
                    "--init",
                    "copy",
                    "--calib-data",
                    str(calib),
                    "--calib-tokens",
                    "512",
                    "--eval-tokens",
                    "256",
                ]
            )
            == 0
        )
        assert load_in_fresh_process(out) == name, arch
