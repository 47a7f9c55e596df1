"""The import rules of the package, checked on the source (every import, function-level ones too):
data flows one way, so `data/` imports no later stage, and `vllm/` holds only what vLLM loads (no
benchmark harness, no data readers). Imports sit at module level unless they defer an optional heavy
dependency (vLLM, lm-eval, datasets, matplotlib, gguf, aiohttp, prometheus_client), which the last test
checks by importing every module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import swiftkv

PACKAGE = Path(swiftkv.__file__).parent

RULES = {
    "swiftkv.data": (
        "swiftkv.distill",
        "swiftkv.replies",
        "swiftkv.evaluate",
        "swiftkv.vllm",
        "swiftkv.bench",
        "swiftkv.cli",
    ),
    "swiftkv.vllm": (
        "swiftkv.bench",
        "swiftkv.data",
        "swiftkv.distill",
        "swiftkv.replies",
        "swiftkv.evaluate",
        "swiftkv.cli",
    ),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the swiftkv modules `path` imports, relative imports resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "swiftkv" or name.startswith("swiftkv.")}


@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_imports_nothing_above_it(layer):
    folder = PACKAGE / layer.split(".", 1)[1]
    files = sorted(folder.rglob("*.py"))
    assert files
    broken = {
        f"{module_name(path)} imports {name}"
        for path in files
        for name in imports_of(path)
        if any(name == banned or name.startswith(banned + ".") for banned in RULES[layer])
    }
    assert not broken, sorted(broken)


def test_the_check_sees_relative_and_function_level_imports(tmp_path):
    assert "swiftkv.data.split" in imports_of(PACKAGE / "data" / "packing.py")
    assert "swiftkv.vllm.hooks" in imports_of(PACKAGE / "vllm" / "__init__.py")  # imported inside register()


# Imported only inside the functions that need them, so `swiftkv --help`, convert, distill and eval never
# pay for (or need) them. The vLLM-side modules import vLLM by design: vLLM itself loads them.
HEAVY_OPTIONAL = ("vllm", "lm_eval", "datasets", "matplotlib", "gguf", "aiohttp", "prometheus_client")
LOADED_BY_VLLM = ("swiftkv.vllm.hooks", "swiftkv.vllm.layers", "swiftkv.vllm.model")


def test_importing_any_module_loads_no_optional_heavy_dependency():
    code = f"""
import importlib, pkgutil, sys, swiftkv, swiftkv.cli
names = [m.name for m in pkgutil.walk_packages(swiftkv.__path__, "swiftkv.") if m.name not in {LOADED_BY_VLLM!r}]
for name in names:
    importlib.import_module(name)
swiftkv.cli.build_parser()
print(len(names), *[m for m in {HEAVY_OPTIONAL!r} if m in sys.modules])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) > 70, out  # every module was imported
    assert out[1:] == [], f"module-level imports load {out[1:]}"
