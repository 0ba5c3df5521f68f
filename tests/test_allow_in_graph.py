"""torch.compiler.allow_in_graph functions: kept in the graph where they are pure, run on
every call (and exactly once) where they have Python effects (outside state written
directly, through a helper, a nonlocal or a closure dict, a global list appended to), and a
tensor-less check kept for its assert."""
import pytest
import torch

import frametrace
import frametrace.testing
from differential import check


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


# -- a tensor-less allow_in_graph check kept for its assert --
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
