"""nn.Modules reached from the frame.  Calling one inlines its forward (and runs its
hooks the way nn.Module.__call__ would); parameters and buffers become graph inputs."""
from __future__ import annotations

import operator
import types

import torch
from torch.nn.modules import module as module_mod
import inspect

from .. import distributed
from ..source import AttrSource, GetItemSource
from .base import Var, object_var, unsupported, wrap
from .classes import class_attr, class_defines, class_lookup, guard_class_none
from .constant import ConstVar, MethodVar
from .containers import DictVar, ListVar, TupleVar
from .iterators import LazyIteratorVar
from .functions import BoundMethodVar, UserFunctionVar, call_rule, module_calls
from .tensor import TensorVar

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
               torch.nn.ParameterList, torch.nn.ParameterDict)
_global_hooks_checked = "global_module_hooks"


class NNModuleVar(Var):
    """An nn.Module (guarded by identity)."""
    __slots__ = ("module",)

    def __init__(self, module, source):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return type(self.module)

    def as_const(self):
        return self.module

    # -- attributes --
    def _child_source(self, store, name):
        if self.source is None:
            return None
        # Read the tables directly: nn.Module.__getattr__ is slow, and guards on
        # parameters run on every call.
        return GetItemSource(AttrSource(self.source, store), name)

    def getattr(self, tx, name):
        m = self.module
        # The class is guarded only where the answer comes from it: what the instance
        # holds is read through a source (whose guard does the whole lookup again).
        cls_attr = class_lookup(type(m), name)
        if isinstance(cls_attr, property):
            tx.guards.class_attr(type(m), name, cls_attr)
            return _call_property(tx, cls_attr, self)
        written = tx.side_effects.load_attr(self.module, name)
        if written is not None:
            return written
        d = m.__dict__
        # Module.__getattr__ reads the tables only where object.__getattribute__ found
        # nothing: a class attribute of the name (a method, None) or an instance one wins.
        tables = ("_parameters", "_buffers", "_modules") if name not in d and \
            cls_attr is None and not class_defines(type(m), name) else ()
        for store in tables:
            table = d.get(store)
            if table is not None and name in table:
                _refuse_pending_writes(tx, m, store, whole=False)
                instead = getattr(tx.output, "reparametrized", None)
                if instead is not None and store != "_modules":
                    got = instead[0].get((id(m), name))
                    if got is not None and got[0] is m:
                        return got[1]       # (torch.func.functional_call's tensor)
                return wrap(tx, table[name], self._child_source(store, name))
        source = AttrSource(self.source, name) if self.source is not None else None
        if name in d:
            return wrap(tx, d[name], source)
        if cls_attr is not None:
            tx.guards.class_attr(type(m), name, cls_attr)
            _shadowing_guard(tx, self.source, m, name, cls_attr)
        if name in _INTROSPECTION and cls_attr is getattr(torch.nn.Module, name):
            return MethodVar(self, name)
        if isinstance(cls_attr, types.FunctionType):
            return BoundMethodVar(UserFunctionVar(cls_attr), self)
        if isinstance(cls_attr, staticmethod):
            return wrap(tx, cls_attr.__func__, None, guard=False)
        if isinstance(cls_attr, classmethod):
            return BoundMethodVar(wrap(tx, cls_attr.__func__, None, guard=False),
                                  object_var(type(m)))
        if cls_attr is not None:
            return wrap(tx, cls_attr, source)
        if class_defines(type(m), name):          # a class attribute that is None
            guard_class_none(tx, type(m), name)
            _shadowing_guard(tx, self.source, m, name, None)
            return ConstVar(None)
        unsupported(f"attribute {name!r} of module {type(m).__name__}")

    def setattr(self, tx, name, value):
        cls = type(self.module)
        hook = class_attr(tx, cls, "__setattr__")
        if hook is not torch.nn.Module.__setattr__:
            unsupported(f"{cls.__name__} defines __setattr__")
        attr = class_attr(tx, cls, name)
        if isinstance(attr, property):
            # Module.__setattr__ runs the property's setter (a plain store would skip it).
            if not isinstance(attr.fset, types.FunctionType):
                unsupported(f"AttributeError: property {name!r} of {cls.__name__} has no setter")
            UserFunctionVar(attr.fset).call(tx, [self, value], {})
            return
        if attr is not None and hasattr(type(attr), "__set__"):
            unsupported(f"setting {name!r} through a descriptor of {cls.__name__}")
        _check_module_store(self.module, name, value)
        tx.side_effects.store_attr(self, self.module, name, value)

    def call_method(self, tx, name, args, kwargs):
        m = self.module
        if name in _INTROSPECTION and name not in m.__dict__ and \
                class_attr(tx, type(m), name) is getattr(torch.nn.Module, name):
            _shadowing_guard(tx, self.source, m, name, getattr(torch.nn.Module, name))
            return _INTROSPECTION[name](tx, self, args, kwargs)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstVar(self.length(tx))
        if name in ("items", "keys", "values") and isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            pairs = [(k, self._member(tx, k)) for k in self._keys(tx)]
            if name == "keys":
                return ListVar([ConstVar(k) for k, _ in pairs])
            if name == "values":
                return ListVar([v for _, v in pairs])
            return ListVar([TupleVar([ConstVar(k), v]) for k, v in pairs])
        return self.getattr(tx, name).call(tx, args, kwargs)

    # -- containers --
    def _table(self, tx, store):
        """The module's real `store` table (_modules, _parameters, ...), which the
        trace has not changed."""
        _refuse_pending_writes(tx, self.module, store)
        return getattr(self.module, store)

    def _member(self, tx, key):
        m = self.module
        store = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        key = str(key)
        return wrap(tx, self._table(tx, store)[key], self._child_source(store, key))

    def _keys(self, tx):
        """The container's member names, guarded: a ModuleList can be appended to."""
        m = self.module
        store = "_parameters" if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict)) \
            else "_modules"
        table = self._table(tx, store)
        if self.source is not None:
            tx.guards.dict_keys(AttrSource(self.source, store), table)
        return list(table.keys())

    def _own_dunder(self, tx, name):
        """The class's own `name` method, written in Python outside torch.nn (a module
        that forwards `self[k]` or `len(self)` to its container), or None."""
        fn = class_attr(tx, type(self.module), name)
        if isinstance(fn, types.FunctionType) and not (fn.__module__ or "").startswith("torch.nn."):
            return fn
        return None

    def getitem(self, tx, key):
        m = self.module
        own = self._own_dunder(tx, "__getitem__")
        if own is not None:
            return UserFunctionVar(own).call(tx, [self, key], {})
        if not isinstance(m, _CONTAINERS):
            unsupported(f"indexing module {type(m).__name__}")
        if not key.is_const():
            unsupported("module index that is not a constant")
        k = key.as_const()
        keys = self._keys(tx)
        if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return self._member(tx, k)
        if isinstance(k, slice):
            return ModuleSliceVar([self._member(tx, name) for name in keys[k]], self, k)
        return self._member(tx, keys[k])

    def unpack(self, tx):
        m = self.module
        if self._own_dunder(tx, "__iter__") is not None:
            unsupported(f"iterating over module {type(m).__name__} (its own __iter__)")
        if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstVar(k) for k in self._keys(tx)]
        if isinstance(m, _CONTAINERS):
            return [self._member(tx, k) for k in self._keys(tx)]
        unsupported(f"iterating over module {type(m).__name__}")

    def length(self, tx):
        own = self._own_dunder(tx, "__len__")
        if own is not None:
            n = UserFunctionVar(own).call(tx, [self], {})
            if not (n.is_const() and type(n.as_const()) is int):
                unsupported(f"len() of module {type(self.module).__name__}: __len__ gave {n}")
            return n.as_const()
        if isinstance(self.module, _CONTAINERS):
            return len(self._keys(tx))
        unsupported(f"len() of module {type(self.module).__name__}")

    def truth(self, tx):
        own = self._own_dunder(tx, "__bool__")
        if own is not None:
            return UserFunctionVar(own).call(tx, [self], {}).truth(tx)
        if self._own_dunder(tx, "__len__") is not None:
            return self.length(tx) != 0         # (bool() falls back on __len__)
        return True if not isinstance(self.module, _CONTAINERS) else bool(self._keys(tx))

    # -- calls --
    def call(self, tx, args, kwargs):
        # (before the class's own __call__ too: HF's checkpointing layers have one)
        _refuse_distributed(self.module)
        call = class_attr(tx, type(self.module), "__call__")
        if call is not torch.nn.Module.__dict__["__call__"]:
            # The class's own __call__ (its super().__call__ comes back to module_call).
            if not isinstance(call, types.FunctionType):
                unsupported(f"{type(self.module).__name__}.__call__ is not a Python function")
            return UserFunctionVar(call).call(tx, [self, *args], kwargs)
        return self.module_call(tx, args, kwargs)

    def module_call(self, tx, args, kwargs):
        """What nn.Module.__call__ does: pre-hooks, forward, forward hooks."""
        m = self.module
        _refuse_distributed(m)
        _guard_global_hooks(tx)
        for table in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            _refuse_pending_writes(tx, m, table)
        if m._backward_hooks or m._backward_pre_hooks:
            unsupported(f"backward hooks on {type(m).__name__}")
        # nn.Module._call_impl calls self.forward: a forward stored on the instance
        # (model.forward = ..., as PEFT and accelerate patch it; here or by the frame)
        # comes before the class's, a staticmethod takes no self.
        patched = self._written_forward(tx)
        if patched is None and "forward" in m.__dict__:
            patched = self.getattr(tx, "forward")       # (guarded through its source)
        forward = class_attr(tx, type(m), "forward")
        if isinstance(forward, staticmethod) and isinstance(forward.__func__, types.FunctionType) \
                and patched is None:
            patched = UserFunctionVar(forward.__func__)
        if patched is None and not isinstance(forward, types.FunctionType):
            unsupported(f"{type(m).__name__}.forward is not a Python function")
        if "forward" not in m.__dict__:
            _shadowing_guard(tx, self.source, m, "forward", forward)
        if self.source is not None:
            if m._forward_hooks or m._forward_pre_hooks:
                tx.guards.hook_keys(self.source, m)
            else:
                tx.guards.no_hooks(self.source, m)
        for hook_id, hook in list(m._forward_pre_hooks.items()):
            hook_var = _hook_var(tx, hook)
            if hook_id in m._forward_pre_hooks_with_kwargs:
                result = hook_var.call(tx, [self, TupleVar(args), _dict(kwargs)], {})
                if not _is_none(result):
                    args, kwargs = result.unpack(tx)
                    args, kwargs = args.unpack(tx), dict(kwargs.items)
            else:
                result = hook_var.call(tx, [self, TupleVar(args)], {})
                if not _is_none(result):
                    args = result.unpack(tx) if isinstance(result, TupleVar) else [result]
        if patched is not None:
            out = patched.call(tx, list(args), kwargs)
        else:
            out = UserFunctionVar(forward).call(tx, [self, *args], kwargs)
        for hook_id, hook in list(m._forward_hooks.items()):
            hook_var = _hook_var(tx, hook)
            if hook_id in m._forward_hooks_with_kwargs:
                result = hook_var.call(tx, [self, TupleVar(args), _dict(kwargs), out], {})
            else:
                result = hook_var.call(tx, [self, TupleVar(args), out], {})
            if not _is_none(result):
                out = result
        return out

    def _written_forward(self, tx):
        """The `forward` the frame stored on this instance, if it did (a Var)."""
        return tx.side_effects.load_attr(self.module, "forward")

    def noun(self):
        return f"the {type(self.module).__qualname__} module"

    def __repr__(self):
        return f"NNModuleVar({type(self.module).__name__})"


class ModuleSliceVar(Var):
    """`container[i:j]` of a ModuleList or Sequential (HF: `self.layers[:n]`): a new
    container of the same class in CPython, whose members the trace iterates, counts
    and indexes.  What would tell it from a list (storing it on a module, methods,
    operators) is refused; leaving the frame, it is made again from its container."""
    __slots__ = ("items", "parent", "index")

    def __init__(self, items, parent, index):
        super().__init__(None)
        self.items, self.parent, self.index = items, parent, index

    def python_type(self):
        return type(self.parent.module)

    def unpack(self, tx):
        return list(self.items)

    def length(self, tx):
        return len(self.items)

    def truth(self, tx):
        return bool(self.items)

    def getitem(self, tx, key):
        if key.is_const() and type(key.as_const()) is int and -len(self.items) <= key.as_const() < len(self.items):
            return self.items[key.as_const()]
        return super().getitem(tx, key)

    def reconstruct(self, cg):
        if self.parent.source is None:
            return super().reconstruct(cg)
        i = self.index     # (a slice is no code constant before 3.14: built)
        cg.call_const(operator.getitem, [self.parent.source.reconstruct, lambda cg: cg.call_const(
            slice, [lambda cg, v=v: cg.load_const(v) for v in (i.start, i.stop, i.step)])])

    def noun(self):
        return f"a slice of the {type(self.parent.module).__qualname__} module"


@call_rule(*module_calls())
def _call_module(tx, args, kwargs):
    """nn.Module.__call__ spelled out (`m.__call__(x)`, `super().__call__(x)`): what
    calling the module does, hooks included."""
    if args and isinstance(args[0], NNModuleVar):
        return args[0].module_call(tx, args[1:], kwargs)
    return None


def _refuse_distributed(m):
    """A call of a DDP or FSDP2 module is a break: CPython makes it, and the module's
    forward compiles as a frame of its own."""
    if distributed.is_ddp(m):
        # Its forward prepares the C++ reducer for the backward (and broadcasts
        # buffers): calls no graph can hold, made in CPython, around the wrapped module.
        unsupported("DistributedDataParallel's forward runs in CPython (its reducer's "
                    "bookkeeping); the wrapped module compiles as its own frame")
    if distributed.is_fsdp_managed(m):
        # Its hooks all-gather and reshard the parameters and hook the autograd graph:
        # collectives around the module, made in CPython.
        unsupported(f"FSDP2 module {type(m).__name__}: its hooks (all-gather, reshard) "
                    "run in CPython; its forward compiles as its own frame")


def _dict(kwargs):
    return DictVar(kwargs)


def _is_none(v):
    return isinstance(v, ConstVar) and v.value is None


def _hook_var(tx, hook):
    return wrap(tx, hook, None, guard=False)


def _guard_global_hooks(tx):
    names = [n for n in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                         "_global_backward_pre_hooks", "_global_forward_hooks_always_called")
             if hasattr(module_mod, n)]
    if any(getattr(module_mod, n) for n in names):
        unsupported("global nn.Module hooks are registered")
    tx.guards.no_global_hooks(names)


def _check_module_store(m, name, value):
    """The TypeErrors Module.__setattr__ raises, raised in place (by stopping the trace at
    the store) rather than when the store is replayed after the graph."""
    if isinstance(value, ModuleSliceVar):
        # (a module in CPython, filed into _modules: the store is CPython's to make)
        unsupported(f"storing {value} on a module")
    is_none = isinstance(value, ConstVar) and value.value is None
    if name in m.__dict__.get("_parameters", {}) and not is_none and not (
            isinstance(value, TensorVar) and value.python_type() is torch.nn.Parameter):
        unsupported(f"TypeError: cannot assign {value} as parameter {name!r}")
    if name in m.__dict__.get("_modules", {}) and not is_none and not isinstance(value, NNModuleVar):
        unsupported(f"TypeError: cannot assign {value} as child module {name!r}")
    if name in m.__dict__.get("_buffers", {}) and not is_none and not isinstance(value, TensorVar):
        unsupported(f"TypeError: cannot assign {value} as buffer {name!r}")


def _shadowing_guard(tx, source, obj, name, attr):
    """A method or other non-data descriptor from the class is what ``obj.name`` gives
    only while the instance's own dict does not shadow it."""
    if source is not None and hasattr(obj, "__dict__") and not hasattr(type(attr), "__set__"):
        tx.guards.not_in_dict(source, name, obj=obj)


def _call_property(tx, prop, obj_var):
    if prop.fget is None:
        unsupported("property without getter")
    return wrap(tx, prop.fget, None, guard=False).call(tx, [obj_var], {})


def _named(kind):
    """nn.Module's own iterator methods (named_parameters(prefix=..., recurse=...,
    remove_duplicate=...), modules() ...), run on the real module for the names and
    their order; each item is the Var read from its path below the module."""
    def method(tx, self, args, kwargs):
        if not all(a.is_const() for a in (*args, *kwargs.values())):
            unsupported(f"{kind}() with arguments that are not constants")
        a = [v.as_const() for v in args]
        kw = {k: v.as_const() for k, v in kwargs.items()}
        impl = getattr(torch.nn.Module, kind)
        for mod in (self.module.modules() if _recurses(kind, a, kw) else (self.module,)):
            for store in _STRUCTURE:
                _refuse_pending_writes(tx, mod, store)
        try:
            items = list(impl(self.module, *a, **kw))
            paths = _unprefixed_paths(self.module, kind, a, kw)
        except Exception as e:       # a bad argument: CPython raises it
            unsupported(f"{kind}() raised {type(e).__name__}: {e}")
        _guard_structure(tx, self, kind, _recurses(kind, a, kw))
        out = []
        for item, path in zip(items, paths):
            name, obj = item if kind.startswith("named_") else (None, item)
            var = self if path == "" else wrap(tx, obj, _path_source(self, path))
            out.append(var if name is None else TupleVar([ConstVar(name), var]))
        return LazyIteratorVar(iter(out), types.GeneratorType)
    return method


_STRUCTURE = ("_parameters", "_buffers", "_modules")


def table_changed(tx, m, store) -> bool:
    """Whether the trace replaced or changed module `m`'s table `store` (_modules,
    _parameters, a hook table ...): writes that CPython makes only after the graph."""
    se = tx.side_effects
    if se.load_attr(m, store) is not None:
        return True
    table = m.__dict__.get(store)
    known = tx.output.object_vars.get(id(table))
    return known is not None and known[0] is table and se.container_mutated(known[1])


def _refuse_pending_writes(tx, m, store, whole=True):
    """A module's table read off the real module must be what the trace sees: a write
    the trace made to it (add_module, ModuleList.extend, a parameter or submodule
    stored as an attribute, a new hook) is replayed only after the graph, so the read
    is refused and CPython makes it, after the writes.  `whole`: the table's keys are
    read (not one entry, whose own pending store the caller has looked up)."""
    if table_changed(tx, m, store):
        unsupported(f"{type(m).__name__}'s {store.strip('_')} changed earlier in the frame")
    se, table = tx.side_effects, m.__dict__.get(store)
    if whole and store in _STRUCTURE:
        # (Module.__setattr__ files a module or parameter, or a new value of a name
        # already there, into the tables)
        for name, value in se.attr_writes(m):
            if (table and name in table) or isinstance(value, NNModuleVar) or \
                    (isinstance(value, TensorVar) and issubclass(value.python_type(), torch.nn.Parameter)):
                unsupported(f"{type(m).__name__}.{name} stored earlier in the frame "
                            f"(its {store.strip('_')} are read now)")


def _unprefixed_paths(m, kind, args, kwargs):
    """The dotted path below `m` of each item `kind(*args, **kwargs)` yields, in order."""
    bound = inspect.signature(getattr(torch.nn.Module, kind)).bind(m, *args, **kwargs)
    params = dict(bound.arguments)
    params.pop("self")
    if "memo" in params and params["memo"] is not None:
        raise TypeError("a memo set is not supported")
    if "prefix" in params:
        params["prefix"] = ""
    named = kind if kind.startswith("named_") else f"named_{kind}"
    return [n for n, _ in getattr(torch.nn.Module, named)(m, **params)]


def _recurses(kind, args, kwargs) -> bool:
    """Whether parameters()/buffers() (and their named_ forms) walk submodules."""
    if "parameters" not in kind and "buffers" not in kind:
        return True
    bound = inspect.signature(getattr(torch.nn.Module, kind)).bind(None, *args, **kwargs)
    return bool(bound.arguments.get("recurse", True))


def _guard_structure(tx, self, kind, recurse=True):
    """What the introspection walks (submodule names, and their parameter or buffer
    names) is guarded by keys: modules can be added and removed between calls.  With
    recurse=False only the module's own parameters or buffers are walked."""
    if self.source is None:
        return
    stores = ([] if not recurse else ["_modules"]) + \
        (["_parameters"] if "parameters" in kind else []) + (["_buffers"] if "buffers" in kind else [])
    subs = [("", self.module)] if kind in ("named_children", "children") or not recurse \
        else self.module.named_modules()
    for name, sub in subs:
        source = _path_source(self, name) if name else self.source
        for store in stores:
            tx.guards.dict_keys(AttrSource(source, store), getattr(sub, store))


def _path_source(self, dotted):
    """Source of a parameter or submodule named by a dotted path below `self`."""
    if self.source is None:
        return None
    source = self.source
    m = self.module
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if not last:
            source = GetItemSource(AttrSource(source, "_modules"), part)
            m = m._modules[part]
        elif part in m._parameters:
            source = GetItemSource(AttrSource(source, "_parameters"), part)
        elif part in m._buffers:
            source = GetItemSource(AttrSource(source, "_buffers"), part)
        else:
            source = GetItemSource(AttrSource(source, "_modules"), part)
    return source


_INTROSPECTION = {name: _named(name) for name in (
    "named_children", "children", "named_parameters", "parameters", "named_buffers", "buffers",
    "named_modules", "modules")}


class NewModuleVar(NNModuleVar):
    """An nn.Module made in the frame (``nn.Softmax(dim=-1)(x)``, ``ACT2FN["gelu"]``): a
    real blank instance on which nn.Module.__init__ ran (torch's own bookkeeping: empty
    tables, training=True), with the class's __init__ inlined; what that stores lives
    here as Vars.  It holds no parameters or buffers (they would be new random tensors
    on each call), and it cannot leave the frame (no source to rebuild it from).
    Buffers registered by its __init__ (``CrossEntropyLoss()``'s weight, None, or a
    tensor computed in the frame) are attributes like the others: introspection that
    would list them is refused."""
    __slots__ = ("attrs", "initialized", "buffers")

    def __init__(self, module):
        super().__init__(module, None)
        self.attrs = {}
        self.initialized = True
        self.buffers = set()

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name in ("_parameters", "_buffers", "_modules", "__dict__"):
            unsupported(f"{name} of a module made in the frame")
        if name == "register_buffer" and class_attr(tx, type(self.module), name) is \
                torch.nn.Module.register_buffer:
            return MethodVar(self, name)   # (its body reads the tables this Var holds)
        return super().getattr(tx, name)

    def setattr(self, tx, name, value):
        cls = type(self.module)
        if class_attr(tx, cls, "__setattr__") is not torch.nn.Module.__setattr__:
            unsupported(f"{cls.__name__} defines __setattr__")
        attr = class_attr(tx, cls, name)
        if attr is not None and hasattr(type(attr), "__set__"):
            if isinstance(attr, property) and isinstance(attr.fset, types.FunctionType):
                UserFunctionVar(attr.fset).call(tx, [self, value], {})
                return
            unsupported(f"setting {name!r} through a descriptor of {cls.__name__}")
        if isinstance(value, TensorVar) and issubclass(value.python_type(), torch.nn.Parameter):
            unsupported(f"a parameter of a module made in the frame ({cls.__name__}.{name})")
        if name in self.buffers and not (isinstance(value, TensorVar) or _is_none(value)):
            unsupported(f"assigning a {value.python_type().__name__} to buffer {name!r} (TypeError)")
        self.attrs[name] = value

    def _written_forward(self, tx):
        return self.attrs.get("forward")

    def call_method(self, tx, name, args, kwargs):
        if name == "register_buffer" and name not in self.attrs and \
                class_attr(tx, type(self.module), name) is torch.nn.Module.register_buffer:
            return self._register_buffer(tx, *_bind_register_buffer(args, kwargs))
        if name in _INTROSPECTION or name.startswith("register_"):
            unsupported(f"{name}() of a module made in the frame")
        return super().call_method(tx, name, args, kwargs)

    def _register_buffer(self, tx, name, tensor):
        """nn.Module.register_buffer's checks, then the buffer is an attribute (whether
        it is persistent only matters to state_dict(), which is refused here)."""
        if not (isinstance(tensor, TensorVar) or _is_none(tensor)) or \
                (isinstance(tensor, TensorVar) and issubclass(tensor.python_type(), torch.nn.Parameter)):
            unsupported("register_buffer() of something other than a tensor or None")
        if "." in name or not name or (name in self.attrs and name not in self.buffers) or \
                class_attr(tx, type(self.module), name) is not None:
            unsupported(f"register_buffer({name!r}) raises (a bad or taken name)")
        if not _no_buffer_hooks():
            unsupported("register_buffer() with global buffer registration hooks")
        tx.guards.global_state("no global buffer registration hooks", _no_buffer_hooks, True,
                               text="no global buffer registration hooks")
        self.buffers.add(name)
        self.attrs[name] = tensor
        return ConstVar(None)


    def noun(self):
        return f"a {type(self.module).__qualname__} module made in the frame"

    def __repr__(self):
        return f"NewModuleVar({type(self.module).__name__})"


def _no_buffer_hooks() -> bool:
    return not torch.nn.modules.module._global_buffer_registration_hooks


def _bind_register_buffer(args, kwargs):
    """(name, tensor) of ``register_buffer(name, tensor, persistent=True)``, the name a
    constant string."""
    names = ("name", "tensor", "persistent")
    if len(args) > 3 or set(kwargs) - set(names[len(args):]):
        unsupported("register_buffer() with unexpected arguments (TypeError)")
    bound = dict(zip(names, args), **kwargs)
    if "name" not in bound or "tensor" not in bound:
        unsupported("register_buffer() missing arguments (TypeError)")
    name = bound["name"]
    if not (name.is_const() and type(name.as_const()) is str):
        unsupported("register_buffer() with a name that is not a constant string")
    persistent = bound.get("persistent")
    if persistent is not None and not persistent.is_const():
        unsupported("register_buffer() with a traced persistent flag")
    return name.as_const(), bound["tensor"]


def construct_module(tx, cls, args, kwargs):
    """``cls(*args)`` for an nn.Module class while tracing: a NewModuleVar."""
    if type(cls) is not type or issubclass(cls, _CONTAINERS):
        unsupported(f"creating module {cls.__name__} in the frame")
    for name, expected in (("__new__", object.__new__), ("__setattr__", torch.nn.Module.__setattr__),
                           ("__getattr__", torch.nn.Module.__getattr__)):
        if class_attr(tx, cls, name) is not expected:
            unsupported(f"creating module {cls.__name__} in the frame ({name} of its own)")
    init = class_attr(tx, cls, "__init__")
    if not isinstance(init, types.FunctionType):
        unsupported(f"{cls.__name__}.__init__ is not a Python function")
    module = object.__new__(cls)
    torch.nn.Module.__init__(module)
    var = NewModuleVar(module)
    if init is not torch.nn.Module.__init__:
        result = UserFunctionVar(init).call(tx, [var, *args], kwargs)
        if not _is_none(result):
            unsupported(f"TypeError: __init__() should return None, not {result}")
    elif args or kwargs:
        unsupported("nn.Module() takes no arguments")
    return var
