"""Values computed in CPython at an earlier graph break, that the trace passes along
without looking at them (a resume frame's locals that are data, and what is read off
them).  Using one's value stops the trace there; its type is guarded only when asked.
"""
from __future__ import annotations

import sys

import torch

from .. import config
from .base import Var, a_type, unsupported


def is_data(value) -> bool:
    """Values computed in CPython that a resume frame passes on without guarding:
    everything but tensors, containers (whose items are guarded one by one) and None."""
    numpy = sys.modules.get("numpy")
    # NumPy arrays are graph inputs like tensors (guarded on type, dtype and shape,
    # never on their values); NumPy scalars stay data (float() of one would pin it).
    return not isinstance(value, (torch.Tensor, list, tuple, dict, type(None))) and \
        not (numpy is not None and type(value) is numpy.ndarray)


def traced_after_break(value) -> bool:
    """Data a resume frame traces all the same: an nn.Module computed at the break
    (config.trace_modules_from_breaks), wrapped without pinning its identity."""
    return isinstance(value, torch.nn.Module) and config.trace_modules_from_breaks


class OpaqueVar(Var):
    """A Python value that is data: passed along unguarded; using its value stops the
    trace there (a graph break).  Its attributes are opaque too, so `obj.method(...)`
    breaks at the call, where CPython can take over.  Its type is known, but may
    differ on the next call: asking for it (isinstance, type()) guards it."""
    __slots__ = ("kind", "base", "attr", "guards")

    def __init__(self, value, source, base=None, attr=None, guards=None):
        super().__init__(source)
        self.kind = type(value) if value is not None else object
        self.base = base
        self.attr = attr
        self.guards = guards

    def python_type(self):
        if self.base is not None or self.guards is None or self.source is None:
            unsupported("the type of a value computed after a graph break")
        self.guards.type_match(self.source, None, kind=self.kind)
        return self.kind

    def getattr(self, tx, name):
        return OpaqueVar(None, None, base=self, attr=name)

    def truth(self, tx):
        unsupported(f"branching on a {self.kind.__name__} computed after a graph break")

    def reconstruct(self, cg):
        if self.base is not None:
            self.base.reconstruct(cg)
            cg.load_attr(self.attr)
        else:
            super().reconstruct(cg)

    def noun(self):
        root, attrs = self, []
        while root.base is not None:
            attrs.append(root.attr)
            root = root.base
        if not attrs:
            return f"{a_type(root.kind)} computed outside the graph"
        return f"{root.kind.__qualname__}.{'.'.join(reversed(attrs))} (of {a_type(root.kind)} " \
            "computed outside the graph)"

    def __repr__(self):
        return f"OpaqueVar({self.kind.__name__})" if self.base is None else \
            f"OpaqueVar({self.base!r}.{self.attr})"
