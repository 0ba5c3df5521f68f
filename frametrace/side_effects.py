"""Side effects: changes the traced code makes to things that outlive the frame
(attributes of objects, globals, closure cells, lists and dicts from outside).

While tracing they are recorded, and reads see the new values; the transformed code
replays them after the graph runs, in program order, so the state after the call is
what CPython would leave.  In-place tensor ops need no replay: they are graph ops on
the real inputs.
"""
from __future__ import annotations

from bytecode import FreeVar

from .source import ClosureSource
from .variables.base import unsupported


class SideEffects:
    def __init__(self, fresh_locals=()):
        # Sources of containers made anew for each call (the root frame's *args, **kwargs).
        self.fresh_locals = set(fresh_locals)
        # Ordered by first write; each key keeps its latest value.
        self._attrs: dict[tuple, tuple] = {}       # (id(obj), name) -> (owner Var, name, value)
        self._globals: dict[tuple, tuple] = {}     # (id(globals), name) -> (globals, name, value, is_root)
        self._cells: dict[int, tuple] = {}         # id(cell) -> (cell, value)
        self._containers: dict[int, object] = {}   # id(real list/dict) -> its ListVar/DictVar
        self._order: list[tuple] = []

    def _note(self, key):
        if key not in self._order:
            self._order.append(key)

    # -- recording --
    def store_attr(self, owner, real_obj, name: str, value):
        if owner.source is None:
            unsupported(f"setting attribute {name!r} on an object made while tracing")
        key = ("attr", id(real_obj), name)
        self._attrs[key] = (owner, name, value)
        self._note(key)

    def load_attr(self, real_obj, name: str):
        hit = self._attrs.get(("attr", id(real_obj), name))
        return None if hit is None else hit[2]

    def store_global(self, f_globals: dict, name: str, value, is_root: bool):
        key = ("global", id(f_globals), name)
        self._globals[key] = (f_globals, name, value, is_root)
        self._note(key)

    def load_global(self, f_globals: dict, name: str):
        hit = self._globals.get(("global", id(f_globals), name))
        return None if hit is None else hit[2]

    def store_cell(self, cell, value):
        if cell.source is not None:
            key = ("cell", id(cell))
            self._cells[key] = (cell, value)
            self._note(key)

    def mutate_container(self, var, real_obj):
        """A list or dict from outside is about to change: its final contents are
        written back after the graph."""
        if var.source in self.fresh_locals:
            return      # the frame's own *args / **kwargs: made anew by every call
        key = ("container", id(real_obj))
        if key not in self._containers:
            self._containers[key] = var
            self._note(key)

    # -- replay --
    def values(self):
        """Every Var the replay will load (graph outputs must include their tensors)."""
        for key in self._order:
            kind = key[0]
            if kind == "attr":
                yield self._attrs[key][2]
            elif kind == "global":
                yield self._globals[key][2]
            elif kind == "cell":
                yield self._cells[key][1]
            else:
                yield self._containers[key]

    def __bool__(self):
        return bool(self._order)

    def reconstruct(self, cg, root_cells: set[str]):
        for key in self._order:
            kind = key[0]
            if kind == "attr":
                owner, name, value = self._attrs[key]
                value.reconstruct(cg)
                owner.source.reconstruct(cg)
                cg.store_attr(name)
            elif kind == "global":
                f_globals, name, value, is_root = self._globals[key]
                value.reconstruct(cg)
                if is_root:
                    cg.emit("STORE_GLOBAL", name)
                else:
                    cg.load_const(f_globals)
                    cg.load_const(name)
                    cg.emit("STORE_SUBSCR")
            elif kind == "cell":
                cell, value = self._cells[key]
                value.reconstruct(cg)
                if isinstance(cell.source, ClosureSource):
                    cg.emit("STORE_DEREF", FreeVar(cell.source.var))
                else:
                    cell.source.base.reconstruct(cg)   # the cell object itself
                    cg.store_attr("cell_contents")
            else:
                var = self._containers[key]
                _write_back_container(cg, var)


def _write_back_container(cg, var):
    from .variables.containers import DictVar, ListVar
    if isinstance(var, ListVar):
        # lst[:] = [new items]
        for item in var.items:
            item.reconstruct(cg)
        cg.build(list, len(var.items))
        var.source.reconstruct(cg)
        cg.load_const(slice(None, None))
        cg.emit("STORE_SUBSCR")
    elif isinstance(var, DictVar):
        # The new contents are built before the dict changes: they may be read from it.
        def new_items(cg=cg):
            for k, v in var.items.items():
                cg.load_const(k)
                v.reconstruct(cg)
            cg.build(dict, len(var.items))
        cg.call_const(_replace_dict, [var.source.reconstruct, new_items])
        cg.emit("POP_TOP")
    else:
        unsupported(f"writing back {var}")


def _replace_dict(d, new):
    d.clear()
    d.update(new)
