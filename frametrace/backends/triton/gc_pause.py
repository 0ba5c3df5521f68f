"""Fewer garbage collections while a graph compiles (config.compile_gc_threshold).

A compile allocates millions of short-lived objects (AOTAutograd's fake tensors and FX
nodes, sympy expressions, the IR, kernel sources) while the model, torch and their
caches hold millions of long-lived ones: at CPython's default threshold (a collection
every 700 net allocations) the collector ran ~1,100 times during EfficientNet-B0's
first training step on the CPU, 2.2-2.6 s, its older generations walking the heap (the
tracing before the backend, outside this, still runs ~300 of them).  Inside `fewer_collections()` the youngest generation's
threshold is raised (the older ones' ratios kept), so that collections still run, about
70 times less often; the thresholds are restored on leaving the outermost one.  Cyclic
garbage then lives a little longer; nothing else changes (reference counting frees the
rest as before)."""
from __future__ import annotations

import contextlib
import functools
import gc
import threading

from . import config

_lock = threading.Lock()
_depth = [0]
_saved: list = [None]


@contextlib.contextmanager
def fewer_collections():
    """Raise the youngest generation's threshold to `config.compile_gc_threshold` (where
    that is higher than the current one and the collector is enabled) for the block;
    nests, and another thread's compile shares the raised threshold until both left."""
    wanted = config.compile_gc_threshold
    with _lock:
        _depth[0] += 1
        if _depth[0] == 1:
            now = gc.get_threshold()
            if wanted and gc.isenabled() and 0 < now[0] < wanted:
                _saved[0] = now
                gc.set_threshold(wanted, *now[1:])
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if _depth[0] == 0 and _saved[0] is not None:
                # (a threshold the program set meanwhile is its own to keep)
                if gc.get_threshold()[0] == wanted:
                    gc.set_threshold(*_saved[0])
                _saved[0] = None


def during(fn):
    """`fn` with its calls inside `fewer_collections()`."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with fewer_collections():
            return fn(*args, **kwargs)
    return wrapped
