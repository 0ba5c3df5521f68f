"""The status line on a terminal while a compile takes long: which frame (function,
file:line), which phase (tracing, backend compile, autotuning kernel N), for how long.

It is shown only when stderr is a terminal, only once a compile has run longer than
`config.compile_status_after` seconds, and it is transient: erased when the compile
ends, never written to a pipe, a file or a log.  `config.compile_status = False` turns
it off.  The compile path only reports to `progress`; a compile shorter than the
threshold costs a lock and a notify: one worker thread (started at the first compile)
waits out the threshold, and only then is rich imported and the line drawn (rich's
Live refreshes it, so the elapsed time moves while a backend works)."""
from __future__ import annotations

import os
import sys
import threading
import time

from . import config, progress
from .bytecode_diff import _def_line    # (the def's line, not a decorator's)


class _Session:
    __slots__ = ("kind", "what", "phase", "t0", "kernels", "thread")

    def __init__(self, kind, what):
        self.kind = kind
        self.what = what
        self.phase = "tracing" if kind == "frame" else "autotuning"
        self.t0 = time.perf_counter()
        self.kernels = 0
        self.thread = threading.get_ident()


def _describe(kind, what) -> str:
    if kind == "frame":
        code = what
        return (f"{getattr(code, 'co_qualname', code.co_name)} "
                f"({os.path.basename(code.co_filename)}:{_def_line(code)})")
    return f"kernel {what}"


class _Line:
    """What the status shows, computed at each refresh (the elapsed time moves)."""

    def __init__(self, status):
        from rich.spinner import Spinner  # (optional dependency)
        self.status = status
        self.spinner = Spinner("dots", style="cyan")
        self.described = {}

    def __rich__(self):
        session = self.status.session
        if session is None:
            return ""
        key = id(session)
        if key not in self.described:
            self.described = {key: _describe(session.kind, session.what)}
        seconds = time.perf_counter() - session.t0
        from rich.text import Text  # (optional dependency)
        # (one line, whatever the terminal's width: a wrapped line would not be erased whole)
        self.spinner.update(text=Text(f"frametrace: compiling {self.described[key]} — "
                                      f"{session.phase} · {seconds:.0f} s"))
        line = self.spinner.render(time.monotonic())
        if isinstance(line, Text):
            line.no_wrap, line.overflow = True, "ellipsis"
        return line


class TerminalStatus:
    """The progress listener (registered at import)."""

    def __init__(self):
        self.lock = threading.Condition()
        self.session = None        # the outermost span being compiled, or None
        self.depth = {}            # thread -> spans open in it (a compile in another
                                   # thread neither shows nor changes the line)
        self.live = None           # rich's Live while the line is shown
        self.worker = None
        self.stream = None         # where the line is drawn (stderr at the span's start)

    # -- progress's listener interface --
    def begin(self, kind, what):
        thread = threading.get_ident()
        with self.lock:
            depth = self.depth[thread] = self.depth.get(thread, 0) + 1
            session = self.session
            if depth > 1 or session is not None:
                if session is not None and session.thread == thread and kind == "autotune":
                    session.kernels += 1
                    session.phase = f"autotuning kernel {session.kernels} ({what})"
                return None
            if not config.compile_status or not _is_terminal(sys.stderr):
                return None
            self.session = _Session(kind, what)
            self.stream = sys.stderr
            if self.worker is None:
                self.worker = threading.Thread(target=self._wait, name="frametrace-compile-status",
                                               daemon=True)
                self.worker.start()
            self.lock.notify_all()
            return self.session

    def phase(self, text):
        session = self.session
        if session is not None and session.thread == threading.get_ident():
            session.phase = text           # (read at the next refresh)

    def end(self, token):
        thread = threading.get_ident()
        with self.lock:
            depth = self.depth.get(thread, 1) - 1
            if depth > 0:
                self.depth[thread] = depth
            else:
                self.depth.pop(thread, None)
            if token is None or token is not self.session:
                return
            self.session = None
            live, self.live = self.live, None
            self.lock.notify_all()
        if live is not None:
            live.stop()                    # transient: the line is erased

    # -- the worker: shows the line once a span has run past the threshold --
    def _wait(self):
        while True:
            with self.lock:
                while self.session is None or self.live is not None:
                    self.lock.wait()
                session = self.session
                left = session.t0 + config.compile_status_after - time.perf_counter()
                if left > 0:
                    self.lock.wait(left)
                    continue
                try:
                    self.live = _start(self, self.stream)
                except Exception:          # a status line is never worth an error
                    self.live = None
                    self.session = None


def _start(status, stream):
    from rich.console import Console  # (optional dependency)
    from rich.live import Live  # (optional dependency)
    console = Console(file=stream)
    # (no redirection of sys.stdout/sys.stderr: a compile prints nothing of the user's,
    # and a program's stdout may be a pipe while stderr is the terminal)
    live = Live(_Line(status), console=console, transient=True, refresh_per_second=4,
                redirect_stdout=False, redirect_stderr=False)
    # (drawn now, not at the refresh thread's first tick: a compile that ends before
    # that tick, on a loaded machine, would otherwise show nothing)
    live.start(refresh=True)
    return live


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


status = TerminalStatus()
progress.add_listener(status)
