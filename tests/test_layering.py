"""The import rules of the package, checked on the source (every import, function-level ones too):
the package's units (its subpackages and top-level modules) sit on LAYERS, and each imports only units of
the layers below its own, so no import runs back up; data flows one way, so `data/` imports no later
stage, and `vllm/` holds only what vLLM loads (no benchmark harness, no data readers); nothing in the
package imports the scripts beside it (scripts/), which import it as user code does; outside distill/,
distillation is imported through its API (`swiftkv.distill`), never from a module behind it. Imports sit at
module level unless they defer an optional heavy dependency (vLLM, lm-eval, datasets, matplotlib, gguf,
aiohttp, prometheus_client), which the last test checks by importing every module."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import swiftkv

PACKAGE = Path(swiftkv.__file__).parent
SCRIPTS = PACKAGE.parents[1] / "scripts"

# The package's units, top layer first: a unit imports units of lower layers only (none of its own layer's,
# none above). Read from the code as it is; a new unit must be placed here before it is imported anywhere.
LAYERS = (
    ("cli",),  # one module per command, over everything below
    ("distill",),  # trains on the replies stage's output
    ("bench", "evaluate", "demo", "replies"),  # stages and measurements over convert, vLLM and the model
    ("convert", "vllm"),
    ("sources", "generation"),
    ("metrics", "flops", "peaks", "data", "dtypes"),
    ("model",),
    ("files", "settings", "results", "plots", "hostmemory", "hub"),
    ("tensorfiles",),  # safetensors read and written a tensor at a time (files reads model identities)
)

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


def package_of(path: Path) -> str:
    """The package a module's relative imports start from."""
    return module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]


def import_statements(path: Path, package: str | None) -> Iterator[tuple[str, list[str]]]:
    """(module, the names imported from it) for every import in `path`, function-level ones too; relative
    imports are resolved against `package` (None: skipped, as a script's are its own package's)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (not node.level or package is not None):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, [alias.name for alias in node.names]


def imports_of(path: Path) -> set[str]:
    """Absolute names of the swiftkv modules `path` imports, relative imports resolved."""
    found = set()
    for base, names in import_statements(path, package_of(path)):
        found.add(base)
        found.update(f"{base}.{name}" for name in names)
    return {name for name in found if name == "swiftkv" or name.startswith("swiftkv.")}


def unit_of(name: str) -> str:
    """The unit a swiftkv module belongs to: its subpackage or top-level module (`swiftkv` for the root)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "swiftkv"


def unit_imports() -> dict[tuple[str, str], set[str]]:
    """(importing unit, imported unit) -> the modules making that import, over the package's source. The
    bare package (`from . import calibration` names it beside its module) is every module's parent, not
    an import of the root's `__init__` as a unit."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        for name in imports_of(path):
            pair = (unit_of(importer), unit_of(name))
            if pair[0] != pair[1] and name != "swiftkv":
                found.setdefault(pair, set()).add(importer)
    return found


def back_arrows(edges, layers=LAYERS) -> list[str]:
    """Each import of a unit on the same layer or above the importer's, said. The package root (its
    `__init__`, which registers the models) imports from below and is imported by nobody."""
    rank = {unit: depth for depth, units in enumerate(layers) for unit in units}
    return sorted(
        f"{importer} imports {imported} ({', '.join(sorted(modules))})"
        for (importer, imported), modules in edges.items()
        if importer != "swiftkv" and rank[imported] <= rank[importer]
    )


def test_every_unit_sits_on_a_layer_once():
    units = {unit_of(module_name(path)) for path in PACKAGE.rglob("*.py")} - {"swiftkv"}
    placed = [unit for layer in LAYERS for unit in layer]
    assert sorted(placed) == sorted(set(placed)), "a unit is on two layers"
    assert units == set(placed), (
        f"not placed: {sorted(units - set(placed))}; gone: {sorted(set(placed) - units)}"
    )


def test_no_import_runs_back_up_the_layers():
    assert back_arrows(unit_imports()) == []


def test_the_layer_check_fails_on_a_reversed_or_sideways_arrow():
    edges = unit_imports()
    assert ("distill", "model") in edges and ("cli", "distill") in edges  # the real graph, as read
    reversed_arrow = {**edges, ("model", "distill"): {"swiftkv.model.surgery"}}
    assert back_arrows(reversed_arrow) == ["model imports distill (swiftkv.model.surgery)"]
    sideways = {**edges, ("bench", "evaluate"): {"swiftkv.bench.offline"}}
    assert back_arrows(sideways) == ["bench imports evaluate (swiftkv.bench.offline)"]


def script_packages() -> set[str]:
    """The names the scripts beside the package import as: their folders' modules and packages."""
    names = set()
    for path in SCRIPTS.rglob("*.py"):
        top = path.relative_to(SCRIPTS).parts
        for depth in range(1, len(top)):
            folder = SCRIPTS.joinpath(*top[:depth])
            if folder.is_dir() and not (folder / "__init__.py").exists():
                inner = path.relative_to(folder).parts
                names.add(inner[0].removesuffix(".py"))
    return names


def test_nothing_in_the_package_imports_the_scripts():
    names = script_packages()
    assert {"loan", "outputs", "gpu_check"} <= names  # what scripts/gpu holds, as its scripts import it
    importing = sorted(
        f"{module_name(path)} imports {name}"
        for path in PACKAGE.rglob("*.py")
        for name in all_imports_of(path)
        if name.split(".")[0] in names | {"scripts"}
    )
    assert importing == []


def all_imports_of(path: Path) -> set[str]:
    """Every absolute module name `path` imports (relative imports are the package's own)."""
    return {base for base, _ in import_statements(path, None)}


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


# Inside distill/: the training core, the start, parallelism and the settings sit under the measuring wing and
# the run that composes them; the loop gets what it measures with (measure/watch.py) from the run.
DISTILL_BELOW = ("core", "start", "parallel", "settings")
DISTILL_ABOVE = ("swiftkv.distill.measure", "swiftkv.distill.run")


def distill_arrows_up() -> list[str]:
    folder = PACKAGE / "distill"
    return sorted(
        f"{module_name(path)} imports {name}"
        for path in folder.rglob("*.py")
        if path.relative_to(folder).parts[0].removesuffix(".py") in DISTILL_BELOW
        for name in imports_of(path)
        if any(name == above or name.startswith(above + ".") for above in DISTILL_ABOVE)
    )


def test_the_training_core_imports_nothing_of_the_measuring_wing():
    assert (PACKAGE / "distill" / "core" / "loop.py").exists()
    # the check reads the tree as it is
    assert "swiftkv.distill.core.loop" in imports_of(PACKAGE / "distill" / "run.py")
    assert distill_arrows_up() == []


def reaches_behind_the_distill_api(files: list[Path]) -> list[str]:
    """Each import, in `files`, of a module behind `swiftkv.distill`'s API (a subpackage or module of it)."""
    reaching = []
    for path in files:
        package = package_of(path) if PACKAGE in path.parents else None
        reaching += [
            f"{path.name} imports {base}"
            for base in sorted({base for base, _ in import_statements(path, package)})
            if base.startswith("swiftkv.distill.")
        ]
    return reaching


def test_code_outside_distill_imports_only_its_api():
    """The CLI and the scripts import distillation from `swiftkv.distill` (its API table names the module
    behind each name), never from a module behind it: those may move without the callers changing."""
    outside = [path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] != "distill"]
    scripts = sorted(SCRIPTS.rglob("*.py"))
    assert any("swiftkv.distill" in all_imports_of(path) for path in scripts)  # it reads them
    assert reaches_behind_the_distill_api(outside + scripts) == []


def test_the_api_check_fails_on_an_import_behind_the_api(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "from swiftkv.distill.core.trainer import train_step\nfrom swiftkv.distill import lr_at\n"
    )
    assert reaches_behind_the_distill_api([script]) == ["probe.py imports swiftkv.distill.core.trainer"]


def test_every_name_of_the_distill_api_is_defined_where_it_says():
    import swiftkv.distill as distill

    for name, module in distill.API.items():
        value = getattr(distill, name)
        assert getattr(importlib.import_module(f"swiftkv.distill.{module}"), name) is value, name
    assert set(distill.API) <= set(dir(distill))
    with pytest.raises(AttributeError, match="no attribute 'train_stepp'"):
        distill.train_stepp  # noqa: B018


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


def test_the_command_line_lists_only_what_users_run():
    """The rented-GPU workflow is scripts (scripts/gpu/loan), not a command: what users run of it is
    `swiftkv distill --snapshot-every / --profile-steps`."""
    from swiftkv.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse's own listing
    assert set(commands) == {
        "convert",
        "export",
        "generate",
        "demo",
        "data",
        "replies",
        "distill",
        "eval",
        "serve",
        "bench",
    }
    assert not list((PACKAGE / "loan").glob("*.py"))  # (a stale __pycache__ of an older checkout aside)
