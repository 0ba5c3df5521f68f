"""Context managers while tracing: grad mode (no_grad, enable_grad, set_grad_enabled,
functions decorated with them), autocast and contextlib.nullcontext.  Mode switches are
graph nodes and also take effect while tracing, so FakeTensors come out right; the
stand-ins for their __exit__ carry them across graph breaks."""
from __future__ import annotations

import torch

from .base import Var, unsupported
from .constant import ConstVar


class GradModeVar(Var):
    """torch.no_grad() / enable_grad() / set_grad_enabled(mode) as a context manager (or
    set_grad_enabled called as a function).  The mode switch is a node of the graph, and
    applies while tracing, so FakeTensors get the right requires_grad."""
    __slots__ = ("mode", "prev")

    def __init__(self, mode: bool):
        super().__init__(None)
        self.mode = mode
        self.prev = None

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
        return ConstVar(None)


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
        GradModeVar(mode)._set(tx, mode)
        return ConstVar(None if self.mode is None else False)


class GradModeDecoratedVar(Var):
    """A function decorated with a grad-mode context while tracing."""
    __slots__ = ("mode", "fn")

    def __init__(self, mode, fn):
        super().__init__(None)
        self.mode = mode
        self.fn = fn

    def call(self, tx, args, kwargs):
        ctx = GradModeVar(self.mode)
        ctx.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            ctx.exit(tx)


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
        from torch.amp.autocast_mode import _enter_autocast
        self.ctx = torch.autocast(*self.args, **self.kwargs)
        self.ctx.__enter__()
        tx.output.open_contexts.append(self.ctx)
        ctx = self.ctx   # its defaults resolved: dtype, enabled, cache_enabled
        self.node = tx.output.graph.create_node(
            "call_function", _enter_autocast,
            (ctx.device, ctx.fast_dtype, ctx._enabled, ctx._cache_enabled))
        return ConstVar(None)

    def exit(self, tx):
        from torch.amp.autocast_mode import _exit_autocast
        if self.ctx in tx.output.open_contexts:
            tx.output.open_contexts.remove(self.ctx)
        self.ctx.__exit__(None, None, None)
        tx.output.graph.create_node("call_function", _exit_autocast, (self.node,))


def grad_mode_class(tx, cls, args, kwargs):
    """The context Var for calling torch.no_grad / enable_grad / set_grad_enabled /
    autocast while tracing, else None."""
    if cls is torch.no_grad:
        return GradModeVar(False)
    if cls is torch.enable_grad:
        return GradModeVar(True)
    if cls is torch.set_grad_enabled and len(args) == 1 and args[0].is_const():
        mode = bool(args[0].as_const())
        # set_grad_enabled(mode) takes effect when called, also outside a `with`.
        var = _SetGradEnabledVar(mode)
        var.prev = torch.is_grad_enabled()
        var._set(tx, mode)
        return var
    if cls is torch.autocast and all(a.is_const() for a in args) and \
            all(v.is_const() for v in kwargs.values()):
        return AutocastVar([a.as_const() for a in args],
                           {k: v.as_const() for k, v in kwargs.items()})
    return None


class NullContextVar(Var):
    """contextlib.nullcontext(value): `with` gives value and does nothing else."""
    __slots__ = ("value",)

    def __init__(self, value):
        super().__init__(None)
        self.value = value

    def enter(self, tx):
        return self.value

    def exit(self, tx):
        pass


def no_op_exit(*exc):
    """Stands for nullcontext's __exit__ when a graph break falls inside its block."""
    return False
