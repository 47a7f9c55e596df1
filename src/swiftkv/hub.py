"""Models named by Hugging Face Hub repo id (`meta-llama/Llama-3.1-8B-Instruct`), fetched through
`huggingface_hub` into its cache, the one transformers and vLLM read: a model already downloaded for
either is not downloaded again, and with HF_HUB_OFFLINE=1 a cached id works without the network.

Only the files a model needs are fetched (its config, tokenizer, safetensors weights and their index,
its generation config), not the other formats many repos also carry (.bin, .gguf, .onnx, ...)."""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

# `org/name`: what the Hub accepts as a model id (letters, digits, `-`, `_`, `.`), one slash.
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")

CONFIG_FILES = ["config.json"]
MODEL_FILES = [
    *CONFIG_FILES,
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
]


def is_repo_id(text: str) -> bool:
    """Whether a model source names a Hub repo: the `org/name` shape, and not a folder or file that exists
    here (a local path wins, as in transformers), nor a `.gguf` or `.json` file name."""
    text = str(text)
    return (
        REPO_ID.fullmatch(text) is not None
        and not text.endswith((".gguf", ".json"))
        and not Path(text).exists()
    )


def resolve(repo_id: str, revision: str | None = None, files: list[str] = MODEL_FILES) -> Path:
    """The cached snapshot folder of `repo_id` at `revision` (default: the main branch), holding `files`
    (glob patterns), downloaded first unless they are cached. A repo that cannot be had (offline and not
    cached, unknown, gated) is one error naming it and how to get it."""
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=files))
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(not_cached_message(repo_id, revision, error)) from error
    except HfHubHTTPError as error:
        raise FileNotFoundError(
            f"Hub model {described(repo_id, revision)} cannot be downloaded: {first_line(error)}"
        ) from error


def not_cached_message(repo_id: str, revision: str | None, error: Exception) -> str:
    fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE=1 forbids downloading it"
    else:
        why = f"the Hub could not be reached ({first_line(error)})"
    # A mistyped local folder (`out/skv50`) has the same shape as an id: the message says both.
    return (
        f"model {described(repo_id, revision)} is no folder here, nor a Hub model in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and {why}; fetch it first where the Hub is reachable: {fetch}"
    )


def described(repo_id: str, revision: str | None) -> str:
    return repr(repo_id) + (f" at revision {revision!r}" if revision else "")


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
