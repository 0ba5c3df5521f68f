"""Errors frametrace raises, and the user-code locations they carry."""
from __future__ import annotations

import linecache
import traceback


class Unsupported(RuntimeError):
    """Raised for code frametrace cannot trace when ``fullgraph=True``.

    Internally the tracer raises it for anything it cannot put in a graph; without
    ``fullgraph`` the frame then runs in CPython.  ``user_stack`` lists
    ``traceback.FrameSummary`` objects, innermost user frame last.

    >>> @frametrace.optimize(fullgraph=True)
    ... def f(x):
    ...     print(x)          # raises frametrace.Unsupported naming this file and line
    """

    def __init__(self, reason: str, user_stack: list[traceback.FrameSummary] | None = None,
                 hint: str | None = None):
        self.reason = reason
        self.user_stack = list(user_stack or [])
        self.hint = hint          # what the user can do about it, where there is something
        # Index of the root frame's instruction that could not be traced (where the
        # frame can break its graph), set by the interpreter.
        self.break_index: int | None = None
        # No break can stand for it in the root frame: that frame runs in CPython.
        self.whole_frame = False
        super().__init__(reason)

    def __str__(self) -> str:
        hint = f"\n  Hint: {self.hint}" if self.hint else ""
        return self.reason + hint + format_user_stack(self.user_stack)


class BackendCompilerFailed(RuntimeError):
    """A backend raised while compiling a graph: the user's error, raised from the
    call that compiled, as torch.compile's.  The backend's exception is `__cause__`;
    `backend_name`, `graph_name` and `frame` say which.  With
    ``frametrace.config.suppress_errors = True`` the frame runs in CPython instead,
    with one log line."""

    def __init__(self, backend_name: str, graph_name: str, error: BaseException):
        self.backend_name = backend_name
        self.graph_name = graph_name
        self.error = error
        self.frame = ""           # "fn (file:line)", set by the compile that failed
        super().__init__(backend_name, graph_name, error)

    def __str__(self) -> str:
        where = f" of {self.frame}" if self.frame else ""
        return (f"backend {self.backend_name!r} raised {type(self.error).__name__} compiling "
                f"graph {self.graph_name}{where}: {self.error}\n(set "
                f"frametrace.config.suppress_errors = True to run such frames in CPython instead)")


class InternalError(RuntimeError):
    """A bug in frametrace itself, found while tracing."""


class Yield(Exception):
    """An inlined generator's frame suspends at a yield: run() unwinds with the value,
    and the next pull calls run() again, at the instruction after the yield."""
    def __init__(self, value):
        super().__init__()
        self.value = value


# A backend that writes a graph's inputs only after the rest of it succeeded
# (AOTAutograd's runtime) marks what its graph's own ops raise: such a failure has
# written nothing, and the frame may run again in CPython.  What it raises after its
# writes (making the outputs that alias inputs) is unmarked: a rerun would write them
# twice.
_BEFORE_INPUT_WRITES = "__frametrace_before_input_writes__"


def mark_before_input_writes(e: BaseException) -> None:
    try:
        setattr(e, _BEFORE_INPUT_WRITES, True)
    except (AttributeError, TypeError):     # (an exception class with __slots__)
        pass


def raised_before_input_writes(e: BaseException) -> bool:
    return getattr(e, _BEFORE_INPUT_WRITES, False) is True


def frame_summary(code, lineno: int | None) -> traceback.FrameSummary:
    lineno = lineno or code.co_firstlineno
    line = linecache.getline(code.co_filename, lineno).strip()
    return traceback.FrameSummary(code.co_filename, lineno, code.co_name, line=line)


def format_user_stack(stack) -> str:
    if not stack:
        return ""
    return "\n" + "".join(traceback.format_list(stack)).rstrip("\n")
