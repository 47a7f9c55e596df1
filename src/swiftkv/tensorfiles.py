"""The weight files of an HF folder, read and written one tensor at a time, so that copying a model
folder with a few tensors added, replaced or dropped (convert, distill's output) never holds the
whole model in memory: a 70B model's folder is 140 GB, and the host holding it may have less.

Reading: `FolderTensors` lists every tensor from the safetensors headers (a few KB) and reads one
when it is asked for. Writing: `write_safetensors` writes a header naming every tensor's dtype and
shape first, then each tensor's bytes as it is produced, in the safetensors layout (8-byte header
length, JSON header padded to 8 bytes, the tensors back to back in header order).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

# The safetensors dtype names (the format's own) and the torch dtypes they hold.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HEADER_ALIGNMENT = 8  # safetensors pads its JSON header so the data starts 8-byte aligned


@dataclass(frozen=True)
class TensorEntry:
    """Where a stored tensor lies and what it is, from its file's header alone."""

    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


def stored_tensors(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Each tensor of a safetensors file, in the file's order: its dtype code ("BF16", ...) and shape, read
    from the header by safetensors itself."""
    try:
        with safe_open(path, framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.offset_keys()}
            return {name: (part.get_dtype(), part.get_shape()) for name, part in slices.items()}
    except SafetensorError as error:
        raise ValueError(
            f"cannot load the weights of {path.parent}: {path.name} is not a safetensors file ({error})"
        ) from error


class FolderTensors(Mapping):
    """The tensors of a folder's `*.safetensors` files by name, read from disk one at a time when
    indexed (nothing is read when the folder is opened but the headers). A folder of pickled
    `*.bin` files is memory-mapped instead: the same interface, the pages read as they are used."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.entries: dict[str, TensorEntry] = {}
        self._pickled: dict[str, torch.Tensor] = {}
        files = sorted(self.folder.glob("*.safetensors"))
        for path in files:
            for name, (dtype, shape) in stored_tensors(path).items():
                self.entries[name] = TensorEntry(path.name, SAFETENSORS_DTYPES[dtype], tuple(shape))
        if not files:
            for path in sorted(self.folder.glob("*.bin")):
                tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                self._pickled.update(tensors)
                for name, tensor in tensors.items():
                    self.entries[name] = TensorEntry(path.name, tensor.dtype, tuple(tensor.shape))
        if not self.entries:
            raise FileNotFoundError(f"{self.folder} has no model weights (*.safetensors or *.bin)")

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._pickled:
            return self._pickled[name].clone()
        entry = self.entries[name]  # KeyError for a name the folder does not hold, as a dict would
        with safe_open(self.folder / entry.file, framework="pt") as handle:
            return handle.get_tensor(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows `start:stop` (along dim 0) of a stored tensor, reading only their bytes: a sharded
        start reads each process's own rows of every tensor this way (distill/start/sharded.py)."""
        if name in self._pickled:
            return self._pickled[name][start:stop].clone()  # memory-mapped: only these pages are read
        entry = self.entries[name]
        with safe_open(self.folder / entry.file, framework="pt") as handle:
            return handle.get_slice(name)[start:stop]

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def files(self) -> list[str]:
        """The weight files, in the order their tensors are listed."""
        return list(dict.fromkeys(entry.file for entry in self.entries.values()))

    def main_dtype(self) -> torch.dtype:
        """The floating dtype most of the weights' bytes are stored in (a bf16 model's, even where a
        few norms are kept in fp32)."""
        totals: dict[torch.dtype, int] = {}
        for entry in self.entries.values():
            if entry.dtype.is_floating_point:
                totals[entry.dtype] = totals.get(entry.dtype, 0) + entry.nbytes
        return max(totals, key=totals.get) if totals else torch.float32

    def total_bytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries.values())


def write_safetensors(
    path: Path,
    layout: list[tuple[str, torch.dtype, tuple[int, ...]]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> None:
    """A safetensors file holding `layout`'s tensors (name, dtype, shape) in that order, each asked of
    `produce(name)` only when its bytes are written and dropped after: one tensor in memory at a
    time. A produced tensor of another dtype is cast; one of another shape is a bug and raises."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape in layout:
        size = TensorEntry("", dtype, shape).nbytes
        header[name] = {
            "dtype": DTYPE_CODES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % HEADER_ALIGNMENT)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for name, dtype, shape in layout:
            tensor = produce(name)
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}; its file declares {shape}")
            data = tensor.detach().to("cpu", dtype).contiguous()
            if data.numel():
                handle.write(data.reshape(-1).view(torch.uint8).numpy().data)
            del tensor, data


def output_files(source: FolderTensors) -> dict[str, str]:
    """The file each source weight file becomes: its own name, a pickled `*.bin` as safetensors."""
    return {
        name: name
        if name.endswith(".safetensors")
        else name.replace("pytorch_model", "model").removesuffix(".bin") + ".safetensors"
        for name in source.files
    }


def neighbour(name: str) -> str:
    """The source tensor a new SwiftKV tensor is written beside: its name without `_swiftkv`
    (q_proj_swiftkv beside q_proj, norm_swiftkv beside norm)."""
    return name.replace("_swiftkv", "")


@dataclass
class FolderLayout:
    """Which tensors each output weight file holds, in order, with their dtype and shape."""

    files: dict[str, list[tuple[str, torch.dtype, tuple[int, ...]]]]

    def names(self) -> Iterable[str]:
        return (name for layout in self.files.values() for name, _, _ in layout)

    def index(self) -> dict:
        """model.safetensors.index.json's content (written unless the one file is model.safetensors)."""
        weight_map = {name: file for file, layout in self.files.items() for name, _, _ in layout}
        total = sum(TensorEntry("", d, s).nbytes for layout in self.files.values() for _, d, s in layout)
        return {"metadata": {"total_size": total}, "weight_map": weight_map}


def folder_layout(
    source: FolderTensors,
    kept: Callable[[str], bool],
    added: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    dtype: torch.dtype | None = None,
) -> FolderLayout:
    """The output's files: the source's tensors that are `kept`, in their files and order, each in its
    stored dtype (or `dtype`, for floating ones); each `added` tensor (name -> dtype, shape) right after
    its `neighbour` (whether that is kept or not), or at the end of the last file when the source has none."""
    renamed = output_files(source)
    files: dict[str, list] = {renamed[file]: [] for file in source.files}
    after: dict[str, list[str]] = {}
    for name in added:
        after.setdefault(neighbour(name) if neighbour(name) in source.entries else "", []).append(name)
    for name, entry in source.entries.items():
        stored = dtype if dtype is not None and entry.dtype.is_floating_point else entry.dtype
        files[renamed[entry.file]] += [(name, stored, entry.shape)] if kept(name) else []
        files[renamed[entry.file]] += [(new, *added[new]) for new in after.get(name, [])]
    files[list(files)[-1]] += [(new, *added[new]) for new in after.get("", [])]
    return FolderLayout({file: layout for file, layout in files.items() if layout})


def write_layout(folder: Path, layout: FolderLayout, produce: Callable[[str], torch.Tensor]) -> None:
    """Every file of `layout` into `folder` (and the index it needs), tensor by tensor."""
    for file, tensors in layout.files.items():
        write_safetensors(folder / file, tensors, produce)
    if list(layout.files) != [SINGLE_FILE]:  # transformers reads one file without an index by this name only
        (folder / INDEX_FILE).write_text(json.dumps(layout.index(), indent=2) + "\n")


def copy_weights(
    source: FolderTensors,
    folder: Path | None,
    kept: Callable[[str], bool] = lambda name: True,
    added: Mapping[str, torch.Tensor] | None = None,
    replaced: Mapping[str, Callable[[], torch.Tensor]] | None = None,
    dtype: torch.dtype | None = None,
    write: bool = True,
) -> FolderLayout:
    """The source's weight files copied into `folder` tensor by tensor: those `kept` (in `dtype`, or as
    stored), with `added` tensors (in memory, new names) beside their neighbours and `replaced` ones
    (source names, each produced when it is written and cast to its stored dtype). `write=False` only
    produces the replaced tensors, in the order they would be written (see `write_layout`)."""
    added, replaced = added or {}, replaced or {}
    unknown = sorted(set(replaced) - set(source.entries))
    if unknown:
        raise ValueError(f"cannot replace {unknown[:3]}: {source.folder} has no such tensors")
    clashing = sorted(set(added) & set(source.entries))
    if clashing:
        raise ValueError(f"cannot add {clashing[:3]}: {source.folder} holds them already")
    layout = folder_layout(
        source, kept, {name: (t.dtype, tuple(t.shape)) for name, t in added.items()}, dtype
    )

    def produce(name: str) -> torch.Tensor:
        if name in replaced:
            return replaced[name]()
        return added[name] if name in added else source[name]

    if write:
        write_layout(folder, layout, produce)
    else:
        for name in layout.names():
            if name in replaced:
                replaced[name]()
    return layout
