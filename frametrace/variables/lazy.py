"""A frame value the trace has not looked at yet.

The frame's locals and cells start as `Lazy`: wrapped into a Var (and guarded) on first
use, so an argument the code never reads adds no guard.  The interpreter, the resume
frames and the cell rebuilding tell a value still lazy (`type(v) is Lazy`) from one the
trace has wrapped.
"""
from __future__ import annotations

from .base import wrap


class Lazy:
    """A frame value not yet looked at: wrapped (and guarded) on first use, so unused
    arguments add no guards."""
    __slots__ = ("value", "source", "data")

    def __init__(self, value, source, data=False):
        self.value = value
        self.source = source
        self.data = data

    def wrap(self, tx):
        if self.data:
            # A number computed at a graph break: a graph input, not a constant.
            return tx.output.add_number_input(self.value, self.source, data=True)
        return wrap(tx, self.value, self.source)
