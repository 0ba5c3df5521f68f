"""The differential harness: a function run in CPython and compiled, side by side.

Each call gets fresh deep copies of the same inputs on both sides (aliasing inside one
input tuple is kept: ``deepcopy`` shares what the original shared).  After every call
the harness compares return values, the arguments afterwards (side effects), the named
globals afterwards and raised exceptions (type and message), and it records what was
compiled: graphs, graph breaks, frames that fell back to CPython and internal tracer
errors.  A test asserts the counts it expects, so that running everything in CPython
cannot pass for success::

    from differential import check

    def f(x, ys):
        ys.append(x + 1)
        return x * 2

    r = check(f, [(torch.randn(3), []), (torch.randn(3), [1])])
    assert r.graphs == 1 and r.breaks == 0

`check` raises AssertionError naming the call and the first difference.  By default
it requires at least one graph and no internal error; pass ``graphs=0`` for a
program that must not compile anything.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import io
import math
import traceback

import numpy as np
import torch

import frametrace
from frametrace import convert

_MISSING = object()


class Call:
    """Arguments of one call, with keywords: ``Call(x, y, flag=True)``."""
    __slots__ = ("args", "kwargs")

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs



class Then(Call):
    """A call made after `action()` changed some state outside the frame: the harness
    copies each call first for CPython, then for the compiled run, and the action runs
    once, before both."""

    def __init__(self, action, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["action"] = action

    def __deepcopy__(self, memo):
        action = self.__dict__.pop("action", None)
        if action is not None:
            action()
        return Call(*copy.deepcopy(self.args, memo), **copy.deepcopy(self.kwargs, memo))


class Report:
    """What a `check` saw: counts of graphs, breaks, fallbacks, compiles and internal
    errors, the compile records, and the CompileCounter backend's graphs."""

    def __init__(self, counter, records, internal_errors):
        self.counter = counter
        self.records = records
        self.graphs = counter.frame_count
        self.ops = counter.op_count
        self.breaks = sum(r.outcome == "break" for r in records)
        self.fallbacks = sum(r.outcome == "fallback" for r in records)
        self.compiles = len(records)
        self.internal_errors = internal_errors

    def reasons(self):
        return [r.reason for r in records_with_reason(self.records)]

    def __repr__(self):
        return (f"Report(graphs={self.graphs}, breaks={self.breaks}, fallbacks={self.fallbacks}, "
                f"compiles={self.compiles}, internal_errors={self.internal_errors}, "
                f"reasons={self.reasons()})")


def records_with_reason(records):
    return [r for r in records if r.reason]


def _run(fn, call):
    try:
        return fn(*call.args, **call.kwargs), None
    except Exception as e:          # compared below, as CPython raised it
        # Kept, its traceback would keep the frames it went through alive, and what
        # they hold open with them: torch 2.11's non-reentrant checkpoint leaves its
        # saved-tensor hooks installed until its generator's frame dies, and every
        # later test ran under them.
        traceback.clear_frames(e.__traceback__)
        return None, e


def _as_call(inp):
    if isinstance(inp, Call):
        return inp
    if isinstance(inp, tuple):
        return Call(*inp)
    return Call(inp)


def same(a, b, path="value", rtol=1e-5, atol=1e-6, seen=None):
    """None if `a` and `b` are equal as results (tensors by dtype, shape and values),
    else a sentence saying where they differ."""
    seen = set() if seen is None else seen
    if a is b:
        return None         # one object seen from both sides (a module, a class ...)
    if type(a) is not type(b):
        return f"{path}: type {type(a).__name__} != {type(b).__name__} ({a!r} vs {b!r})"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return f"{path}: tensor {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        if a.requires_grad != b.requires_grad:
            return f"{path}: requires_grad {a.requires_grad} != {b.requires_grad}"
        if a.is_conj() != b.is_conj() or a.is_neg() != b.is_neg():
            return f"{path}: conj/neg bits differ"
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
            ok = torch.equal(a, b)
        else:
            ok = torch.allclose(a.detach().resolve_conj(), b.detach().resolve_conj(),
                                rtol=rtol, atol=atol, equal_nan=True)
        if not ok:
            return f"{path}: tensor values differ\n{a}\nvs\n{b}"
        return _same_tensor_extras(a, b, path, rtol, atol, seen)
    if isinstance(a, (np.ndarray, np.generic)):
        return _same_numpy(a, b, path, rtol, atol)
    if isinstance(a, complex) and (a != a) and (b != b):
        return None
    if isinstance(a, float):
        if math.isnan(a) and math.isnan(b):
            return None
        return None if a == b or math.isclose(a, b, rel_tol=rtol, abs_tol=atol) else f"{path}: {a} != {b}"
    if isinstance(a, BaseException):
        if str(a) != str(b) or a.args != b.args and str(a.args) != str(b.args):
            return f"{path}: {type(a).__name__}({a}) != {type(b).__name__}({b})"
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)} ({a!r} vs {b!r})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = same(x, y, f"{path}[{i}]", rtol, atol, seen)
            if d:
                return d
        return _same_attrs(a, b, path, rtol, atol, seen) if hasattr(a, "__dict__") else None
    if isinstance(a, dict):
        if any(isinstance(k, torch.Tensor) for k in a):
            # Keys hashed by identity (an optimizer's state): compared as values, in order.
            d = same(list(a.keys()), list(b.keys()), f"{path}.keys()", rtol, atol, seen) or \
                same(list(a.values()), list(b.values()), f"{path}.values()", rtol, atol, seen)
            if d:
                return d
            return _same_attrs(a, b, path, rtol, atol, seen) if hasattr(a, "__dict__") else None
        if list(a.keys()) != list(b.keys()):
            return f"{path}: keys {list(a.keys())} != {list(b.keys())}"
        for k in a:
            d = same(a[k], b[k], f"{path}[{k!r}]", rtol, atol, seen)
            if d:
                return d
        return _same_attrs(a, b, path, rtol, atol, seen) if hasattr(a, "__dict__") else None
    if isinstance(a, (set, frozenset)):
        return None if a == b else f"{path}: {a!r} != {b!r}"
    if isinstance(a, io.StringIO):          # what was printed to it
        return None if a.getvalue() == b.getvalue() else f"{path}: {a.getvalue()!r} != {b.getvalue()!r}"
    if isinstance(a, torch.nn.Module):
        return same(a.state_dict(), b.state_dict(), f"{path}.state_dict()", rtol, atol, seen) or \
            same([p.grad for p in a.parameters()], [p.grad for p in b.parameters()],
                 f"{path}.parameters() .grad", rtol, atol, seen)
    if type(a).__eq__ is not object.__eq__ and not dataclasses.is_dataclass(a):
        pass                # the class says what equal means: == below (a dataclass's
        #                     __eq__ would compare tensors with ==, so its fields are)
    elif (hasattr(a, "__dict__") or _slot_names(type(a))) and not isinstance(a, type) and not callable(a):
        return _same_attrs(a, b, path, rtol, atol, seen)
    try:
        equal = a == b
        if not isinstance(equal, bool):
            equal = bool(equal)
    except Exception:
        equal = a is b
    return None if equal else f"{path}: {a!r} != {b!r}"


def _same_tensor_extras(a, b, path, rtol, atol, seen):
    """What a tensor carries besides its values: its accumulated gradient (a leaf's
    .grad; reading a non-leaf's warns) and its Python attributes (`t.tag = 1`)."""
    if id(a) in seen:
        return None
    seen.add(id(a))
    if a.is_leaf and b.is_leaf:
        d = same(a.grad, b.grad, f"{path}.grad", rtol, atol, seen)
        if d:
            return d
    return same(_tensor_attrs(a), _tensor_attrs(b), f"{path}.__dict__", rtol, atol, seen)


def _tensor_attrs(t):
    # AOTAutograd marks the tensors it returns with symbolic dims (torch.compile's too).
    # (`_dynamo_propagated_dynamic_indices`, `_dynamo_weak_dynamic_indices` on torch 2.11)
    return {k: v for k, v in t.__dict__.items() if not k.startswith("_dynamo_")}


def _same_numpy(a, b, path, rtol, atol):
    """NumPy arrays and scalars: by dtype, shape and values (NaNs equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{path}: ndarray {a.dtype}{a.shape} != {b.dtype}{b.shape}"
    if a.dtype.kind in "fc":
        ok = np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(a, b)
    return None if ok else f"{path}: ndarray values differ\n{a!r}\nvs\n{b!r}"


def _same_attrs(a, b, path, rtol, atol, seen):
    if id(a) in seen:
        return None
    seen.add(id(a))
    return same(_state(a), _state(b), f"{path}.__dict__", rtol, atol, seen)


def _slot_names(cls):
    names = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if n not in ("__dict__", "__weakref__")]
    return names


def _state(obj):
    """An object's attributes: its __dict__ and the __slots__ that are set."""
    state = dict(getattr(obj, "__dict__", {}))
    for name in _slot_names(type(obj)):
        if hasattr(obj, name):
            state[name] = getattr(obj, name)
    return state


def check(fn, inputs, *, backend="eager", globals=(), graphs=_MISSING, breaks=None,
          fallbacks=None, compiles=None, max_graphs=None, rtol=1e-5, atol=1e-6,
          compiled=None, **optimize_kwargs) -> Report:
    """Run `fn` in CPython and compiled on fresh copies of each input in `inputs` (a
    tuple of arguments, a `Call`, or a single argument), in order, and compare.

    `globals` names module globals of `fn` the program reads or writes: they are
    compared after each call, and each side starts from the same state.  `graphs`,
    `breaks`, `fallbacks`, `compiles` are exact counts to require, `max_graphs` a bound;
    by default at least one graph must be compiled.  `compiled` replaces
    ``frametrace.optimize(fn)`` (for a module wrapper, say)."""
    counter = frametrace.testing.CompileCounter(inner=backend)
    target = compiled(counter) if compiled is not None else \
        frametrace.optimize(backend=counter, **optimize_kwargs)(fn)
    # (a wrapper made with functools.wraps names the globals of the function it wraps)
    inner = getattr(fn, "__wrapped__", fn)
    g = getattr(inner, "__globals__", None) or getattr(getattr(inner, "forward", None), "__globals__", {})
    records = []
    errors_before = convert.counters["internal_error"]
    convert.record_observers.append(records.append)
    try:
        for i, inp in enumerate(inputs):
            call = _as_call(inp)
            start = {n: g.get(n, _MISSING) for n in globals}
            start_copy = copy.deepcopy(start)
            eager_call = copy.deepcopy(call)
            torch.manual_seed(i)
            want, want_exc = _run(fn, eager_call)
            eager_globals = {n: g.get(n, _MISSING) for n in globals}
            for n, v in copy.deepcopy(start_copy).items():
                if v is _MISSING:
                    g.pop(n, None)
                else:
                    g[n] = v
            compiled_call = copy.deepcopy(call)
            torch.manual_seed(i)
            got, got_exc = _run(target, compiled_call)
            where = f"call {i} of {getattr(fn, '__name__', fn)}"
            if (want_exc is None) != (got_exc is None):
                raise AssertionError(f"{where}: CPython {'raised ' + repr(want_exc) if want_exc else 'returned'}"
                                     f", compiled {'raised ' + repr(got_exc) if got_exc else 'returned'}") \
                    from (got_exc or want_exc)
            diff = same(want_exc, got_exc, "exception") if want_exc is not None else \
                same(want, got, "return value", rtol, atol)
            diff = diff or same(eager_call.args, compiled_call.args, "arguments after the call", rtol, atol) \
                or same(eager_call.kwargs, compiled_call.kwargs, "keyword arguments after the call", rtol, atol)
            for n in globals:
                diff = diff or same(eager_globals[n], g.get(n, _MISSING), f"global {n}", rtol, atol)
            if diff:
                raise AssertionError(f"{where}: {diff}")
    finally:
        convert.record_observers.remove(records.append)
    report = Report(counter, records, convert.counters["internal_error"] - errors_before)
    assert report.internal_errors == 0, f"internal tracer errors: {report}"
    if graphs is _MISSING:
        assert report.graphs >= 1, f"nothing was compiled: {report}"
    elif graphs is not None:
        assert report.graphs == graphs, f"expected {graphs} graphs: {report}"
    for name, want in (("breaks", breaks), ("fallbacks", fallbacks), ("compiles", compiles)):
        if want is not None:
            assert getattr(report, name) == want, f"expected {name}={want}: {report}"
    if max_graphs is not None:
        assert report.graphs <= max_graphs, f"expected at most {max_graphs} graphs: {report}"
    return report


def with_grads(f, use_backward=False):
    """f's result and the gradients of its sum with respect to every argument that needs
    them (and a module argument's parameters), by torch.autograd.grad or .backward()."""
    @functools.wraps(f)
    def run(*args):
        out = f(*args)
        leaves = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                leaves.append(a)
            elif isinstance(a, torch.nn.Module):
                leaves += list(a.parameters())
        outs = out if isinstance(out, (tuple, list)) else (out,)
        total = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        if use_backward:
            total.backward()
            grads = [leaf.grad for leaf in leaves]
        else:
            grads = torch.autograd.grad(total, leaves, allow_unused=True)
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads
    return run


def check_grads(f, inputs, backend="eager", fullgraph=False, use_backward=False, **kw):
    """`check` of f's results and of the gradients through them (by torch.autograd.grad,
    or by .backward() into .grad), compiled with `backend`."""
    return check(with_grads(f, use_backward), inputs, backend=backend,
                 compiled=lambda counter: with_grads(
                     frametrace.optimize(backend=counter, fullgraph=fullgraph)(f), use_backward), **kw)
