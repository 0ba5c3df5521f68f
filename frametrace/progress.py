"""Where a compile is, for whoever wants to know: the compile path reports here (a frame
begins, a phase starts, it ends) and listeners registered here hear of it.

The terminal status line (compile_status.py) is one listener; the compile path knows
nothing of it, and this module imports nothing of frametrace's, so imports run one way
(UI -> progress <- compile path).  With no listener registered each report is one test
of an empty list."""
from __future__ import annotations

_listeners: list = []


def add_listener(listener) -> None:
    """`listener` has begin(kind, what), phase(text) and end(token) methods; begin's
    return value is the token its end gets."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def begin(kind: str, what) -> list | None:
    """A span of compile work starts: `kind` "frame" (`what` its code object) or
    "autotune" (`what` the kernel's name).  Returns the token end() takes."""
    if not _listeners:
        return None
    return [(listener, listener.begin(kind, what)) for listener in list(_listeners)]


def phase(text: str) -> None:
    """The current span's work is now `text` ("tracing", "backend compile (eager)")."""
    for listener in _listeners:
        listener.phase(text)


def end(token) -> None:
    if token:
        for listener, inner in token:
            listener.end(inner)
