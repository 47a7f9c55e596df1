"""docs/architecture.md's tree names every module of src/swiftkv, and nothing that is not there."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "swiftkv"
MODULE = re.compile(r"(?<![\w/`])(\w+\.py)\b")


def documented_modules() -> set[str]:
    """The tree block's .py names, each under the folders (lines `name/`) that enclose it by indentation."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = text.split("## The tree", 1)[1].split("```")[1]
    folders: list[tuple[int, str]] = []  # (indent, name) of the enclosing folders
    found = set()
    for line in tree.splitlines()[2:]:  # after the "src/swiftkv/" line
        indent = len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        folder = re.match(r"\s*(\w+)/\s", line + " ")
        if folder:
            folders.append((indent, folder.group(1)))
            continue
        prefix = "".join(f"{name}/" for _, name in folders)
        names = line.strip().split("  ")[0]  # the name column; a description follows after two spaces
        found |= {prefix + name for name in MODULE.findall(names)}
    return found


def defines_something(init: Path) -> bool:
    """Whether a package's `__init__.py` holds code of its own (a function, a class or a named value), not
    only its docstring and what it exports."""
    return any(
        isinstance(node, (ast.FunctionDef, ast.ClassDef))
        or (
            isinstance(node, ast.Assign)
            and not all(getattr(t, "id", "").startswith("__") for t in node.targets)
        )
        or isinstance(node, ast.AnnAssign)
        for node in ast.parse(init.read_text()).body
    )


def package_modules() -> set[str]:
    return {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or (p.parent != PACKAGE and defines_something(p))
    }


def test_the_architecture_tree_lists_exactly_the_package_modules():
    documented, present = documented_modules(), package_modules()
    assert not present - documented, (
        f"modules missing from docs/architecture.md's tree: {sorted(present - documented)}"
    )
    assert not documented - present, (
        f"docs/architecture.md's tree names modules that do not exist: {sorted(documented - present)}"
    )
