"""User torch.autograd.Function subclasses called in a traced frame (``Fn.apply(...)``).

forward (with setup_context, in that style) is speculated into a subgraph under no_grad,
with a ctx stand-in that records save_for_backward, mark_non_differentiable and the
attributes set on it; backward is speculated into a second subgraph over the output
gradients and what forward kept.  The frame's graph then calls
`functorch_runtime.apply_function`, a real autograd.Function running the two subgraphs,
so the gradient is the user's backward (also where it is not the derivative of forward),
on every backend.  What cannot be expressed (side effects in either function, a
backward the tracer cannot follow, outputs other than tensors, mark_dirty) refuses the
call, which then runs in CPython with the user's class."""
from __future__ import annotations


import torch

from .. import functorch_runtime as runtime
from ..source import AttrSource
from .functions import UserFunctionVar
from .fx_values import map_graph_vars
from .base import Var, unsupported, wrap
from .classes import class_attr
from .constant import ConstVar, MethodVar
from .containers import ListVar, TupleVar
from .functorch import _fresh, node_arg
from .symbolic import SymNodeVar
from .tensor import TensorVar

# `Fn.apply`: before torch 2.14 a Python classmethod (a bound method, its __func__ this
# function); from 2.14 a C one (a builtin method bound to the class, without __func__,
# equal to every other read of it).  `_apply_of(cls)` is the one `Fn.apply` must equal.
_APPLY = getattr(torch.autograd.Function.apply, "__func__", None)
_apply_of = torch.autograd.Function.__dict__["apply"].__get__
_BASE_SETUP_CONTEXT = torch.autograd.Function.setup_context
_BASE_BACKWARD = torch.autograd.Function.backward
_ONCE_DIFFERENTIABLE_CODE = torch.autograd.function.once_differentiable(lambda ctx: None).__code__


def autograd_function_apply_var(tx, value, source, guards):
    """The Var for ``Fn.apply`` of a user autograd.Function subclass, or None."""
    cls = getattr(value, "__self__", None)
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function) or \
            value != _apply_of(None, cls):
        return None
    if guards is not None:
        if _APPLY is not None:
            guards.identity(AttrSource(source, "__func__"), _APPLY)
        else:
            guards.identity(source, value)      # (a builtin method: compared with ==)
    cls_var = wrap(tx, cls, AttrSource(source, "__self__") if source is not None else None,
                   guards is not None)
    return AutogradFunctionApplyVar(cls, cls_var)


class FunctionInstanceVar(Var):
    """`Fn()`, an instance of a user autograd.Function subclass made in the frame (as
    older code calls `Fn().apply(x)`): its `apply` is the class's."""
    __slots__ = ("cls",)

    def __init__(self, cls):
        super().__init__(None)
        self.cls = cls

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        if name == "__class__":
            return wrap(tx, self.cls, None, guard=False)
        if name == "apply" and class_attr(tx, self.cls, "apply") is torch.autograd.Function.__dict__["apply"]:
            return AutogradFunctionApplyVar(self.cls, wrap(tx, self.cls, None, guard=False))
        unsupported(f"attribute {name!r} of a {self.cls.__qualname__} instance made in the frame")

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)


def construct_function_instance(tx, cls, args, kwargs):
    """Calling an autograd.Function subclass: an instance (no arguments, the class's own
    __init__ not overridden), else None."""
    if args or kwargs or cls.__init__ is not torch.autograd.Function.__init__ or \
            "__new__" in cls.__dict__:
        return None
    made = FunctionInstanceVar(cls)
    # (its __init__ warns that instances are deprecated, at the caller's line)
    UserFunctionVar(torch.autograd.Function.__init__).call(tx, [made], {})
    return made


class AutogradFunctionApplyVar(Var):
    __slots__ = ("cls", "cls_var")

    def __init__(self, cls, cls_var):
        super().__init__(None)
        self.cls = cls
        self.cls_var = cls_var

    def __repr__(self):
        return f"AutogradFunctionApplyVar({self.cls.__qualname__})"

    def reconstruct(self, cg):
        # Held on the stack at a graph break (the call then runs in CPython).
        cg.load_const(self.cls.apply)

    def call(self, tx, args, kwargs):
        name = self.cls.__qualname__
        if kwargs:
            unsupported(f"{name}.apply with keyword arguments")
        for a in args:
            if not isinstance(a, TensorVar) and (isinstance(a, SymNodeVar) or _holds_graph_values(a)):
                # (autograd does not look for tensors inside containers; a symbolic
                # number would be a placeholder that is not an input of the Function)
                unsupported(f"{name}.apply over {a}, a number or a container holding tensors")
        grad_on = torch.is_grad_enabled()
        needs = tuple(isinstance(a, TensorVar) and grad_on and a.example.requires_grad for a in args)
        state = _CtxState(needs)
        forward = _Forward(self.cls_var.getattr(tx, "forward"), _CtxVar(state, "forward"),
                           self._setup_context(tx))
        # Traced without recording, as autograd.Function runs forward (and backward,
        # unless create_graph): the right requires_grad on what they make.
        with torch.set_grad_enabled(False):
            fwd = tx.subgraphs.speculate(tx, forward, args, f"{name}.forward", finish=False)
        outs = _outputs(fwd, name)
        kept = []
        for v in (*state.saved, *state.attrs.values()):
            map_graph_vars(v, lambda t: _keep(t, kept, name))
        tx.subgraphs.finish_outputs(fwd, kept)
        tensor_inputs = list(fwd.output.arg_vars)
        bwd, once, grads = None, False, (False,) * len(tensor_inputs)
        if any(needs):
            bwd, once, grads = self._backward(tx, state, outs, kept, args, name)
        plan = {"fwd_lifted": len(fwd.output.lifted), "outputs": len(outs),
                "non_differentiable": _output_indices(state.non_differentiable, outs, name),
                "tuple_out": fwd.spec != ("leaf",),
                "once_differentiable": once, "grads": grads}
        fwd_module = fwd.module()
        bwd_module = bwd.module() if bwd is not None else None
        bwd_lifted = list(bwd.output.lifted) if bwd is not None else []
        tensors = [*tensor_inputs, *fwd.output.lifted, *bwd_lifted]
        try:
            with tx.output.fake_mode:
                examples = runtime.apply_function(plan, fwd_module, bwd_module, len(tensor_inputs),
                                                  *(t.example for t in tensors))
        except Exception as e:
            unsupported(f"{name}.apply failed while tracing: {type(e).__name__}: {e}")
        fwd_node = tx.output.install_subgraph("autograd_fwd", fwd_module)
        bwd_node = tx.output.install_subgraph("autograd_bwd", bwd_module) if bwd is not None else None
        results = tx.subgraphs.call_hop(tx, runtime.apply_function,
                           (plan, fwd_node, bwd_node, len(tensor_inputs),
                            *(node_arg(tx, t) for t in tensors)), _fresh(tx, examples))
        return TupleVar(results) if plan["tuple_out"] else results[0]

    def _setup_context(self, tx):
        # Read through the class (guarded), so a setup_context assigned later is seen.
        setup = self.cls_var.getattr(tx, "setup_context")
        value = getattr(setup, "value", getattr(setup, "fn", None))
        return None if value is _BASE_SETUP_CONTEXT else setup

    def _backward(self, tx, state, outs, kept, args, name):
        """Speculate backward over the output gradients and what forward kept: its
        subgraph, whether it is once_differentiable, and which tensor inputs get a
        gradient."""
        backward = self.cls_var.getattr(tx, "backward")
        real = self.cls.backward
        if real is _BASE_BACKWARD:
            unsupported(f"{name} defines no backward")
        once = getattr(real, "__code__", None) is _ONCE_DIFFERENTIABLE_CODE
        if once:
            backward = backward.getattr(tx, "__wrapped__")
        call = _Backward(backward, state, [o.example for o in outs], kept)
        # Traced without recording, as autograd.Function runs forward (and backward,
        # unless create_graph): the right requires_grad on what they make.
        with torch.set_grad_enabled(False):
            # A gradient may be returned as it came (a straight-through estimator):
            # the runtime's autograd.Function handles such aliases as eager does.
            bwd = tx.subgraphs.speculate(tx, call, [], f"{name}.backward", allow_aliasing=True)
        result = bwd.result
        got = list(result.items) if type(result) in (TupleVar, ListVar) else [result]
        if len(got) < len(args) or any(not _is_none(g) for g in got[len(args):]):
            unsupported(f"{name}.backward returned {len(got)} gradients for {len(args)} inputs")
        grads = []
        for a, g in zip(args, got):
            if _is_none(g):
                if isinstance(a, TensorVar):
                    grads.append(False)
                continue
            if not isinstance(a, TensorVar) or not isinstance(g, TensorVar):
                unsupported(f"{name}.backward returned {g} for the input {a}")
            grads.append(True)
        return bwd, once, tuple(grads)


def _holds_graph_values(v) -> bool:
    found = []
    map_graph_vars(v, lambda t: found.append(t) or t)
    return bool(found)


def _is_none(v) -> bool:
    return isinstance(v, ConstVar) and v.value is None


def _outputs(fwd, name) -> list:
    spec = fwd.spec
    if spec == ("leaf",):
        leaves = fwd.leaves
    elif spec[0] is TupleVar and all(s == ("leaf",) for s in spec[1]) and spec[1]:
        leaves = fwd.leaves
    else:
        unsupported(f"{name}.forward returns something other than a tensor or a tuple of tensors")
    for leaf in leaves:
        if not isinstance(leaf, TensorVar):
            unsupported(f"{name}.forward returns a number")
        if leaf.node.op == "placeholder":
            # An input returned as is: autograd makes it a view of the input in eager.
            unsupported(f"{name}.forward returns one of its inputs unchanged")
    return leaves


def _keep(t, kept, name):
    if isinstance(t, SymNodeVar):
        unsupported(f"{name} keeps a symbolic number on ctx")
    if not any(t is k for k in kept):
        kept.append(t)
    return t


def _output_indices(marked, outs, name) -> tuple:
    found = []
    for v in marked:
        idx = next((i for i, o in enumerate(outs) if o.node is getattr(v, "node", None)), None)
        if idx is None:
            unsupported(f"{name} marks a tensor that is not an output non-differentiable")
        found.append(idx)
    return tuple(found)


class _CtxState:
    """What the ctx stand-in recorded.  A plain object, not a Var: the speculation's
    side-effect check compares it by identity, since forward filling its own ctx is
    what forward is for, not a change of outside state."""
    __slots__ = ("needs_input_grad", "saved", "attrs", "non_differentiable", "bwd_saved", "bwd_attrs")

    def __init__(self, needs):
        self.needs_input_grad = needs
        self.saved = []
        self.attrs = {}
        self.non_differentiable = []
        self.bwd_saved = None
        self.bwd_attrs = None


class _CtxVar(Var):
    """The ctx forward, setup_context and backward get."""
    __slots__ = ("state", "phase")

    def __init__(self, state, phase):
        super().__init__(None)
        self.state = state
        self.phase = phase

    def python_type(self):
        return torch.autograd.function.FunctionCtx

    def __repr__(self):
        return f"ctx({self.phase})"

    def getattr(self, tx, name):
        s = self.state
        if name == "needs_input_grad":
            return TupleVar([ConstVar(n) for n in s.needs_input_grad])
        if self.phase == "backward":
            if name in ("saved_tensors", "saved_variables"):
                return TupleVar(list(s.bwd_saved))
            if name in s.bwd_attrs:
                return s.bwd_attrs[name]
        elif name in s.attrs:
            return s.attrs[name]
        if name in _CTX_METHODS and self.phase != "backward":
            return MethodVar(self, name)
        unsupported(f"ctx.{name} in {self.phase}")

    def setattr(self, tx, name, value):
        if self.phase == "backward" or name in _CTX_METHODS or name in ("saved_tensors", "needs_input_grad"):
            unsupported(f"setting ctx.{name} in {self.phase}")
        self.state.attrs[name] = value

    def call_method(self, tx, name, args, kwargs):
        s = self.state
        if self.phase == "backward" or kwargs:
            unsupported(f"ctx.{name}() in {self.phase}")
        if name == "save_for_backward":
            if any(not isinstance(a, TensorVar) and not _is_none(a) for a in args):
                unsupported("ctx.save_for_backward of something other than tensors")
            s.saved = list(args)
            return ConstVar(None)
        if name == "mark_non_differentiable":
            s.non_differentiable += [a for a in args if isinstance(a, TensorVar)]
            return ConstVar(None)
        if name == "set_materialize_grads" and len(args) == 1 and isinstance(args[0], ConstVar) \
                and args[0].value is True:
            return ConstVar(None)       # the default
        unsupported(f"ctx.{name}()")


_CTX_METHODS = ("save_for_backward", "mark_non_differentiable", "set_materialize_grads",
                "mark_dirty", "save_for_forward")


class _Forward(Var):
    """forward(ctx, *args), or forward(*args) then setup_context(ctx, args, output)."""
    __slots__ = ("fn", "ctx", "setup")

    def __init__(self, fn, ctx, setup):
        super().__init__(None)
        self.fn, self.ctx, self.setup = fn, ctx, setup

    def call(self, tx, args, kwargs):
        if self.setup is None:
            return self.fn.call(tx, [self.ctx, *args], kwargs)
        out = self.fn.call(tx, list(args), kwargs)
        self.setup.call(tx, [self.ctx, TupleVar(list(args)), out], {})
        return out


class _Backward(Var):
    """backward(ctx, *grads) in the backward subgraph: its placeholders are the output
    gradients, then the tensors forward kept (saved or set on ctx), read back through a
    ctx whose attributes name those placeholders."""
    __slots__ = ("fn", "state", "grad_examples", "kept")

    def __init__(self, fn, state, grad_examples, kept):
        super().__init__(None)
        self.fn, self.state, self.grad_examples, self.kept = fn, state, grad_examples, kept

    def call(self, tx, args, kwargs):
        out = tx.output
        # Fresh FakeTensors: a gradient is not the output it belongs to, nor a saved tensor.
        fresh = _fresh(tx, [*self.grad_examples, *(k.example for k in self.kept)])
        for f in fresh:
            f.requires_grad_(False)
        grads = [out._new_placeholder("grad", TensorVar(None, ex)) for ex in fresh[:len(self.grad_examples)]]
        inner = {id(k): out._new_placeholder("saved", TensorVar(None, ex))
                 for k, ex in zip(self.kept, fresh[len(self.grad_examples):])}
        remap = lambda t: inner[id(t)]                                      # noqa: E731
        s = self.state
        s.bwd_saved = [map_graph_vars(v, remap) for v in s.saved]
        s.bwd_attrs = {k: map_graph_vars(v, remap) for k, v in s.attrs.items()}
        return self.fn.call(tx, [_CtxVar(s, "backward"), *grads], {})
