"""Python objects known at trace time: modules, torch functions, builtins, bound
methods of traced values, and nn.Modules."""
from __future__ import annotations

import collections.abc
import functools
import math
import sys
import operator
import types
import weakref

import torch

from ..source import (AttrSource, CallMethodSource, ConstSource, ContainsSource, GetItemSource,
                      GlobalSource, _named_arg)
from .base import (ValueVar, Var, a_type, base_container_method, call_unbound_builtin, construct,
                   fromkeys_var, register, registrar, safe_repr, set_key, unsupported, wrap)
from .contexts import GradModeSetVar, context_function
from .functions import BoundMethodVar, OutsideState, UserFunctionVar, cached_call, visible_outside_writes
from .classes import class_lookup
from .constant import ConstVar, MethodVar, fold_call, is_constant_value, is_pure_method
from .containers import ListVar, NamedTupleVar, SizeVar, structseq_fields
from .symbolic import SHAPE_QUERIES, SymNodeVar, shape_query
from .symbolic_calls import call_check, is_check, is_tensor_of_numbers, tensor_of_numbers
from .tensor import TensorVar
from .fx_values import PassedAsIs
from .. import _C
from .grad_utils import foreach_tensor_scalars, group_by_device_and_dtype
from .optimizers import trace_time_call
from .device_facts import device_fact


def callable_name(value) -> str:
    """`time.time`, `Adam.step`, `os.getpid`: a callable as its user would spell it."""
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(qualname, str):
        return a_type(type(value))
    module = getattr(value, "__module__", None)
    if isinstance(value, types.MethodType) or "." in qualname or not isinstance(module, str) \
            or module == "builtins":
        return qualname
    module = _MODULE_SPELLING.get(module, module)
    if module.startswith("torch.") and getattr(torch, qualname, None) is value:
        module = "torch"            # torch.save, not torch.serialization.save
    elif module.startswith("_") and module[1:] in sys.modules:
        module = module[1:]         # the C half of a stdlib module (_warnings, _random)
    return qualname if module.startswith("_") else f"{module}.{qualname}"


_MODULE_SPELLING = {"posix": "os", "nt": "os", "_io": "io", "_thread": "threading"}


def call_hint(value) -> str | None:
    """What the user can do about a call the trace cannot follow."""
    if isinstance(value, _C.Unhooked):
        return ("it is marked frametrace.disable (or torch.compiler.disable), so it runs in "
                "CPython; the graph breaks around the call")
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType,
                          types.MethodDescriptorType, types.WrapperDescriptorType)):
        return ("frametrace does not see inside functions written in C: move the call out of "
                "the compiled function, or into a function marked torch.compiler.disable")
    return None


def object_noun(value) -> str:
    """An object of the program named for a message: a module, a class, a function by
    its name; anything else by its type."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, type):
        return f"class {value.__qualname__}"
    if callable(value) and isinstance(getattr(value, "__qualname__", None), str):
        return callable_name(value)
    return a_type(type(value))


_TYPE_DICT = type.__dict__["__dict__"]


def _refuse_metaclass_hook(cls, name):
    """``cls.name`` would run a user metaclass's own __getattribute__ (always) or
    __getattr__ (for a name the lookup misses): Python code that may count or log,
    which neither the trace nor a guard may run in CPython's place.  The read is a
    graph break, made by CPython."""
    meta = type(cls)
    for hook in ("__getattribute__", "__getattr__"):
        fn = class_lookup(meta, hook)
        if not isinstance(fn, types.FunctionType) or \
                (getattr(fn, "__module__", None) or "").split(".")[0] in sys.stdlib_module_names:
            continue
        if hook == "__getattr__":
            try:
                type.__getattribute__(cls, name)
                continue
            except AttributeError:
                pass
        unsupported(f"{cls.__qualname__}.{name} runs {meta.__qualname__}.{hook}")


def class_source(cls) -> ConstSource:
    """The source of a class the entry holds itself (one per class: guards on it share
    their loads)."""
    return ConstSource(cls, getattr(cls, "__qualname__", None) or repr(cls))


class ObjectVar(ValueVar, PassedAsIs):
    """An object used as-is while tracing (guarded by identity when it has a source).

    A class reached with no path of its own (``type(o)``, ``o.__class__``, a
    classmethod's ``cls``) is a fixed object, held by the entry: it gets a ConstSource,
    so that what the trace reads from it (``type(o).__mro__[1].k``) is guarded like
    any other attribute.  Without one, every read below it would go unguarded."""
    __slots__ = ()

    def __init__(self, value, source=None):
        if source is None and isinstance(value, type):
            source = class_source(value)
        super().__init__(value, source)

    # Read-only methods of plain objects (mapping proxies, os.environ, OrderedDicts from
    # outside), answered on the real object.  What they answer is state of a mutable
    # object (an identity guard does not cover it): the result is guarded through a
    # source that calls the method again.
    def call_method(self, tx, name, args, kwargs):
        if name in _PURE_READERS and not isinstance(self.value, (type, types.ModuleType)) and \
                _all_const(args, kwargs) and not kwargs:
            method = getattr(self.value, name, None)
            if method is not None:
                consts = _consts(args)
                try:
                    result = method(*consts)
                except Exception as e:
                    unsupported(f"{type(self.value).__name__}.{name}() raised {type(e).__name__}")
                listed = isinstance(result, (type({}.keys()), type({}.values()), type({}.items())))
                return self._read(tx, list(result) if listed else result, name, consts, listed)
        if name == "get" and len(args) in (1, 2) and not kwargs and \
                _lookup_key(args[0]) is not _NO_KEY and \
                isinstance(self.value, collections.abc.Mapping) and \
                not isinstance(self.value, (type, types.ModuleType)):
            # `registry.get(name, fallback_function)`, `validators.get(get_origin(t))`: the
            # default is any value of the trace's, the key a constant or a fixed object;
            # which one is answered depends only on whether the key is there.
            if not self.contains(tx, args[0]):
                return args[1] if len(args) == 2 else ConstVar(None)
            return self.getitem(tx, args[0])
        if name in _PURE_READERS and not isinstance(self.value, (type, types.ModuleType)) and \
                callable(getattr(self.value, name, None)):
            # (getattr gives a MethodVar calling this method again: `d.get(k, tensor)` of
            # a dict held as an object recursed until RecursionError)
            unsupported(f"{type(self.value).__name__}.{name}() with arguments that are not constants")
        return super().call_method(tx, name, args, kwargs)

    def _read(self, tx, result, name, args, listed=False):
        if self.source is None:
            return wrap(tx, result, None, guard=False)
        if name == "__getitem__" and len(args) == 1 and isinstance(args[0], (str, int)):
            return wrap(tx, result, GetItemSource(self.source, args[0]))
        if not CallMethodSource.supports(args):
            unsupported(f"{type(self.value).__name__}.{name}() on arguments a guard cannot name")
        var = wrap(tx, result, CallMethodSource(self.source, name, args, listed))
        if listed:
            # A new list, which the frame may mutate freely: not the source's object.
            tx.output.object_vars.pop(id(result), None)
            var = ListVar(list(var.items))
        return var

    def getitem(self, tx, key):
        k = _lookup_key(key)
        if k is not _NO_KEY and not isinstance(self.value, (type, types.ModuleType)) and \
                hasattr(type(self.value), "__getitem__") and isinstance(self.value, collections.abc.Mapping):
            try:
                result = self.value[k]
            except Exception as e:
                unsupported(f"{type(self.value).__name__}[{k!r}] raised {type(e).__name__}")
            return self._read(tx, result, "__getitem__", [k])
        if _is_type_hint(self.value):
            return _type_hint(tx, self.value, key)
        return super().getitem(tx, key)

    def contains(self, tx, item) -> bool:
        """`item in self` on a real container (a set in a closure, os.environ)."""
        if isinstance(self.value, (set, frozenset)) and (
                not item.is_const() or type(item.as_const()) not in (str, int, bool, type(None))):
            return self._contains_object(tx, item)
        key = _lookup_key(item)
        if key is _NO_KEY or isinstance(self.value, (type, types.ModuleType)):
            unsupported(f"`in` on {type(self.value).__name__}")
        try:
            found = key in self.value
        except Exception as e:
            unsupported(f"`in` on {type(self.value).__name__} raised {type(e).__name__}")
        self._read(tx, found, "__contains__", [key])
        return found

    def _contains_object(self, tx, item) -> bool:
        """An object hashed by identity (a function, a module) in a real set: what the
        set holds can change between calls, so the guard asks again."""
        key = set_key(item)
        found = key in self.value
        if self.source is not None:
            guards = tx.guards
            e, k = self.source.guard_expr(), guards.const(key)
            guards._add(self.source, f"CONTAINS {k}", f"({k} in {e}) is {found}",
                        f"({safe_repr(key)} in {self.source.name()}) is {found}")
        return found

    def unpack(self, tx):
        if _is_iterator(self.value) or isinstance(self.value, _MUTABLE_ITERABLES):
            # Iterating would consume the program's iterator now, at trace time, or read
            # contents that the guard on the object's identity does not cover.
            unsupported(f"iterating over a {type(self.value).__name__} from outside the frame")
        try:
            items = list(self.value)
        except TypeError:
            unsupported(f"iterating over {type(self.value).__name__}")
        if any(isinstance(i, torch.Tensor) for i in items):
            unsupported(f"iterating over {type(self.value).__name__} holding tensors")
        return self._read(tx, items, "__iter__", [], listed=True).unpack(tx)

    def length(self, tx):
        try:
            n = len(self.value)
        except TypeError:
            unsupported(f"len() of {type(self.value).__name__}")
        self._read(tx, n, "__len__", [])
        return n

    def is_const(self):
        # Classes, functions and modules: fixed objects, usable as constants.
        return isinstance(self.value, (type, types.FunctionType, types.ModuleType,
                                       types.BuiltinFunctionType))

    def as_const(self):
        return self.value

    def truth(self, tx):
        v = self.value
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType)) or \
                isinstance(v, type) and type(v) is type:
            return True       # no __bool__ or __len__ (a metaclass's could say otherwise)
        return super().truth(tx)

    def reconstruct(self, cg):
        # A class, function or module the trace reached without a path (type(obj), a
        # class attribute): the object itself, held by the compiled code.
        if self.source is None and self.is_const():
            return cg.load_const(self.value)
        super().reconstruct(cg)

    def getattr(self, tx, name):
        if self.value is object and name == "__setattr__":
            return GenericSetattrVar()
        if self.value is object and name == "__getattribute__":
            return GenericGetattrVar()
        if type(self.value) is types.ModuleType and not _is_library_object(self.value):
            # A user module's attributes are its globals: writes by any spelling count.
            if name == "__dict__":
                return namespace_var(tx, vars(self.value))
            if tx.side_effects.load_global(vars(self.value), name) is not None:
                return tx.side_effects.load_global(vars(self.value), name)
        if name in _PURE_READERS and not isinstance(self.value, (type, types.ModuleType)) and \
                callable(getattr(self.value, name, None)):
            return MethodVar(self, name)
        if name == "__dict__" and isinstance(self.value, type) and self.source is not None and \
                class_lookup(type(self.value), "__dict__") is _TYPE_DICT:
            # A new mapping proxy on every read, of the class's own dict: what the
            # trace reads from it is guarded through this source, not its identity.
            return ObjectVar(vars(self.value), AttrSource(self.source, "__dict__"))
        if name == "fromkeys" and isinstance(self.value, type):
            made = fromkeys_var(tx, self.value)
            if made is not None:
                return made
        if isinstance(self.value, type):
            _refuse_metaclass_hook(self.value, name)
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            unsupported(f"{self.value!r} has no attribute {name!r}")
        if type(attr) is types.BuiltinMethodType and attr.__self__ is self.value and \
                type(self.value) in (set, frozenset, list, dict, tuple, str, bytes):
            # A method of a builtin container this Var holds opaquely (a set from outside,
            # a dict with keys no guard compares): wrap() hands such a method back to its
            # owner's Var, which is this one (`m = s.add` recursed until the C stack
            # ran out).  Its calls would change or read state no guard covers: a call
            # is a graph break, and CPython makes it on the method read again.
            reason = f"{type(self.value).__name__}.{name} of a {type(self.value).__name__} " \
                "the trace holds as an opaque object"
            if self.source is None:
                unsupported(reason)
            return ForeignCallableVar(attr, AttrSource(self.source, name), reason)
        source = AttrSource(self.source, name) if self.source is not None else None
        # Guarded even on torch and the standard library: `math.sqrt = ...` is legal.
        return wrap(tx, attr, source)

    def setattr(self, tx, name, value):
        if type(self.value) is types.ModuleType and not _is_library_object(self.value):
            write_global(tx, vars(self.value), name, value)
            return
        super().setattr(tx, name, value)

    def call(self, tx, args, kwargs):
        value = self.value
        if not _hashable(value):
            # (an instance of a dataclass with eq=True: in no table of functions below,
            # and looking it up there would raise)
            return self._call_unlisted(tx, args, kwargs)
        if value is torch.Size and len(args) == 1 and not kwargs:
            return SizeVar(args[0].unpack(tx))       # symbolic sizes stay symbolic
        if isinstance(value, type) and value.__module__ == "torch.return_types" and \
                len(args) == 1 and not kwargs:
            # torch.return_types.max((values, indices)): what the op would return
            items, fields = args[0].unpack(tx), structseq_fields(value)
            if fields is None or len(items) != len(fields):
                unsupported(f"{value.__name__}() of {len(items)} items")
            return NamedTupleVar(items, fields, cls=value)
        if isinstance(value, type) and value in _CONST_CLASSES and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if isinstance(value, type):
            made = construct(tx, value, args, kwargs)
            if made is not None:
                return made
        if value in TRACE_TIME_ANSWERS:
            return ConstVar(TRACE_TIME_ANSWERS[value])
        if value is object.__new__ and args:
            from .user_objects import new_plain_object  # (lazy: import cycle, to break)
            return new_plain_object(tx, args[0], args[1:], kwargs)
        if type(value) is types.BuiltinMethodType and value.__name__ == "__subclasses__" and \
                isinstance(value.__self__, type) and not args and not kwargs and \
                isinstance(self.source, AttrSource):
            # The classes derived from it now, read again by the guard (a class
            # statement anywhere adds one).
            found = value()
            source = CallMethodSource(self.source.base, "__subclasses__", ())
            tx.guards.length(source, found)
            # (a new list per call: the program may change it)
            return ListVar([wrap(tx, c, GetItemSource(source, i)) for i, c in enumerate(found)])
        if type(value) is weakref.ref and not args and not kwargs and self.source is not None:
            # The referent (or None once it died), read again through the call.
            return wrap(tx, value(), CallMethodSource(self.source, "__call__", ()))
        if isinstance(value, functools._lru_cache_wrapper):
            return cached_call(tx, self, args, kwargs)
        if not args and not kwargs and value in _global_state_readers():
            return _read_global_state(tx, value)
        if value in SHAPE_QUERIES:
            made = shape_query(tx, value, args, kwargs)
            if made is not None:
                return made
        if value is torch.overrides.is_tensor_like and len(args) == 1 and not kwargs and \
                isinstance(args[0], (TensorVar, ConstVar, SymNodeVar)):
            # (a number is never a tensor nor has __torch_function__)
            return ConstVar(isinstance(args[0], TensorVar))
        made = trace_time_call(tx, value, args, kwargs)
        if made is not None:
            return made
        made = device_fact(tx, value, args, kwargs)
        if made is not None:
            return made
        if value in _PURE_LIBRARY_FUNCTIONS and _all_const(args, kwargs):
            return ConstVar(value(*_consts(args), **_const_kwargs(kwargs)))
        if isinstance(value, types.MethodDescriptorType) and args and _all_const(args, kwargs) \
                and is_pure_method(value.__objclass__, value.__name__) \
                and type(args[0].as_const()) is value.__objclass__:
            return fold_call(value, args, kwargs, value.__qualname__)     # str.upper(s)
        if value in _OPERATORS and any(isinstance(a, TensorVar) for a in args):
            return tx.output.call("call_function", value, tuple(args), kwargs)
        made = call_unbound_builtin(tx, value, args, kwargs)
        if made is not None:
            return made
        made = context_function(tx, value, args, kwargs)
        if made is not None:
            return made
        unsupported(f"calling {callable_name(value)}", hint=call_hint(value))

    def _call_unlisted(self, tx, args, kwargs):
        unsupported(f"calling {callable_name(self.value)}", hint=call_hint(self.value))

    def noun(self):
        return object_noun(self.value)

    def __repr__(self):
        return f"ObjectVar({safe_repr(self.value)})"



@register
def object_var(value, source=None):
    return ObjectVar(value, source)


class InGraphCallVar(ObjectVar):
    """A function torch.compiler.allow_in_graph registered: each call is one graph node,
    run on FakeTensors while tracing (as torch.compile does).  Two kinds of call are
    left to CPython (a graph break) before that run: one that passes the graph no
    tensor (nothing ties it to the graph, which dropped it, so a function kept for its
    effects ran once, at trace time; the eager backend keeps it, as a node it runs every
    call), and one of a function whose own code writes a
    global, a nonlocal or an attribute (the trace-time run would make that write once
    more than CPython).  A change the run made to the function's globals or closure
    cells anyway (through a helper) is undone, and the call left to CPython too.
    Other effects of the functions it calls (a list appended to) are not seen."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        name = f"{getattr(self.value, '__qualname__', 'a function')} (allow_in_graph)"
        if tx.output.functionalizes and not any(_holds_graph_value(a) for a in (*args, *kwargs.values())):
            # (the eager backend runs the node every call; AOTAutograd's re-trace would
            # run it once, at compile time, and drop it)
            unsupported(f"{name} called with no tensor: the graph would not keep the call; "
                        "CPython makes it")
        writes = visible_outside_writes(self.value)
        if writes is not None:
            unsupported(f"{name} {writes}: its run while tracing would repeat the write; "
                        "CPython makes the call")
        state = OutsideState(self.value)
        try:
            out = tx.output.call("call_function", self.value, tuple(args), kwargs)
        finally:
            changed = state.undo()
        if changed:
            unsupported(f"{name} changed a global or a closure cell while tracing (undone): "
                        "CPython makes the call")
        if not (isinstance(out, ConstVar) and out.value is None) and not _holds_graph_value(out):
            unsupported(f"{name} returned no tensor: the graph would not keep the call")
        return out


def _holds_graph_value(v) -> bool:
    if isinstance(v, (TensorVar, SymNodeVar)):
        return True
    items = getattr(v, "items", None)
    if isinstance(items, dict):
        items = items.values()
    return isinstance(items, (list, tuple, type({}.values()))) and any(map(_holds_graph_value, items))


class ConstantResultVar(ObjectVar):
    """A function marked by torch.compiler.assume_constant_result: called once while
    tracing (on constant arguments), its result is a constant nothing guards."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        if not all(a.is_const() for a in (*args, *kwargs.values())):
            unsupported(f"{getattr(self.value, '__name__', 'a function')} (assume_constant_result) "
                        f"called on arguments that are not constants")
        try:
            result = self.value(*[a.as_const() for a in args],
                                **{k: v.as_const() for k, v in kwargs.items()})
        except Exception as e:
            unsupported(f"{getattr(self.value, '__name__', 'a function')} (assume_constant_result) "
                        f"raised {type(e).__name__}")
        if not is_constant_value(result):
            unsupported(f"{getattr(self.value, '__name__', 'a function')} (assume_constant_result) "
                        f"returned a {type(result).__name__}, not a constant")
        return ConstVar(result)


class ForeignCallableVar(ObjectVar):
    """A callable another compiler owns (torch.compile'd) or that torch's markers keep
    out of compilers (torch.compiler.disable): never inlined; calling it is a graph
    break, and CPython makes the call."""
    __slots__ = ("reason",)

    def __init__(self, value, source, reason: str):
        super().__init__(value, source)
        self.reason = reason

    def call(self, tx, args, kwargs):
        unsupported(self.reason)

    def call_method(self, tx, name, args, kwargs):
        if name in ("__call__", "forward"):
            unsupported(self.reason)
        return super().call_method(tx, name, args, kwargs)

class OptimizedWrapperVar(ObjectVar):
    """What optimize() returns (a hooked function, an OptimizedModule), met while
    tracing: calls trace the wrapped function or module into this graph, as
    torch.compile inlines a nested compiled region (a disable() inside still breaks
    the graph there).  As a value it stays the wrapper: identity, type, and what a
    graph break hands to CPython.  `inner` is the wrapped object's Var."""
    __slots__ = ("inner",)

    def __init__(self, value, source, inner: Var):
        super().__init__(value, source)
        self.inner = inner

    def call(self, tx, args, kwargs):
        return self.inner.call(tx, args, kwargs)

    def _own(self, name) -> bool:
        # An OptimizedModule answers the rest from its module (its __getattr__, and its
        # methods delegate); a hooked function is itself.
        return not isinstance(self.value, torch.nn.Module) or name in vars(self.value) or \
            name.startswith("__") and name not in ("__call__", "__dict__")

    def call_method(self, tx, name, args, kwargs):
        if name == "__call__":
            return self.inner.call(tx, args, kwargs)
        if self._own(name):
            return super().call_method(tx, name, args, kwargs)
        return self.inner.call_method(tx, name, args, kwargs)

    def getattr(self, tx, name):
        return super().getattr(tx, name) if self._own(name) else self.inner.getattr(tx, name)

    def setattr(self, tx, name, value):
        if self._own(name):
            return super().setattr(tx, name, value)
        return self.inner.setattr(tx, name, value)


class GlobalsDictVar(Var):
    """A module's namespace dict (`globals()`, `vars(module)`, `module.__dict__`): its
    items are that module's globals, read and written through the same records as
    LOAD_GLOBAL / STORE_GLOBAL and module attributes, so every spelling sees every write."""
    __slots__ = ("namespace",)

    def __init__(self, namespace: dict):
        super().__init__(ConstSource(namespace, f"{namespace.get('__name__', '?')}.__dict__"))
        self.namespace = namespace

    def python_type(self):
        return dict

    def getitem(self, tx, key):
        if not key.is_const() or not isinstance(key.as_const(), str):
            unsupported(f"globals()[{key}]")
        return read_global(tx, self.namespace, key.as_const())

    def setitem(self, tx, key, value):
        if not key.is_const() or not isinstance(key.as_const(), str):
            unsupported(f"globals()[{key}] = ...")
        write_global(tx, self.namespace, key.as_const(), value)

    def contains(self, tx, item):
        if not item.is_const() or not isinstance(item.as_const(), str):
            unsupported(f"{item} in globals()")
        name = item.as_const()
        if tx.side_effects.load_global(self.namespace, name) is not None:
            return True
        found = name in self.namespace
        tx.guards.equals(ContainsSource(self.source, name), found)
        return found

    def call_method(self, tx, name, args, kwargs):
        if name in ("__getitem__", "__setitem__", "__contains__") and not kwargs:
            if name == "__getitem__" and len(args) == 1:
                return self.getitem(tx, args[0])
            if name == "__setitem__" and len(args) == 2:
                self.setitem(tx, *args)
                return ConstVar(None)
            if name == "__contains__" and len(args) == 1:
                return ConstVar(self.contains(tx, args[0]))
        if name == "get" and 1 <= len(args) <= 2 and not kwargs:
            if self.contains(tx, args[0]):
                return self.getitem(tx, args[0])
            return args[1] if len(args) == 2 else ConstVar(None)
        unsupported(f"globals().{name}()")

    def noun(self):
        return f"globals() of module {self.namespace.get('__name__', '?')}"

    def __repr__(self):
        return f"GlobalsDictVar({self.namespace.get('__name__', '?')})"


def read_global(tx, namespace: dict, name: str):
    """Global `name` of the module whose namespace is `namespace`, as the trace has it."""
    written = tx.side_effects.load_global(namespace, name)
    if written is not None:
        return written
    if name not in namespace:
        unsupported(f"KeyError/AttributeError: {namespace.get('__name__', '?')} has no {name!r}")
    source = GlobalSource(name) if namespace is tx.root.f_globals else \
        GetItemSource(ConstSource(namespace, f"{namespace.get('__name__', '?')}.__dict__"), name)
    return wrap(tx, namespace[name], source)


def write_global(tx, namespace: dict, name: str, value):
    tx.side_effects.store_global(namespace, name, value, namespace is tx.root.f_globals)


def module_namespace(value):
    """The module whose __dict__ `value` is, as its namespace, or None."""
    if type(value) is not dict:
        return None
    name = value.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return value if module is not None and getattr(module, "__dict__", None) is value else None


# Calls of torch functions given a value of a kind above objects (torch.from_numpy,
# torch.as_tensor ... of a traced ndarray): fn -> rule(tx, fn, args, kwargs), None for
# a call the rule leaves to the graph.  The kind's module registers it (numpy).
_TORCH_CALL_RULES: dict = {}


torch_call_rule = registrar(_TORCH_CALL_RULES)   # (rules for calls, with arguments, of each)


def _hashable(value) -> bool:
    try:
        hash(value)
    except Exception:   # (unhashable, or a __hash__ that raises: a half-built frozen dataclass)
        return False
    return True


class TorchFnVar(ObjectVar):
    """A torch function, Tensor method or operator: its calls become graph nodes."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        fn = self.value
        if fn in TRACE_TIME_ANSWERS:
            return ConstVar(TRACE_TIME_ANSWERS[fn])
        if fn is torch._C._set_grad_enabled:
            return GradModeSetVar().call(tx, args, kwargs)
        if is_check(fn):
            return call_check(tx, fn, args, kwargs)
        if is_tensor_of_numbers(fn, args):
            return tensor_of_numbers(tx, fn, args, kwargs)
        rule = _TORCH_CALL_RULES.get(fn) if args else None
        if rule is not None:
            made = rule(tx, fn, args, kwargs)
            if made is not None:
                return made
        if fn in _GLOBAL_STATE_READERS:
            return _read_global_state(tx, fn)
        if tx.output.functionalizes and any(fn is op for op in _RNN_OPS):
            # AOTAutograd's fake kernels for the fused RNN ops do not match the real
            # ones (mkldnn_rnn_layer gives a tensor where the kernel gives none: its
            # saved-tensor check fails on every call, after the compile).  Left to
            # CPython, as torch.compile leaves RNN modules (allow_rnn=False); the
            # eager backend runs them as traced.
            unsupported(f"torch.{fn.__name__} (a fused RNN op) on a backend that re-traces the graph",
                        hint="the eager backend compiles it")
        if fn is torch.use_deterministic_algorithms or fn is torch._C._set_deterministic_algorithms:
            return _set_deterministic(tx, args, kwargs)
        if fn in _GLOBAL_STATE_WRITERS:
            unsupported(f"torch.{fn.__name__} changes global state")
        if not args and not kwargs and _is_state_reader(fn) and _is_flag(fn()):
            return _read_global_state(tx, fn)       # torch.autograd._profiler_enabled()
        if _is_state_writer(fn):
            unsupported(f"torch.{fn.__name__} changes global state")
        made = foreach_tensor_scalars(tx, fn, args, kwargs)
        if made is not None:
            return made
        made = group_by_device_and_dtype(tx, fn, args, kwargs)
        if made is not None:
            return made
        out = tx.output.call("call_function", fn, tuple(args), kwargs)
        if not args and not kwargs and isinstance(out, (ConstVar, ListVar)):
            # Computed from nothing but torch's global state, which nothing guards.
            unsupported(f"torch.{getattr(fn, '__name__', fn)}() returned a constant")
        return out


_RNN_OPS = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu,
            torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu)


def _set_deterministic(tx, args, kwargs):
    """torch.use_deterministic_algorithms(mode, warn_only=): a node in the graph where
    the ops after it run, and set again by the transformed code where it leaves the
    graph.  The state it leaves is the call's, whatever it was at entry: nothing to
    guard.  Not switched while tracing (a graph break traces the frame again from the
    entry state): the trace's readers answer with the call's state."""
    if len(args) != 1 or set(kwargs) - {"warn_only"} or \
            not all(v.is_const() for v in (*args, *kwargs.values())):
        unsupported("torch.use_deterministic_algorithms with traced or unexpected arguments")
    mode, warn_only = args[0].as_const(), kwargs["warn_only"].as_const() if kwargs else False
    if type(mode) is not bool or type(warn_only) is not bool:
        unsupported("torch.use_deterministic_algorithms of a non-bool (TypeError)")
    if type(tx.output).__name__ == "SubgraphOutput":
        # (the body of a higher-order op: its graph runs elsewhere, or several times)
        unsupported("torch.use_deterministic_algorithms inside a higher-order op's body")
    tx.output.graph.create_node("call_function", torch._C._set_deterministic_algorithms,
                                (mode,), {"warn_only": warn_only})
    tx.output.deterministic = (mode, warn_only)
    return ConstVar(None)


_DETERMINISTIC_READERS = {torch.are_deterministic_algorithms_enabled,
                          torch.is_deterministic_algorithms_warn_only_enabled,
                          torch.get_deterministic_debug_mode,
                          torch._C._get_deterministic_algorithms,
                          torch._C._get_deterministic_algorithms_warn_only}


def _read_deterministic(fn, state):
    """What `fn` answers in the state the frame set (torch's own answer, switched to it
    for the call)."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch._C._set_deterministic_algorithms(state[0], warn_only=state[1])
    try:
        return fn()
    finally:
        torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])


def _read_global_state(tx, fn):
    value = fn()
    if tx.output.deterministic is not None and fn in _DETERMINISTIC_READERS:
        # what the frame set: the same on every run
        return ConstVar(_read_deterministic(fn, tx.output.deterministic))
    entry = tx.output.entry_state
    if entry is not None and tx.output.open_contexts:
        # Inside contexts the trace entered for real, the answer is the context's,
        # from the state at frame entry: that state is what the guards check.
        # (Each reader's answer there depends on the context and its own state before.)
        if fn not in entry:
            unsupported(f"reading torch.{fn.__name__}() inside a context")
        if fn is not torch.is_grad_enabled:
            tx.guards.global_state(fn.__name__, fn, entry[fn])
        return ConstVar(value)
    if fn is not torch.is_grad_enabled:
        # Grad mode is guarded at frame entry, and changes inside the frame are traced;
        # the others can only change outside it.
        tx.guards.global_state(fn.__name__, fn, value)
    return ConstVar(value)


class SuperVar(Var):
    """super(cls, obj): attribute lookup starts after cls in obj's MRO."""
    __slots__ = ("cls", "obj")

    def __init__(self, cls: Var, obj: Var):
        super().__init__(None)
        self.cls = cls
        self.obj = obj

    def getattr(self, tx, name):
        cls = self.cls.as_const() if not isinstance(self.cls, ObjectVar) else self.cls.value
        # super(C, obj) searches type(obj)'s MRO; super(C, klass) in a classmethod,
        # klass's own (and binds classmethods to it).
        start = self.obj.value if isinstance(self.obj, ObjectVar) and isinstance(self.obj.value, type) \
            and isinstance(cls, type) and issubclass(self.obj.value, cls) else self.obj.python_type()
        mro = start.__mro__
        if cls not in mro:
            unsupported(f"super({cls!r}, {self.obj}): not an instance or subtype")
        for klass in mro[mro.index(cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                # A base's class dict can be patched (`Parent.scale = 7`): guarded
                # through an equivalent super object, which reads the MRO again.
                tx.guards.class_attr(mro[0], name, attr, after=cls)
                made = base_container_method(self.obj, klass, name, attr)
                if made is not None:
                    return made
                if attr is torch.nn.Module.__init__ and getattr(self.obj, "initialized", False):
                    return _ModuleInitDoneVar()
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVar(wrap(tx, attr, None, guard=False), self.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodVar(wrap(tx, attr.__func__, None, guard=False), ObjectVar(start))
                if isinstance(attr, staticmethod):
                    return wrap(tx, attr.__func__, None, guard=False)
                if isinstance(attr, property):
                    return wrap(tx, attr.fget, None, guard=False).call(tx, [self.obj], {})
                if klass is object and name == "__setattr__":
                    return BoundMethodVar(GenericSetattrVar(), self.obj)
                if klass is object and name == "__getattribute__":
                    return BoundMethodVar(GenericGetattrVar(), self.obj)
                if not isinstance(attr, (types.FunctionType, types.WrapperDescriptorType,
                                         types.MethodDescriptorType)) and \
                        not (klass is object or getattr(klass, "__module__", "") == "builtins"):
                    return wrap(tx, attr, None, guard=False)   # a value: guarded above
                if name == "__init__" and self.obj.builtin_init is not None:
                    return self.obj.builtin_init()       # an exception's args
                if klass is object or getattr(klass, "__module__", "") == "builtins":
                    if name == "__init__":
                        return _NoOpVar()
                    if klass is object and name == "__new__":
                        from .user_objects import ObjectNewVar  # (lazy: import cycle, to break)
                        return ObjectNewVar()
                    if name in _PURE_READERS and hasattr(self.obj, "value"):
                        return _RealMethodVar(attr, self.obj.value, self.obj.source)
                    unsupported(f"super().{name} of a builtin class")
                if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                    unsupported(f"super().{name} is implemented in C")
                return wrap(tx, attr, None, guard=False)
        unsupported(f"super() has no attribute {name!r}")



_PURE_READERS = {"get", "__getitem__", "__contains__", "__len__", "keys", "values", "items",
                 "count", "index"}


class _RealMethodVar(Var):
    """A read-only method of a builtin type, called on the real object at trace time
    (e.g. dict.get on a registry that is a dict subclass)."""
    __slots__ = ("method", "obj", "obj_source")

    def __init__(self, method, obj, obj_source=None):
        super().__init__(None)
        self.method = method
        self.obj = obj
        self.obj_source = obj_source

    def call(self, tx, args, kwargs):
        if not _all_const(args, kwargs) or kwargs:
            unsupported(f"{self.method.__qualname__} with traced arguments")
        consts = _consts(args)
        result = self.method(self.obj, *consts)
        listed = isinstance(result, (type({}.keys()), type({}.values()), type({}.items())))
        if listed:
            result = list(result)       # a view, read as the list of what it shows now
        if self.obj_source is None:
            return wrap(tx, result, None, guard=False)
        if not CallMethodSource.supports(consts):
            unsupported(f"{self.method.__qualname__} on arguments a guard cannot name")
        # The object's contents can change between calls: read again by the guard.
        var = wrap(tx, result, CallMethodSource(self.obj_source, self.method.__name__, consts,
                                                as_list=listed, through=self.method))
        if listed:
            # A new list, which the frame may mutate freely: not the source's object.
            tx.output.object_vars.pop(id(result), None)
            var = ListVar(list(var.items))
        return var


class ContextVarVar(ValueVar):
    """A contextvars.ContextVar: set/get/reset while tracing act on a traced value, which
    must be reset before the frame returns (no lasting side effect)."""
    __slots__ = ()

    def call_method(self, tx, name, args, kwargs):
        state = tx.output.context_vars
        cv = self.value
        if name == "set" and len(args) == 1:
            token = _TokenVar(cv, state.get(id(cv)))
            state[id(cv)] = args[0]
            return token
        if name == "get":
            if id(cv) in state and state[id(cv)] is not None:
                return state[id(cv)]
            try:
                value = cv.get(*_consts(args))
            except LookupError:
                unsupported(f"ContextVar {cv.name} has no value")
            # Its value can differ on the next call: read again by the guard.
            if self.source is None or not CallMethodSource.supports(_consts(args)):
                unsupported(f"ContextVar {cv.name}.get() with no way to guard its value")
            return wrap(tx, value, CallMethodSource(self.source, "get", _consts(args)))
        if name == "reset" and len(args) == 1 and isinstance(args[0], _TokenVar):
            state[id(cv)] = args[0].previous
            if args[0].previous is None:
                state.pop(id(cv), None)
            return ConstVar(None)
        unsupported(f"ContextVar.{name}")


class _TokenVar(Var):
    __slots__ = ("cv", "previous")

    def __init__(self, cv, previous):
        super().__init__(None)
        self.cv = cv
        self.previous = previous


class GenericSetattrVar(Var):
    """object.__setattr__ (called by a class's own __setattr__): the plain store,
    descriptors included, without the class's hook."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        from .attributes import InstanceAttrs  # (lazy: import cycle, to break)
        from .user_objects import DataclassVar  # (lazy: import cycle, to break)
        if len(args) == 3 and not kwargs and isinstance(args[0], DataclassVar) and \
                args[1].is_const() and isinstance(args[1].as_const(), str):
            args[0].plain_setattr(tx, args[1].as_const(), args[2])
            return ConstVar(None)
        if len(args) != 3 or kwargs or not args[1].is_const() or \
                not isinstance(args[0], InstanceAttrs):
            unsupported(f"object.__setattr__ on {args[0] if args else None}")
        args[0].generic_setattr(tx, args[1].as_const(), args[2])
        return ConstVar(None)


class GenericGetattrVar(Var):
    """object.__getattribute__ (called by a class's own __getattribute__): the plain
    lookup, descriptors included, without the class's hook."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        from .attributes import InstanceAttrs  # (lazy: import cycle, to break)
        if len(args) != 2 or kwargs or not args[1].is_const() or \
                not isinstance(args[0], InstanceAttrs) or type(args[1].as_const()) is not str:
            unsupported(f"object.__getattribute__ on {args[0] if args else None}")
        return args[0].generic_getattr(tx, args[1].as_const())


class _ModuleInitDoneVar(Var):
    """nn.Module.__init__ reached through super() from the __init__ of a module made in
    the frame: already run, on the real blank module (see modules.construct_module)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        if args or kwargs:
            unsupported("nn.Module.__init__() with arguments")
        return ConstVar(None)


class _NoOpVar(Var):
    """object.__init__ reached through super(): does nothing."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return ConstVar(None)


def namespace_var(tx, namespace: dict) -> GlobalsDictVar:
    """The one GlobalsDictVar of the trace for a module's namespace dict."""
    known = tx.output.object_vars.get(id(namespace))
    if known is not None and known[0] is namespace:
        return known[1]
    var = GlobalsDictVar(namespace)
    tx.output.object_vars[id(namespace)] = (namespace, var)
    return var


# ---------------------------------------------------------------- helpers
_NO_KEY = object()


def _lookup_key(v):
    """The real key a traced value looks up in a real mapping: a constant, or a
    function (hashed by identity); _NO_KEY for others."""
    if isinstance(v, UserFunctionVar):
        return v.fn
    if isinstance(v, ObjectVar) and _named_arg(v.value) and \
            type(v.value).__hash__ is object.__hash__ and type(v.value).__eq__ is object.__eq__:
        # a class or a typing form (`Union`), hashed by identity: the object itself finds
        # what it finds in CPython, and guards name it as a constant
        return v.value
    return v.as_const() if v.is_const() else _NO_KEY


def _is_type_hint(value) -> bool:
    """Builtin generic classes (list[int]) and typing's forms (Optional[int]), whose
    subscripts only make annotation objects (evaluated by `def` when annotations are)."""
    if isinstance(value, type):
        return value.__module__ in ("builtins", "collections.abc", "collections") and \
            "__class_getitem__" in value.__dict__
    return type(value).__module__ == "typing"


def _hint_arg(v):
    if isinstance(v, ObjectVar):
        return v.value
    if type(v).__name__ == "TupleVar":
        return tuple(_hint_arg(i) for i in v.items)
    if v.is_const():
        return v.as_const()
    unsupported(f"type hint argument {v}")


def _type_hint(tx, hint, key):
    try:
        made = hint[_hint_arg(key)]
    except Exception as e:
        unsupported(f"{hint}[...] raised {type(e).__name__}: {e}")
    return wrap(tx, made, None, guard=False)



def _all_const(args, kwargs):
    return all(a.is_const() for a in args) and all(v.is_const() for v in kwargs.values())


def _consts(args):
    return [a.as_const() for a in args]


def _const_kwargs(kwargs):
    return {k: v.as_const() for k, v in kwargs.items()}


def _is_library_object(value) -> bool:
    if isinstance(value, (types.CodeType, types.MappingProxyType)):
        return True     # immutable: nothing to guard below them
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None) or ""
    root = name.split(".")[0]
    return root in ("torch", "math", "operator", "builtins", "functools", "itertools",
                    "collections", "typing", "numbers") or (
        isinstance(value, type) and value.__module__ == "builtins")


_CONST_CLASSES = {torch.Size, torch.device, torch.finfo, torch.iinfo, slice}

_PURE_LIBRARY_FUNCTIONS = set()
for _name in ("sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "floor",
              "ceil", "pow", "isclose", "isfinite", "isinf", "isnan", "prod", "gcd", "fabs",
              "erf", "atan", "atan2", "degrees", "radians", "hypot", "comb", "factorial"):
    if hasattr(math, _name):
        _PURE_LIBRARY_FUNCTIONS.add(getattr(math, _name))
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pos", "not_",
              "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "index"):
    _PURE_LIBRARY_FUNCTIONS.add(getattr(operator, _name))

_OPERATORS = {v for k, v in vars(operator).items() if callable(v) and not k.startswith("_")
              and not isinstance(v, type)} - {operator.attrgetter, operator.itemgetter,
                                              operator.methodcaller}

# What libraries ask to choose their compile-friendly paths: while frametrace traces,
# the program is being compiled (as under torch.compile), and not scripted or traced.
TRACE_TIME_ANSWERS = {
    torch.compiler.is_compiling: True,
    torch.compiler.is_dynamo_compiling: True,
    torch.compiler.is_exporting: False,
    torch.jit.is_scripting: False,
    torch.jit.is_tracing: False,
    torch._C._get_tracing_state: None,
    # How torch was built: fixed for the life of the process.
    torch.distributed.is_available: torch.distributed.is_available(),
}

_GLOBAL_STATE_READERS = {torch.is_grad_enabled, torch.get_default_dtype,
                         torch.is_inference_mode_enabled, torch.are_deterministic_algorithms_enabled,
                         torch.backends.mha.get_fastpath_enabled,
                         # Whether torch.fx's symbolic tracer runs (it may run a compiled
                         # function): read now, and guarded.
                         torch.fx._symbolic_trace.is_fx_tracing,
                         torch.fx._symbolic_trace.is_fx_symbolic_tracing}


def _global_state_readers():
    """The readers above, and those of modules torch imports lazily, once the program
    has imported them (torch.onnx's export flag, read and guarded as the others)."""
    onnx = sys.modules.get("torch.onnx")
    reader = getattr(onnx, "is_in_onnx_export", None)
    return _GLOBAL_STATE_READERS | {reader} if reader is not None else _GLOBAL_STATE_READERS


def entry_state_readers():
    """The state readers answered inside contexts entered while tracing (see
    `OutputGraph.entering_context`)."""
    names = ("is_autocast_enabled", "is_autocast_cache_enabled", "is_autocast_cpu_enabled",
             "get_autocast_cpu_dtype", "get_autocast_gpu_dtype", "is_autocast_ipu_enabled",
             "is_autocast_xla_enabled", "get_autocast_ipu_dtype", "get_autocast_xla_dtype")
    return (*_global_state_readers(), torch._C._is_torch_function_enabled,
            torch._C._is_torch_function_all_disabled, torch._C._is_torch_function_mode_enabled,
            *(getattr(torch, n) for n in names if hasattr(torch, n)))


def _is_state_reader(fn) -> bool:
    """A torch function of no arguments that reads a flag (is_*, get_*, *_enabled):
    evaluated again by the guard."""
    name = getattr(fn, "__name__", "").lstrip("_")
    return name.startswith(("is_", "get_", "are_")) or name.endswith("_enabled")


def _is_flag(value) -> bool:
    """Values the global-state guard can compare with `is`."""
    return value is None or type(value) is bool or isinstance(value, torch.dtype)


def _is_state_writer(fn) -> bool:
    """torch.set_num_threads, torch._C._set_cudnn_enabled ...: run at trace time, they
    would change the state once and never again."""
    return getattr(fn, "__name__", "").lstrip("_").startswith("set_")


_GLOBAL_STATE_WRITERS = {torch.manual_seed, torch.set_grad_enabled, torch.set_default_dtype,
                         torch.use_deterministic_algorithms, torch.set_printoptions,
                         torch.seed}


_MUTABLE_ITERABLES = (type({}.keys()), type({}.values()), type({}.items()), bytearray, set,
                      memoryview)


def _is_iterator(value) -> bool:
    try:
        return iter(value) is value
    except Exception:
        return False
