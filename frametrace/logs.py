"""Logs, switched on by FRAMETRACE_LOGS, a comma list of:

    graph         each compiled FX graph's code
    graph_breaks  each graph break, with the reason and the user's file and line
    guards        the guards of each compiled entry
    bytecode      original and transformed bytecode of each compiled frame
    recompiles    each recompile, with the guard that failed, its old and new value
    output_code   the code a backend produced (the FX code for eager backends)
    perf_hints    what a backend could not compile as well as it meant to: each op the
                  triton backend runs as an aten call that a kernel could have run, and why

    FRAMETRACE_LOGS=graph_breaks,recompiles python train.py

They are ordinary `logging` loggers named ``frametrace.<kind>``; `configure` sets them
to INFO with a handler on stderr.
"""
from __future__ import annotations

import logging
import os
import sys

KINDS = ("graph", "graph_breaks", "guards", "bytecode", "recompiles", "output_code", "perf_hints")


def configure(spec: str | None = None) -> list[str]:
    """Switch on the logs named in `spec` (default: $FRAMETRACE_LOGS); returns them."""
    spec = os.environ.get("FRAMETRACE_LOGS", "") if spec is None else spec
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS and k != "all"]
    if unknown:
        raise ValueError(f"FRAMETRACE_LOGS: unknown log kind(s) {unknown}; known: {', '.join(KINDS)}")
    if "all" in kinds:
        kinds = list(KINDS)
    for kind in kinds:
        logger = logging.getLogger(f"frametrace.{kind}")
        logger.setLevel(logging.INFO)
        if not any(getattr(h, "_frametrace", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(f"[frametrace.{kind}] %(message)s"))
            handler._frametrace = True
            logger.addHandler(handler)
            logger.propagate = False
    return kinds
