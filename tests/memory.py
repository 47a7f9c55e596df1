"""Host memory of the commands that write model folders: random-weight folders of a real model's shape,
written tensor by tensor (a 1B folder is made without holding it), and the peak RSS of a command run
in its own process.

`python -m tests.memory DIR` makes a Llama-3.2-1B-shaped bf16 folder in DIR and prints the peak RSS of
`swiftkv convert` on it with --init copy and with lstsq, as a multiple of the folder's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig

from swiftkv.tensorfiles import write_safetensors
from tests.tiny import random_chats, tiny_tokenizer

# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, vocab 128256, tied).
LLAMA_1B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
}

# Runs `argv` as its only child and prints that child's peak RSS in KiB (Linux reports ru_maxrss in
# KiB): RUSAGE_CHILDREN of a fresh process counts this command alone, not earlier ones of the caller.
PEAK_OF_CHILD = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print("peak-rss-kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.exit(code)
"""


def llama_tensor_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The stored tensors of a plain Llama of `config`, by name, in the order HF saves them."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.mlp.gate_proj.weight": (config.intermediate_size, hidden),
            f"{prefix}.mlp.up_proj.weight": (config.intermediate_size, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, config.intermediate_size),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def random_llama_folder(folder: Path, dtype: torch.dtype = torch.bfloat16, **shape) -> Path:
    """A plain Llama HF folder of `shape` (LlamaConfig keys) with random weights in `dtype` (norms at 1,
    projections at a width-scaled normal, so activations stay finite) and the tiny tokenizer, written one
    tensor at a time: making it needs memory for one tensor, not the model."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.dtype = dtype
    config.architectures = ["LlamaForCausalLM"]
    folder.mkdir(parents=True)
    shapes = llama_tensor_shapes(config)
    generator = torch.Generator().manual_seed(0)

    def produce(name: str) -> torch.Tensor:
        size = shapes[name]
        if len(size) == 1:
            return torch.ones(size, dtype=dtype)
        return (torch.randn(size, generator=generator) * size[-1] ** -0.5).to(dtype)

    layout = [(name, dtype, size) for name, size in shapes.items()]
    write_safetensors(folder / "model.safetensors", layout, produce)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def calibration_text(path: Path, count: int = 1200) -> Path:
    """A JSONL of random chats in the tiny tokenizer's words (calibration data for lstsq)."""
    path.write_text("".join(json.dumps(chat) + "\n" for chat in random_chats(count, seed=3, words=60)))
    return path


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


def peak_rss_bytes(argv: list[str], env: dict | None = None) -> tuple[int, str]:
    """(peak RSS of `argv` run as a process of its own, its combined output); raises if it fails."""
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_CHILD, *argv], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("peak-rss-kib"))
    return int(line.split()[1]) * 1024, result.stdout + result.stderr


def convert_peak(src: Path, dst: Path, *extra: str, env: dict | None = None) -> int:
    """Peak RSS of `swiftkv convert SRC DST --swiftkv-fraction 0.5 ...` in its own process."""
    argv = [sys.executable, "-m", "swiftkv.cli", "convert", str(src), str(dst), "--swiftkv-fraction", "0.5"]
    peak, _ = peak_rss_bytes([*argv, *extra], env)
    return peak


def main(root: str) -> None:
    root = Path(root)
    folder = random_llama_folder(root / "llama-1b", **LLAMA_1B)
    size = folder_bytes(folder)
    print(f"folder: {size / 2**30:.2f} GiB bf16", flush=True)
    data = calibration_text(root / "calib.jsonl")
    runs = {
        "copy": ["--init", "copy", "--no-measure"],
        "lstsq": ["--calib-data", str(data)],  # the default 8192 fit + 2048 held-out tokens
    }
    for name, extra in runs.items():
        peak = convert_peak(folder, root / f"out-{name}", *extra)
        print(
            f"convert --init {name}: peak RSS {peak / 2**30:.2f} GiB = {peak / size:.2f}x the folder",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1])
