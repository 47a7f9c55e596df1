"""`python -m loan stage TEACHER --out STAGE`: everything a rented GPU trains the students from, staged on
a CPU into two folders, each small enough for one transfer beside the code (TRANSFER_MIB).

The GPU machine this was written for has no network and takes TRANSFER_MIB per upload, the code included,
and keeps its files only between calls close together. So the teacher travels as it is stored (the 98 MB
GGUF of SmolLM2 is smaller than any dequantized copy), cut in two; the replies are written on the GPU,
except those written ahead on a CPU (`--replies`); the lstsq init is not staged but fitted there from the
calibration blocks convert would use. What is staged:

  part1/teacher.tar.0      the first bytes of the teacher (a tar of the .gguf file, or of an HF folder)
  part2/teacher.tar.1      the rest
  part2/prompts.npz.xz     the train prompts as token ids: every user turn of the train chats, with the
                           conversation before it, in the order distill's split takes them; a chat's
                           prompts are prefixes of its last one, so each chat's tokens are stored once
  part2/blocks.pt          the calibration blocks (convert's lstsq fit) and the held-out blocks (distill's)
  part2/replies.npz.xz     with --replies: the teacher's replies written ahead, to the prompts from the
                           first up to the first one they do not answer; the GPU run writes only the rest
  part2/site.tar.xz        the `gguf` package transformers reads a GGUF with (GGUF teachers only)
  part2/stage.json         what was staged and how: sizes, digests, the split's settings

`need` is the one check of a staged file: a missing one is named with the stage that writes it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import lzma
import subprocess
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from swiftkv.convert import ConvertSettings
from swiftkv.convert.calibration import token_blocks
from swiftkv.data.chat import read_source
from swiftkv.data.packing import pack
from swiftkv.data.split import shuffled, take_documents
from swiftkv.data.tokens import MAX_PROMPT_TOKENS, prompt_key, turn_prompts
from swiftkv.files import atomic_output_dir
from swiftkv.replies import REPLY_TOKENS, read_replies
from swiftkv.settings import parse_count, setting
from swiftkv.sources import SMOLLM2_ALIAS, open_source, smollm2_gguf

MIB = 2**20
ROOT = Path(__file__).resolve().parents[3]  # the checkout (scripts/gpu/loan/stage.py)
# Settings of the GPU machine these scripts were written for, not of swiftkv: one upload carried at most
# TRANSFER_MIB, the checkout's files included; MARGIN_MIB is left free in each part for files the checkout
# gains before the run.
TRANSFER_MIB = 64
MARGIN_MIB = 1
PARTS = ("part1", "part2")
STAGE_FILE = "stage.json"
PROMPTS_FILE = "prompts.npz.xz"
REPLIES_FILE = "replies.npz.xz"  # replies aligned with the prompts: staged ahead, or written by a loan
BLOCKS_FILE = "blocks.pt"
SITE_FILE = "site.tar.xz"
TEACHER_TAR = "teacher.tar"


@dataclass
class StageSettings:
    teacher: str = setting(None, "the teacher: an HF folder, a .gguf file or an alias", cli=False)
    out: str | None = setting(None, "the stage folder (part1/ and part2/ inside, written atomically)")
    data: str = setting(
        "sharegpt", "the chats whose prompts the teacher answers on the GPU (the --data grammar)"
    )
    tokens: int = setting(
        32_000_000,
        "train tokens wanted (prompt + a full reply each); the stage stops there or where the data ends",
        parse=parse_count,
    )
    heldout_tokens: int = setting(16_384, "held-out tokens (distill's --heldout-tokens)", parse=parse_count)
    seed: int = setting(0, "the split's seed (distill's --seed)")
    seq_len: int = setting(1024, "tokens per packed block (distill's --seq-len)")
    reply_tokens: int = setting(REPLY_TOKENS, "most tokens of a written reply (distill's --reply-tokens)")
    replies: str | None = setting(
        None,
        "teacher replies written ahead (`swiftkv replies --prompt-turns every` on the same --data and --seed, "
        "or its records' ids as .jsonl.xz): they answer the staged prompts from the first on, and the loan "
        "writes only the rest",
    )
    calib_tokens: int = setting(
        ConvertSettings.calib_tokens, "calibration tokens of the lstsq init (convert's --calib-tokens)"
    )
    tree_mib: float | None = setting(
        None, "MiB of the code that travels beside each part (default: this checkout's files, measured)"
    )


def checkout_files(root: Path = ROOT) -> list[Path]:
    """The checkout's files as an upload of it carries them, relative to the root: tracked and
    untracked-not-ignored, present."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return [Path(name.decode()) for name in listed if name and (root / name.decode()).is_file()]


def checkout_mib(root: Path = ROOT) -> float:
    """MiB of the checkout an upload carries beside a part."""
    return sum((root / f).stat().st_size for f in checkout_files(root)) / MIB


def need(path: Path, stage: str) -> Path:
    """`path`, or one error naming the missing file and the stage that writes it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; it is written by {stage}")
    return path


def staged(stage: Path, name: str) -> Path:
    """A staged file of part 2 (the part the run reads), checked."""
    return need(stage / "part2" / name, "`python -m loan stage` (part2, carried by the second call)")


def write_stage(settings: StageSettings) -> dict:
    """Write the stage folder; returns its manifest (also `part2/stage.json`). Every part is checked
    against the transfer limit before anything is written."""
    if not settings.out:
        raise ValueError("--out is required: the stage folder")
    teacher = open_source(settings.teacher)
    tokenizer = teacher.load_tokenizer()
    split = iter(shuffled(read_source(settings.data), settings.seed))
    heldout = take_documents(split, tokenizer, settings.heldout_tokens)  # distill's held-out part, first
    prompts, prompts_summary = train_prompts(settings, tokenizer, split)
    written_ahead, replies_summary = staged_replies(settings, decode_ids(prompts))
    blocks = staged_blocks(settings, tokenizer, heldout)
    teacher_tar, teacher_path = teacher_archive(settings.teacher, teacher.folder)
    site = gguf_site() if teacher_path.endswith(".gguf") else None
    tree = settings.tree_mib if settings.tree_mib is not None else checkout_mib()
    room = (TRANSFER_MIB - MARGIN_MIB - tree) * MIB
    small = {
        PROMPTS_FILE: prompts,
        BLOCKS_FILE: blocks,
        **({SITE_FILE: site} if site else {}),
        **({REPLIES_FILE: written_ahead} if written_ahead else {}),
    }
    rest = len(teacher_tar) - int(room)
    if rest + sum(map(len, small.values())) > room:
        raise ValueError(
            f"the stage needs {(len(teacher_tar) + sum(map(len, small.values()))) / MIB:.1f} MiB, more than "
            f"two transfers hold beside {tree:.1f} MiB of code ({2 * room / MIB:.1f} MiB); stage fewer "
            "--tokens, or make the checkout smaller"
        )
    files = {
        "part1": {f"{TEACHER_TAR}.0": teacher_tar[: max(0, int(room))]},
        "part2": {f"{TEACHER_TAR}.1": teacher_tar[max(0, int(room)) :], **small},
    }
    manifest = {
        "settings": asdict(settings),
        "teacher": {"name": str(settings.teacher), "path": teacher_path, "tar_sha256": sha256(teacher_tar)},
        "tokenizer_eos": tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
        "prompts": prompts_summary,
        "replies": replies_summary,
        "tree_mib": round(tree, 1),
        "parts_mib": {p: round(sum(map(len, f.values())) / MIB, 2) for p, f in files.items()},
    }
    with atomic_output_dir(settings.out, force=True) as tmp:
        for part, contents in files.items():
            (tmp / part).mkdir()
            for name, data in contents.items():
                (tmp / part / name).write_bytes(data)
        (tmp / "part2" / STAGE_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------------
# What is staged
# --------------------------------------------------------------------------------------------------


def train_prompts(settings: StageSettings, tokenizer, rest) -> tuple[bytes, dict]:
    """The train prompts distill's split would answer (`--prompt-turns every`): `rest` is the seeded
    shuffle after the held-out documents; every user turn of each chat with its context, until `tokens` of
    prompt + full reply. Stored as one token stream (each chat's last prompt, which holds the others as
    prefixes; a prompt that is not one is stored on its own) plus each prompt's start and length; with
    their count, tokens and compressed size."""
    stream: list[int] = []
    starts, lengths = [], []
    wanted = settings.tokens
    for example in rest:
        if wanted <= 0:
            break
        found = [
            ids for _, ids in turn_prompts(tokenizer, example, every_turn=True, max_tokens=MAX_PROMPT_TOKENS)
        ]
        if not found:
            continue
        base = len(stream)
        stream += found[-1]
        for ids in found:
            if found[-1][: len(ids)] != ids:
                starts.append(len(stream))
                stream += ids
            else:
                starts.append(base)
            lengths.append(len(ids))
            wanted -= len(ids) + settings.reply_tokens
    if not lengths:
        raise ValueError(f"--data {settings.data!r} has no train chat with a user turn to answer")
    data = encode_ids(stream, starts, lengths)
    return data, {
        "prompts": len(lengths),
        "prompt_tokens": sum(lengths),
        "compressed_mib": round(len(data) / MIB, 2),
    }


def staged_replies(settings: StageSettings, prompts: list[list[int]]) -> tuple[bytes | None, dict]:
    """The replies written ahead (`--replies`) to the staged prompts from the first up to the first they
    do not answer (the loan writes the rest in order), encoded as the loan writes its own; with their
    count and source."""
    if not settings.replies:
        return None, {"staged": 0}
    path = Path(settings.replies)
    if not path.is_file():
        raise FileNotFoundError(f"--replies {path} does not exist; write it with `swiftkv replies`")
    replies = read_replies(path)
    answered = []
    for prompt in prompts:
        reply = replies.get(prompt_key(prompt))
        if reply is None:
            break
        if len(reply.ids) > settings.reply_tokens:
            raise ValueError(
                f"--replies {path}: a reply of {len(reply.ids)} tokens, more than --reply-tokens "
                f"{settings.reply_tokens}; write the replies with the stage's --reply-tokens"
            )
        answered.append(reply.ids)
    if not answered:
        raise ValueError(
            f"--replies {path} answers none of the staged prompts from the first; write it with "
            f"`swiftkv replies --prompt-turns every` on --data {settings.data} and --seed {settings.seed}"
        )
    return encode_lists(answered), {"staged": len(answered), "from": str(path)}


def encode_ids(stream: list[int], starts: list[int], lengths: list[int]) -> bytes:
    """Token id lists as one stream plus each list's start and length, xz-compressed (uint16 ids where
    the vocabulary allows: a prompt stream then takes 2 bytes per token before compression)."""
    dtype = np.uint16 if max(stream, default=0) < 2**16 else np.uint32
    buffer = io.BytesIO()
    np.savez(
        buffer,
        tokens=np.asarray(stream, dtype=dtype),
        starts=np.asarray(starts, dtype=np.int64),
        lengths=np.asarray(lengths, dtype=np.int32),
    )
    return lzma.compress(buffer.getvalue(), preset=6)


def encode_lists(lists: list[list[int]]) -> bytes:
    """`encode_ids` of lists stored one after another (the written replies)."""
    lengths = [len(ids) for ids in lists]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64).tolist() if lists else []
    return encode_ids([t for ids in lists for t in ids], starts, lengths)


def decode_ids(data: bytes) -> list[list[int]]:
    """The token id lists of `encode_ids`, in order."""
    arrays = np.load(io.BytesIO(lzma.decompress(data)))
    tokens, starts, lengths = arrays["tokens"], arrays["starts"], arrays["lengths"]
    return [tokens[s : s + n].astype(np.int64).tolist() for s, n in zip(starts, lengths, strict=True)]


def staged_blocks(settings: StageSettings, tokenizer, heldout_docs) -> bytes:
    """Convert's calibration fit blocks (its defaults: the same lstsq init as `swiftkv convert --init
    lstsq`) and distill's held-out blocks (the same held-out KL as `swiftkv distill`)."""
    fit, _ = token_blocks(tokenizer, settings.data, settings.calib_tokens, ConvertSettings.eval_tokens)
    heldout = pack(
        heldout_docs, settings.seq_len, max_blocks=max(1, settings.heldout_tokens // settings.seq_len)
    )
    buffer = io.BytesIO()
    torch.save({"calibration": torch.stack(fit), "heldout": vars(heldout)}, buffer)
    return buffer.getvalue()


def teacher_archive(name: str, folder: Path) -> tuple[bytes, str]:
    """(a tar of the teacher as stored, the path inside it that `open_source` takes): the GGUF file of a
    GGUF source (smaller than its dequantized folder), else the HF folder's files."""
    text = str(name)
    gguf = smollm2_gguf() if text == SMOLLM2_ALIAS else Path(text) if text.endswith(".gguf") else None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if gguf is not None:
            tar.add(gguf, arcname=gguf.name)
            inside = gguf.name
        else:
            for path in sorted(Path(folder).iterdir()):
                tar.add(path, arcname=f"teacher/{path.name}")
            inside = "teacher"
    return buffer.getvalue(), inside


def gguf_site() -> bytes:
    """The installed `gguf` package with its metadata (transformers checks its version), as a tar.xz."""
    distribution = importlib.metadata.distribution("gguf")
    root = Path(distribution.locate_file(""))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        tar.add(root / "gguf", arcname="gguf", filter=lambda t: None if "__pycache__" in t.name else t)
        tar.add(Path(distribution._path), arcname=Path(distribution._path).name)  # noqa: SLF001 - its dist-info
    return buffer.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
