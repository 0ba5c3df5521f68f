"""Cases from PyTorch's own Dynamo tests that frametrace got wrong (issue 29, class 10):
an allow_in_graph function kept for its Python effects, torch._check facts that no
runtime assert checked, a method read from a set held opaquely, and an object made in
the frame that fills a read-only property through its __dict__."""
import pytest
import torch
from torch._higher_order_ops.wrap import wrap

import frametrace
import frametrace.testing
from frametrace import convert
from differential import check


# ---------------------------------------------------------------- allow_in_graph
def _counting_closure():
    count = 0

    @torch.compiler.allow_in_graph
    def bump():
        nonlocal count
        count += 1

    def f(x):
        before = count
        y = x * 2
        bump()
        return y + (count - before), count - before

    return f


LOG = []


@torch.compiler.allow_in_graph
def _note():
    LOG.append(len(LOG))


def test_allow_in_graph_without_tensors_runs_on_every_call():
    # (torch.compile's test: the call took no tensor, the graph dropped it, and its
    # effect happened once, while tracing)
    def f(x):
        y = x * 2
        _note()
        return y + 1

    r = check(f, [torch.ones(2), torch.ones(2), torch.ones(2)], globals=("LOG",), breaks=1)
    assert r.graphs >= 1


def test_allow_in_graph_without_tensors_counts_exactly():
    f, g = _counting_closure(), _counting_closure()
    c = frametrace.optimize("eager")(g)
    for _ in range(4):
        assert f(torch.ones(2))[1] == c(torch.ones(2))[1] == 1
    assert f.__closure__[0].cell_contents.__closure__[0].cell_contents == 4
    assert g.__closure__[0].cell_contents.__closure__[0].cell_contents == 4


CALLS = 0


@torch.compiler.allow_in_graph
def _double_counting_global(x):
    global CALLS
    CALLS += 1
    return x * 2


class _State:
    def __init__(self):
        self.n = 0


STATE = _State()


@torch.compiler.allow_in_graph
def _double_counting_attribute(x):
    STATE.n += 1
    return x * 2


def _bump_state():
    STATE.n += 1


@torch.compiler.allow_in_graph
def _double_counting_attribute_in_a_helper(x):
    _bump_state()
    return x * 2


@pytest.mark.parametrize("fn", [_double_counting_global, _double_counting_attribute,
                                _double_counting_attribute_in_a_helper])
def test_allow_in_graph_writing_outside_state_runs_once_per_call(fn):
    def f(x):
        return fn(x.sin()) + 1

    r = check(f, [torch.randn(3), torch.randn(3), torch.randn(3)], globals=("CALLS", "STATE"),
              breaks=1)
    assert r.graphs >= 1


def test_allow_in_graph_writing_a_nonlocal_with_a_tensor():
    seen = []

    def make():
        n = 0

        @torch.compiler.allow_in_graph
        def g(x):
            nonlocal n
            n += 1
            seen.append(n)
            return x + 1

        def f(x):
            return g(x * 2)
        return f

    f, h = make(), make()
    c = frametrace.optimize("eager")(h)
    for _ in range(3):
        torch.testing.assert_close(f(torch.ones(2)), c(torch.ones(2)))
    assert seen == [1, 1, 2, 2, 3, 3]


HELPED = 0


def _helper_bumps_a_global():
    global HELPED
    HELPED += 1


def _helper_bumps_a_global_by_subscript():
    globals()["HELPED"] = HELPED + 1


@torch.compiler.allow_in_graph
def _double_with_helper(x):
    _helper_bumps_a_global()
    return x * 2


@torch.compiler.allow_in_graph
def _double_with_subscript_helper(x):
    _helper_bumps_a_global_by_subscript()
    return x * 2


def test_allow_in_graph_whose_helper_writes_a_global():
    # Seen in the helper's code: CPython makes the call, which is never run while tracing.
    def f(x):
        return _double_with_helper(x.sin()) + 1

    r = check(f, [torch.randn(3), torch.randn(3), torch.randn(3)], globals=("HELPED",), breaks=1)
    assert r.graphs >= 1 and "calls _helper_bumps_a_global()" in r.reasons()[0]


def test_allow_in_graph_whose_helper_writes_a_global_by_subscript():
    # No instruction shows the write: the run while tracing changed a global, which is
    # undone, and CPython makes the call.
    def f(x):
        return _double_with_subscript_helper(x.sin()) + 1

    r = check(f, [torch.randn(3), torch.randn(3), torch.randn(3)], globals=("HELPED",), breaks=1)
    assert r.graphs >= 1 and "undone" in r.reasons()[0]


SHAPES = []
SCALES = [2.0, 3.0]


@torch.compiler.allow_in_graph
def _records_shape(x):
    SHAPES.append(tuple(x.shape))
    return x * SCALES[0]


EVENTS = []


def _log_event(x):
    EVENTS.append(x.dim())


@torch.compiler.allow_in_graph
def _logs_through_a_helper(x):
    _log_event(x)
    return x - 1


def test_allow_in_graph_whose_helper_appends_to_a_global_list():
    def f(x):
        return _logs_through_a_helper(x.exp()) * 2

    r = check(f, [torch.randn(3), torch.randn(2, 2), torch.randn(3)], globals=("EVENTS",))
    assert r.breaks >= 1 and "undone" in r.reasons()[0]


@torch.compiler.allow_in_graph
def _reads_a_global_list(x):
    return x * SCALES[1]


def test_allow_in_graph_appending_to_a_global_list():
    # The trace-time run appended once more than CPython; it is undone, and the
    # call left to CPython.
    def f(x):
        return _records_shape(x.sin()) + 1

    r = check(f, [torch.randn(3), torch.randn(3), torch.randn(2, 2)], globals=("SHAPES",))
    assert r.breaks >= 1 and "undone" in r.reasons()[0]


def test_allow_in_graph_writing_a_closure_dict_through_a_method():
    seen = []

    def make():
        counts = {}

        @torch.compiler.allow_in_graph
        def g(x):
            counts.setdefault("n", 0)
            counts["n"] += 1
            seen.append(counts["n"])
            return x + 1

        return lambda x: g(x * 2)

    f, h = make(), make()
    c = frametrace.optimize("eager")(h)
    for _ in range(3):
        torch.testing.assert_close(f(torch.ones(2)), c(torch.ones(2)))
    assert seen == [1, 1, 2, 2, 3, 3]


def test_allow_in_graph_reading_a_global_list_stays_in_the_graph():
    def f(x):
        return _reads_a_global_list(x.cos()) - 1

    r = check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0)
    assert _reads_a_global_list in [n.target for n in r.records[0].graph_module.graph.nodes]


@torch.compiler.allow_in_graph
def _pure(x, k):
    return x * k + 1


def test_allow_in_graph_pure_function_stays_one_node():
    def f(x):
        return _pure(x.cos(), 3) - 1

    r = check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0)
    assert _pure in [n.target for n in r.records[0].graph_module.graph.nodes]


# ---------------------------------------------------------------- torch._check
@pytest.fixture
def capture_scalars(monkeypatch):
    monkeypatch.setattr(frametrace.config, "capture_scalar_outputs", True)
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_check_of_unbacked_against_sum_of_sizes(capture_scalars, backend):
    # torch._check(u0 == a + b) made u0 stand for a + b, and the assert pass merged the
    # item() node with the graph's a + b: `item == item`, checked by nothing.
    def f(x, y, n):
        u0 = n.item()
        torch._check(u0 == x.size(0) + y.size(0))
        return x.sum() + y.sum() + u0

    r = check(f, [(torch.ones(2), torch.ones(3), torch.tensor(5)),
                  (torch.ones(2), torch.ones(3), torch.tensor(6)),
                  (torch.ones(4), torch.ones(3), torch.tensor(7)),
                  (torch.ones(4), torch.ones(5), torch.tensor(8))],
              backend=backend, dynamic=True, graphs=1, breaks=0)
    assert r.compiles == 1


def _is_size_and_twice(x, n):
    u0 = n.item()
    torch._check_is_size(u0)
    torch._check(u0 == x.size(0) * 2)
    return torch.ones(u0).sum() + x.sum()


def _two_reads(x, n):
    u0, u1 = n.tolist()
    torch._check(u0 == u1 + x.size(0))
    return x.sum() + u0 - u1


def _bounds(x, n):
    u0 = n.item()
    torch._check(u0 >= 2)
    torch._check(u0 <= 5)
    return x * u0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn,inputs", [
    (_is_size_and_twice, [(torch.ones(4), torch.tensor(8)), (torch.ones(4), torch.tensor(7)),
                          (torch.ones(5), torch.tensor(10)), (torch.ones(5), torch.tensor(-1))]),
    (_two_reads, [(torch.ones(4), torch.tensor([6, 2])), (torch.ones(4), torch.tensor([6, 3])),
                  (torch.ones(5), torch.tensor([7, 2])), (torch.ones(5), torch.tensor([7, 3]))]),
    (_bounds, [(torch.ones(3), torch.tensor(3)), (torch.ones(3), torch.tensor(1)),
               (torch.ones(3), torch.tensor(6)), (torch.ones(3), torch.tensor(5))]),
])
def test_checks_relating_reads_and_sizes(capture_scalars, backend, fn, inputs):
    r = check(fn, inputs, backend=backend, dynamic=True, breaks=0, fallbacks=0)
    assert r.graphs == 1, r


def _even_then_random(x, n):
    u0 = n.item()
    torch._check(u0 % 2 == 0, lambda: "n must be even")
    return torch.randn(2) + x.sum() + u0


def _even_default_message(x, n):
    u0 = n.item()
    torch._check(u0 % 2 == 0)
    return torch.randn(2) + x.sum() + u0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_even_then_random, _even_default_message])
def test_failing_check_in_a_graph_that_cannot_rerun_raises_torchs_message(capture_scalars, backend, fn):
    # (the graph drew random numbers: its error is the program's, so it must be the
    # error torch._check raises, message included)
    r = check(fn, [(torch.ones(2), torch.tensor(4)), (torch.ones(3), torch.tensor(5)),
                   (torch.ones(3), torch.tensor(6))], backend=backend, dynamic=True, breaks=0)
    assert r.graphs == 1, r


def _nonzero_multiple_of_4(x):
    y = x.nonzero()
    torch._check(y.shape[0] % 4 == 0)
    return torch.zeros(y.shape[0]) + x.sum()


def _in_cond(x):
    return torch.cond(x.shape[0] % 4 == 0, lambda: _nonzero_multiple_of_4(x),
                      lambda: _nonzero_multiple_of_4(x))


def _in_checkpoint(x):
    return torch.utils.checkpoint.checkpoint(_nonzero_multiple_of_4, x, use_reentrant=False)


def _in_wrap(x):
    return wrap(_nonzero_multiple_of_4, x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_in_cond, _in_checkpoint, _in_wrap])
def test_check_inside_a_higher_order_op_is_enforced(capture_scalars, backend, fn):
    # (torch.compile's test_cond_runtime_assert_generation: the body's torch._check
    # stayed a Python call, which AOTAutograd traced into its own ShapeEnv and checked
    # nowhere)
    r = check(fn, [torch.ones(4, 4), torch.ones(5, 5), torch.zeros(3, 3), torch.ones(2, 2),
                   torch.ones(3, 3)],
              backend=backend, dynamic=True, breaks=0, fallbacks=0)
    assert r.graphs >= 1


# ---------------------------------------------------------------- methods of opaque sets
S = {1, 2}
D = {1.5: 2}


class _Holder:
    def __init__(self):
        self.s = {10}


H = _Holder()


def _read_add(x):
    y = x * 2
    m = S.add
    m(3)
    return y + len(S)


def _call_add(x):
    y = x * 2
    S.add(4)
    return y + len(S)


def _read_discard(x):
    y = x * 2
    m = S.discard
    m(1)
    return y + len(S)


def _read_copy(x):
    y = x * 2
    m = S.copy
    return y + len(m())


def _attribute_set(x):
    y = x * 2
    m = H.s.add
    m(11)
    return y + len(H.s)


def _float_keyed_dict(x):
    y = x * 2
    m = D.setdefault
    m(2.5, 3)
    return y + len(D)


@pytest.mark.parametrize("fn", [_read_add, _call_add, _read_discard, _read_copy, _attribute_set,
                                _float_keyed_dict])
def test_method_of_a_set_held_opaquely(fn):
    # `m = s.add` of a set from outside: wrap() handed the method to its owner's Var,
    # which wrapped it again (RecursionError, the frame ran in CPython)
    # (each call starts from fresh copies of the globals: a new set, so a new compile)
    r = check(fn, [torch.ones(2), torch.ones(2), torch.ones(2)], globals=("S", "D", "H"))
    assert r.graphs >= 2 and r.fallbacks == 0
    if fn is not _float_keyed_dict:
        assert r.breaks >= 3 and "opaque object" in r.reasons()[0], r


def test_method_of_a_closure_set():
    def make():
        cs = {5}

        def f(x):
            y = x + 1
            m = cs.add
            m(len(cs) + 5)
            return y * len(cs), sorted(cs)
        return f

    f, g = make(), make()
    counter = frametrace.testing.CompileCounter()
    c = frametrace.optimize(counter)(g)
    errors = convert.counters["internal_error"]
    for _ in range(3):
        a, b = f(torch.ones(2)), c(torch.ones(2))
        torch.testing.assert_close(a[0], b[0])
        assert a[1] == b[1]
    assert convert.counters["internal_error"] == errors and counter.frame_count >= 2


def test_method_of_a_set_made_in_the_frame():
    def f(x):
        s = {1}
        m = s.add
        m(2)
        return x + len(s), s

    check(f, [torch.ones(2), torch.ones(2)], graphs=1, breaks=0)


# ---------------------------------------------------------------- objects rebuilt
class _ReadOnly:
    def __init__(self, v):
        self.__dict__["x"] = v

    @property
    def x(self):
        return self.__dict__["x"] * 10


class _SetterRaises:
    def __init__(self, v):
        self.__dict__["x"] = v
        self.y = v + 1

    @property
    def x(self):
        return -1

    @x.setter
    def x(self, v):
        raise RuntimeError("setter ran")


class _SlotsAndDict:
    __slots__ = ("a", "__dict__")

    def __init__(self, v):
        self.a = v
        self.b = v


class _OwnSetattr:
    def __setattr__(self, k, v):
        raise RuntimeError("no")

    def __init__(self, v):
        object.__setattr__(self, "z", v)


@pytest.mark.parametrize("cls", [_ReadOnly, _SetterRaises, _SlotsAndDict, _OwnSetattr])
def test_object_made_in_the_frame_is_rebuilt_where_it_held_its_values(cls):
    # A read-only property filled through self.__dict__: the rebuild set it with
    # object.__setattr__, which raised (or ran the property's setter).
    def f(t):
        o = cls(3)
        return t + 1, o

    r = check(f, [torch.ones(2), torch.ones(2)], graphs=1, breaks=0)
    assert r.fallbacks == 0
    out = frametrace.optimize("eager")(f)(torch.ones(2))[1]
    assert type(out) is cls
    if cls is _ReadOnly:
        assert out.x == 30 and vars(out) == {"x": 3}
    if cls is _SlotsAndDict:
        assert out.a == 3 and vars(out) == {"b": 3}


CHECKS = []


@torch.compiler.allow_in_graph
def _check_grad_mode_is_off():
    # A check kept for its assert: no tensor, no effect but raising.
    assert not torch.is_grad_enabled(), "grad mode is on"


def test_allow_in_graph_check_without_tensors_stays_in_an_eager_graph():
    # (PyTorch's sdpa_kernel test: a tensor-less allow_in_graph check under
    # fullgraph=True) The eager backend runs the node on every call, so it raises
    # when the state it checks changes; a re-tracing backend would drop it: a break.
    def f(x):
        y = x * 2
        _check_grad_mode_is_off()
        return y + 1

    with torch.no_grad():
        check(f, [torch.ones(2), torch.ones(2)], graphs=1, breaks=0, fullgraph=True)
    c = frametrace.optimize(f)
    with torch.no_grad():
        c(torch.ones(2))
    with pytest.raises(AssertionError, match="grad mode is on"):
        c(torch.ones(2))        # grad on: a recompile, whose trace-time run fails: CPython raises
    with torch.no_grad():
        r = check(f, [torch.ones(2), torch.ones(2)], backend="aot_eager", breaks=1, graphs=None)
    assert any("no tensor" in why for why in r.reasons()), r
