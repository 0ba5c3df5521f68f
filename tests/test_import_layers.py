"""The import contract: frametrace's modules import one way, down the layers below.

Data flows hook -> convert -> interpreter -> graph/guards -> backend -> bytecode; the
modules are layered so that each imports only from its own layer or the ones under it:

    tools          explain, viewer, __main__, testing, compile_status, the package itself
    hook's front   eval_frame
    frame driving  convert, resume, codegen, cache_limit, recompiles
    interpreter    interpreter
    backends       backends/ (one layer)
    graph building graph, side_effects, subgraph, replayed_views
    values         variables/ (one layer), guards, shapes
    leaves         source, exc, config, logs, bytecode_analysis, bytecode_diff, files,
                   backend_registry, resume_codes, progress,
                   interop, stance, global_state, cxx_modules, functorch_runtime, view_ops, the C
                   extensions

Checked over `ast`, without importing anything:
1. no import goes up a layer, except the ALLOWED (module level) and ALLOWED_IN_FUNCTIONS
   lists of today's remaining violations (a ratchet: a new one fails, and a fixed one
   must leave its list);
2. imports inside function bodies (of any module, frametrace's or not) number at most
   FUNCTION_LEVEL_CEILING: an import goes to the top of its module unless it must be lazy
   (an import cycle still to be broken, an optional dependency, start-up time), and then
   says why in a comment (3: those without one number at most UNEXPLAINED_CEILING).
   Lower the ceilings when you move some up or explain them;
4. the largest import circle among the modules of variables/ (a strongly connected
   component of their module- and function-level imports together) has at most
   VARIABLES_CIRCLE_CEILING modules (issue 32 wants 8 at most); the triton backend's
   modules have none (its pipeline imports down to its leaves);
5. interpreter.py, opcode dispatch only, has at most INTERPRETER_LINES lines: operator
   semantics, Vars and their tables go down to variables/.

`python tests/test_import_layers.py` prints the figures and every upward import.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "frametrace"

LAYERS = [
    ("leaves", {"source", "exc", "config", "logs", "bytecode_analysis", "progress", "interop",
                "stance", "global_state", "cxx_modules", "functorch_runtime", "bytecode_diff",
                "resume_codes",
                "backend_registry", "distributed", "files", "view_ops",
                "_C", "_tensor_reads", "_views", "_launch_keys"}),
    ("values", {"variables", "guards", "shapes"}),
    ("graph building", {"graph", "side_effects", "subgraph", "replayed_views"}),
    ("backends", {"backends"}),
    ("interpreter", {"interpreter"}),
    ("frame driving", {"convert", "resume", "codegen", "cache_limit", "recompiles", "warm_cache"}),
    ("hook's front", {"eval_frame"}),
    ("tools", {"explain", "viewer", "__main__", "testing", "compile_status", ""}),
]

# Upward module-level imports still there, each to be removed by the change that fixes it
# (issue 32).  Keys are (importer, imported) as frametrace-relative dotted names.  None
# left: higher-order ops' Vars speculate their bodies through `tx.subgraphs`.
ALLOWED: dict = {
}

# The same for imports inside functions: a lazy import that goes up hides the wrong
# direction without fixing it.  None left (issue 32 removed the last ones).
ALLOWED_IN_FUNCTIONS: dict = {
}

# Imports inside function bodies under frametrace/ (issue 32 item 3: 560 when first counted).
# (67: issue 33's loader of the triton backend's cached result, in the package's
# __init__, which `import frametrace` loads without the pipeline; 62: the triton
# backend's partition, decompositions and driver import at their tops)
FUNCTION_LEVEL_CEILING = 62
# Of those, imports without a comment saying why they are lazy: none may be added.
UNEXPLAINED_CEILING = 0
# Modules in the largest import circle inside variables/ (30 when first counted: all the
# modules that hold Vars; the module-level imports alone have no circle, the lazy ones
# close them).
VARIABLES_CIRCLE_CEILING = 4
# interpreter.py's length (1180 before issue 32 moved its tables, f-string formatting,
# locals() and MAKE_FUNCTION's function building down to variables/).
INTERPRETER_LINES = 1100


def _modules():
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        if "build" in path.relative_to(PKG).parts:
            continue
        name = ".".join(path.relative_to(PKG).with_suffix("").parts)
        if name.endswith("__init__"):
            name = name[: -len("__init__")].rstrip(".")
        mods[name] = path
    for ext in ("_C", "_tensor_reads", "_views", "_launch_keys"):   # the C extensions: leaves
        mods.setdefault(ext, None)
    return mods


def _layer(name):
    first = name.split(".")[0]
    for i, (_, members) in enumerate(LAYERS):
        if first in members or name in members:
            return i
    raise AssertionError(f"frametrace.{name} has no layer: add it to LAYERS in {__file__}")


def _targets(mods, importer, is_pkg, node):
    """The frametrace modules an import statement loads (relative names)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".") if importer else []
            if not is_pkg:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            if not (node.module == "frametrace" or node.module.startswith("frametrace.")):
                return []
            mod = node.module[len("frametrace"):].lstrip(".")
        names = []
        for a in node.names:
            sub = f"{mod}.{a.name}" if mod else a.name
            names.append(sub if sub in mods else mod)
        names = ["frametrace." + n if n else "frametrace" for n in names]
    out = set()
    for n in names:
        if n != "frametrace" and not n.startswith("frametrace."):
            continue
        n = n[len("frametrace"):].lstrip(".")
        while n and n not in mods:
            n = n.rpartition(".")[0]
        if n != importer:
            out.add(n)
    return out


def _explained(lines, node) -> bool:
    """A comment on the import's lines or on the line above it."""
    return any("#" in lines[k] for k in range(node.lineno - 1, node.end_lineno)) or \
        (node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#"))


def scan(unexplained=None):
    """(module-level edges {(a, b)}, function-level edges {(a, b)}, function-level count);
    `unexplained`: a list to which "path:line" of each function-level import without a
    comment is appended."""
    mods = _modules()
    top, inner, count = set(), set(), 0
    for name, path in mods.items():
        if path is None:
            continue
        text = path.read_text()
        lines = text.split("\n")
        tree = ast.parse(text, str(path))
        is_pkg = path.name == "__init__.py"
        stack = [(tree, False)]
        while stack:
            node, in_func = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    count += in_func
                    if in_func and unexplained is not None and not _explained(lines, child):
                        unexplained.append(f"{path.relative_to(ROOT)}:{child.lineno}")
                    for t in _targets(mods, name, is_pkg, child):
                        (inner if in_func else top).add((name, t))
                stack.append((child, in_func or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))))
    return top, inner, count


def circles(edges, within=lambda name: True):
    """The strongly connected components of the import graph `edges` restricted to the
    modules `within` accepts, largest first (Tarjan's algorithm, iterative)."""
    graph = {}
    for a, b in edges:
        if within(a) and within(b):
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return sorted(out, key=len, reverse=True)


def variables_circle():
    """The largest import circle among the modules of variables/."""
    top, inner, _ = scan()
    comps = circles(top | inner, lambda name: name.startswith("variables."))
    return comps[0] if comps else []


def upward(edges):
    return {(a, b) for a, b in edges if _layer(a) < _layer(b)}


def test_no_new_upward_import():
    top, _, _ = scan()
    up = upward(top)
    new = sorted(up - set(ALLOWED))
    assert not new, ("module-level imports that go up a layer (import from your own layer or "
                     "below; pass what you need down, or register it): "
                     + ", ".join(f"{a} -> {b}" for a, b in new))
    fixed = sorted(set(ALLOWED) - up)
    assert not fixed, ("fixed, remove from ALLOWED in tests/test_import_layers.py: "
                       + ", ".join(f"{a} -> {b}" for a, b in fixed))


def test_no_new_upward_import_in_functions():
    _, inner, _ = scan()
    up = upward(inner)
    new = sorted(up - set(ALLOWED_IN_FUNCTIONS))
    assert not new, ("imports inside functions that go up a layer (a lazy import hides the "
                     "wrong direction, it does not fix it): "
                     + ", ".join(f"{a} -> {b}" for a, b in new))
    fixed = sorted(set(ALLOWED_IN_FUNCTIONS) - up)
    assert not fixed, ("fixed, remove from ALLOWED_IN_FUNCTIONS in tests/test_import_layers.py: "
                       + ", ".join(f"{a} -> {b}" for a, b in fixed))


def test_function_level_imports_under_ceiling():
    _, _, count = scan()
    assert count <= FUNCTION_LEVEL_CEILING, (
        f"{count} imports inside functions (ceiling {FUNCTION_LEVEL_CEILING}): put the import "
        "at the top of the module, or, if it must be lazy, say why in a comment and make the "
        "case in review before raising the ceiling")


def test_function_level_imports_say_why():
    where = []
    scan(where)
    assert len(where) <= UNEXPLAINED_CEILING, (
        f"{len(where)} imports inside functions without a comment saying why they are "
        f"not at the top (ceiling {UNEXPLAINED_CEILING}): " + ", ".join(where[:20]))


def test_variables_circle_under_ceiling():
    circle = variables_circle()
    assert len(circle) <= VARIABLES_CIRCLE_CEILING, (
        f"{len(circle)} modules of variables/ import each other in a circle (ceiling "
        f"{VARIABLES_CIRCLE_CEILING}; module- and function-level imports counted): "
        + ", ".join(circle) + ". Import from modules under yours in the inner order, "
        "or register what a lower module needs from a higher one")


def triton_circle():
    """The largest import circle among the triton backend's modules."""
    top, inner, _ = scan()
    comps = circles(top | inner, lambda name: name.startswith("backends.triton."))
    return comps[0] if comps else []


def test_no_circle_inside_the_triton_backend():
    circle = triton_circle()
    assert len(circle) <= 1, (
        "modules of the triton backend import each other in a circle (module- and "
        "function-level imports counted): " + ", ".join(circle) + ". The pipeline "
        "imports down (backend -> result_cache -> compiled_module -> ... -> ir): pass "
        "what a lower module needs from a higher one as an argument")


def test_no_circle_spans_two_layers():
    top, inner, _ = scan()
    for comp in circles(top | inner):
        assert len({_layer(m) for m in comp}) == 1, (
            "an import circle spans two layers: " + ", ".join(comp))


def test_interpreter_is_opcode_dispatch():
    n = len((PKG / "interpreter.py").read_text().splitlines())
    assert n <= INTERPRETER_LINES, (
        f"interpreter.py has {n} lines (at most {INTERPRETER_LINES}): it dispatches opcodes; "
        "what a handler computes on values belongs in variables/")


def test_every_module_has_a_layer():
    for name in _modules():
        _layer(name)


if __name__ == "__main__":
    where = []
    top, inner, count = scan(where)
    print(f"function-level imports without a comment: {len(where)}")
    print(f"module-level edges: {len(top)}, upward: {len(upward(top))}")
    print(f"function-level: {count} imports, {len(inner)} frametrace edges, "
          f"upward: {len(upward(inner))}")
    circle = variables_circle()
    print(f"largest circle inside variables/: {len(circle)} modules: {', '.join(circle)}")
    circle = triton_circle()
    print(f"largest circle inside backends/triton/: {len(circle)} modules: {', '.join(circle)}")
    for a, b in sorted(upward(top)):
        print(f"    module level:    {a} -> {b}")
    for a, b in sorted(upward(inner)):
        print(f"    inside function: {a} -> {b}")
