"""Python floats that become symbolic (an argument that changed between calls,
`dynamic=True`, a number from `x.item()` in the graph or at a graph break) compute as
CPython's floats do, IEEE 754: NaN, infinities, -0.0, rounding, denormals.  sympy's
real-number algebra (`m * 0 == 0`, `m - m == 0`, `(m + 1.0) - m == 1.0`, `m == m`,
finite symbols) must never decide a result, and a cache entry must not serve a float
it was not traced for (NaN != NaN, 0.0 == -0.0, 1 == 1.0).

Results are compared exactly: each float by its repr (the sign of zero, NaN, every
bit of the value), together with its type."""
from __future__ import annotations

import functools
import math

import pytest
import torch

import frametrace
from differential import Call, check

NAN, INF = math.nan, math.inf
VALUES = [1.0, 2.5, NAN, INF, -INF, -0.0, 0.0, 1e20, 1e-320, 3.75]
BACKENDS = ["eager", "aot_eager"]


def _exact(v):
    """`v` with every float replaced by (type, repr): compared bit for bit."""
    if isinstance(v, float):
        return ("float", repr(v))
    if isinstance(v, (tuple, list)):
        return type(v)(_exact(i) for i in v)
    return v


def strict(f):
    @functools.wraps(f)
    def run(*args, **kwargs):
        return _exact(f(*args, **kwargs))
    return run


def check_exact(f, inputs, backend="eager", dynamic=None, **kw):
    return check(strict(f), inputs, backend=backend,
                 compiled=lambda counter: strict(frametrace.optimize(backend=counter, dynamic=dynamic)(f)),
                 **kw)


def calls(values=VALUES):
    return [(torch.ones(2), v) for v in values]


@pytest.fixture(autouse=True)
def _fresh():
    frametrace.reset()
    yield
    frametrace.reset()


# -- arithmetic on a float argument that became symbolic --

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_arithmetic_is_ieee(backend, dynamic):
    def f(x, m):
        return x * m, m * 0, (m + 1.0) - m, m - m, -m, m / 2, 0.0 * m + m, m * 1e300, m * -1.0

    r = check_exact(f, calls(), backend, dynamic)
    # one graph for every value (None: the first value is a constant, then symbolic);
    # nothing is pinned to a value, nothing breaks
    assert (r.graphs, r.breaks) == ((2, 0) if dynamic is None else (1, 0)), r


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_comparisons_are_ieee(backend, dynamic):
    def f(x, m):
        return x + 1, m == m, m != m, m < INF, m > -INF, m <= m, m == 0.0, m > 0

    r = check_exact(f, calls(), backend, dynamic)
    assert r.breaks == 0, r
    if backend == "eager":
        # (AOTAutograd's scalar pass restarts the compile with m static: one per value)
        assert r.graphs <= 2, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_branches_on_a_float(dynamic):
    def f(x, m):
        if m > 1.0:
            x = x + m
        if m != m:
            return x * 2
        if m < INF:
            return x - 1
        return x

    r = check_exact(f, calls(), dynamic=dynamic)
    # `m > 1.0` is a guard on the relation; `m != m` (NaN) cannot be one: it is computed
    # in the graph, and branching on it is a break (in each compile's resumed frame)
    assert 1 <= r.breaks <= 3 and r.graphs <= 10, r


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_conversions_raise_as_cpython(backend, dynamic):
    # int() / round() / floor() of NaN and inf: ValueError / OverflowError, as CPython
    def f(x, m):
        return x + 1, int(m), math.floor(m), math.ceil(m), round(m), math.trunc(m)

    r = check_exact(f, calls(), backend, dynamic)
    # NaN and the infinities: the graph raises, the frame runs again in CPython
    assert r.reasons().count("ValueError raised: ('cannot convert float NaN to integer',)") <= 1, r
    assert r.graphs >= 1 and r.breaks <= 3, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_sign_of_zero_and_nan_tell_entries_apart(dynamic):
    def f(x, m):
        return x + 1, math.copysign(1.0, m), str(m), repr(m), math.atan2(m, -1.0), \
            m.hex(), m.is_integer()

    values = [0.0, -0.0, 0.0, NAN, NAN, 2.5, -0.0, NAN, 2.5, INF, -INF, 1e-320]
    r = check_exact(f, calls(values), dynamic=dynamic)
    assert r.breaks == 0, r


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_division_by_a_signed_zero(dynamic):
    def f(x, m):
        return x + 1, 1 / m, 5.0 // m if m else None

    check_exact(f, calls([2.0, 0.0, -0.0, 4.0, NAN, -0.0]), dynamic=dynamic)


def test_nan_entry_reused_for_nan_only():
    def f(x, m):
        return x * 2, math.isnan(m), m * 0

    # a constant NaN: one entry for every NaN
    r = check_exact(f, calls([NAN, NAN, NAN]), dynamic=False)
    assert r.compiles == 1, r
    # an entry traced for a number does not serve NaN, nor -0.0 one for 0.0
    r = check_exact(f, calls([2.5, NAN, 2.5, NAN, 0.0, -0.0, 0.0, -0.0]), dynamic=False)
    assert r.compiles == 4, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_int_and_float_of_equal_value_stay_apart(dynamic):
    def f(x, k):
        return x + 1, type(k).__name__, str(k), k / 2, 7 // k, k * 3, k - k

    inputs = calls([1.0, 1, 2, 2.0, 3.0, 3, True, 5.5, 5])
    r = check_exact(f, inputs, dynamic=dynamic)
    assert r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_from_item_in_the_graph(backend, monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_scalar_outputs", True)

    def f(x):
        m = x.sum().item()
        return x * m, m * 0, (m + 1.0) - m, m - m, m == m, m < INF, -m, m / 4

    inputs = [torch.tensor([v], dtype=torch.float64) for v in VALUES]
    r = check_exact(f, inputs, backend)
    assert (r.graphs, r.breaks) == (1, 0), r


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_from_a_graph_break(backend):
    def f(x):
        m = x.sum().item()          # capture_scalar_outputs off: a break
        return x * m, m * 0, (m + 1.0) - m, m - m, m == m, m < INF, m * 3 / 2

    inputs = [torch.tensor([v], dtype=torch.float64) for v in VALUES]
    r = check_exact(f, inputs, backend)
    assert r.breaks == 1 and r.graphs == 2, r


def test_float_from_data_that_needs_cpython():
    # `m // 3` and `m ** 2` of a number from data: no tensor op computes them as CPython
    # does, and no guard can pin the number: a graph break, CPython computes them
    def f(x):
        m = x.sum().item()
        return x + 1, m // 3, m % 2, m ** 2

    inputs = [torch.tensor([v], dtype=torch.float64) for v in VALUES]
    check_exact(f, inputs)


def test_float_held_in_an_argument_object():
    class Cfg:
        def __init__(self, scale):
            self.scale = scale

    def f(x, cfg):
        s = cfg.scale
        return x * s, s * 0, (s + 1.0) - s, s - s

    check_exact(f, [(torch.ones(2), Cfg(v)) for v in VALUES])


def test_rounding_of_a_symbolic_float():
    # (m + big) - big is not m; the sum of tenths is not the product
    def f(x, m):
        return x + m, (m + 1e16) - 1e16, m + m + m == 3 * m, (m * 0.1) * 10

    check_exact(f, calls([0.1, 0.3, 1.0, 2.5, 0.7, 1e-320, 5e-324]))


def test_lr_in_python_arithmetic_compiles_once_per_branch():
    # the float stays symbolic through Python arithmetic: no entry per value
    def f(x, lr):
        step = lr * 0.5
        if lr > 1.0:
            return x - step
        return x + step

    r = check_exact(f, [(torch.ones(3), s) for s in (0.1, 0.2, 0.3, 2.0, 3.0, 0.4, NAN, INF)])
    assert r.compiles <= 5, r


MIN_MAX = {
    "max_inf": lambda x, m: (x + 1, max(m, INF)),
    "min_minus_inf": lambda x, m: (x + 1, min(m, -INF)),
    "max_three": lambda x, m: (x + 1, max(m, 2.0, -1.0)),
    "min_int": lambda x, m: (x + 1, min(m, 1)),
    "max_size": lambda x, m: (x + 1, max(x.shape[0], m)),
}


@pytest.mark.parametrize("name", sorted(MIN_MAX))
@pytest.mark.parametrize("dynamic", [None, True])
def test_min_max_with_floats(dynamic, name):
    # max() picks by `>` as CPython does: max(nan, inf) is nan (inf > nan is False)
    check_exact(MIN_MAX[name], calls([1.0, 2.5, NAN, INF, -INF, NAN, -0.0, 0.0]), dynamic=dynamic)


def test_sign_of_nan_tells_entries_apart():
    # -nan is a NaN with its sign bit set (`-nan`, and `inf - inf` on x86): copysign and
    # struct.pack read it, so an entry traced for nan does not serve -nan
    def f(x, m):
        return x + 1, math.copysign(1.0, m), math.copysign(3.0, m * 2.0)

    r = check_exact(f, calls([NAN, -NAN, NAN, -NAN]), dynamic=False)
    assert r.compiles == 2, r


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_division_floor_division_and_modulo(backend, dynamic):
    # CPython's own // and % (signs) and ZeroDivisionError, at run time in the graph:
    # one graph for every value, no entry pinned to a value
    def f(x, m):
        return x + 1, 1.0 / m, m // 3.0, -7.0 % m, m % -3, 5 // m, (m / 3.0) * 3.0

    values = [2.5, 3.75, -7.5, NAN, INF, -INF, 1e20, 1e-320, 0.0, -0.0, 4.0]
    r = check_exact(f, calls(values), backend, dynamic)
    assert r.graphs <= 3, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_truth_of_a_float(dynamic):
    # bool(nan) is True, bool(-0.0) False: `if m` is the guard `m != 0`, not a pin
    def f(x, m):
        return x * (1.0 / m) if m else x - 1

    values = [2.5, 3.75, NAN, -0.0, 0.0, INF, 1e-320, 5.5]
    r = check_exact(f, calls(values), dynamic=dynamic)
    assert r.graphs <= 4, r


def test_floats_from_data_divide_in_the_graph(monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_scalar_outputs", True)

    def f(x):
        m = x.sum().item()
        return x * m, 1.0 / m, m // 2.0, m % 3.0

    inputs = [torch.tensor([v], dtype=torch.float64) for v in VALUES]
    r = check_exact(f, inputs)
    assert r.graphs == 1, r


# -- a symbol pinned by a guard, and sympy's folds of symbolic floats --

def _pinned_then_zeroed(t, m):
    s = str(m)              # pins m: its symbol becomes the number seen, guarded
    z = m * 0
    signs = (t + z).signbit()      # (inf * 0: a NaN with its sign bit set)
    return signs, s, z, 0 * m, m * False, True * m, m - m, m * 0.0 - m * 0, (m + 1.0) - m, \
        -(m * 0), m * -0.0, 0.0 / m if m else None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_a_pinned_float_times_zero_keeps_its_sign(backend, dynamic):
    # -1.5 * 0 is -0.0: sympy's 0 for the pinned symbol gave 0.0 (and t + 0.0 a
    # positive zero where CPython's t + -0.0 keeps -0.0)
    t = torch.tensor([-0.0, 0.0, 1.0])
    r = check_exact(_pinned_then_zeroed, [Call(t, v) for v in [-1.5, 2.5, -3.0, -1.5, 2.5, -3.0]],
                    backend, dynamic)
    # one entry per value, each served again
    assert r.compiles == 3 and r.breaks == 0 and r.graphs >= 3, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_pinned_float_with_nan_inf_and_signed_zeros(dynamic):
    t = torch.tensor([-0.0, 0.0, 1.0])
    r = check_exact(_pinned_then_zeroed, [Call(t, v) for v in
                                          [-2.5, NAN, INF, -INF, -0.0, 0.0, NAN, -0.0, -2.5, INF]],
                    dynamic=dynamic)
    # inf and -inf: their NaN runs the tensor op in CPython, at a break
    assert r.compiles == 8 and r.breaks == 2, r


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_pinned_number_of_mixed_types(dynamic):
    # 1, True and 1.0 are three entries; -2 * 0 is 0, -2.0 * 0 is -0.0
    t = torch.tensor([-0.0, 0.0, 1.0])
    r = check_exact(_pinned_then_zeroed, [Call(t, v) for v in
                                          [1, True, 1.0, -2, -2.0, False, -2.0, 1, True, 1.0]],
                    dynamic=dynamic)
    assert r.compiles == 6 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_sympy_folds_of_floats_from_sizes(backend):
    # Floats computed from a symbolic size: -n * 0.0 is -0.0 (sympy: 0), n * 0.0 - n * 0.0
    # is 0.0; n / n (ints) is exactly 1.0 and stays symbolic.
    def f(x):
        n = x.shape[0]
        return x * 2, -n * 0.0, 0.0 * -n, (-n * 0.0) * 5.0, n / n, n * 0.5

    r = check_exact(f, [(torch.ones(k),) for k in (2, 3, 4, 3, 2)], backend, dynamic=True)
    # the folds pin the size: one entry per size, each served again
    assert r.compiles == 3 and r.breaks == 0, r

    def g(x):
        n = x.shape[0]
        return x * 2, n / n, n * 0.5, (n * 0.5) == (n * 0.5)

    r = check_exact(g, [(torch.ones(k),) for k in (2, 3, 4, 3, 2)], backend, dynamic=True)
    assert r.compiles == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_of_a_nan_constant_in_a_tensor_op(backend):
    # CPython's inf * 0 is a NaN with its sign bit set; the graph's code wrote it as
    # `nan` (no sign): t + z's signbit() and copysign(1, z) read it
    def f(t, m):
        z = m * 0
        return (t + z).signbit(), torch.copysign(torch.ones(1), torch.tensor(z)), t.add(-z).signbit()

    r = check_exact(f, [Call(torch.tensor([-0.0, 1.0]), v) for v in [INF, -INF, NAN, 2.0, INF, 2.0]],
                    backend)
    # the NaN's op runs in CPython at a break; the other values compile
    assert r.graphs >= 3 and 1 <= r.breaks <= 4, r
