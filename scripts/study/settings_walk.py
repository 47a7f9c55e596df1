"""Count the walk of distill's settings: the functions that receive or read the DistillSettings object
on the call path from swiftkv.distill.run.run_distillation, and the modules they live in.

How: parse every module under SRC/swiftkv with `ast`. Start at run_distillation(settings). In a function
that holds the settings object under some local names (its parameter that received it, names assigned
from it or from dataclasses.replace(it, ...), and the enclosing function's names for nested functions
that read them), every call that passes one of those names as an argument (positional or keyword) is
followed to its callee, resolved through the module's imports, its own top-level functions and classes
(a class call -> its __init__), `self.method` within a class, and `module.func`. The callee's matching
parameter holds the object there. `self.X = settings` in a method makes every method of that class that
reads `self.X` a stop too, and a nested def/lambda that reads an enclosing settings name is a stop.
A stop = one function (qualified name); modules = the files those functions are in.

    python scripts/study/settings_walk.py src [--fields] [--uses]

--fields: also follow a field of the object passed as an argument (`f(settings.seq_len)`), a wider
count; --source: follow the object and its `source` field only (the calls that pass settings or
settings.source on); --uses: list the fields each stop reads (a stop that reads one or two fields is a candidate for
taking those fields instead of the object). Today: 10 stops in 4 modules (41 in 12 with --fields); issue 24
started from 28 in 4 at dbf2db2 (61 in 13 with --fields)."""

import ast
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else "src") / "swiftkv"
FIELDS = (
    "--fields" in sys.argv
)  # also follow a field of the object passed as an argument (f(settings.seq_len))
SOURCE = "--source" in sys.argv  # also follow settings.source (issue 35's hand count: settings or its source)
modules = {}
for path in SRC.rglob("*.py"):
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    modules[".".join(parts)] = (ast.parse(path.read_text()), is_pkg)

funcs = {}  # qualname -> (module, node, classname)
classes = {}  # module.Class -> node
nested_parent = {}


def collect(mod, body, prefix, cls=None):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            q = f"{prefix}.{node.name}"
            funcs[q] = (mod, node, cls)
            collect_nested(mod, node, q, cls)
        elif isinstance(node, ast.ClassDef):
            q = f"{prefix}.{node.name}"
            classes[q] = node
            collect(mod, node.body, q, q)


def collect_nested(mod, fn, q, cls):
    for node in ast.walk(fn):
        if node is fn:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and f"{q}.{node.name}" not in funcs:
            nq = f"{q}.<locals>.{node.name}"
            funcs[nq] = (mod, node, cls)
            nested_parent[nq] = q


for mod, (tree, _) in modules.items():
    collect(mod, tree.body, mod)


def imports_of(mod):
    tree, is_pkg = modules[mod]
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                names[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return names


IMPORTS = {m: imports_of(m) for m in modules}


def resolve_name(full):
    """module.attr chains -> a function qualname (class -> __init__), following re-exports."""
    for _ in range(5):
        if full in funcs:
            return full
        if full in classes:
            return f"{full}.__init__" if f"{full}.__init__" in funcs else None
        mod, _, attr = full.rpartition(".")
        if mod in IMPORTS and attr in IMPORTS[mod]:
            full = IMPORTS[mod][attr]
            continue
        return None
    return None


def resolve_call(call, mod, cls, qual):
    f = call.func
    if isinstance(f, ast.Name):
        # nested function in the same function?
        for cand in (f"{qual}.<locals>.{f.id}", f"{nested_parent.get(qual, '')}.<locals>.{f.id}"):
            if cand in funcs:
                return cand
        if f"{mod}.{f.id}" in funcs or f"{mod}.{f.id}" in classes:
            return resolve_name(f"{mod}.{f.id}")
        if f.id in IMPORTS[mod]:
            return resolve_name(IMPORTS[mod][f.id])
        return None
    if isinstance(f, ast.Attribute):
        if isinstance(f.value, ast.Name) and f.value.id in ("self", "cls") and cls:
            return resolve_name(f"{cls}.{f.attr}")
        chain = []
        v = f
        while isinstance(v, ast.Attribute):
            chain.insert(0, v.attr)
            v = v.value
        if isinstance(v, ast.Name) and v.id in IMPORTS[mod]:
            return resolve_name(".".join([IMPORTS[mod][v.id], *chain]))
    return None


def param_names(fn):
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args], {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}


stops = {}  # qual -> how
unresolved = set()
self_attrs = {}  # class -> attribute names holding settings


def holders_in(fn, start):
    names = set(start)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                v = node.value
                if (isinstance(v, ast.Name) and v.id in names) or (
                    isinstance(v, ast.Call)
                    and getattr(v.func, "id", getattr(v.func, "attr", None)) == "replace"
                    and v.args
                    and isinstance(v.args[0], ast.Name)
                    and v.args[0].id in names
                ):
                    if node.targets[0].id not in names:
                        names.add(node.targets[0].id)
                        changed = True
    return names


def visit(qual, held, how):
    if qual in stops:
        return
    stops[qual] = how
    mod, fn, cls = funcs[qual]
    names = holders_in(fn, held)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):  # self.X = settings
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and isinstance(node.value, ast.Name)
                    and node.value.id in names
                    and cls
                ):
                    self_attrs.setdefault(cls, set()).add(t.attr)
        if isinstance(node, ast.Call):

            def holds(a):
                if isinstance(a, ast.Name) and a.id in names:
                    return True
                return (
                    (FIELDS or SOURCE)
                    and isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name)
                    and a.value.id in names
                    and (FIELDS or a.attr == "source")
                )

            passed = [(i, a) for i, a in enumerate(node.args) if holds(a)]
            passed_kw = [k.arg for k in node.keywords if holds(k.value)]
            if not passed and not passed_kw:
                continue
            callee = resolve_call(node, mod, cls, qual)
            if callee is None:
                unresolved.add(f"{qual}: {ast.unparse(node.func)}")
                continue
            positional, allp = param_names(funcs[callee][1])
            offset = 1 if positional and positional[0] in ("self", "cls") else 0
            got = {positional[i + offset] for i, _ in passed if i + offset < len(positional)} | {
                k for k in passed_kw if k in allp
            }
            if got:
                visit(callee, got, f"called from {qual}")
    # nested functions reading an enclosing holder
    for nq, parent in nested_parent.items():
        if parent == qual:
            nfn = funcs[nq][1]
            own = param_names(nfn)[1]
            reads = {n.id for n in ast.walk(nfn) if isinstance(n, ast.Name)} & (names - own)
            if reads:
                visit(nq, reads, f"closure in {qual}")


start = "swiftkv.distill.run.run_distillation"
visit(start, {"settings"}, "start")
# methods reading self.<attr holding settings>
grew = True
while grew:
    grew = False
    for cls, attrs in list(self_attrs.items()):
        for q, (_, fn, c) in list(funcs.items()):
            if c == cls and q not in stops:
                if any(
                    isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "self"
                    and n.attr in attrs
                    for n in ast.walk(fn)
                ):
                    before = len(stops)
                    visit(q, set(), f"reads self.{'/'.join(attrs)}")
                    grew |= len(stops) > before

mods = sorted({funcs[q][0] for q in stops})
print(f"{len(stops)} stops in {len(mods)} modules")
for m in mods:
    print(f"  {m}: " + ", ".join(q[len(m) + 1 :] for q in stops if funcs[q][0] == m))
if unresolved:
    print("unresolved calls passing settings:", *sorted(unresolved), sep="\n  ")

if "--uses" in sys.argv:
    print("\nfields each stop reads:")
    for q, how in stops.items():
        mod, fn, cls = funcs[q]
        pos, allp = param_names(fn)
        names = holders_in(
            fn,
            {p for p in allp if p in ("settings",) or p.endswith("settings")}
            | ({"settings"} if q.endswith("probe_step") else set()),
        )
        used = sorted(
            {
                n.attr
                for n in ast.walk(fn)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in names
            }
        )
        whole = any(
            isinstance(n, ast.Name)
            and n.id in names
            and not isinstance(getattr(n, "_parent", None), ast.Attribute)
            for n in ast.walk(fn)
        )
        print(f"  {q} ({how}): {', '.join(used)}")
