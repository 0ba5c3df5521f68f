"""Symbolic sizes while tracing: a SymInt (SymFloat, SymBool) of the compile's ShapeEnv
with the FX node that computes it at run time.

Arithmetic and comparisons on them stay symbolic (graph nodes; a comparison used as a
Python bool adds a guard on the relation, e.g. ``s0 > 16``).  Anything else that needs
the plain number asks `as_const()`, which specializes the symbol: a guard pins it to the
value seen, so the answer is right, at the price of a recompile for another value.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode, free_unbacked_symbols,
                                                   guard_bool, guard_float, guard_int)

from .base import Var, unsupported
from .constant import ConstVar

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PLAIN = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def is_symbolic(value) -> bool:
    """A symbolic value whose expression is not (yet) a constant."""
    return isinstance(value, SYM_TYPES) and not value.node.expr.is_number


def mark_data(sym) -> None:
    """`sym` is a number computed in CPython at a graph break (``x.item()``): data that
    changes from call to call.  Arithmetic and torch ops on it, and on what is computed
    from it, stay in the graph; code that needs the plain number breaks the graph
    instead of pinning the value (which would recompile on every call)."""
    if not isinstance(sym, SYM_TYPES):
        return
    env = sym.node.shape_env
    data = getattr(env, "_frametrace_data", None)
    if data is None:
        data = env._frametrace_data = set()
    data |= sym.node.expr.free_symbols


def _from_data(value) -> bool:
    if not isinstance(value, SYM_TYPES):
        return False
    data = getattr(value.node.shape_env, "_frametrace_data", None)
    return bool(data) and not data.isdisjoint(value.node.expr.free_symbols)


def is_unbacked(value) -> bool:
    """A number the graph computes from a tensor's data (``t.item()``, a size of
    ``nonzero()``): the trace never knows it, and no guard may name it."""
    return isinstance(value, SYM_TYPES) and bool(free_unbacked_symbols(value))


def plain(value):
    """The number a Sym* value stands for, by specializing it (adds a guard)."""
    if is_unbacked(value):
        unsupported(f"using the value of {value}, a number the graph reads from a tensor's data")
    if _from_data(value):
        unsupported(f"using the value of a {_PLAIN[type(value)].__name__} computed at a "
                    "graph break (it changes between calls)")
    if isinstance(value, torch.SymBool):
        return guard_bool(value)
    if isinstance(value, torch.SymFloat):
        return guard_float(value)
    if isinstance(value, torch.SymInt):
        return guard_int(value)
    return value


class SymNodeVar(Var):
    __slots__ = ("node", "example")

    def __init__(self, node, example, source=None):
        super().__init__(source)
        self.node = node
        self.example = example

    def python_type(self):
        return _PLAIN[type(self.example)]

    # A size is a constant to any code that needs one: asking specializes it.  Not so
    # for numbers computed from data (see `mark_data`): those break the graph instead.
    def is_const(self):
        return not _from_data(self.example) and not is_unbacked(self.example)

    def as_const(self):
        return plain(self.example)

    def truth(self, tx):
        # bool(SymBool) guards on the relation; bool(SymInt) on "!= 0".  About a
        # number read from data, only what the ShapeEnv can prove is answered (a guard
        # cannot read it): anything else is a graph break.
        try:
            return bool(self.example)
        except GuardOnDataDependentSymNode:
            unsupported(f"branching on {self.example}, which depends on a tensor's data")

    def getattr(self, tx, name):
        return ConstVar(self.as_const()).getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        return ConstVar(self.as_const()).call_method(tx, name, args, kwargs)

    def getitem(self, tx, key):
        unsupported(f"indexing {self}")

    def reconstruct(self, cg):
        if not is_symbolic(self.example):
            cg.load_const(plain(self.example))
        else:
            cg.load_tensor(self)    # a graph output (or the int input itself)

    def noun(self):
        kind = _PLAIN.get(type(self.example), type(self.example)).__name__
        return f"{'an' if kind == 'int' else 'a'} {kind} computed in the graph (symbolic)"

    def __repr__(self):
        return f"SymNodeVar({self.node.name}: {self.example})"


class SliceVar(Var):
    """A slice with a symbolic bound (``x[:, :n]``), passed to the graph as is."""
    __slots__ = ("parts",)

    def __init__(self, parts):
        super().__init__()
        self.parts = list(parts)

    def python_type(self):
        return slice

    def is_const(self):
        return True

    def as_const(self):
        return slice(*(p.as_const() for p in self.parts))

    def reconstruct(self, cg):
        cg.load_const(self.as_const())


def wrap_sym(node, value) -> Var:
    """The Var for an op result that is a Sym* value (or a plain number)."""
    if is_symbolic(value):
        node.meta["example_value"] = node.meta["val"] = value
        return SymNodeVar(node, value)
    return ConstVar(plain(value))
