"""The frame hook: when frames are compiled, cached, skipped or run in CPython.

Every test checks values against plain eager PyTorch *and* what was compiled (a
CompileCounter backend, the C cache entries), so a silent fall-back to eager cannot
pass.  Each test calls frametrace.reset() first and does not rely on conftest.py.
"""
import asyncio
import copy
import decimal
import functools
import json
import os
import sys
import sysconfig
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import frametrace
from frametrace import _C, convert
from frametrace.testing import CompileCounter

from conftest import compile_counted, compiled_entries, entries, fallback_entries, quiet, resume_codes


def compiled_names(globals_dict):
    return sorted(k for k in globals_dict if k.startswith("__compiled_fn_"))


# 'with' over a C context manager frametrace does not know (decimal's) cannot be
# traced, and a frame cannot break its graph at the 'with'
# (BEFORE_WITH): a frame that does it runs entirely in CPython, from a fallback entry.
# (print() and other untraceable calls only break the graph now.)
CPYTHON_ONLY = decimal.localcontext()


# --------------------------------------------------------------------------- caching
def test_matching_guards_reuse_the_cache():
    frametrace.reset()

    def f(x, y):
        return (x.sin() + y).relu() * 2

    g, cnt = compile_counted(f)
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(g(x, y), f(x, y))
    assert cnt.frame_count == 1 and cnt.op_count == 4
    for _ in range(5):
        x2, y2 = torch.randn(8), torch.randn(8)     # new values, same guards
        torch.testing.assert_close(g(x2, y2), f(x2, y2))
    assert cnt.frame_count == 1 and cnt.op_count == 4
    assert len(entries(f)) == 1
    assert isinstance(entries(f)[0].code, type(f.__code__))   # transformed code, not CPython
    # A new shape misses, compiles once; the old shape still hits its entry.
    z = torch.randn(3)
    torch.testing.assert_close(g(z, z), f(z, z))
    torch.testing.assert_close(g(x, y), f(x, y))
    torch.testing.assert_close(g(z, z), f(z, z))
    assert cnt.frame_count == 2 and len(entries(f)) == 2


def test_transformed_code_is_never_traced_itself():
    frametrace.reset()

    def f(x):
        return x * 3 - 1

    g, cnt = compile_counted(f)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    new_code = entries(f)[0].code
    assert _C.code_flags(new_code) == (1, 0)        # marked skip
    assert _C.entries(new_code) == []


# --------------------------------------------------------------------------- disable
def test_disabled_function_runs_in_cpython():
    frametrace.reset()

    def helper(x):                  # would compile if it were reached by the hook
        return x * 3 + 1

    def nested_in_disabled(x):
        return x - 2

    def helper_calls_nested(x):
        return nested_in_disabled(helper(x))

    disabled = frametrace.disable(helper_calls_nested)
    assert disabled.__wrapped__ is helper_calls_nested

    def compiled_part(x):
        return x.cos() * 2

    def f(x):
        return compiled_part(disabled(x))   # the disabled call breaks f's graph

    g, cnt = compile_counted(f)
    x = torch.randn(5)
    expected = f(x)
    for _ in range(3):
        torch.testing.assert_close(g(x), expected)
    # f breaks at the disabled call (nothing to compile before it) and goes on in a
    # resume function, compiled once, into which compiled_part is inlined; the disabled
    # function and everything it calls never get a cache entry.
    assert cnt.frame_count == 1 and cnt.op_count == 2
    assert len(compiled_entries(f)) == 1 and fallback_entries(f) == []
    (resume,) = resume_codes(f)
    assert len(compiled_entries(resume)) == 1 and len(_C.entries(resume)) == 1
    assert entries(compiled_part) == []
    for fn in (helper, nested_in_disabled, helper_calls_nested):
        assert entries(fn) == [], fn.__name__
        assert _C.code_flags(fn.__code__) == (0, 0), fn.__name__
    # Called outside any optimized region it is just the function.
    torch.testing.assert_close(disabled(x), helper_calls_nested(x))


def test_disable_as_decorator():
    frametrace.reset()
    calls = []

    @frametrace.disable
    def log_stats(x):
        calls.append(float(x.sum()))       # .item()-like: would force a fall-back anyway
        return x * 10

    def f(x):
        y = x + 1
        return log_stats(y) - y

    g, cnt = compile_counted(f)
    x = torch.ones(3)
    torch.testing.assert_close(g(x), torch.full((3,), 18.0))
    torch.testing.assert_close(g(x), torch.full((3,), 18.0))
    assert calls == [6.0, 6.0]
    assert entries(log_stats.__wrapped__) == []
    assert log_stats.__name__ == "log_stats"
    # f breaks its graph at the disabled call: y = x + 1 | log_stats in CPython | - y
    assert cnt.frame_count == 2 and cnt.op_count == 2
    assert len(compiled_entries(f)) == 1 and fallback_entries(f) == []
    assert [len(compiled_entries(c)) for c in resume_codes(f)] == [1]


def test_optimized_call_inside_disabled_function_is_compiled():
    frametrace.reset()

    def leaf(x):
        return x.exp() + 1

    leaf_opt, cnt = compile_counted(leaf)

    @frametrace.disable
    def middle(x):
        return leaf_opt(x) * 1          # re-enables the hook for leaf

    def top(x):
        return middle(x)

    top_opt = frametrace.optimize(backend=cnt)(top)
    x = torch.randn(4)
    torch.testing.assert_close(top_opt(x), leaf(x))
    torch.testing.assert_close(top_opt(x), leaf(x))
    assert cnt.frame_count == 1 and len(compiled_entries(leaf)) == 1
    assert entries(middle.__wrapped__) == []
    assert not _C.hook_installed() and _C.get_callback() is None


# --------------------------------------------------------------------------- nesting
def test_frames_called_from_a_fallback_frame_are_compiled():
    frametrace.reset()

    def inner(x):
        return x * 2 + 1

    def middle(x):
        with CPYTHON_ONLY:               # middle runs in CPython
            print("middle")
        return inner(x) - 1

    def outer(x):
        with CPYTHON_ONLY:               # outer runs in CPython
            print("outer")
        return middle(x) + inner(x)

    g, cnt = compile_counted(outer)
    x = torch.randn(3)
    with quiet() as out:
        expected = outer(x)
    assert out.getvalue() == "outer\nmiddle\n"
    for _ in range(3):
        with quiet() as out:
            torch.testing.assert_close(g(x), expected)
        assert out.getvalue() == "outer\nmiddle\n"    # side effects happen every call
    assert cnt.frame_count == 1 and cnt.op_count == 2      # inner only, compiled once
    assert len(compiled_entries(inner)) == 1
    assert len(fallback_entries(outer)) == 1 and len(entries(outer)) == 1
    assert len(fallback_entries(middle)) == 1 and len(entries(middle)) == 1


def test_comprehension_in_fallback_frame_is_not_retraced_every_call():
    frametrace.reset()

    def f(x, xs):
        with CPYTHON_ONLY:                  # f runs in CPython
            pass
        ys = [t * 2 for t in xs]
        return x + sum(ys)

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the cache-limit warning would fail here
        for _ in range(12):
            torch.testing.assert_close(g(x, [x, x]), f(x, [x, x]))
    assert len(fallback_entries(f)) == 1 == len(entries(f))    # f: one fallback entry
    nested = [c for c in f.__code__.co_consts if hasattr(c, "co_name")]
    if sys.version_info < (3, 12):                    # 3.12 inlines comprehensions
        (listcomp,) = nested
        assert _C.entries(listcomp) == [] and _C.code_flags(listcomp) == (1, 0)
    else:
        assert nested == []


# --------------------------------------------------------------------------- skipping
def user_json_helper(d):
    text = json.dumps(d, sort_keys=True)
    clone = copy.deepcopy(d)
    return len(text), clone


def test_stdlib_and_torch_frames_are_not_compiled():
    frametrace.reset()

    def tensor_part(x, n):
        return x * n + 1

    def f(x):
        with CPYTHON_ONLY:                             # f runs in CPython
            pass
        n, clone = user_json_helper({"a": [1, 2, 3]})
        y = F.relu(x)                                  # torch's Python frame, from CPython
        return tensor_part(y, n) + clone["a"][0]

    g, cnt = compile_counted(f)
    x = torch.randn(6)
    expected = f(x)
    for _ in range(3):
        torch.testing.assert_close(g(x), expected)
    assert cnt.frame_count == 1            # tensor_part only
    assert len(compiled_entries(tensor_part)) == 1
    assert len(fallback_entries(f)) == 1 == len(entries(f))
    # user code: traced, with a graph break at json.dumps, which runs in CPython from its
    # transformed code (no tensor work: no graphs); copy.deepcopy of the dict is traced
    assert len(compiled_entries(user_json_helper)) == 1 == len(entries(user_json_helper))
    # breaks at json.dumps and len() of the string json.dumps made (data)
    assert [len(compiled_entries(c)) for c in resume_codes(user_json_helper)] == [1, 1]
    for lib_code in (json.dumps.__code__, json.JSONEncoder.encode.__code__, F.relu.__code__):
        assert _C.code_flags(lib_code) == (1, 0), lib_code
        assert _C.entries(lib_code) == [], lib_code


def test_is_skipped_file():
    frametrace.reset()
    for module in (torch, torch.nn.functional, torch.fx.graph_module, copy, json,
                   json.encoder, threading, asyncio, convert, frametrace):
        assert convert.is_skipped_file(module.__file__), module.__name__
    assert convert.is_skipped_file("<frozen importlib._bootstrap>")
    assert convert.is_skipped_file("<eval_with_key>.3")
    assert not convert.is_skipped_file(__file__)
    assert not convert.is_skipped_file("<string>")
    user_pkg = os.path.join(sysconfig.get_paths()["purelib"], "some_user_pkg", "model.py")
    assert not convert.is_skipped_file(user_pkg)
    assert not convert.is_skipped_file("/tmp/some_project/train.py")


# --------------------------------------------------------------------------- installation
def test_hook_is_installed_only_during_optimized_calls():
    frametrace.reset()
    seen = {}

    @frametrace.disable
    def probe_disabled():
        seen["disabled"] = (_C.hook_installed(), _C.get_callback())

    def probe_fallback():
        # a user frame that runs in CPython under the callback
        with CPYTHON_ONLY:
            seen["fallback"] = (_C.hook_installed(), _C.get_callback())

    def f(x):
        probe_disabled()
        probe_fallback()
        return x + 1

    g, cnt = compile_counted(f)
    assert not _C.hook_installed()
    assert _C.get_callback() is None
    x = torch.randn(2)
    torch.testing.assert_close(g(x), x + 1)
    assert not _C.hook_installed()
    assert _C.get_callback() is None
    assert seen["disabled"] == (True, None)
    assert seen["fallback"][0] is True and seen["fallback"][1] is g.callback
    # still true after a cache hit, and after an exception escapes the region
    torch.testing.assert_close(g(x), x + 1)
    assert not _C.hook_installed() and _C.get_callback() is None
    # f breaks its graph at both calls; x + 1 is compiled in the last resume function
    assert cnt.frame_count == 1 and len(compiled_entries(f)) == 1
    assert len(fallback_entries(probe_fallback)) == 1 == len(entries(probe_fallback))

    def bad(x, y):
        probe_fallback()
        return x + y

    h, _ = compile_counted(bad)
    with pytest.raises(RuntimeError, match="must match the size"):
        h(torch.randn(2), torch.randn(3))
    assert not _C.hook_installed() and _C.get_callback() is None


# --------------------------------------------------------------------------- threads
def test_optimized_call_in_one_thread_does_not_compile_another_thread():
    frametrace.reset()
    entered, release = threading.Event(), threading.Event()
    result, errors, seen = {}, [], {}

    def wait_in_region():
        entered.set()
        release.wait(30)

    def compiled_part(x):
        return x * 2 + 3

    def region(x):
        wait_in_region()                     # a graph break; the hook stays on
        return compiled_part(x)

    def plain(x):                            # identical work, called by the other thread
        return x * 2 + 3

    def plain_other(x):
        return (x - 1).abs()

    g, cnt = compile_counted(region)
    x = torch.randn(4)

    def worker():
        try:
            result["value"] = g(x)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert entered.wait(30)
        # The worker is inside its optimized call right now.
        seen["installed"] = _C.hook_installed()
        seen["callback"] = _C.get_callback()
        for _ in range(50):
            torch.testing.assert_close(plain(x), x * 2 + 3)
            torch.testing.assert_close(plain_other(x), (x - 1).abs())
    finally:
        release.set()
        t.join(30)
    assert not t.is_alive() and errors == []
    assert seen == {"installed": True, "callback": None}
    for fn in (plain, plain_other):
        assert entries(fn) == [] and _C.code_flags(fn.__code__) == (0, 0)
    torch.testing.assert_close(result["value"], x * 2 + 3)
    # compiled by the worker: region breaks at wait_in_region(), compiled_part is
    # inlined into its resume function
    assert cnt.frame_count == 1 and len(compiled_entries(region)) == 1
    assert entries(compiled_part) == []
    assert [len(compiled_entries(c)) for c in resume_codes(region)] == [1]
    assert not _C.hook_installed()


def test_two_threads_call_the_same_optimized_function():
    frametrace.reset()

    def f(x, y):
        return (x * y).sum(0) + x.mean()

    g, cnt = compile_counted(f)
    barrier = threading.Barrier(2)
    errors, counts = [], {}

    def worker(name, shape, seed):
        try:
            gen = torch.Generator().manual_seed(seed)
            barrier.wait(30)
            n = 0
            for _ in range(200):
                x, y = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
                torch.testing.assert_close(g(x, y), f(x, y))
                n += 1
            counts[name] = n
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=("a", (4, 3), 1)),
               threading.Thread(target=worker, args=("b", (5, 2), 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], errors
    assert counts == {"a": 200, "b": 200}
    assert cnt.frame_count == 2 and len(compiled_entries(f)) == 2   # one per shape
    assert not _C.hook_installed() and _C.get_callback() is None


# --------------------------------------------------------------------------- generators
def scaled(x, i):
    return x * i + 1


def gen_values(x, n):
    for i in range(n):
        yield scaled(x, i)


async def coro_value(x):
    await asyncio.sleep(0)
    return scaled(x, 10) - x


def test_generators_and_coroutines_run_in_cpython():
    frametrace.reset()

    def f(x):
        with CPYTHON_ONLY:                            # f runs in CPython
            pass
        total = sum(gen_values(x, 3))
        via_coro = asyncio.run(coro_value(x))
        squares = list(v * v for v in (x, x + 1))     # a generator expression
        return total + via_coro + squares[1]

    g, cnt = compile_counted(f)
    x = torch.randn(4)
    expected = f(x)
    for _ in range(2):
        torch.testing.assert_close(g(x), expected)
    # scaled() is reached from a generator and from a coroutine: compiled for i = 0
    # and 1 (specialized), then once with i symbolic (i = 2 and 10), and then reused.
    assert cnt.frame_count == 3 and len(compiled_entries(scaled)) == 3
    genexpr = next(c for c in f.__code__.co_consts if getattr(c, "co_name", "") == "<genexpr>")
    for code in (gen_values.__code__, coro_value.__code__, genexpr):
        assert _C.entries(code) == [] and _C.code_flags(code) == (0, 0), code.co_name


def test_optimized_generator_function():
    frametrace.reset()

    def gen(x):
        yield x + 1
        yield x * 2

    g, cnt = compile_counted(gen)
    x = torch.randn(3)
    out = list(g(x))
    torch.testing.assert_close(out[0], x + 1)
    torch.testing.assert_close(out[1], x * 2)
    assert cnt.frame_count == 0 and entries(gen) == []


# --------------------------------------------------------------------------- exceptions
def test_shape_mismatch_error_propagates_from_fallback():
    frametrace.reset()

    def f(x, y):
        return x + y

    g, cnt = compile_counted(f)
    a, b = torch.randn(3), torch.randn(4)
    with pytest.raises(RuntimeError) as eager_err:
        f(a, b)
    with pytest.raises(RuntimeError) as err:
        g(a, b)
    assert type(err.value) is RuntimeError
    assert not isinstance(err.value, frametrace.Unsupported)
    assert str(err.value) == str(eager_err.value)
    assert "must match the size" in str(err.value)
    assert cnt.frame_count == 0
    # Shapes that do match compile and work afterwards.
    torch.testing.assert_close(g(a, a), a + a)
    assert cnt.frame_count == 1


def test_bad_call_signature_raises_like_eager():
    frametrace.reset()

    def f(x, *, k):
        return x * k

    g, cnt = compile_counted(f)
    x = torch.randn(2)
    for args, kwargs in (((x,), {}), ((x, 1), {"k": 2}), ((x,), {"k": 2, "j": 3})):
        with pytest.raises(TypeError) as eager_err:
            f(*args, **kwargs)
        with pytest.raises(TypeError) as err:
            g(*args, **kwargs)
        assert str(err.value) == str(eager_err.value)
    assert cnt.frame_count == 0 and entries(f) == []
    assert not _C.hook_installed() and _C.get_callback() is None
    torch.testing.assert_close(g(x, k=2), x * 2)
    assert cnt.frame_count == 1


def test_shape_mismatch_with_fullgraph_raises_unsupported():
    frametrace.reset()

    def f(x, y):
        return x + y

    g, cnt = compile_counted(f, fullgraph=True)
    with pytest.raises(frametrace.Unsupported):
        g(torch.randn(3), torch.randn(4))
    assert cnt.frame_count == 0
    assert not _C.hook_installed() and _C.get_callback() is None


def test_error_raised_by_compiled_code_propagates():
    frametrace.reset()

    def f(x, idx):
        return torch.index_select(x, 0, idx) * 2

    g, cnt = compile_counted(f)
    x = torch.randn(5)
    good, bad = torch.tensor([0, 4]), torch.tensor([0, 7])    # same guards
    torch.testing.assert_close(g(x, good), f(x, good))
    assert cnt.frame_count == 1
    with pytest.raises(IndexError) as eager_err:
        f(x, bad)
    with pytest.raises(IndexError) as err:
        g(x, bad)
    assert str(err.value) == str(eager_err.value)
    assert cnt.frame_count == 1               # the cached graph raised; nothing retraced
    torch.testing.assert_close(g(x, good), f(x, good))
    assert not _C.hook_installed() and _C.get_callback() is None


class MyError(Exception):
    pass


def test_exception_from_fallback_and_nested_frames_propagates_unchanged():
    frametrace.reset()
    err = MyError("custom failure 42")

    def inner(x, idx):
        return torch.index_select(x, 0, idx) + 1

    def outer(x, idx, fail):
        if fail:
            raise err                        # unsupported: outer runs in CPython
        return inner(x, idx)

    g, cnt = compile_counted(outer)
    x = torch.randn(4)
    with pytest.raises(MyError) as info:
        g(x, torch.tensor([1]), True)
    assert info.value is err and str(info.value) == "custom failure 42"
    torch.testing.assert_close(g(x, torch.tensor([1]), False), x[[1]] + 1)
    assert cnt.frame_count == 1
    # the compiled inner frame raises through the CPython outer frame
    with pytest.raises(IndexError, match="index out of range"):
        g(x, torch.tensor([9]), False)
    # The failed graph's frame ran again in CPython, where inner is a frame of its own
    # (compiled once); outer is not compiled again.
    assert cnt.frame_count == 2
    assert not _C.hook_installed() and _C.get_callback() is None


# --------------------------------------------------------------------------- recursion
def test_recursion_through_fallback():
    frametrace.reset()
    cnt = CompileCounter()

    # (an optimized function called from a compiled one is traced into it: the call
    # goes through a disable()d function to break the graph there)
    @frametrace.disable
    def call(f, *args):
        return f(*args)

    @frametrace.optimize(backend=cnt, dynamic=False)
    def fact_like(x, n):
        if n == 0:
            return x * 2                     # compiled for n == 0
        return call(fact_like, x, n - 1) + n     # a graph break: the call runs in CPython

    def eager(x, n):
        return x * 2 if n == 0 else eager(x, n - 1) + n

    x = torch.randn(3)
    for n in (0, 3, 5, 5):
        torch.testing.assert_close(fact_like(x, n), eager(x, n))
    # n = 0: x * 2; n = 1..5: the recursive call runs in CPython, then `+ n` in the
    # resume function (one graph per guarded n)
    assert cnt.frame_count == 6
    code = fact_like.__wrapped__.__code__
    assert len([e for e in _C.entries(code) if e.code is not None]) == 6 == len(_C.entries(code))
    (resume,) = resume_codes(code)
    assert len([e for e in _C.entries(resume) if e.code is not None]) == 5
    for n in (0, 3, 5):                        # all cached
        torch.testing.assert_close(fact_like(x, n), eager(x, n))
    assert cnt.frame_count == 6
    assert not _C.hook_installed()


def test_bounded_recursion_is_inlined():
    frametrace.reset()

    def walk(x, depth):
        if depth == 0:
            return x.sin()
        return walk(x, depth - 1) * 1.5

    def f(x):
        return walk(x, 4) - 1

    g, cnt = compile_counted(f)
    x = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(g(x), f(x))
    # walk is inlined five levels deep into f's one graph: sin, four muls, sub.
    assert cnt.frame_count == 1 and cnt.op_count == 6
    assert len(compiled_entries(walk)) == 0


# --------------------------------------------------------------------------- methods
def test_optimize_on_method_binds_self():
    frametrace.reset()
    cnt = CompileCounter()

    class Scaler:
        def __init__(self, w, b):
            self.w = w
            self.b = b

        @frametrace.optimize(backend=cnt)
        def forward(self, x):
            return x * self.w + self.b

        def eager(self, x):
            return x * self.w + self.b

    s1 = Scaler(torch.full((3,), 2.0), 1.0)
    s2 = Scaler(torch.full((3,), 3.0), -1.0)
    x = torch.randn(3)
    torch.testing.assert_close(s1.forward(x), s1.eager(x))
    torch.testing.assert_close(s2.forward(x), s2.eager(x))
    torch.testing.assert_close(Scaler.forward(s1, x), s1.eager(x))    # unbound call
    torch.testing.assert_close(s1.forward(x=x), s1.eager(x))
    bound = s2.forward
    assert bound.__self__ is s2
    torch.testing.assert_close(bound(x), s2.eager(x))
    assert cnt.frame_count == 2 and cnt.op_count == 4        # one graph per instance
    assert len(_C.entries(Scaler.forward.__wrapped__.__code__)) == 2


def test_optimize_bound_method():
    frametrace.reset()

    class Affine:
        def __init__(self):
            self.a = torch.randn(4)

        def apply(self, x):
            return self.a * x - 1

    m = Affine()
    g, cnt = compile_counted(m.apply)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(g(x), m.apply(x))
    assert cnt.frame_count == 1


# --------------------------------------------------------------------------- reset
def test_reset_recompiles_and_removes_compiled_globals():
    frametrace.reset()

    def f(x):
        return x.tanh() + 1

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    names = compiled_names(f.__globals__)
    assert len(names) == 1
    frametrace.reset()
    assert compiled_names(f.__globals__) == []
    assert entries(f) == [] and _C.code_flags(f.__code__) == (0, 0)
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2
    new_names = compiled_names(f.__globals__)
    assert len(new_names) == 1 and new_names != names
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2
    for i in range(5):
        frametrace.reset()
        torch.testing.assert_close(g(x), f(x))
        assert cnt.frame_count == 3 + i
        assert len(compiled_names(f.__globals__)) == 1
    frametrace.reset()
    assert compiled_names(f.__globals__) == []


def test_reset_clears_fallback_and_cache_limit_state():
    frametrace.reset()

    def f(x):
        with CPYTHON_ONLY:
            pass
        return x + 1

    g, cnt = compile_counted(f)
    x = torch.randn(2)
    torch.testing.assert_close(g(x), x + 1)
    assert len(fallback_entries(f)) == 1 and cnt.frame_count == 0
    frametrace.reset()
    assert entries(f) == [] and _C.code_flags(f.__code__) == (0, 0)

    def h(x):
        return x * 2

    hg, hcnt = compile_counted(h, dynamic=False)     # each new shape is a new entry
    limit = frametrace.config.cache_size_limit
    frametrace.config.cache_size_limit = 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n in (1, 2, 3, 4):
                torch.testing.assert_close(hg(torch.ones(n)), torch.full((n,), 2.0))
        assert hcnt.frame_count == 2
        assert _C.code_flags(h.__code__) == (0, 1)
        frametrace.reset()
        assert _C.code_flags(h.__code__) == (0, 0)
        torch.testing.assert_close(hg(torch.ones(4)), torch.full((4,), 2.0))
        assert hcnt.frame_count == 3
    finally:
        frametrace.config.cache_size_limit = limit


# --------------------------------------------------------------------------- signatures
def test_varargs_and_varkwargs():
    frametrace.reset()

    def f(x, *args, scale=2, **kw):
        for a in args:
            x = x + a
        return x * scale + kw["bias"]

    g, cnt = compile_counted(f)
    x, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(g(x, 1, 2, scale=3, bias=b), f(x, 1, 2, scale=3, bias=b))
    torch.testing.assert_close(g(x, 1, 2, scale=3, bias=b), f(x, 1, 2, scale=3, bias=b))
    assert cnt.frame_count == 1
    torch.testing.assert_close(g(x, 1, bias=b), f(x, 1, bias=b))
    torch.testing.assert_close(g(x, 1.5, 2, 4, scale=3, bias=b), f(x, 1.5, 2, 4, scale=3, bias=b))
    assert cnt.frame_count == 3 and len(compiled_entries(f)) == 3


def test_tensors_in_varargs_and_kwargs():
    frametrace.reset()

    def f(*tensors, **named):
        out = named["start"]
        for t in tensors:
            out = out + t
        return out * named["scale"]

    g, cnt = compile_counted(f)
    ts = [torch.randn(2) for _ in range(3)]
    s = torch.randn(2)
    for _ in range(2):
        torch.testing.assert_close(g(*ts, start=s, scale=0.5), f(*ts, start=s, scale=0.5))
    assert cnt.frame_count == 1 and cnt.op_count == 4


def test_keyword_only_args_and_defaults():
    frametrace.reset()

    def f(x, y=1.5, *, k=3, bias=None):
        out = x * y - k
        if bias is not None:
            out = out + bias
        return out

    g, cnt = compile_counted(f)
    x, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    torch.testing.assert_close(g(x, 2.0, k=1), f(x, 2.0, k=1))
    torch.testing.assert_close(g(x, k=1, bias=b), f(x, k=1, bias=b))
    torch.testing.assert_close(g(x, y=2.0, k=1), f(x, 2.0, k=1))     # same guards as above
    assert cnt.frame_count == 3


def test_many_arguments():
    frametrace.reset()
    names = [f"a{i}" for i in range(40)]           # more than the hook's 32 stack slots
    ns = {}
    exec(f"def f({', '.join(names)}):\n    return {' + '.join(names)}\n", ns)
    f = ns["f"]
    g, cnt = compile_counted(f)
    args = [torch.randn(2) for _ in names]
    for _ in range(3):
        torch.testing.assert_close(g(*args), f(*args))
    assert cnt.frame_count == 1 and cnt.op_count == 39


def make_adder(k):
    def add(x):
        return x + k
    return add


def test_closures_with_constant_cells_recompile():
    frametrace.reset()
    cnt = CompileCounter()
    a = frametrace.optimize(backend=cnt)(make_adder(1))
    b = frametrace.optimize(backend=cnt)(make_adder(2))
    x = torch.randn(3)
    for fn, k in ((a, 1), (b, 2), (a, 1), (b, 2), (a, 1)):
        torch.testing.assert_close(fn(x), x + k)
    assert cnt.frame_count == 2                 # the cell value is guarded
    assert len(compiled_entries(make_adder(0))) == 2   # same code object for all closures


def test_closures_with_tensor_cells_read_their_own_cell():
    frametrace.reset()
    cnt = CompileCounter()
    t1, t2 = torch.ones(3), torch.full((3,), 5.0)
    a = frametrace.optimize(backend=cnt)(make_adder(t1))
    b = frametrace.optimize(backend=cnt)(make_adder(t2))
    x = torch.randn(3)
    for fn, k in ((a, t1), (b, t2), (a, t1), (a, t1), (b, t2), (b, t2)):
        torch.testing.assert_close(fn(x), x + k)
    # same metadata: one graph, each call reads the calling closure's tensor
    assert cnt.frame_count == 1
    c = frametrace.optimize(backend=cnt)(make_adder(torch.ones(2, 3)))
    torch.testing.assert_close(c(x), x + torch.ones(2, 3))   # broadcast: new guard, new graph
    torch.testing.assert_close(a(x), x + t1)
    assert cnt.frame_count == 2


def test_closure_cell_rebound_recompiles():
    frametrace.reset()

    def make():
        k = 1.0
        t = torch.zeros(3)

        def inner(x):
            return x * k + t

        def set_k(v):
            nonlocal k
            k = v

        def set_t(v):
            nonlocal t
            t = v
        return inner, set_k, set_t

    inner, set_k, set_t = make()
    g, cnt = compile_counted(inner)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), x)
    set_k(10.0)
    torch.testing.assert_close(g(x), x * 10)
    assert cnt.frame_count == 2
    set_t(torch.ones(3))                             # same metadata: no recompile
    torch.testing.assert_close(g(x), x * 10 + 1)
    assert cnt.frame_count == 2
    set_t(torch.ones(2, 3))                          # new shape: recompile
    torch.testing.assert_close(g(x), x * 10 + torch.ones(2, 3))
    assert cnt.frame_count == 3
    set_k(1.0)
    set_t(torch.zeros(3))
    torch.testing.assert_close(g(x), x)              # the first entry again
    assert cnt.frame_count == 3


# --------------------------------------------------------------------------- more edges
def test_reset_inside_an_optimized_call():
    frametrace.reset()

    def inner(x):
        return x * 2

    def do_reset():
        frametrace.reset()

    def f(x):
        a = inner(x)
        do_reset()                   # drops the entry inner just ran from
        b = inner(x)
        do_reset()
        return a + b + inner(x)

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    for i in range(3):
        torch.testing.assert_close(g(x), x * 6)
        # f breaks at each do_reset(): inner(x) | reset | inner(x) | reset | a + b + inner(x);
        # each reset drops every entry, so all three graphs compile again on every call
        assert cnt.frame_count == 3 * (i + 1)
    assert not _C.hook_installed() and _C.get_callback() is None


def test_optimize_functools_partial():
    frametrace.reset()

    def mul(x, y, z):
        return x * y + z

    g, cnt = compile_counted(functools.partial(mul, z=1.0))
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(g(x, 2.0), x * 2 + 1)
    assert cnt.frame_count == 1 and len(compiled_entries(mul)) == 1


def test_recursion_error_propagates():
    frametrace.reset()

    def rec(x, n):
        if n == 0:
            return x
        return rec(x, n - 1) + 1

    g, cnt = compile_counted(rec, dynamic=False)     # an entry per depth
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # the cache-limit warning
        torch.testing.assert_close(g(x, 300), x + 300)
        with pytest.raises(RecursionError):
            g(x, 100_000)
        torch.testing.assert_close(g(x, 300), x + 300)
    # the first cache_size_limit depths were traced; then misses run in CPython
    assert len(entries(rec)) == frametrace.config.cache_size_limit
    assert _C.code_flags(rec.__code__) == (0, 1)
    assert not _C.hook_installed() and _C.get_callback() is None


def test_thread_started_inside_an_optimized_call_is_not_hooked():
    frametrace.reset()
    out, seen = {}, {}

    def spawned_work(x):
        return x - 1

    def thread_body(x):
        seen["callback"] = _C.get_callback()
        out["value"] = spawned_work(x)

    def region(x):
        t = threading.Thread(target=thread_body, args=(x,))
        t.start()
        t.join(30)
        return spawned_work(x) * 2

    g, cnt = compile_counted(region)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), (x - 1) * 2)
    torch.testing.assert_close(out["value"], x - 1)
    assert seen["callback"] is None
    assert entries(thread_body) == [] and _C.code_flags(thread_body.__code__) == (0, 0)
    # compiled once, by the calling thread only: region breaks at the Thread calls, and
    # spawned_work is inlined into its last resume function
    assert entries(spawned_work) == [] and _C.code_flags(spawned_work.__code__) == (0, 0)
    assert cnt.frame_count == 1 and len(compiled_entries(region)) == 1
    assert not _C.hook_installed() and _C.get_callback() is None


# -- frametrace called from inside a compile --
def test_optimized_call_while_compiling_keeps_the_hook_state():
    from frametrace import _C

    @frametrace.optimize
    def inner(x):
        return x * 3

    calls = []

    def backend(gm, example_inputs):
        calls.append(inner(torch.ones(2)))      # frametrace used from inside a compile
        return gm.forward

    @frametrace.optimize(backend=backend)
    def outer(x):
        return inner(x + 1) + 1

    x = torch.ones(2)
    for _ in range(2):
        torch.testing.assert_close(outer(x), (x + 1) * 3 + 1)
        assert not _C.hook_installed() and _C.get_callback() is None
    assert calls and all(torch.equal(c, torch.full((2,), 3.0)) for c in calls)
    # the hook still installs and compiles afterwards
    cnt = frametrace.testing.CompileCounter()
    torch.testing.assert_close(frametrace.optimize(backend=cnt)(lambda t: t - 1)(x), x - 1)
    assert cnt.frame_count == 1
