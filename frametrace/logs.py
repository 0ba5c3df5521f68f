"""Logs: what frametrace compiled, and why it did not.  Kinds:

    graph         each compiled FX graph: every value's dtype and shape, and above each
                  group of nodes the user's line it came from (``# File: path:line in fn,
                  code: ...``)
    graph_breaks  each graph break and each frame left to run in CPython, with the
                  reason, a hint where there is one, and the user's file and line
                  (once per line and reason, not again at every recompile)
    guards        the guards of each compiled entry
    bytecode      original and transformed bytecode of each compiled frame
    recompiles    each recompile, with the guard that failed, its old and new value
    output_code   the code a backend produced (a line when it runs the FX graph as is)
    cache         each entry the on-disk cache stores, serves (a warm start), cannot
                  describe or cannot read (warm_cache.py)
    perf_hints    what a backend could not compile as well as it meant to: each op the
                  triton backend runs as an aten call that a kernel could have run, and why

Switch them on from the environment, as a comma list (``all`` for every kind)::

    FRAMETRACE_LOGS=graph_breaks,recompiles python train.py

or in code, as ``torch._logging.set_logs``::

    >>> import frametrace
    >>> frametrace.logs.set(graph_breaks=True, recompiles=True)
    ['graph_breaks', 'recompiles']
    >>> frametrace.logs.set(recompiles=False)
    ['graph_breaks']
    >>> frametrace.logs.clear()
    []

They are ordinary `logging` loggers named ``frametrace.<kind>``, at INFO with a handler
on stderr while switched on.

Switched off, they are silent even where the program configures logging for itself
(``logging.basicConfig(level=logging.INFO)`` would otherwise print every graph and guard
frametrace makes into the program's log): the ``frametrace`` logger is at WARNING unless
the program set its level first, so only warnings reach the program's handlers.  The
program's own configuration of it (``logging.getLogger("frametrace").setLevel(INFO)``, or
of one kind's logger) is honoured as for any library's logger.
"""
from __future__ import annotations

import logging
import os
import sys

ROOT = "frametrace"
KINDS = ("graph", "graph_breaks", "guards", "bytecode", "recompiles", "output_code", "perf_hints",
         "cache")


def configure(spec: str | None = None) -> list[str]:
    """Switch on the logs named in `spec`, a comma list (default: $FRAMETRACE_LOGS);
    returns them."""
    spec = os.environ.get("FRAMETRACE_LOGS", "") if spec is None else spec
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    _check(kinds, "FRAMETRACE_LOGS")
    if "all" in kinds:
        kinds = list(KINDS)
    for kind in kinds:
        _switch(kind, True)
    return kinds


def set(*, all: bool | None = None, **kinds: bool) -> list[str]:  # noqa: A001 (torch's name)
    """Switch log kinds on (True) or off (False); kinds not named stay as they are.
    ``all=True`` switches every kind on (``all=False`` off) before the named ones.
    Returns the kinds on afterwards.

        frametrace.logs.set(graph=True, graph_breaks=True)
    """
    _check(kinds, "frametrace.logs.set")
    if all is not None:
        for kind in KINDS:
            _switch(kind, all)
    for kind, on in kinds.items():
        _switch(kind, bool(on))
    return enabled()


def clear() -> list[str]:
    """Switch every kind off (also those FRAMETRACE_LOGS switched on); returns []."""
    for kind in KINDS:
        _switch(kind, False)
    return enabled()


def enabled() -> list[str]:
    """The kinds switched on, in the order of KINDS."""
    return [k for k in KINDS if any(_ours(h) for h in logging.getLogger(f"frametrace.{k}").handlers)]


def _check(kinds, where):
    unknown = [k for k in kinds if k not in KINDS and k != "all"]
    if unknown:
        raise ValueError(f"{where}: unknown log kind(s) {unknown}; known: {', '.join(KINDS)}, all")


def _ours(handler) -> bool:
    return getattr(handler, "_frametrace", False)


def _switch(kind: str, on: bool) -> None:
    logger = logging.getLogger(f"frametrace.{kind}")
    mine = [h for h in logger.handlers if _ours(h)]
    if on:
        logger.setLevel(logging.INFO)
        if not mine:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(f"[frametrace.{kind}] %(message)s"))
            handler._frametrace = True
            logger.addHandler(handler)
            logger.propagate = False
    elif mine:
        for h in mine:
            logger.removeHandler(h)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True



def _quiet_by_default() -> None:
    # The level of our root logger, not a NullHandler or propagate=False: records below
    # WARNING are then not even made (the callers test isEnabledFor before formatting a
    # graph), and a program that asks for more by setting a level gets it through its
    # own handlers.  A level the program set before importing frametrace is kept.
    root = logging.getLogger(ROOT)
    if root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)


_quiet_by_default()
