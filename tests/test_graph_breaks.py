"""Graph breaks: at the root frame, what cannot be traced runs in CPython between two
graphs, and the frame goes on in a resume function that the hook compiles in its turn.

Every test checks values against eager PyTorch *and* what was compiled: the graphs a
CompileCounter backend received, the cache entries of the frame and of its resume
functions, and every compile the callback made (convert.record_observers), so neither
a silent whole-frame fall-back nor a retrace on every call can pass.
"""
import io

import pytest
import torch

import frametrace
from frametrace import _C, convert

from conftest import (code_of, compile_counted, compiled_entries, fallback_entries, quiet,
                      resume_codes)


# --------------------------------------------------------------------------- helpers
@pytest.fixture
def compiles():
    """Every CompileRecord made while the test runs (one per traced frame)."""
    records = []
    convert.record_observers.append(records.append)
    yield records
    convert.record_observers.remove(records.append)


def outcomes(records, fn):
    """(qualname, outcome) of the compiles of fn and of its resume functions."""
    name = code_of(fn).co_qualname
    return [(r.code.co_qualname, r.outcome) for r in records
            if r.code.co_qualname == name or r.code.co_qualname.startswith(name + ".<resume")]


# --------------------------------------------------------------------------- print
def test_break_on_print(compiles):
    def f(x):
        y = x.sin() * 2
        print("between", y.shape)
        return y.cos() + x

    g, cnt = compile_counted(f)
    x = torch.randn(4)
    with quiet() as out:
        expected = f(x)
    eager_out = out.getvalue()
    assert eager_out == "between torch.Size([4])\n"
    for _ in range(3):
        with quiet() as out:
            torch.testing.assert_close(g(x), expected)
        assert out.getvalue() == eager_out               # print runs on every call
    # two graphs: sin, mul before the print; cos, add after it
    assert cnt.frame_count == 2 and cnt.op_count == 4
    assert len(compiled_entries(f)) == 1 and fallback_entries(f) == []
    (resume,) = resume_codes(f)
    assert resume.co_qualname.startswith("test_break_on_print.<locals>.f.<resume at line")
    assert len(compiled_entries(resume)) == 1
    assert outcomes(compiles, f) == [(f.__code__.co_qualname, "break"),
                                     (resume.co_qualname, "compiled")]     # traced once
    assert not _C.hook_installed() and _C.get_callback() is None


def test_break_on_item():
    def f(x):
        s = x.sum() * 2
        n = s.item()
        return x * 3 - 1, n

    g, cnt = compile_counted(f)
    for x in (torch.ones(3), torch.full((3,), 2.0), torch.randn(3)):
        out, n = g(x)
        eo, en = f(x)
        torch.testing.assert_close(out, eo)
        assert type(n) is float and n == en
    # sum, mul before the break; mul, sub after it (the same graphs for every value)
    assert cnt.frame_count == 2 and cnt.op_count == 4
    assert len(compiled_entries(f)) == 1
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [1]


def test_item_value_is_not_specialized_across_breaks():
    def f(x):
        n = x.sum().item()
        m = n * 2 + 1                                # Python arithmetic on the float
        return x * n + m, m

    g, cnt = compile_counted(f)
    for i, x in enumerate([torch.ones(3), torch.full((3,), 2.0)] +
                          [torch.randn(3) for _ in range(4)]):
        a, b = g(x)
        ea, eb = f(x)
        torch.testing.assert_close(a, ea)
        assert b == eb
        if i == 0:
            frames = cnt.frame_count
    assert cnt.frame_count == frames                 # no graph per value


# --------------------------------------------------------------------------- branches
def test_break_on_data_dependent_branch_takes_both_branches():
    def f(x):
        y = x * 2
        if y.sum() > 0:
            return y + 1
        return y - 1

    g, cnt = compile_counted(f)
    pos, neg = torch.ones(3), -torch.ones(3)
    torch.testing.assert_close(g(pos), f(pos))
    assert cnt.frame_count == 2                      # mul, sum, gt | add
    torch.testing.assert_close(g(neg), f(neg))
    assert cnt.frame_count == 3                      # the same first graph | sub
    for _ in range(3):
        for x in (pos, neg, torch.randn(3), torch.randn(3)):
            torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 3 and len(compiled_entries(f)) == 1
    resumes = resume_codes(f)
    assert len(resumes) == 2 and all(len(compiled_entries(c)) == 1 for c in resumes)


# --------------------------------------------------------------------------- loops
def test_break_inside_for_loop_over_range(compiles):
    def f(x, n):
        acc = x * 0
        for i in range(n):
            acc = acc + x * i
            print(i)
        return acc.relu()

    g, cnt = compile_counted(f)
    x = torch.randn(4)
    with quiet() as out:
        expected = f(x, 3)
    assert out.getvalue() == "0\n1\n2\n"
    for _ in range(3):
        with quiet() as out2:
            torch.testing.assert_close(g(x, 3), expected)
        assert out2.getvalue() == out.getvalue()
    # mul, mul, add (i = 0) | mul, add (i = 1) | mul, add (i = 2) | relu
    assert cnt.frame_count == 4 and cnt.op_count == 8
    assert len(compiled_entries(f)) == 1
    # One resume code for the loop's continuation, an entry per iteration left (the
    # remaining items are guarded); bounded by cache_size_limit for long loops.
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [3]
    assert len(compiles) == 4                        # each frame traced once


def test_break_inside_long_loop_is_bounded():
    def f(x, n):
        for i in range(n):
            x = x + 1
            print(end="")
        return x

    g, cnt = compile_counted(f)
    x = torch.randn(4)
    for n in (20, 21):
        torch.testing.assert_close(g(x, n), f(x, n))
    # one break site in the loop: its resume functions share one code object, whose
    # entries are bounded by cache_size_limit
    assert len({c.co_qualname for c in resume_codes(f)}) == len(resume_codes(f))
    assert cnt.frame_count <= 2 * (frametrace.config.cache_size_limit + 1)


def test_break_inside_for_loop_over_list_of_tensors():
    def f(xs, w):
        out = []
        for t in xs:
            y = t * w
            print(end="")
            out.append(y + 1)
        return out

    g, cnt = compile_counted(f)
    xs, w = [torch.randn(3) for _ in range(3)], torch.randn(3)
    for _ in range(3):
        got = g(xs, w)
        expected = f(xs, w)
        assert len(got) == 3
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    # mul | add, mul | add, mul | add: one graph per iteration, compiled once
    assert cnt.frame_count == 4 and cnt.op_count == 6
    frames = cnt.frame_count
    assert len(compiled_entries(f)) == 1
    # One resume code for the loop's continuation, an entry per iteration left (the
    # remaining items are guarded); bounded by cache_size_limit for long loops.
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [3]
    xs2 = [torch.randn(3) for _ in range(3)]           # new values, same guards
    for a, b in zip(g(xs2, w), f(xs2, w)):
        torch.testing.assert_close(a, b)
    assert cnt.frame_count == frames


# --------------------------------------------------------------------------- grad mode
@pytest.fixture(autouse=True)
def _restore_grad_mode():
    # A test that fails with grad mode switched off must not take the others with it.
    yield
    torch.set_grad_enabled(True)


def grad_probe():
    modes = []

    @frametrace.disable
    def probe(tag):                                  # a call the tracer cannot trace
        modes.append((tag, torch.is_grad_enabled()))

    return modes, probe


def check_grad_outputs(got, expected):
    assert torch.is_grad_enabled()
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
        assert a.requires_grad == b.requires_grad


def test_break_right_after_no_grad_block():
    modes, probe = grad_probe()

    def f(x, w):
        with torch.no_grad():
            y = x * w
            z = y + 1
        probe("after")                               # graph break right after the block
        return z * w, y, z

    g, cnt = compile_counted(f)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    expected = f(x, w)
    assert modes == [("after", True)]
    for _ in range(3):
        modes.clear()
        got = g(x, w)
        assert modes == [("after", True)]
        check_grad_outputs(got, expected)
    assert [t.requires_grad for t in got] == [True, False, False]
    got[0].sum().backward()
    torch.testing.assert_close(w.grad, expected[2].detach())
    # mul, add under no_grad | mul: nothing compiled again after the first call
    assert cnt.frame_count == 2 and len(compiled_entries(f)) == 1
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [1]


def test_untraceable_code_inside_no_grad_keeps_grad_mode():
    modes, probe = grad_probe()

    def f(x, w):
        with torch.no_grad():
            y = x * w
            probe("inside")
        probe("after")
        return y * w

    g, cnt = compile_counted(f)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    expected = f(x, w)
    modes.clear()
    got = g(x, w)
    assert modes == [("inside", False), ("after", True)]
    check_grad_outputs([got], [expected])


def test_break_inside_no_grad_block():
    modes, probe = grad_probe()

    def f(x, w):
        with torch.no_grad():
            y = x * w
            probe("inside")                          # graph break inside the block
            z = y + 1
        probe("after")
        return z * w, y, z

    g, cnt = compile_counted(f)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    expected = f(x, w)
    for _ in range(2):
        modes.clear()
        got = g(x, w)
        assert modes == [("inside", False), ("after", True)]
        check_grad_outputs(got, expected)
    assert cnt.frame_count == 3 and len(compiled_entries(f)) == 1


# --------------------------------------------------------------------------- closures
def test_closure_cell_live_across_break():
    def make(scale):
        bias = torch.ones(3)

        def f(x):
            nonlocal bias
            y = x * scale + bias
            print(end="")
            bias = bias + 1                          # a cell written after the break
            return y * scale, bias

        return f

    f_eager, f_comp = make(2.0), make(2.0)
    g, cnt = compile_counted(f_comp)
    x = torch.randn(3)
    for _ in range(3):
        a, b = g(x)
        ea, eb = f_eager(x)
        torch.testing.assert_close(a, ea)
        torch.testing.assert_close(b, eb)
        torch.testing.assert_close(f_comp.__closure__[0].cell_contents,
                                   f_eager.__closure__[0].cell_contents)
    assert cnt.frame_count == 2 and len(compiled_entries(f_comp)) == 1


def test_cell_of_the_frame_live_across_break():
    def f(x):
        k = x * 2
        print(end="")

        def use():                                   # made after the break: k is a cell
            return k + 1

        return use() * 3

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2 and len(compiled_entries(f)) == 1


def test_nested_function_live_across_break():
    def f(x):
        k = x * 2

        def use():
            return k + 1

        print(end="")
        return use() * 3

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2 and len(compiled_entries(f)) == 1


# --------------------------------------------------------------------------- kwargs
def scale_shift(x, *, scale=1.0, shift=0.0):
    return x * scale + shift


def test_keyword_argument_calls_around_the_break():
    def f(x):
        a = scale_shift(x, scale=2.0, shift=1.0)
        print("k", end="", sep="", flush=False)        # the breaking call has kwargs
        b = scale_shift(a, shift=-3.0)
        return torch.clamp(b, min=-1.0, max=1.0)

    g, cnt = compile_counted(f)
    x = torch.randn(5) * 3
    with quiet() as out:
        expected = f(x)
    for _ in range(2):
        with quiet() as out2:
            torch.testing.assert_close(g(x), expected)
        assert out2.getvalue() == out.getvalue() == "k"
    assert cnt.frame_count == 2 and len(compiled_entries(f)) == 1


def test_breaking_call_with_tensor_keyword_arguments():
    @frametrace.disable
    def blend(a, *, other, alpha=0.5):               # runs in CPython at the break
        return a * alpha + other * (1 - alpha)

    def f(x, y):
        a = x.exp()
        z = blend(a, other=y * 2, alpha=0.25)
        return scale_shift(z, scale=3.0) + a

    g, cnt = compile_counted(f)
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(g(x, y), f(x, y))
    # exp, mul | mul, add (shift), add
    assert cnt.frame_count == 2 and cnt.op_count == 5
    assert len(compiled_entries(f)) == 1
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [1]


# --------------------------------------------------------------------------- inlining
def test_break_inside_inlined_call_runs_callee_as_its_own_frame(compiles):
    def inner(x):
        y = x.sin()
        print(end="")                                # breaks inner, not outer's inlining
        return y * 2

    def outer(x):
        a = x + 1
        b = inner(a)
        return b - a

    g, cnt = compile_counted(outer)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(g(x), outer(x))
    # outer: add | resume: sub.  inner, run in CPython by outer's break, is caught by
    # the hook: sin | resume: mul.
    assert cnt.frame_count == 4
    assert len(compiled_entries(outer)) == 1 and len(compiled_entries(inner)) == 1
    assert [len(compiled_entries(c)) for c in resume_codes(inner)] == [1]
    assert len(compiles) == 4                         # every frame traced once


# --------------------------------------------------------------------------- caching
def test_no_recompile_on_identical_calls(compiles):
    def f(x, y):
        z = x @ y
        print(end="")
        return z.relu().sum(0)

    g, cnt = compile_counted(f)
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(g(x, y), f(x, y))
    n = len(compiles)
    assert cnt.frame_count == 2 and n == 2
    for _ in range(10):
        x, y = torch.randn(3, 4), torch.randn(4, 2)
        torch.testing.assert_close(g(x, y), f(x, y))
    assert cnt.frame_count == 2 and len(compiles) == n
    assert len(_C.entries(f.__code__)) == 1
    assert [len(_C.entries(c)) for c in resume_codes(f)] == [1]


def test_fresh_object_from_breaking_call_does_not_recompile(compiles):
    def f(x):
        buf = io.StringIO()                           # graph break: calling io.StringIO
        buf.write("a")
        return x + 1

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    for _ in range(5):
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    # f, its resume after io.StringIO(), the one after buf.write(): each traced once
    assert len(compiles) == 3, outcomes(compiles, f)


def test_reset_drops_resume_functions():
    def f(x):
        y = x + 1
        print(end="")
        return y * 2

    g, cnt = compile_counted(f)
    x = torch.randn(3)
    torch.testing.assert_close(g(x), f(x))
    (resume,) = resume_codes(f)
    frametrace.reset()
    assert _C.entries(f.__code__) == [] and _C.entries(resume) == []
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 4


# --------------------------------------------------------------------------- fullgraph
@pytest.mark.parametrize("kind", ["print", "item", "branch"])
def test_fullgraph_still_raises(kind):
    def f(x):
        y = x * 2
        if kind == "print":
            print(end="")
        elif kind == "item":
            y = y + y.sum().item()
        elif y.sum() > 0:
            y = y + 1
        return y

    g, cnt = compile_counted(f, fullgraph=True)
    with pytest.raises(frametrace.Unsupported):
        g(torch.ones(3))
    assert cnt.frame_count == 0 and _C.entries(f.__code__) == []
    assert not _C.hook_installed() and _C.get_callback() is None


# --------------------------------------------------------------------------- found on the way
# Not graph-break code, but met while testing it (the same happens with fullgraph=True).
OUTSIDE = {}


def test_two_writes_to_a_global_dict_are_both_replayed():
    def f(x):
        OUTSIDE["a"] = 1
        OUTSIDE["b"] = 2
        return x + 1

    OUTSIDE.clear()
    g, cnt = compile_counted(f, fullgraph=True)
    torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), 2.0))
    assert OUTSIDE == {"a": 1, "b": 2}


def test_grad_mode_read_inside_no_grad_does_not_recompile():
    def f(x):
        with torch.no_grad():
            flag = torch.is_grad_enabled()
        return x + 1, flag

    g, cnt = compile_counted(f, fullgraph=True)
    for _ in range(3):
        out, flag = g(torch.ones(2))
        assert flag is False
    assert cnt.frame_count == 1


def test_break_on_numpy_call():
    np = pytest.importorskip("numpy")

    def f(x):
        y = x * 2
        a = np.polyval([1.0, 2.0], 3.0)   # a NumPy function torch._numpy lacks: CPython's
        return y + float(a)
    g, cnt = compile_counted(f)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(g(x), f(x))
    # x * 2 compiles; numpy and float() run in CPython; the add is the resumed graph's,
    # with the float an input of it (not pinned: one entry serves every value)
    assert cnt.frame_count == 2 and cnt.op_count == 2
    assert len(compiled_entries(f)) == 1


def test_break_inside_while_loop():
    def w(x, n):
        i = 0
        while i < n:
            x = x + 1
            if x.sum() > 100:             # data-dependent: breaks each iteration
                break
            i += 1
        return x * 2
    g, cnt = compile_counted(w)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(g(x, 3), w(x, 3))
    frames = cnt.frame_count
    assert frames >= 2
    torch.testing.assert_close(g(x + 1000, 3), w(x + 1000, 3))    # the other branch
    torch.testing.assert_close(g(x, 3), w(x, 3))
