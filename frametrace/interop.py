"""Living beside torch.compile: each compiler leaves the other's frames alone.

torch.compile (Dynamo) installs its own PEP 523 hook over ours and hands the frames it
does not take down to ours.  The rules, all without importing torch._dynamo (its
markers are attributes and code objects, read only once the user has imported it):

- While torch.compile is active on a thread, the frames its hook hands down (its
  compiled code, frames it runs as they are) run untouched (the C hook asks torch's
  per-thread callback, registered by `install`); frames of torch's compiler (a
  TracingContext is active while we are not compiling) are not traced either.
- An optimize()d call switches torch.compile off for its duration, as torch's own
  `torch.compiler.disable` does, and our wrappers carry torch's `_torchdynamo_disable`
  marker, so torch.compile's tracer calls them instead of tracing them.
- Met while tracing, a torch.compile'd callable is not inlined: the call is a graph
  break and runs in CPython, where torch.compile runs it.
- `torch.compiler.disable`: a disabled function is a graph break, and it and all it
  calls run unhooked; `recursive=False` leaves its callees to us.  (torch's own uses
  of the same wrapper around its code keep only torch's frames out, as before.)
"""
from __future__ import annotations

import inspect
import sys

import torch

from . import _C, config

_MARKER_MSG = "compiled by frametrace"


def install():
    """Tell the C hook how to read and switch torch.compile's per-thread callback."""
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    get = getattr(frames, "get_eval_frame_callback", None)
    set_ = getattr(frames, "set_eval_frame", None)
    if get is not None and set_ is not None:
        _C.set_foreign_hook(get, set_)


def mark_ours(wrapper):
    """torch.compile's tracer treats an object with this marker as a function it must
    call, not trace (its graph breaks there and our wrapper runs)."""
    try:
        wrapper._torchdynamo_disable = True
        wrapper._torchdynamo_disable_msg = _MARKER_MSG
    except (AttributeError, TypeError):
        pass
    return wrapper


def _dynamo_module(name="torch._dynamo.eval_frame"):
    return sys.modules.get(name)


_disable_codes: tuple | None = None


def _disable_wrapper_codes():
    """The code of torch.compiler.disable's wrapper (recursive) and of its
    non-recursive variant, once torch._dynamo is imported."""
    global _disable_codes
    if _disable_codes is not None:
        return _disable_codes
    frames, decorators = _dynamo_module(), _dynamo_module("torch._dynamo.decorators")
    if frames is None or decorators is None:
        return (None, None)
    recursive = None
    context = getattr(frames, "DisableContext", None)
    call = getattr(getattr(context, "__call__", None), "__code__", None)
    for const in (call.co_consts if call is not None else ()):
        if inspect.iscode(const) and const.co_name == "_fn":
            recursive = const
    _disable_codes = (recursive, getattr(decorators, "_nonrecursive_disable_wrapper_code", None))
    return _disable_codes


def frame_decision(code, func, is_skipped_file):
    """What the hook does with a frame before anything else: `_C.RUN_UNHOOKED` for
    torch.compiler.disable's wrapper of a user's function (this call and all it makes
    run unhooked), `_C.SKIP` for a function torch's markers keep out of compilers, None
    to run it in CPython this time (a frame torch's compiler runs, a non-recursively
    disabled function, torch's own uses of the disable wrapper), or False: no opinion."""
    if _dynamo_module() is not None:
        recursive, nonrecursive = _disable_wrapper_codes()
        if code is recursive and code is not None:
            # torch wraps its own code so too (the eager paths of wrap and checkpoint,
            # around the user's function): there only torch's frames are kept out.
            inner = _disabled_function(func, code)
            inner_code = getattr(inner, "__code__", None) or \
                getattr(getattr(inner, "__func__", None), "__code__", None)
            if inner_code is not None and is_skipped_file(inner_code.co_filename):
                return None
            return _C.RUN_UNHOOKED
        # (The hook asks before the frame starts: our caller's caller is its caller.)
        if nonrecursive is not None and _caller_code() is nonrecursive:
            return None
        if inspect.getattr_static(func, "_torchdynamo_disable", False) is True:
            return _C.SKIP               # torch._dynamo.skip(fn): its code is never compiled
    if torch._guards.TracingContext.try_get() is not None or \
            torch._guards.CompileContext.try_get() is not None:
        return None          # torch's compiler is running (ours runs with the hook off)
    return False


def _disabled_function(func, code):
    """The function a torch.compiler.disable wrapper calls (a cell of its closure)."""
    try:
        return func.__closure__[code.co_freevars.index("fn")].cell_contents
    except (AttributeError, ValueError, IndexError, TypeError):
        return None


def _caller_code():
    try:
        return sys._getframe(3).f_code
    except ValueError:
        return None


def foreign_reason(value) -> str | None:
    """Why a callable met while tracing is not ours to trace, or None: it is compiled
    by torch.compile, or kept out of compilers by torch.compiler.disable."""
    if isinstance(value, (_C.Hooked, _C.Unhooked)):
        return None
    try:
        disabled = inspect.getattr_static(value, "_torchdynamo_disable", False)
        compiled = inspect.getattr_static(value, "_torchdynamo_orig_callable", None)
    except Exception:
        return None
    if disabled is True:
        return f"{_name(value)} is disabled by torch.compiler.disable; it runs in CPython"
    if compiled is not None and callable(value):
        return f"{_name(value)} is compiled by torch.compile; it runs under torch.compile"
    return None


def _name(value) -> str:
    inner = value
    for _ in range(8):
        nxt = getattr(inner, "_torchdynamo_orig_callable", None)
        if nxt is None:
            break
        inner = nxt
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None)
    return f"`{name}`" if isinstance(name, str) else f"a {type(value).__name__}"


def allowed_in_graph(value) -> bool:
    """Whether torch.compiler.allow_in_graph registered `value`: its calls are graph
    nodes, run on FakeTensors while tracing (as torch.compile does), never inlined."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    ids = getattr(rules, "_allowed_callable_ids", None)
    try:
        return ids is not None and callable(value) and id(value) in ids
    except Exception:
        return False


def assumed_constant(value) -> bool:
    """Whether torch.compiler.assume_constant_result marked `value`: called once while
    tracing, its result is a constant of the graph, guarded by nothing (as
    torch.compile does: the user promised it does not change)."""
    try:
        return inspect.getattr_static(value, "_dynamo_marked_constant", False) is True
    except Exception:
        return False


def _torch_compile_setting(name) -> bool:
    """torch._dynamo.config's `name`, if the program has imported it and we honour it."""
    if not config.honour_torch_compile_config:
        return False
    theirs = sys.modules.get("torch._dynamo.config")
    try:
        return theirs is not None and getattr(theirs, name, False) is True
    except Exception:
        return False


def capture_scalar_outputs() -> bool:
    """Whether `t.item()` and friends stay in the graph: frametrace.config's switch, or
    torch._dynamo.config's as a torch.compile user set it::

        torch._dynamo.config.capture_scalar_outputs = True   # on for frametrace too
    """
    return config.capture_scalar_outputs or _torch_compile_setting("capture_scalar_outputs")


def capture_dynamic_output_shape_ops() -> bool:
    """Whether ops with data-dependent output sizes stay in the graph (frametrace.config's
    switch, or torch._dynamo.config's, as `capture_scalar_outputs`)."""
    return config.capture_dynamic_output_shape_ops or \
        _torch_compile_setting("capture_dynamic_output_shape_ops")
