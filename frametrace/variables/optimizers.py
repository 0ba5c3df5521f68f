"""torch.optim's step traced as the user's own code (as torch.compile inlines it).

The optimizers are plain Python over parameters, gradients and state tensors; what this
module adds is what their code asks of a compiler:

- `Optimizer.step` is wrapped by `_use_grad_for_differentiable`, which sets grad mode
  to the optimizer's `differentiable` flag and asks torch.compile for a graph break on
  each side (so that AOTAutograd sees an inference graph).  The break is a hint about
  Dynamo's graphs, not part of the program: we trace the step under that grad mode, in
  the caller's graph.
- The helpers that list the devices with foreach/fused kernels are fixed for the life
  of the process: evaluated at trace time.
- Compiled, `_get_value(step)` keeps the step counter a tensor (so that a new step is
  not a new constant), and the updates then pass 0-d tensors where eager passes Python
  numbers (`addcdiv_(..., value=-step_size)`).  ATen would read such a scalar with
  `.item()`: we write the op out as the arithmetic it stands for, in the graph.
- Eager keeps step counters on the CPU, which compiled would make host-side ops in
  the middle of a device graph (hundreds per step: the bias corrections are computed
  per parameter).  As torch.compile does, an optimizer whose parameters are all on an
  accelerator gets its counters there, and its groups run the `capturable` code path
  (the same arithmetic as foreach ops on device tensors) when its state is new.
"""
from __future__ import annotations

import types

import torch
from torch._compile import _disable_dynamo
from torch.optim.optimizer import _use_grad_for_differentiable
from torch.utils import _foreach_utils as fu

from .base import wrap

# torch packages of plain Python over tensors that are programs to capture, as the
# user's own code is (torch.compile inlines them too): the optimizers' steps.  Their
# frames are traced on their own too.
TRACED_TORCH_PACKAGES = ("torch.optim", "torch.nn.utils.clip_grad", "torch.utils._foreach_utils")


def in_traced_torch_package(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in TRACED_TORCH_PACKAGES)


def _use_grad_code():
    return _use_grad_for_differentiable(lambda self: None).__code__


_USE_GRAD_CODE = _use_grad_code()


def use_grad_wrapped(fn):
    """The step function inside torch.optim's `_use_grad_for_differentiable` wrapper
    `fn`, else None."""
    if fn.__code__ is not _USE_GRAD_CODE or not fn.__closure__:
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
    try:
        return cells["func"].cell_contents
    except (KeyError, ValueError):
        return None


def _disable_dynamo_code():
    return _disable_dynamo(lambda: None).__code__


_DISABLE_DYNAMO_CODE = _disable_dynamo_code()


def dynamo_disabled_traced(fn):
    """The function inside torch's `_disable_dynamo` (or torch._dynamo.disable) wrapper
    `fn` when it is one of the traced torch packages' (`Optimizer.zero_grad`,
    `add_param_group`, `_init_group`), else None.
    torch keeps Dynamo out of these; they are plain Python over parameters and their
    `.grad` (set to None, zeroed), which we trace like the step."""
    inner = _dynamo_disabled_original(fn)
    if not isinstance(inner, types.FunctionType) or \
            not in_traced_torch_package(getattr(inner, "__module__", "") or ""):
        return None
    return inner


def _dynamo_disabled_original(fn):
    if fn.__code__ is _DISABLE_DYNAMO_CODE and fn.__closure__:
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
        try:
            return cells["fn"].cell_contents
        except (KeyError, ValueError):
            return None
    # torch._dynamo.disable(fn), which torch._dynamo puts on every optimizer's
    # `_init_group` once it is used in the process (torch.compile beside us).
    if getattr(fn, "_torchdynamo_disable", False) is True:
        return getattr(fn, "_torchdynamo_orig_callable", None)
    return None


def prefer_device_counters(opt) -> None:
    """Before tracing optimizer `opt`: on the real object, step counters on the CPU move
    to their parameter's device, and the param groups whose parameters are all on an
    accelerator and have no state yet are set `capturable` (their state is then made
    on the device).  Both change where the arithmetic runs, not its result, and both
    are what torch.compile does to the optimizers it traces; a group with state keeps
    its flag, as state made by one code path need not suit the other."""
    state = getattr(opt, "state", None)
    groups = getattr(opt, "param_groups", None)
    if not isinstance(state, dict) or not isinstance(groups, list):
        return
    for p, s in state.items():
        step = s.get("step") if isinstance(s, dict) and isinstance(p, torch.Tensor) else None
        if isinstance(step, torch.Tensor) and step.device.type == "cpu" and p.device.type != "cpu" \
                and p.device.type != "meta":
            s["step"] = step.to(p.device)
    for group in groups:
        if not isinstance(group, dict) or group.get("capturable") is not False:
            continue
        params = group.get("params") or ()
        if params and all(isinstance(p, torch.Tensor) and p.device.type in ("cuda", "xpu") and
                           p not in state for p in params):
            group["capturable"] = True


def trace_time_functions():
    """Functions of torch whose answers are fixed for the process (no arguments)."""
    return {f for f in (getattr(fu, "_get_fused_kernels_supported_devices", None),
                        getattr(fu, "_get_foreach_kernels_supported_devices", None))
            if f is not None}


_TRACE_TIME = None


def trace_time_call(tx, fn, args, kwargs):
    """The Var of `fn()` evaluated now, for the functions above; else None."""
    global _TRACE_TIME
    if _TRACE_TIME is None:
        _TRACE_TIME = trace_time_functions()
    if fn not in _TRACE_TIME or args or kwargs:
        return None
    return wrap(tx, fn(), None, guard=False)


# In-place ops whose scalar keyword ATen reads with .item() when given a tensor, and
# the arithmetic they compute: self + scalar * combine(t1, t2).
_SCALAR_KEYWORD = {"addcdiv_": ("value", torch.div), "addcmul_": ("value", torch.mul),
                   "add_": ("alpha", None), "sub_": ("alpha", None)}


def tensor_scalar_method(tx, self, name, args, kwargs):
    """`t.addcdiv_(a, b, value=s)` (and addcmul_, add_/sub_ with alpha) with a 0-d
    tensor `s`: the same update written as graph arithmetic; else None."""
    spec = _SCALAR_KEYWORD.get(name)
    if spec is None:
        return None
    key, combine = spec
    scalar = kwargs.get(key)
    # (`self` is a TensorVar, a class without subclasses: its type is the tensor kind.)
    if not isinstance(scalar, type(self)) or scalar.example.dim() != 0 or \
            set(kwargs) != {key} or len(args) != (2 if combine is not None else 1):
        return None
    call = tx.output.call
    if combine is not None:
        # ATen's order of operations: self + scalar * t1 / t2 (resp. * t2).
        term = call("call_function", combine,
                    (call("call_function", torch.mul, (scalar, args[0]), {}), args[1]), {})
    else:
        term = call("call_function", torch.mul, (scalar, args[0]), {})
    method = "sub_" if name == "sub_" else "add_"
    return call("call_method", method, (self, term), {})
