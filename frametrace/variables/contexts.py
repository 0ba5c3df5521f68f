"""Context managers while tracing: grad mode (no_grad, enable_grad, set_grad_enabled,
functions decorated with them), autocast and contextlib.nullcontext.  Mode switches are
graph nodes and also take effect while tracing, so FakeTensors come out right; the
stand-ins for their __exit__ carry them across graph breaks."""
from __future__ import annotations

import _thread
import dis
import inspect

import torch
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
import contextlib
import types
import warnings

from ..bytecode_analysis import instructions
from ..exc import Yield
from .base import Var, register, unsupported, wrap
from .constant import ConstVar
from ..source import AttrSource
from .containers import DictVar, ListVar, TupleVar
from .functions import BoundMethodVar, UserFunctionVar


class GradModeVar(Var):
    """torch.no_grad() / enable_grad() / set_grad_enabled(mode) as a context manager (or
    set_grad_enabled called as a function).  The mode switch is a node of the graph, and
    applies while tracing, so FakeTensors get the right requires_grad."""
    __slots__ = ("mode", "prev")

    def __init__(self, mode: bool, source=None):
        super().__init__(source)
        self.mode = mode
        self.prev = None

    def reconstruct(self, cg):
        # A context object held across a graph break (made, or entered, in the trace).
        if self.source is not None:
            return super().reconstruct(cg)
        remade = isinstance(self, _SetGradEnabledVar)
        cg.call_const(remake_grad_context, [lambda cg: cg.load_const(self.mode),
                                            lambda cg: cg.load_const(self.prev),
                                            lambda cg: cg.load_const(remade)])

    def _set(self, tx, mode):
        if torch.is_grad_enabled() == mode:
            return      # no change: no node (the grad-mode guard fixes the mode here)
        torch._C._set_grad_enabled(mode)
        tx.output.graph.create_node("call_function", torch._C._set_grad_enabled, (mode,))

    def enter(self, tx):
        self.prev = torch.is_grad_enabled()
        self._set(tx, self.mode)
        return ConstVar(None)

    def exit(self, tx):
        self._set(tx, self.prev)

    def call(self, tx, args, kwargs):
        # Used as a decorator: @torch.no_grad() def f(...)
        if len(args) == 1 and not kwargs:
            return GradModeDecoratedVar(self.mode, args[0])
        unsupported("calling a grad-mode context object")


class _SetGradEnabledVar(GradModeVar):
    """torch.set_grad_enabled(mode): already in effect when `with` enters it."""
    __slots__ = ()

    def enter(self, tx):
        # Its constructor switched the mode and kept the one before (for exit).
        tx.output.unscoped_grad.discard(id(self))
        self._set(tx, self.mode)
        return ConstVar(None)

    def call(self, tx, args, kwargs):
        # Used as a decorator, it puts back the mode its constructor switched.
        decorated = super().call(tx, args, kwargs)
        self._set(tx, self.prev)
        return decorated


def remake_grad_context(mode, prev, set_grad_enabled):
    """The grad-mode context object a trace made (its `prev` as the trace had it),
    without switching the mode as set_grad_enabled's constructor would."""
    if set_grad_enabled:
        obj = object.__new__(torch.set_grad_enabled)
        obj.mode = mode
    else:
        obj = (torch.enable_grad if mode else torch.no_grad)()
    if prev is not None:
        obj.prev = prev
    return obj


def wrap_context_object(tx, value, source, guards):
    """The Var for a context object of a kind frametrace models, found in the frame
    (made before a graph break, or passed in), else None."""

    t = type(value)
    if t is torch.no_grad or t is torch.enable_grad:
        if guards is not None:
            guards.type_match(source, value)
        return GradModeVar(t is torch.enable_grad, source)
    if t is torch.set_grad_enabled and type(getattr(value, "prev", None)) is bool:
        if guards is not None:
            guards.type_match(source, value)
            guards.equals(AttrSource(source, "mode"), value.mode)
            guards.equals(AttrSource(source, "prev"), value.prev)
        var = _SetGradEnabledVar(bool(value.mode), source)
        var.prev = value.prev
        return var
    if t is contextlib.nullcontext:
        if guards is not None:
            guards.type_match(source, value)
        inner = AttrSource(source, "enter_result") if source is not None else None
        var = NullContextVar(wrap(tx, value.enter_result, inner, guards is not None))
        var.source = source
        return var
    return None


class GradModeRestore:
    """Stands for a grad-mode context's __exit__ when a graph break falls inside its
    `with` block: called with the exception triple, it restores the mode."""
    __slots__ = ("mode",)

    def __init__(self, mode):
        self.mode = mode

    def __call__(self, *exc):
        torch._C._set_grad_enabled(self.mode)
        return False

    def __repr__(self):
        return f"GradModeRestore({self.mode})"


class GradModeSetVar(Var):
    """A callable that sets grad mode: torch._C._set_grad_enabled, or a GradModeRestore
    carried into a resume function.  Calling it is a mode switch in the graph."""
    __slots__ = ("mode",)

    def __init__(self, mode=None, source=None):
        super().__init__(source)
        self.mode = mode

    def call(self, tx, args, kwargs):
        mode = self.mode
        if mode is None:
            if len(args) != 1 or not args[0].is_const():
                unsupported("torch._C._set_grad_enabled with a traced mode")
            mode = bool(args[0].as_const())
            tx.output.unscoped_grad.add("torch._C._set_grad_enabled")
        GradModeVar(mode)._set(tx, mode)
        return ConstVar(None if self.mode is None else False)


class ContextDecoratedVar(Var):
    """A function decorated with a context (a ContextDecorator): each call runs it in a
    context made anew by `make_ctx`."""
    __slots__ = ("make_ctx", "fn")

    def __init__(self, make_ctx, fn):
        super().__init__(None)
        self.make_ctx = make_ctx
        self.fn = fn

    def call(self, tx, args, kwargs):
        ctx = self.make_ctx()
        ctx.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:        # also when the call raises (an exception the frame may catch)
            ctx.exit(tx)

    def __repr__(self):
        return f"{type(self).__name__}({self.fn!r})"


class GradModeDecoratedVar(ContextDecoratedVar):
    """A function decorated with a grad-mode context while tracing (it can leave the
    frame: rebuilt by `grad_mode_decorated`)."""
    __slots__ = ("mode",)

    def __init__(self, mode, fn):
        super().__init__(lambda: GradModeVar(mode), fn)
        self.mode = mode

    def reconstruct(self, cg):
        cg.call_const(grad_mode_decorated, [lambda cg: cg.load_const(self.mode), self.fn.reconstruct])


@register
def call_in_grad_mode(tx, mode, fn, args, kwargs):
    """A call of a function decorated with a grad mode (a GradModeDecoratedVar's)."""
    return GradModeDecoratedVar(mode, fn).call(tx, args, kwargs)


def grad_mode_decorated(mode, fn):
    """What @torch.enable_grad() / @torch.no_grad() makes of `fn`."""
    return (torch.enable_grad if mode else torch.no_grad)()(fn)


class AutocastVar(Var):
    """torch.autocast(...) as a context manager: entered for real while tracing (so
    FakeTensors get autocast dtypes) and recorded as enter/exit nodes in the graph."""
    __slots__ = ("args", "kwargs", "ctx", "node")

    def __init__(self, args, kwargs):
        super().__init__(None)
        self.args = args
        self.kwargs = kwargs
        self.ctx = None
        self.node = None

    def enter(self, tx):
        self.ctx = torch.autocast(*self.args, **self.kwargs)
        tx.output.entering_context()
        self.ctx.__enter__()
        tx.output.open_contexts.append(self.ctx)
        ctx = self.ctx   # its defaults resolved: dtype, enabled, cache_enabled
        self.node = tx.output.graph.create_node(
            "call_function", _enter_autocast,
            (ctx.device, ctx.fast_dtype, ctx._enabled, ctx._cache_enabled))
        return ConstVar(None)

    def exit(self, tx):
        if self.ctx in tx.output.open_contexts:
            tx.output.open_contexts.remove(self.ctx)
        self.ctx.__exit__(None, None, None)
        tx.output.graph.create_node("call_function", _exit_autocast, (self.node,))


def grad_mode_class(tx, cls, args, kwargs):
    """The context Var for calling torch.no_grad / enable_grad / set_grad_enabled /
    autocast while tracing, else None."""
    if cls is torch.no_grad or cls is torch.enable_grad:
        mode = cls is torch.enable_grad
        if not args and not kwargs:
            return GradModeVar(mode)
        if len(args) == 1 and not kwargs:
            # torch.no_grad(fn) is torch.no_grad()(fn)
            return GradModeDecoratedVar(mode, args[0])
        unsupported(f"{cls.__name__} with arguments")
    if cls is torch.set_grad_enabled and len(args) == 1 and args[0].is_const():
        mode = bool(args[0].as_const())
        # set_grad_enabled(mode) takes effect when called, also outside a `with`.
        var = _SetGradEnabledVar(mode)
        var.prev = torch.is_grad_enabled()
        var._set(tx, mode)
        tx.output.unscoped_grad.add(id(var))        # until a `with` enters it
        return var
    if cls is torch.autocast and all(a.is_const() for a in args) and \
            all(v.is_const() for v in kwargs.values()):
        return AutocastVar([a.as_const() for a in args],
                           {k: v.as_const() for k, v in kwargs.items()})
    return None


class NullContextVar(Var):
    """contextlib.nullcontext(value): `with` gives value and does nothing else.  Also
    the contexts that do nothing a graph can see (profiler ranges); `resumable` says
    whether CPython may run part of the block without them (at a graph break)."""
    __slots__ = ("value", "resumable", "factory", "args")

    def __init__(self, value, resumable=True, factory=None, args=()):
        super().__init__(None)
        self.value = value
        self.resumable = resumable
        # How the transformed code makes it again (None: contextlib.nullcontext(value)):
        # a class called on constants, or None for one it cannot make.
        self.factory = factory
        self.args = args

    def enter(self, tx):
        return self.value

    def exit(self, tx):
        pass

    def reconstruct_exit(self, cg):
        if not self.resumable:
            unsupported(f"a graph break inside 'with' over {self.value}")
        cg.load_const(no_op_exit)

    def reconstruct(self, cg):
        if self.source is not None:
            return super().reconstruct(cg)
        if self.factory is None:
            cg.call_const(contextlib.nullcontext, [self.value.reconstruct])
        elif self.factory is _CANNOT_REMAKE:
            unsupported(f"{self} outlives the trace")
        else:
            cg.call_const(self.factory, [lambda cg, a=a: cg.load_const(a) for a in self.args])

    def remakable(self) -> bool:
        """Whether the transformed code can make it again (at a graph break)."""
        return self.factory is not _CANNOT_REMAKE

    def __repr__(self):
        return f"NullContextVar({getattr(self.factory, '__name__', 'nullcontext')})"


_CANNOT_REMAKE = object()


class SuppressVar(NullContextVar):
    """contextlib.suppress(*exceptions): its exit swallows those exceptions."""
    __slots__ = ()

    def reconstruct_exit(self, cg):
        unsupported("a graph break inside 'with contextlib.suppress(...)'")

    def exit_with(self, tx, args):
        kind = args[0]
        if kind.is_const() and kind.as_const() is None:
            return ConstVar(False)
        cls = kind.as_const() if kind.is_const() else getattr(kind, "value", None)
        if not isinstance(cls, type):
            unsupported(f"the exception type {kind} leaving contextlib.suppress")
        return ConstVar(issubclass(cls, self.args))


class UnusableVar(Var):
    """What a no-op context's __enter__ gives (a profiler object): any use of it stops
    the trace (so the frame runs it in CPython)."""
    __slots__ = ("what",)

    def __init__(self, what):
        super().__init__(None)
        self.what = what

    def __repr__(self):
        return f"UnusableVar({self.what})"


class RunTimeContextVar(Var):
    """A torch context that switches process state the graph's operations depend on
    (inference mode, sdpa_kernel's backends, disabled saved-tensor hooks), made from
    constants: entered for real while tracing, and entered and exited again by nodes of
    the graph at run time, where the state before it is read again."""
    __slots__ = ("factory", "args", "kwargs", "value", "real", "node")

    def __init__(self, factory, args, kwargs, value=None):
        super().__init__(None)
        self.factory = factory
        self.args = args
        self.kwargs = kwargs
        self.value = value           # what `as` binds: None, or a Var for a constant
        self.real = None
        self.node = None

    def enter(self, tx):
        self.real = self.factory(*self.args, **self.kwargs)
        tx.output.entering_context()
        value = self.real.__enter__()
        tx.output.open_contexts.append(self.real)
        self.node = tx.output.graph.create_node(
            "call_function", RunTimeEnter(self.factory, self.args, self.kwargs), ())
        if value is None or value == {}:
            return wrap(tx, value, None, guard=False)
        unsupported(f"the value {type(value).__name__} of 'with {self.factory.__name__}(...)'")

    def call(self, tx, args, kwargs):
        # Used as a decorator: each call of the function enters a new one.
        if len(args) != 1 or kwargs or self.real is not None:
            unsupported(f"calling {self}")
        return ContextDecoratedVar(lambda: RunTimeContextVar(self.factory, self.args, self.kwargs),
                                   args[0])

    def exit(self, tx):
        if self.real in tx.output.open_contexts:
            tx.output.open_contexts.remove(self.real)
        self.real.__exit__(None, None, None)
        tx.output.graph.create_node("call_function", run_time_exit, (self.node,))

    def reconstruct(self, cg):
        if self.real is not None or self.kwargs:
            unsupported(f"{self} outlives the trace")

        def emit(cg, a):
            if isinstance(a, list):
                for item in a:
                    cg.load_const(item)
                cg.build(list, len(a))
            else:
                cg.load_const(a)
        cg.call_const(self.factory, [lambda cg, a=a: emit(cg, a) for a in self.args])

    def __repr__(self):
        return f"RunTimeContextVar({self.factory.__name__})"


class RunTimeEnter:
    """A graph node's target: makes and enters the context, returns it for the exit."""
    def __init__(self, factory, args, kwargs):
        self.factory = factory
        self.args = args
        self.kwargs = kwargs
        # FX names a node's target by these (and keeps the object by reference)
        self.__name__ = self.__qualname__ = f"enter_{factory.__name__}"

    def __call__(self):
        ctx = self.factory(*self.args, **self.kwargs)
        ctx.__enter__()
        return ctx


def run_time_exit(ctx):
    ctx.__exit__(None, None, None)


def no_op_exit(*exc):
    """Stands for nullcontext's __exit__ when a graph break falls inside its block."""
    return False


class NoOpExitVar(Var):
    """no_op_exit carried into a resume function: calling it does nothing."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return ConstVar(False)


# --------------------------------------------------------------------------- user contexts
class UserContextVar(Var):
    """`with obj:` over an object of a user class: its class's __enter__ and __exit__
    (Python functions, found as CPython finds them, on the type) are inlined.  At a graph
    break inside the block the real __exit__ is handed over bound to the object, which
    the transformed code rebuilds or reloads; __enter__ has run once, in the trace."""
    __slots__ = ("obj", "enter_fn", "exit_fn")

    def __init__(self, obj, enter_fn, exit_fn):
        super().__init__(None)
        self.obj = obj
        self.enter_fn = enter_fn
        self.exit_fn = exit_fn

    def enter(self, tx):
        return UserFunctionVar(self.enter_fn).call(tx, [self.obj], {})

    def exit(self, tx):
        none = ConstVar(None)
        self.exit_with(tx, [none, none, none])

    def exit_with(self, tx, args):
        """__exit__(type, value, traceback): what it returns says whether it swallows
        an exception."""
        return UserFunctionVar(self.exit_fn).call(tx, [self.obj, *args], {})

    def reconstruct_exit(self, cg):
        if not never_suppresses(self.exit_fn):
            unsupported(f"a graph break inside 'with' over {self.obj}, whose __exit__ may "
                        "swallow an exception")
        cg.call_const(types.MethodType, [lambda cg: cg.load_const(self.exit_fn),
                                         lambda cg: self.obj.reconstruct(cg)])

    def __repr__(self):
        return f"UserContextVar({self.obj!r})"


class LockContextVar(Var):
    """`with lock:` over a threading.Lock or RLock from outside the frame.  The trace
    runs alone (under the compile lock), but the compiled code runs in any thread: the
    block's writes to outside state, replayed after the graph, are replayed holding
    the lock (side_effects.hold_lock); a block that wrote nothing leaves the lock
    untouched (what it read is guarded at the frame's entry, before any lock).  The
    trace never blocks on the lock: one that is held now (by another thread, or by
    this one: a Lock would deadlock) is not traced through, nor a Lock entered again
    inside its own block.  A graph break inside the block goes to its `with` (CPython
    runs the whole block)."""
    __slots__ = ("lock", "writes_before", "written_before")

    def __init__(self, lock):
        super().__init__(None)
        self.lock = lock

    def enter(self, tx):
        real = self.lock.value
        if type(real) is _thread.LockType:
            free = not real.locked()
        else:
            free = real.acquire(blocking=False)
            if free:
                real.release()
        entered = tx.side_effects.locks_entered
        if not free or (type(real) is _thread.LockType and any(real is e for e in entered)):
            unsupported("'with' over a lock that is held while tracing")
        entered.append(real)
        self.writes_before = tx.side_effects.writes
        self.written_before = len(tx.output.fake_mode.written_storages)
        return ConstVar(True)

    def exit(self, tx):
        entered = tx.side_effects.locks_entered
        if entered and entered[-1] is self.lock.value:
            entered.pop()
        if len(tx.output.fake_mode.written_storages) != self.written_before:
            # (in-place writes of the graph happen before the replay, outside the lock)
            unsupported("an in-place tensor write inside 'with' over a lock")
        if tx.side_effects.writes != self.writes_before:
            tx.side_effects.hold_lock(self.lock)

    def exit_with(self, tx, args):
        self.exit(tx)
        return ConstVar(False)      # (a lock's __exit__ never swallows an exception)

    def reconstruct_exit(self, cg):
        unsupported("a graph break inside 'with' over a lock")

    def __repr__(self):
        return f"LockContextVar({type(self.lock.value).__name__})"


def never_suppresses(fn) -> bool:
    """Whether a Python __exit__ can only return None or False (so it never swallows the
    exception it is given): every return in its code returns one of those constants."""
    code = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE |
                        inspect.CO_ASYNC_GENERATOR):
        return False
    prev = None
    for inst in dis.get_instructions(code):
        if inst.opname == "RETURN_CONST" and inst.argval not in (None, False):
            return False
        if inst.opname == "RETURN_VALUE" and (inst.is_jump_target or not (
                prev is not None and prev.opname == "LOAD_CONST" and prev.argval in (None, False))):
            return False            # (a jump to it brings another value: `return a or None`)
        prev = inst
    return True


# --------------------------------------------------------------------------- contextlib
class GeneratorContextVar(Var):
    """A @contextlib.contextmanager context made while tracing: the generator's frame is
    inlined, run to its yield at enter (the yielded value is what `as` binds) and on to
    its end at exit.  The generator exists only in the trace, so a graph break inside
    the block cannot hand it over (the frame runs in CPython then)."""
    __slots__ = ("func", "args", "kwargs", "frame")

    def __init__(self, func, args, kwargs):
        super().__init__(None)
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.frame = None

    def enter(self, tx):
        if self.frame is not None:
            unsupported("RuntimeError: a contextmanager's generator entered twice")
        tx.take_generator_frame = True
        try:
            frame = self.func.call(tx, list(self.args), dict(self.kwargs))
        finally:
            tx.take_generator_frame = False
        if not isinstance(frame, GeneratorFrameVar):
            unsupported(f"contextmanager over {self.func}, which does not make a generator")
        self.frame = frame
        value = frame.resume()
        if value is None:
            unsupported("RuntimeError: generator didn't yield")
        return value

    def exit(self, tx):
        if self.frame.resume() is not None:
            unsupported("RuntimeError: generator didn't stop")

    def exit_with(self, tx, args):
        if any(not (a.is_const() and a.as_const() is None) for a in args):
            # (thrown into the generator, which may catch it)
            unsupported(f"an exception leaving 'with' over {self}")
        self.exit(tx)
        return ConstVar(False)

    def reconstruct(self, cg):
        """Not entered yet (a graph break at its `with`): made again as the decorated
        function made it; nothing has run of the generator."""
        if self.frame is not None:
            unsupported(f"{self} entered in the trace outlives it")
        cg.call_const_packed(contextlib._GeneratorContextManager, [self.func.reconstruct],
                             list(self.args), dict(self.kwargs))

    def __repr__(self):
        return f"GeneratorContextVar({self.func!r})"


class GeneratorFrameVar(Var):
    """An inlined generator's frame driven by its caller (see GeneratorContextVar)."""
    __slots__ = ("child",)

    def __init__(self, child):
        super().__init__(None)
        self.child = child

    def resume(self):
        """Run to the next yield (its value) or to the end (None)."""
        self.child.root.code_runs += 1
        try:
            self.child.run()
        except Yield as y:
            return y.value
        return None


def _plain_constant(v: Var):
    """The value of a Var made only of constants (pybind enums too, as sdpa_kernel's
    backends), else raise Unsupported."""
    if isinstance(v, (ListVar, TupleVar)):
        items = [_plain_constant(i) for i in v.items]
        return items if isinstance(v, ListVar) else tuple(items)
    if v.is_const():
        return v.as_const()
    value = getattr(v, "value", None)
    if type(type(value)).__name__ == "pybind11_type" and hasattr(value, "name"):
        return value
    unsupported(f"{v} is not a constant")


def _no_op_contexts():
    return {torch.profiler.profile: True, torch.autograd.profiler.profile: True,
            torch.autograd.profiler.record_function: True,
            # (its exit puts back warning filters that CPython code in the block may change)
            warnings.catch_warnings: False}


def _run_time_contexts():
    # (DisableTorchFunctionSubclass changes nothing the graph's ops see, but code in
    # the block reads its state: torch._C._is_torch_function_enabled() is False there)
    return (torch.inference_mode, torch.nn.attention.sdpa_kernel, torch._C.DisableTorchFunctionSubclass,
            torch.autograd.graph.disable_saved_tensors_hooks, torch.random.fork_rng)


def context_function(tx, fn, args, kwargs):
    """The context Var for calling `fn`, a context manager class or function
    frametrace models, else None."""
    if any(fn is f for f in _run_time_contexts()):
        return RunTimeContextVar(fn, [_plain_constant(a) for a in args],
                                 {k: _plain_constant(v) for k, v in kwargs.items()})
    no_op = _no_op_contexts()
    if any(fn is f for f in no_op):
        if fn is warnings.catch_warnings and kwargs.get("record", ConstVar(False)).as_const():
            unsupported("warnings.catch_warnings(record=True)")
        value = ConstVar(None) if fn is warnings.catch_warnings \
            else UnusableVar(fn.__name__)
        remake = fn if fn is warnings.catch_warnings and not kwargs else _CANNOT_REMAKE
        return NullContextVar(value, resumable=no_op[fn], factory=remake)
    if fn is contextlib.suppress and not kwargs:
        kinds = tuple(getattr(a, "value", None) for a in args)
        if all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds):
            return SuppressVar(ConstVar(None), resumable=False, factory=fn, args=kinds)
    return None


def context_class(tx, cls, args, kwargs):
    """The context Var for calling a context manager class frametrace models, else None."""
    if cls is contextlib.nullcontext and len(args) <= 1 and not kwargs:
        return NullContextVar(args[0] if args else ConstVar(None))
    made = context_function(tx, cls, args, kwargs)
    if made is not None:
        return made
    if cls is contextlib._GeneratorContextManager and len(args) == 3 and not kwargs:
        func, fargs, fkwargs = args
        if isinstance(fargs, TupleVar) and isinstance(fkwargs, DictVar):
            return GeneratorContextVar(func, fargs.items, fkwargs.items)
    return grad_mode_class(tx, cls, args, kwargs)


# --------------------------------------------------------------------------- breaks in `with`
def _with_spans(code) -> list:
    """(start, end, depth) of each `with` body.  Its exception-table entries (split by
    blocks nested in it) share one handler, PUSH_EXC_INFO then WITH_EXCEPT_START, and
    one depth: the stack up to and including its __exit__.  The body starts right
    after its BEFORE_WITH."""
    at = {i.offset: i for i in instructions(code)}
    spans = {}
    for entry in dis._parse_exception_table(code):
        first, after = at.get(entry.target), at.get(entry.target + 2)
        if first is None or first.opname != "PUSH_EXC_INFO" or after is None or \
                after.opname != "WITH_EXCEPT_START":
            continue
        start, end, depth = spans.get(entry.target, (entry.start, entry.end, entry.depth))
        spans[entry.target] = (min(start, entry.start), max(end, entry.end), depth)
    return list(spans.values())


def enclosing_with_starts(code, offset) -> list:
    """The offsets of the BEFORE_WITHs of the `with` blocks around `offset`, innermost
    first: where a graph break can go instead of inside a block whose context cannot
    be handed over, so that CPython runs the whole block (entering it once)."""
    at = {i.offset: i for i in instructions(code)}
    starts = [start - 2 for start, end, depth in _with_spans(code)
              if start <= offset < end and getattr(at.get(start - 2), "opname", None) == "BEFORE_WITH"]
    return sorted(starts, reverse=True)


class ExitVar(Var):
    """The __exit__ that BEFORE_WITH leaves on the stack: called with three Nones at
    the block's end (or with an exception, for a context that takes one)."""
    __slots__ = ("ctx",)

    def __init__(self, ctx):
        super().__init__(None)
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        with_exception = self.ctx.exit_with
        if with_exception is not None:
            return with_exception(tx, args)
        self.ctx.exit(tx)         # (the others restore state, and never swallow one)
        return ConstVar(None)

    def reconstruct(self, cg):
        handover = self.ctx.reconstruct_exit
        if handover is not None:
            handover(cg)
        elif isinstance(self.ctx, GradModeVar) and self.ctx.prev is not None:
            cg.load_const(GradModeRestore(self.ctx.prev))
        elif isinstance(self.ctx, NullContextVar):
            cg.load_const(no_op_exit)
        else:
            unsupported(f"a graph break inside 'with {self.ctx}'")


def check_exit_handover(var):
    """A graph break inside a `with` hands its __exit__ to CPython, which must then
    behave as the original frame: an __exit__ that may swallow the exception raised at
    the break would need the code after the block, so such breaks are refused."""
    if isinstance(var, (ExitVar, GradModeSetVar, NoOpExitVar)):
        return                      # ExitVar.reconstruct checks its context
    if isinstance(var, BoundMethodVar) and isinstance(var.fn, UserFunctionVar) and \
            never_suppresses(var.fn.fn):
        return
    unsupported(f"a graph break inside 'with' whose __exit__ ({var}) may swallow an exception")


def exit_all(exc, *exits):
    """Run the __exit__s of the `with` blocks an exception leaves (innermost first), as
    the original frame's cleanups would; none of them swallows it (check_exit_handover).
    One that raises replaces the exception, chained to it, and is raised here; else
    the caller re-raises the original."""
    raised = exc
    for exit_ in exits:
        try:
            exit_(type(raised), raised, raised.__traceback__)
        except BaseException as e:      # noqa: B036 (raised by __exit__: it propagates)
            if e is not raised and e.__context__ is None:
                e.__context__ = raised
            raised = e
    if raised is not exc:
        raise raised
