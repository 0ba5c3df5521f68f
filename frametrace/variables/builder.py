"""`wrap`: from a real value found in the frame to a Var, with the guards the trace
relies on.  This is where every input-derived guard is made.

The rule (guards.py says it in full): a value wrapped with a source is guarded for
every fact its Var answers without looking again: constants by value, containers by
type and length or keys (their items through their own sources), user objects and
lists by type (their attributes and items are guarded where read), everything else by
identity.  An identity guard does not cover an object's mutable state: Vars that read
it (function attributes, class dicts, len() of a set, os.environ.get) guard what they
read through a source of their own.  A second path to an object already wrapped is
guarded to be the same object; distinct mutable objects are guarded distinct at the
end of the trace (convert._guard_aliasing).  ``guard=False`` is only for values the
caller guarded another way or that have no outside source."""
from __future__ import annotations

import builtins
import collections
import contextvars
import enum
import functools
import sys
import types

import torch

from .. import _C, config
from ..source import AttrSource, GetItemSource
from .base import register, unsupported
from .fx_values import fx_can_name
from .constant import ConstVar, is_constant_value
from .containers import DictVar, ListVar, NamedTupleVar, TupleVar, constant_key
from .higher_order import higher_order_var
from .functorch import functorch_var
from .autograd_function import autograd_function_apply_var
from .functions import BoundMethodVar, PartialVar, UserFunctionVar, in_inlined_torch_package, is_inlinable
from .modules import NNModuleVar
from .builtins import BuiltinVar
from .iterators import wrap_outer_list_iterator
from .contexts import GradModeRestore, GradModeSetVar, NoOpExitVar, no_op_exit, wrap_context_object
from .numpy import VALUE_TYPES as NUMPY_VALUE_TYPES, numpy_callable_var, wrap_numpy_value
from ..interop import allowed_in_graph, assumed_constant, foreign_reason
from .objects import (ConstantResultVar, ContextVarVar, ForeignCallableVar, InGraphCallVar, ObjectVar,
                      OptimizedWrapperVar, TorchFnVar, module_namespace, namespace_var)
from .log_calls import logger_var
from .stdlib import DequeVar, library_var
from .user_objects import UserObjectVar, has_own_getattribute
from .optimizers import prefer_device_counters
from .subclasses import wrap_container_subclass, wrap_tensor_keyed_dict

_BUILTIN_IDS = {id(v) for v in vars(builtins).values() if callable(v)}


def wrap(tx, value, source, guard: bool = True):
    """Make a Var for `value`, read from `source`.  With ``guard=False`` (attributes of
    torch and the standard library) only tensors are guarded.

    The Var is the first answer of the rules below, tried in their order (see
    `wrap_rule`): the rules for values, then those for objects used as they are (whose
    Var is remembered, one per object), then, once the object is guarded by identity,
    the rest, ObjectVar last."""
    guards = tx.guards if (guard and source is not None) else None
    known = tx.output.object_vars.get(id(value))
    if known is not None and known[0] is value:
        # One Var per mutable object, so every path to it sees the same mutations; the
        # trace now relies on both paths reaching the same object.
        if guards is not None and known[1].source is not None and known[1].source != source:
            guards.same_object(source, known[1].source)
        return known[1]
    cls = type(value)
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _plan(cls)
    values, objects, identified = plan
    for rule in values:
        var = rule(tx, value, source, guards, guard)
        if var is not None:
            return var
    for rule in objects:
        var = rule(tx, value, source, guards, guard)
        if var is not None:
            break
    else:
        if guards is not None:
            guards.identity(source, value)
        for rule in identified:
            var = rule(tx, value, source, guards, guard)
            if var is not None:
                break
        else:
            var = ObjectVar(value, source)
    if isinstance(var, (ListVar, DictVar, UserObjectVar, NNModuleVar)):
        tx.output.object_vars[id(value)] = (value, var)
    return var


register(wrap)      # (the Var modules under builder call it through base.wrap)

_constant_key = constant_key      # (dict keys the keys guard compares by type and value)


# -- the registry --
# A rule is `rule(tx, value, source, guards, guard) -> Var | None` (None: not a value
# it takes; `guards` is None where nothing is to be guarded).  The groups, in the order
# wrap tries them:
#   VALUES      values whose Var guards what it needs (constants, containers, tensors);
#               the first Var is the answer;
#   OBJECTS     objects used as they are, each guarded by its own rule;
#   IDENTIFIED  the same, tried after the object is guarded by identity (nothing above
#               took it); ObjectVar when none answers.
# A Var of the last two that is a list, dict, user object or module is remembered, one
# per object.  The order within a group is the order of registration, which is the
# order of the definitions below: more special kinds first (a subclass before its
# base, a hooked user object before everything).  Today's order:
#   VALUES      a user object whose class hooks attribute reads (by type alone) ·
#               tensors (Parameters, subclasses) · NumPy values · ints and floats that
#               are symbolic inputs · constants (enums too, torch.Size before tuples) ·
#               lists appended to lazily · tuples and lists · plain namedtuples ·
#               deques · a module's namespace dict · dicts of constant keys · dicts
#               keyed by tensors
#   OBJECTS     subclasses of dict, list, tuple · optimize() wrappers · (an optimizer's
#               counters prepared) · foreign callables · allowed in the graph or
#               assumed constant · NumPy callables · grad-mode restores · context
#               objects · higher-order ops · no_op_exit · autograd.Function.apply ·
#               bound methods · functools.partial · user objects (nn.Modules too) ·
#               torch.jit.script functions · a builtin container's bound method ·
#               closures
#   IDENTIFIED  loggers · nn.Modules · ContextVars · functorch transforms · library
#               functions · torch functions · builtins · user functions · a list
#               iterator from outside · ObjectVar
VALUES, OBJECTS, IDENTIFIED = 0, 1, 2
_RULES: list = []       # (group, applies, rule) in the order of registration
# The rules that may take a value of a type, per type: a dict lookup on wrap's hot path.
# Only for types whose class cannot change (C types, immutable ones, torch.Tensor and
# Parameter: `applies` reads the class once); other classes (users', mutable) get every
# rule, each deciding on the value as it is now.
_PLANS: dict = {}
_EVERY_RULE = None
_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8
_FIXED_CLASSES = (torch.Tensor, torch.nn.Parameter)


def wrap_rule(group: int, applies=None):
    """Register the decorated rule last in `group`.  `applies(cls)` says whether the
    rule can take a value of type `cls` at all (it must not say no where the rule could
    answer); None: any type.  Helpers: `exactly(*types)`, `instances(*classes)`."""
    def register_rule(rule):
        global _EVERY_RULE
        _RULES.append((group, applies, rule))
        _PLANS.clear()
        _EVERY_RULE = None
        return rule
    return register_rule


def exactly(*types_):
    """`applies` of a rule for values of exactly these types (``type(v) is T``)."""
    return lambda cls: cls in types_


def instances(*classes):
    """`applies` of a rule for instances of these classes.  isinstance() also believes
    an object's `__class__` (a property, or a proxy's forwarding: weakref.proxy) and a
    metaclass's __instancecheck__: only classes known to report themselves are told
    apart by their bases."""
    checked = any("__instancecheck__" in vars(meta) for c in classes
                  for meta in type(c).__mro__ if meta is not type)
    return lambda cls: checked or issubclass(cls, classes) or not _reports_its_class(cls)


_HONEST_MODULES = ("builtins", "collections", "functools", "torch")


def _reports_its_class(cls) -> bool:
    """Instances of `cls` (a class that cannot change) say `cls` as their `__class__`."""
    return _class_slot(cls) is _CLASS_SLOT and \
        str(getattr(cls, "__module__", "")).partition(".")[0] in _HONEST_MODULES


def _maybe_torch_class(cls) -> bool:
    """Whether the tracer runs a class's code as a user's may change with the
    state of torch (`in_inlined_torch_package`): only classes of torch's modules."""
    return str(getattr(cls, "__module__", "")).startswith("torch")


def _plan(cls):
    """The rules that may take a value of `cls`, by group."""
    global _EVERY_RULE
    flags = cls.__flags__
    if flags & _HEAPTYPE and not flags & _IMMUTABLETYPE and cls not in _FIXED_CLASSES:
        if _EVERY_RULE is None:
            _EVERY_RULE = _grouped(_RULES, None)
        return _EVERY_RULE
    plan = _PLANS[cls] = _grouped(_RULES, cls)
    return plan


def _grouped(rules, cls):
    groups = ([], [], [])
    for group, applies, rule in rules:
        if cls is None or applies is None or applies(cls):
            groups[group].append(rule)
    return tuple(map(tuple, groups))


# -- values (their Vars guard what they need) --
def _hooked_applies(cls) -> bool:
    return _reads_through_python(cls) or _maybe_torch_class(cls)


@wrap_rule(VALUES, _hooked_applies)
def _hooked_user_instance(tx, value, source, guards, guard):
    # isinstance() on this object would run its class's own __getattribute__ (or
    # __class__ property) now, while tracing: a hook that counts or logs would see the
    # compile.  Its Var is chosen by its type alone.
    if _reads_through_python(type(value)) and _is_user_instance(value):
        return _wrap_user_instance(tx, value, source, guards)
    return None


@wrap_rule(VALUES, instances(torch.Tensor))
def _tensor(tx, value, source, guards, guard):
    if isinstance(value, torch.Tensor):
        if source is None:
            unsupported("a tensor reached without a source (a constant tensor held by an object)")
        return tx.output.add_input(value, source)
    return None


@wrap_rule(VALUES, instances(*NUMPY_VALUE_TYPES))
def _numpy_value(tx, value, source, guards, guard):
    if isinstance(value, NUMPY_VALUE_TYPES):
        return wrap_numpy_value(tx, value, source, guards)
    return None


@wrap_rule(VALUES, exactly(int, float))
def _symbolic_number(tx, value, source, guards, guard):
    if guards is not None and type(value) in (int, float) and _may_be_symbolic(tx, source, value):
        return tx.output.add_number_input(value, source)
    return None


# (the types of is_constant_value's values, which the rule asks; an enum by isinstance)
_CONSTANT_TYPES = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, slice,
                   range, torch.memory_format, torch.layout, type(None), type(Ellipsis),
                   type(NotImplemented))
_enum_instances = instances(enum.Enum)


@wrap_rule(VALUES, lambda cls: cls in _CONSTANT_TYPES or _enum_instances(cls))
def _constant(tx, value, source, guards, guard):
    if is_constant_value(value):
        if guards is not None:
            guards.equals(source, value)
        return ConstVar(value, source)
    return None


@wrap_rule(VALUES, exactly(list))
def _lazy_list(tx, value, source, guards, guard):
    if type(value) is list and guards is not None and config.lazy_list_appends:
        guards.type_match(source, value)
        var = ListVar.lazy(tx, value, source)
        tx.output.object_vars[id(value)] = (value, var)
        return var
    return None


@wrap_rule(VALUES, exactly(tuple, list))
def _tuple_or_list(tx, value, source, guards, guard):
    if type(value) not in (tuple, list):
        return None
    if guards is not None:
        guards.length(source, value)
    items = [wrap(tx, v, GetItemSource(source, i) if source is not None else None, guard)
             for i, v in enumerate(value)]
    var = (TupleVar if type(value) is tuple else ListVar)(items, source)
    if type(value) is list:
        tx.output.object_vars[id(value)] = (value, var)
    elif source is not None:
        var.real = value
    return var


@wrap_rule(VALUES, lambda cls: cls.__bases__ == (tuple,))
def _plain_namedtuple(tx, value, source, guards, guard):
    if not _is_plain_namedtuple(type(value)):
        return None
    if guards is not None:
        guards.length(source, value)        # (its exact class, too)
    return NamedTupleVar([wrap(tx, v, GetItemSource(source, i) if source is not None else None, guard)
                          for i, v in enumerate(value)], type(value)._fields, source, type(value))


@wrap_rule(VALUES, exactly(collections.deque))
def _deque(tx, value, source, guards, guard):
    if type(value) is collections.deque:
        return _wrap_deque(tx, value, source, guards, guard)
    return None


@wrap_rule(VALUES, exactly(dict))
def _module_namespace(tx, value, source, guards, guard):
    if module_namespace(value) is not None:
        if guards is not None:
            guards.identity(source, value)      # the trace reads this module's globals
        return namespace_var(tx, value)
    return None


@wrap_rule(VALUES, exactly(dict))
def _dict(tx, value, source, guards, guard):
    if not (type(value) is dict and all(map(_constant_key, value))):
        return None
    if guards is not None:
        # Keys looked up one at a time are guarded one at a time (a registry's
        # get(name), a config's __dict__.get(key)); the whole dict when used whole.
        guards.type_match(source, value)
        var = DictVar.lazy(tx, value, source)
    else:
        var = DictVar({k: wrap(tx, v, GetItemSource(source, k) if source is not None else None,
                               guard) for k, v in value.items()}, source)
    tx.output.object_vars[id(value)] = (value, var)
    return var


@wrap_rule(VALUES, exactly(dict))
def _tensor_keyed_dict(tx, value, source, guards, guard):
    if type(value) is not dict:
        return None
    var = wrap_tensor_keyed_dict(tx, value, source, guards)
    if var is not None:
        tx.output.object_vars[id(value)] = (value, var)
    return var


# -- objects used as they are, each guarded by its rule (a list, dict, user object or
# module among their Vars is remembered) --
_containers = instances(dict, list, tuple)


@wrap_rule(OBJECTS, lambda cls: cls.__module__ != "builtins" and _containers(cls))
def _container_subclass(tx, value, source, guards, guard):
    if type(value).__module__ != "builtins" and isinstance(value, (dict, list, tuple)):
        return wrap_container_subclass(tx, value, source, guards)
    return None


@wrap_rule(OBJECTS, lambda cls: cls is _C.Hooked or "__frametrace_wraps__" in cls.__dict__)
def _optimized_wrapper(tx, value, source, guards, guard):
    inner = _optimized_inner(value)
    if inner is None:
        return None
    if guards is not None:
        guards.identity(source, value)
    return OptimizedWrapperVar(value, source, wrap(
        tx, inner[1], AttrSource(source, inner[0]) if source is not None else None, guard))


@wrap_rule(OBJECTS, instances(torch.optim.Optimizer))
def _optimizer_counters(tx, value, source, guards, guard):
    if isinstance(value, torch.optim.Optimizer):
        prefer_device_counters(value)   # before anything of it is read (its Var comes below)
    return None


@wrap_rule(OBJECTS)
def _foreign(tx, value, source, guards, guard):
    foreign = foreign_reason(value)
    if foreign is None:
        return None
    if guards is not None:
        guards.identity(source, value)
    return ForeignCallableVar(value, source, foreign)


@wrap_rule(OBJECTS)
def _in_graph_or_assumed_constant(tx, value, source, guards, guard):
    if not (allowed_in_graph(value) or assumed_constant(value)):
        return None
    if guards is not None:
        guards.identity(source, value)
    return (InGraphCallVar if allowed_in_graph(value) else ConstantResultVar)(value, source)


@wrap_rule(OBJECTS)
def _numpy_callable(tx, value, source, guards, guard):
    numpy_var = numpy_callable_var(value, source)
    if numpy_var is not None and guards is not None:
        guards.identity(source, value)
    return numpy_var


@wrap_rule(OBJECTS, instances(GradModeRestore))
def _grad_mode_restore(tx, value, source, guards, guard):
    if not isinstance(value, GradModeRestore):
        return None
    if guards is not None:
        guards.type_match(source, value)
        guards.equals(AttrSource(source, "mode"), value.mode)
    if tx.output.outer_grad is None:
        # The exit of the resumed frame's outermost grad-mode `with` (its stack is read
        # bottom first): the mode an exception out of the frame leaves.
        tx.output.outer_grad = value.mode
    return GradModeSetVar(value.mode, source)


@wrap_rule(OBJECTS)
def _context_object(tx, value, source, guards, guard):
    return wrap_context_object(tx, value, source, guards)


@wrap_rule(OBJECTS)
def _higher_order_op(tx, value, source, guards, guard):
    hop = higher_order_var(value, source)
    if hop is not None and guards is not None:
        guards.identity(source, value)
    return hop


@wrap_rule(OBJECTS, exactly(type(no_op_exit)))
def _no_op_exit(tx, value, source, guards, guard):
    if value is not no_op_exit:
        return None
    if guards is not None:
        guards.identity(source, value)
    return NoOpExitVar(source)


@wrap_rule(OBJECTS, instances(types.MethodType, types.BuiltinMethodType))
def _autograd_function_apply(tx, value, source, guards, guard):
    if isinstance(value, (types.MethodType, types.BuiltinMethodType)):
        # (a builtin method from torch 2.14 on)
        return autograd_function_apply_var(tx, value, source, guards)
    return None


@wrap_rule(OBJECTS, instances(types.MethodType))
def _bound_method(tx, value, source, guards, guard):
    if not isinstance(value, types.MethodType):
        return None
    self_source = AttrSource(source, "__self__") if source is not None else None
    func_source = AttrSource(source, "__func__") if source is not None else None
    return BoundMethodVar(wrap(tx, value.__func__, func_source, guards is not None),
                          wrap(tx, value.__self__, self_source, guards is not None), source)


@wrap_rule(OBJECTS, exactly(functools.partial))
def _partial(tx, value, source, guards, guard):
    if type(value) is not functools.partial:
        return None
    if guards is not None:
        guards.type_match(source, value)
    sub = (lambda attr: AttrSource(source, attr)) if source is not None else (lambda attr: None)
    g = guards is not None
    return PartialVar(wrap(tx, value.func, sub("func"), g),
                      wrap(tx, value.args, sub("args"), g).items,
                      wrap(tx, value.keywords, sub("keywords"), g).items, source, value)


@wrap_rule(OBJECTS, lambda cls: _is_user_class(cls) or _maybe_torch_class(cls))
def _user_instance(tx, value, source, guards, guard):
    if _is_user_instance(value):
        return _wrap_user_instance(tx, value, source, guards)
    return None


@wrap_rule(OBJECTS, instances(torch.jit.ScriptFunction))
def _script_function(tx, value, source, guards, guard):
    inline = getattr(value, "_torchdynamo_inline", None) \
        if isinstance(value, torch.jit.ScriptFunction) else None
    if not (isinstance(inline, types.FunctionType) and is_inlinable(inline)):
        return None
    # A torch.jit.script function: its Python original is traced (torch.jit.script keeps
    # it for compilers); the scripted object is guarded by identity.
    if guards is not None:
        guards.identity(source, value)
    return wrap(tx, inline, AttrSource(source, "_torchdynamo_inline") if source is not None
                else None, guards is not None)


@wrap_rule(OBJECTS, exactly(types.BuiltinMethodType))
def _container_method(tx, value, source, guards, guard):
    if not (type(value) is types.BuiltinMethodType and type(value.__self__) in _CONTAINER_TYPES
            and source is not None):
        return None
    # `log.append` held on a stack at a break: a new bound method on every call, so not
    # an identity; it is the method of its (wrapped, guarded) object.
    if guards is not None:
        guards.type_match(source, value)
    owner = wrap(tx, value.__self__, AttrSource(source, "__self__"), guards is not None)
    return owner.getattr(tx, value.__name__)


@wrap_rule(OBJECTS, instances(types.FunctionType))
def _closure(tx, value, source, guards, guard):
    if not (isinstance(value, types.FunctionType) and value.__closure__ and guards is not None
            and is_inlinable(value)):
        return None
    # A closure: often a new function object per call of its parent.  Guard its code;
    # its cells and defaults are read (and guarded) through it.
    guards.type_match(source, value)
    guards.identity(AttrSource(source, "__code__"), value.__code__)
    return UserFunctionVar(value, source)


# -- objects guarded by identity (wrap adds the guard before these) --
@wrap_rule(IDENTIFIED)
def _logger(tx, value, source, guards, guard):
    return logger_var(ObjectVar(value, source), value)


@wrap_rule(IDENTIFIED, instances(torch.nn.Module))
def _module(tx, value, source, guards, guard):
    return NNModuleVar(value, source) if isinstance(value, torch.nn.Module) else None


@wrap_rule(IDENTIFIED, instances(contextvars.ContextVar))
def _context_var(tx, value, source, guards, guard):
    return ContextVarVar(value, source) if isinstance(value, contextvars.ContextVar) else None


@wrap_rule(IDENTIFIED)
def _functorch_transform(tx, value, source, guards, guard):
    return functorch_var(value, source)


@wrap_rule(IDENTIFIED)
def _library_function(tx, value, source, guards, guard):
    return library_var(value, source)


@wrap_rule(IDENTIFIED)
def _torch_function(tx, value, source, guards, guard):
    return TorchFnVar(value, source) if is_torch_callable(value) else None


@wrap_rule(IDENTIFIED)
def _builtin(tx, value, source, guards, guard):
    if id(value) in _BUILTIN_IDS and getattr(builtins, getattr(value, "__name__", ""), None) is value:
        return BuiltinVar(value, source)
    return None


@wrap_rule(IDENTIFIED, instances(types.FunctionType))
def _user_function(tx, value, source, guards, guard):
    if isinstance(value, types.FunctionType) and is_inlinable(value):
        return UserFunctionVar(value, source)
    return None


@wrap_rule(IDENTIFIED, exactly(type(iter([]))))
def _outer_list_iterator(tx, value, source, guards, guard):
    if type(value) is _LIST_ITERATOR and guards is not None:
        return wrap_outer_list_iterator(tx, value, source)
    return None



def _may_be_symbolic(tx, source, value) -> bool:
    """Whether a number from the frame is a symbolic input (once it has changed between
    calls).  Ints held by nn.Modules stay constants, as torch.compile has them (a
    module's sizes are not expected to change; a change recompiles) until they have
    changed twice (a counter); their floats once they have changed."""
    policy = tx.output.policy
    if type(value) is float:
        return policy.dynamic_float(source, value, held_by_module=_under_module(tx, source))
    if _under_module(tx, source):
        return policy.dynamic_module_int(source, value)
    return policy.dynamic_int(source, value)


def _under_module(tx, source) -> bool:
    owners = []
    while isinstance(source, (AttrSource, GetItemSource)):
        source = source.base
        owners.append(source)
    if not owners:
        return False
    objects = tx.output.object_vars
    if config.incremental_module_sources and isinstance(objects, ObjectVars):
        modules, training = objects.owner_sources()
    else:
        modules, training = _owner_sources(objects.values())
    for owner in owners:            # (nearest first)
        if owner in training:
            return False
        if owner in modules:
            return True
    return False


def _owner_sources(objects, into=None) -> tuple[set, set]:
    """The sources of the traced nn.Modules, and of optimizers and LR schedulers: their
    numbers are training state wherever it is held (`self.sched.last_epoch` of a trainer
    module), counters that change every step.  (By type: isinstance would ask an object
    its own `__class__`.)  `into`: the two sets to add them to."""
    modules, training = (set(), set()) if into is None else into
    for value, var in objects:
        if var.source is None:
            continue
        if isinstance(var, NNModuleVar):
            modules.add(var.source)
        if issubclass(type(value), _TRAINING_STATE):
            training.add(var.source)
    return modules, training


class ObjectVars(dict):
    """`OutputGraph.object_vars` ({id(object): (object, Var)}), which keeps the sources of
    its module and training-state Vars (`owner_sources`, for `_under_module`, asked at
    every number wrapped) up to date as entries are added, instead of collecting them
    from every entry at each question: built at the first question, extended by each
    new entry, built again after any other change (an entry replaced or removed).  A
    Var's source is set when it is made, before it is entered here.
    `config.incremental_module_sources = False` collects them at each question."""
    __slots__ = ("_owners",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._owners = None

    def owner_sources(self) -> tuple[set, set]:
        if self._owners is None:
            self._owners = _owner_sources(self.values())
        return self._owners

    def __setitem__(self, key, item):
        if self._owners is not None:
            if key in self:
                self._owners = None
            else:
                _owner_sources([item], self._owners)
        super().__setitem__(key, item)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __delitem__(self, key):
        self._owners = None
        super().__delitem__(key)

    def pop(self, *args):
        self._owners = None
        return super().pop(*args)

    def popitem(self):
        self._owners = None
        return super().popitem()

    def clear(self):
        self._owners = None
        super().clear()

    def update(self, *args, **kwargs):
        self._owners = None
        super().update(*args, **kwargs)

    def __ior__(self, other):
        self._owners = None
        return super().__ior__(other)


_TRAINING_STATE = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


# (copyreg caches __slotnames__ on the class when an instance is copied or pickled.)
_NAMEDTUPLE_KEYS = frozenset(collections.namedtuple("_", "a").__dict__) - {"a"} | {
    "__orig_bases__", "__annotations__", "__slotnames__"}


def _is_plain_namedtuple(cls) -> bool:
    """A class collections.namedtuple made, with nothing of the user's added: its
    instances are tuples with field names."""
    return cls.__bases__ == (tuple,) and isinstance(cls.__dict__.get("_fields"), tuple) and \
        set(cls.__dict__) - set(cls._fields) <= _NAMEDTUPLE_KEYS


def _wrap_deque(tx, value, source, guards, guard):
    """A deque from outside: its items and maxlen are guarded as a list's; changes to
    it are written back after the graph."""
    if guards is not None:
        guards.length(source, value)
        guards.equals(AttrSource(source, "maxlen"), value.maxlen)
    items = [wrap(tx, v, GetItemSource(source, i) if source is not None else None, guard)
             for i, v in enumerate(value)]
    var = DequeVar(items, value.maxlen, source)
    tx.output.object_vars[id(value)] = (value, var)
    return var


_LIST_ITERATOR = type(iter([]))


_CONTAINER_TYPES = (list, dict, set, frozenset, tuple, str, bytes)


def _optimized_inner(value):
    """(attribute, callable) that an optimize() wrapper runs under the hook, or None."""
    if type(value) is _C.Hooked:
        return "fn", value.fn
    # (an OptimizedModule says where its module is: the class is the hook's front,
    # above the values, and not imported here)
    attr = type(value).__dict__.get("__frametrace_wraps__")
    if attr is not None:
        return attr, value.__dict__[attr]
    return None


def _wrap_user_instance(tx, value, source, guards):
    if guards is not None:
        guards.type_match(source, value)
    if issubclass(type(value), torch.nn.Module):
        if guards is not None and not tx.output.unspecialized(source):
            guards.identity(source, value)
        var = NNModuleVar(value, source)
    else:
        var = UserObjectVar(value, source)
    tx.output.object_vars[id(value)] = (value, var)
    return var


_CLASS_SLOT = object.__dict__["__class__"]
# Classes whose instances wrap() hands to other Vars even when their class has hooks
# (constants, containers, tensors).
_NOT_PLAIN = (enum.Enum, dict, list, tuple, set, frozenset, torch.Tensor, BaseException)


def _reads_through_python(cls) -> bool:
    """Instances of a user's class whose attribute reads, `__class__` included, run
    Python code of the class (a __getattribute__ of its own, or a `__class__`
    property, which isinstance() reads)."""
    try:
        hooked = has_own_getattribute(cls) or _class_slot(cls) is not _CLASS_SLOT
    except Exception:
        return False
    return hooked and not issubclass(cls, _NOT_PLAIN) and _is_user_class(cls)


def _class_slot(cls):
    for klass in cls.__mro__:
        if "__class__" in klass.__dict__:
            return klass.__dict__["__class__"]
    return None


def _is_user_instance(value) -> bool:
    """Instances of classes defined in Python by users (or libraries such as
    transformers), as opposed to functions, classes, modules and builtin types."""
    cls = type(value)
    if not _is_user_class(cls):
        return False
    if issubclass(cls, torch.nn.Module) or in_inlined_torch_package(getattr(cls, "__module__", "") or ""):
        return True
    if _reads_through_python(cls):      # (hasattr would run the class's hook)
        return cls.__dictoffset__ != 0 or hasattr(cls, "__slots__")
    return hasattr(value, "__dict__") or hasattr(cls, "__slots__")


def _is_user_class(cls) -> bool:
    """The class test of `_is_user_instance` (by the object's real type: isinstance
    would ask the object for its `__class__`)."""
    if issubclass(cls, torch.nn.Module):
        return True
    if issubclass(cls, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                        types.MethodType, types.CodeType, torch.Tensor)):
        return False
    module = getattr(cls, "__module__", "") or ""
    if in_inlined_torch_package(module):
        return True             # an optimizer, an LR scheduler, a distribution: objects we trace
    if module == "builtins" or module.startswith(("torch", "typing", "enum")) or \
            (module.startswith("_") and module != "__main__") or \
            module.split(".")[0] in sys.stdlib_module_names:
        return False
    return True


def is_torch_callable(value) -> bool:
    """Functions whose calls become graph nodes: torch.*, torch.nn.functional.*, Tensor
    methods, torch.ops overloads."""
    if isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return True
    if isinstance(value, type):
        return False
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType,
                          types.MethodDescriptorType, types.WrapperDescriptorType)):
        if isinstance(value, types.FunctionType) and is_inlinable(value):
            return False        # nn.Module code (forwards, staticmethods): traced through
        if not fx_can_name(value):
            return False        # FX would write a path to it that does not exist
        objclass = getattr(value, "__objclass__", None)
        if objclass is torch._C.TensorBase or objclass is torch.Tensor:
            return True
        module = getattr(value, "__module__", None) or ""
        if module == "torch" or module.startswith(("torch.nn.functional", "torch._C", "torch.functional",
                                                   "torch.linalg", "torch.fft", "torch.special",
                                                   "torch._tensor", "torch.nn.modules")):
            return True
        owner = getattr(value, "__self__", None)
        if isinstance(owner, types.ModuleType) and owner.__name__.startswith("torch"):
            return True
    return False
