"""Sources: where a traced value lives in the user's frame.

A source gives the expression a guard reads (`guard_expr`), and the bytecode that
loads the value again in the transformed frame (`reconstruct`).  Guard functions take
the frame's argument slots by name, then ``___func`` (the running function), so
globals and closure cells are read through it.
"""
from __future__ import annotations
import inspect
import torch
import types
import typing


def guard_local_name(name: str) -> str:
    """The guard function's parameter for frame local `name` (comprehension frames have
    locals such as '.0' that are not identifiers)."""
    if name.isidentifier() and not name.startswith("___"):
        return name
    return "___arg_" + "".join(c if c.isalnum() else "_" for c in name)


def root_local(source) -> str | None:
    """The frame local a source's path starts from, or None (a global, a closure cell)."""
    while not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
        if source is None:
            return None
    return source.local


class Source:
    # (_hash: the hash, kept once computed -- a source is not changed after it is made,
    # and its hash walks its whole chain of bases; not pickled: str hashes differ
    # between processes)
    __slots__ = ("_hash",)

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
        try:
            return self._hash
        except AttributeError:
            h = self._hash = hash((type(self), self.key()))
            return h

    def __getstate__(self):
        return None, {name: getattr(self, name) for cls in type(self).__mro__
                      for name in getattr(cls, "__slots__", ()) if name != "_hash" and hasattr(self, name)}

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


class ClosureCellSource(Source):
    """The closure cell object itself of the traced function's free variable `var`."""
    __slots__ = ("var", "index")

    def __init__(self, var: str, index: int):
        self.var = var
        self.index = index

    def key(self):
        return (self.var, self.index)

    def guard_expr(self):
        return f"___func.__closure__[{self.index}]"

    def name(self):
        return f"<cell {self.var}>"

    def reconstruct(self, cg):
        cg.load_closure(self.var)


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
        cg.load_source(self.base)
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
        return f"{self.base.guard_expr()}[{_index_expr(self.index)}]"

    def name(self):
        return f"{self.base.name()}[{self.index!r}]"

    def reconstruct(self, cg):
        cg.load_source(self.base)
        cg.load_const(self.index)
        cg.subscr()


class ContainsSource(GetItemSource):
    """``index in base``: whether a key is there, for a guard on its presence."""
    __slots__ = ()

    def guard_expr(self):
        return f"({_index_expr(self.index)} in {self.base.guard_expr()})"

    def name(self):
        return f"{self.index!r} in {self.base.name()}"


class InstanceDictSource(Source):
    """The instance dict of `base` as ``object.__getattribute__(base, '__dict__')`` reads
    it: past a __getattribute__ of the class's own (a guard on an attribute the hook
    would find there reads the dict, not the hook)."""
    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base

    def key(self):
        return self.base

    def guard_expr(self):
        return f"___odict({self.base.guard_expr()})"

    def name(self):
        return f"{self.base.name()}.__dict__"

    def reconstruct(self, cg):
        cg.push_callable(lambda cg: cg.load_const(object.__getattribute__))
        self.base.reconstruct(cg)
        cg.load_const("__dict__")
        cg.call(2)


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


def _literal(index) -> bool:
    """`repr(index)` reads back, in a check, as an object of the same type and value."""
    t = type(index)
    if t in (str, int, bool, type(None)):
        return True
    if t is float:
        return index - index == 0.0        # (finite: nan and inf are names)
    if t is tuple:
        return all(map(_literal, index))
    return t is torch.dtype                 # (the check has `torch`)


def _index_expr(index) -> str:
    """An item's key as a check writes it: its repr, or, where that would not read back
    (a torch.device's repr calls `device`, an enum member's is no expression), the
    name of the constant (see const_sources)."""
    return repr(index) if _literal(index) else ConstSource(index, "key").guard_expr()


def const_sources(source):
    """The ConstSources a source expression is rooted at (for the guard namespace)."""
    while source is not None:
        if isinstance(source, ConstSource):
            yield source
            return
        if isinstance(source, GetItemSource) and not _literal(source.index):
            yield ConstSource(source.index, "key")
        through = getattr(source, "through", None)
        if through is not None:
            yield through
        if isinstance(source, CallMethodSource):
            yield from (_class_arg(a) if _named_arg(a) else a for a in source.args
                        if _named_arg(a) or isinstance(a, ConstSource))
        source = getattr(source, "base", None)


def _named_arg(a) -> bool:
    """Arguments a guard names as constants: classes, functions and typing's special
    forms (`Union`, `Literal`): fixed objects."""
    return isinstance(a, (type, types.FunctionType, types.BuiltinFunctionType, typing._SpecialForm))


def _class_arg(cls):
    return ConstSource(cls, getattr(cls, "__qualname__", "class"))


class CallMethodSource(Source):
    """``base.method(*args)`` for a read-only method of a real object and constant
    arguments (``os.environ.get('X')``, ``s.__len__()``, ``'k' in d``; a ConstSource
    argument names a fixed object, ``cached(logger, 'msg')``): what the trace
    read by calling it, re-read by the guard.  With `as_list`, ``[*base.method()]``
    (a view such as ``d.keys()``, read as a list)."""
    __slots__ = ("base", "method", "args", "as_list", "through")

    def __init__(self, base: Source, method: str, args=(), as_list=False, through=None):
        self.base = base
        self.method = method
        self.args = tuple(args)
        self.as_list = as_list
        # A method object to call with base as first argument instead (`dict.get` for
        # super().get: the object's own `get` may be overridden).
        self.through = ConstSource(through, method) if through is not None else None

    @staticmethod
    def supports(args) -> bool:
        """Arguments written into the guard's text (their repr must read back), or
        classes and functions (named as constants of the guard: `cls in registry`)."""
        return all(a is None or type(a) in (str, int, bool) or _named_arg(a) or isinstance(a, ConstSource)
                   for a in args)

    def _args_expr(self):
        return [a.guard_expr() if isinstance(a, ConstSource) else
                _class_arg(a).guard_expr() if _named_arg(a) else repr(a) for a in self.args]

    def key(self):
        return (self.base, self.method, self.args, self.as_list, self.through)

    def guard_expr(self):
        if self.through is not None:
            args = ", ".join((self.base.guard_expr(), *self._args_expr()))
            call = f"{self.through.guard_expr()}({args})"
        else:
            call = f"{self.base.guard_expr()}.{self.method}({', '.join(self._args_expr())})"
        return f"[*{call}]" if self.as_list else call

    def name(self):
        args = ", ".join(a.name() if isinstance(a, ConstSource) else repr(a) for a in self.args)
        call = f"{self.base.name()}.{self.method}({args})"
        return f"list({call})" if self.as_list else call

    def _bound_method(self, cg):
        self.base.reconstruct(cg)
        cg.load_attr(self.method)

    def reconstruct(self, cg):
        def emit_call(cg):
            if self.through is not None:
                cg.push_callable(lambda cg: cg.load_const(self.through.obj))
                self.base.reconstruct(cg)
            else:
                cg.push_callable(self._bound_method)
            for a in self.args:
                cg.load_const(a.obj if isinstance(a, ConstSource) else a)
            cg.call(len(self.args) + (self.through is not None))
        if self.as_list:
            cg.call_const(list, [emit_call])
        else:
            emit_call(cg)


def fresh_arg_sources(code):
    """*args and **kwargs of a frame: new objects on every call."""
    n = code.co_argcount + code.co_kwonlyargcount
    fresh = []
    if code.co_flags & inspect.CO_VARARGS:
        fresh.append(LocalSource(code.co_varnames[n]))
        n += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        fresh.append(LocalSource(code.co_varnames[n]))
    return fresh
