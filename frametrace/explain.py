"""explain(): what frametrace makes of a call, for people.

    >>> report = frametrace.explain(model)(x)
    >>> report.graph_count, report.graph_break_count
    (2, 1)
    >>> print(report)          # graphs, breaks with file, line and source, guards

The call runs once under its own recording backend (eager), so the report is about
exactly this call; the entries it compiled are dropped afterwards and the function's
other compiled entries are not touched.
"""
from __future__ import annotations

import io
import shutil
import sys
import types

from . import _C, convert, shapes
from .backends import describe, lookup_backend
from .eval_frame import OptimizedModule, optimize


class BreakReason:
    """One graph break (or frame run in CPython): why, and where in the user's code
    (`user_stack`: traceback.FrameSummary objects, innermost user frame last), and
    `hint`: what the user can change, or None."""
    __slots__ = ("reason", "user_stack", "graph_break", "hint")

    def __init__(self, reason, user_stack, graph_break, hint=None):
        self.reason = reason
        self.hint = hint
        self.user_stack = list(user_stack)
        self.graph_break = graph_break   # False: the whole frame ran in CPython

    def __repr__(self):
        where = self.user_stack[-1] if self.user_stack else None
        at = f" at {where.filename}:{where.lineno}" if where else ""
        return f"BreakReason({self.reason!r}{at})"


class ExplainOutput:
    """The report `explain(fn)(*args)` returns."""

    def __init__(self, records, result):
        self.records = records
        self.result = result
        self.graphs = [r.graph_module for r in records if r.graph_module is not None]
        self.graph_count = len(self.graphs)
        self.ops_per_graph = [r.op_count for r in records if r.graph_module is not None]
        # which backend the explained function's own settings compile each graph with
        self.backends = [r.graph_module.meta.get("frametrace_backend") for r in records
                         if r.graph_module is not None]
        self.break_reasons = [BreakReason(r.reason, r.user_stack, r.outcome == "break", r.hint)
                              for r in records if r.outcome in ("break", "fallback")]
        self.graph_break_count = sum(1 for b in self.break_reasons if b.graph_break)
        self.guards = [g for r in records for g in r.guards]
        self.compile_times = [r.compile_seconds for r in records]
        # entries read from the on-disk cache (warm_cache.py): nothing traced for them
        self.from_cache = [r for r in records if getattr(r, "from_cache", False)]

    def __rich__(self):
        from rich.console import Group  # (optional dependency)
        from rich.panel import Panel  # (optional dependency)
        from rich.syntax import Syntax  # (optional dependency)
        from rich.table import Table  # (optional dependency)
        from rich.text import Text  # (optional dependency)
        parts = []
        summary = Table.grid(padding=(0, 2))
        summary.add_row("graphs", str(self.graph_count))
        summary.add_row("graph breaks", str(self.graph_break_count))
        fallbacks = len(self.break_reasons) - self.graph_break_count
        if fallbacks:
            summary.add_row("frames run in CPython", str(fallbacks))
        summary.add_row("ops per graph", ", ".join(map(str, self.ops_per_graph)) or "-")
        summary.add_row("compile time", f"{sum(self.compile_times) * 1e3:.1f} ms")
        if self.from_cache:
            summary.add_row("from the on-disk cache", f"{len(self.from_cache)} entries (not traced)")
        parts.append(Panel(summary, title="frametrace.explain", expand=False))
        for i, b in enumerate(self.break_reasons, 1):
            kind = "graph break" if b.graph_break else "frame run in CPython"
            parts.append(break_text(f"{kind} {i}", b.reason, b.user_stack, b.hint))
        for r, i in zip([r for r in self.records if r.graph_module is not None], range(1, 10**6)):
            backend = r.graph_module.meta.get("frametrace_backend")
            parts.append(Text(f"graph {i}: {r.code.co_qualname} ({r.op_count} ops"
                              f"{f'; backend: {backend}' if backend else ''})", style="bold"))
            # (wrapped, not cut, where the terminal is narrower than a line)
            parts.append(Syntax(convert.readable_graph(r.graph_module), "python", theme="ansi_dark",
                                background_color="default", word_wrap=True))
        if self.guards:
            guard_text = Text()
            for r in self.records:
                guard_text.append(f"{r.code.co_qualname}:\n", style="bold")
                for g in r.guards:
                    guard_text.append(f"  {g}\n")
            parts.append(Panel(guard_text, title="guards", expand=False))
        return Group(*parts)

    def __str__(self):
        from rich.console import Console  # (optional dependency)
        buffer = io.StringIO()
        # (rich's own guess of the width looks at the buffer, which is no terminal)
        Console(file=buffer, width=output_width(sys.stdout), color_system=None,
                force_terminal=False).print(self)
        return buffer.getvalue()

    def __repr__(self):
        return (f"ExplainOutput(graph_count={self.graph_count}, "
                f"graph_break_count={self.graph_break_count}, ops_per_graph={self.ops_per_graph})")


# The width of output that goes to no terminal (a pipe, a file, a log): wide enough that
# rich neither wraps nor cuts a line; what reads it (less, an editor, grep) decides.
UNBOUNDED_WIDTH = 1 << 16


def is_terminal(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):     # no isatty, or a closed file
        return False


def output_width(file) -> int:
    """The columns to lay text out in for `file`: the terminal's on a terminal, where a
    long line wraps; else `UNBOUNDED_WIDTH`, where none is cut."""
    return shutil.get_terminal_size().columns if is_terminal(file) else UNBOUNDED_WIDTH


def break_text(heading: str, reason: str, user_stack, hint=None):
    """A graph break (or a frame run in CPython) for people: the heading, the reason,
    the hint if there is one, then each user frame's file, line and source line,
    innermost last."""
    from rich.text import Text  # (optional dependency)
    text = Text()
    text.append(heading, style="bold red")
    text.append(f": {reason}\n")
    if hint:
        text.append("  Hint: ", style="bold green")
        text.append(f"{hint}\n")
    for fs in user_stack:
        text.append(f'  File "{fs.filename}", line {fs.lineno}, in {fs.name}\n', style="cyan")
        if fs.line:
            text.append(f"    {fs.line}\n", style="yellow")
    return text


def _underlying(fn):
    """What an optimize()d function or module (or a method bound from one) runs: the
    explaining compile traces that, under its own recording backend."""
    while True:
        if isinstance(fn, _C.Hooked):
            fn = fn.fn
        elif isinstance(fn, OptimizedModule):
            fn = fn._orig_mod
        elif isinstance(fn, types.MethodType) and isinstance(fn.__func__, _C.Hooked):
            fn = types.MethodType(fn.__func__.fn, fn.__self__)
        else:
            return fn


def _backend_of(fn):
    """The backend `fn` compiles with: its optimize()'s, else optimize()'s default."""
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, _C.Hooked):
        fn = fn.__func__
    callback = fn.callback if isinstance(fn, _C.Hooked) else \
        fn.__dict__["_callback"] if isinstance(fn, OptimizedModule) else None
    backend = getattr(callback, "backend", None)
    return backend if backend is not None else lookup_backend("default")


def explain(fn):
    """``explain(fn)(*args, **kwargs)`` runs the call under frametrace and returns an
    `ExplainOutput`: graphs, graph_count, graph_break_count, break_reasons (reason and
    user_stack), ops_per_graph, guards and compile_times.  ``print()`` it for a report.
    """
    backend = _backend_of(fn)
    fn = _underlying(fn)

    def run(*args, **kwargs):
        records = []

        def recording_backend(gm, example_inputs):
            gm.meta["frametrace_backend"] = describe(backend, gm, example_inputs)
            return gm.forward
        # traced as for the explained function's backend (what a graph may keep differs:
        # the default backend's CPU graphs keep what only the eager backend runs right)
        recording_backend.__frametrace_runs_ops_as_traced__ = \
            getattr(backend, "__frametrace_runs_ops_as_traced__", False)

        convert.record_observers.append(records.append)
        sizes = shapes.saved_sizes()
        try:
            result = optimize(backend=recording_backend)(fn)(*args, **kwargs)
        finally:
            convert.record_observers.remove(records.append)
            shapes.restore_sizes(sizes)
            for r in records:
                if r.check is not None:
                    _C.remove_entry(r.code, r.check)
        return ExplainOutput(records, result)
    return run

