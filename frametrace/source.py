"""Sources: where a traced value lives in the user's frame.

A source gives the expression a guard reads (`guard_expr`), and the bytecode that
loads the value again in the transformed frame (`reconstruct`).  Guard functions take
the frame's argument slots by name, then ``___func`` (the running function), so
globals and closure cells are read through it.
"""
from __future__ import annotations


def guard_local_name(name: str) -> str:
    """The guard function's parameter for frame local `name` (comprehension frames have
    locals such as '.0' that are not identifiers)."""
    if name.isidentifier() and not name.startswith("___"):
        return name
    return "___arg_" + "".join(c if c.isalnum() else "_" for c in name)


class Source:
    __slots__ = ()

    def guard_expr(self) -> str:
        raise NotImplementedError

    def reconstruct(self, cg) -> None:
        raise NotImplementedError

    def name(self) -> str:
        """Readable name, as the user would write it."""
        return self.guard_expr()

    def __eq__(self, other):
        return type(self) is type(other) and self.key() == other.key()

    def __hash__(self):
        return hash((type(self), self.key()))

    def key(self):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.name()})"


class LocalSource(Source):
    """An argument of the traced frame."""
    __slots__ = ("local",)

    def __init__(self, local: str):
        self.local = local

    def key(self):
        return self.local

    def guard_expr(self):
        return guard_local_name(self.local)

    def name(self):
        return self.local

    def reconstruct(self, cg):
        cg.load_local(self.local)


class GlobalSource(Source):
    __slots__ = ("global_name",)

    def __init__(self, global_name: str):
        self.global_name = global_name

    def key(self):
        return self.global_name

    def guard_expr(self):
        return f"___G[{self.global_name!r}]"

    def name(self):
        return self.global_name

    def reconstruct(self, cg):
        cg.load_global(self.global_name)


class BuiltinSource(Source):
    __slots__ = ("builtin",)

    def __init__(self, builtin: str):
        self.builtin = builtin

    def key(self):
        return self.builtin

    def guard_expr(self):
        return f"___B[{self.builtin!r}]"

    def name(self):
        return self.builtin

    def reconstruct(self, cg):
        cg.load_global(self.builtin)


class ClosureSource(Source):
    """A free variable of the traced function (its closure cell's contents)."""
    __slots__ = ("var", "index")

    def __init__(self, var: str, index: int):
        self.var = var
        self.index = index

    def key(self):
        return (self.var, self.index)

    def guard_expr(self):
        return f"___func.__closure__[{self.index}].cell_contents"

    def name(self):
        return self.var

    def reconstruct(self, cg):
        cg.load_deref(self.var)


class AttrSource(Source):
    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str):
        self.base = base
        self.attr = attr

    def key(self):
        return (self.base, self.attr)

    def guard_expr(self):
        return f"{self.base.guard_expr()}.{self.attr}"

    def name(self):
        return f"{self.base.name()}.{self.attr}"

    def reconstruct(self, cg):
        self.base.reconstruct(cg)
        cg.load_attr(self.attr)


class GetItemSource(Source):
    """``base[index]`` for a constant index (int or str)."""
    __slots__ = ("base", "index")

    def __init__(self, base: Source, index):
        self.base = base
        self.index = index

    def key(self):
        return (self.base, self.index)

    def guard_expr(self):
        return f"{self.base.guard_expr()}[{self.index!r}]"

    def name(self):
        return f"{self.base.name()}[{self.index!r}]"

    def reconstruct(self, cg):
        self.base.reconstruct(cg)
        cg.load_const(self.index)
        cg.subscr()


class BuiltinCallSource(Source):
    """``op(base, *args)`` for `len` or `operator.contains` and constant arguments: a fact
    read through a builtin method of an object (a dict subclass's ``in`` or ``len``), so
    that a guard can check it again."""
    __slots__ = ("base", "op", "args")

    _EXPR = {"len": "___len({0})", "contains": "({1!r} in {0})"}

    def __init__(self, base: Source, op: str, args=()):
        self.base = base
        self.op = op
        self.args = tuple(args)

    def key(self):
        return (self.base, self.op, self.args)

    def guard_expr(self):
        return self._EXPR[self.op].format(self.base.guard_expr(), *self.args)

    def name(self):
        return self._EXPR[self.op].replace("___", "").format(self.base.name(), *self.args)

    def reconstruct(self, cg):
        import operator
        fn = len if self.op == "len" else operator.contains
        cg.call_const(fn, [self.base.reconstruct] + [lambda cg, a=a: cg.load_const(a) for a in self.args])


class ConstSource(Source):
    """An object held by the compiled entry itself (a module's globals dict, a closure
    cell, a function): guards name it as a constant and the transformed code loads it
    with LOAD_CONST.  Used where the frame has no expression that reaches the object,
    e.g. the globals of a function from another module inlined into this frame."""
    __slots__ = ("obj", "label")

    def __init__(self, obj, label: str):
        self.obj = obj
        self.label = label

    def key(self):
        return id(self.obj)

    def guard_expr(self):
        return f"___c{id(self.obj)}"

    def name(self):
        return self.label

    def reconstruct(self, cg):
        cg.load_const(self.obj)


def const_sources(source):
    """The ConstSources a source expression is rooted at (for the guard namespace)."""
    while source is not None:
        if isinstance(source, ConstSource):
            yield source
            return
        source = getattr(source, "base", None)
