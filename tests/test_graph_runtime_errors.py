"""A compiled graph that raises at run time, for reasons only the data decide (an index
out of range, a singular matrix ...): what the frame did before the failing op is still
done, as in CPython, and nothing is done twice.  Every test is differential."""
import pytest
import torch

import frametrace
from differential import check

SEEN = []
STATE = {"n": 0}


class Box:
    pass


def test_list_append_before_an_index_out_of_range():
    def f(x, idx, log):
        log.append("before")
        return x[idx] * 2
    check(f, [(torch.randn(4), torch.tensor([1]), []), (torch.randn(4), torch.tensor([9]), [1]),
              (torch.randn(4), torch.tensor([2]), [])], max_graphs=2)


def test_attribute_and_global_written_before_a_failing_gather():
    def f(x, idx, box):
        global SEEN
        box.v = x.sum()
        SEEN = SEEN + [1]
        STATE["n"] += 1
        return torch.gather(x, 0, idx) + 1
    check(f, [(torch.randn(4), torch.tensor([0, 1]), Box()),
              (torch.randn(4), torch.tensor([0, 7]), Box()),
              (torch.randn(4), torch.tensor([3, 2]), Box())], globals=("SEEN", "STATE"), max_graphs=3)


def test_effects_after_the_failing_op_are_not_done():
    def f(x, idx, log):
        log.append(1)
        y = x[idx]
        log.append(2)
        return y
    check(f, [(torch.randn(3), torch.tensor([0]), []), (torch.randn(3), torch.tensor([5]), [])], graphs=1)


def test_a_data_dependent_error_caught_in_the_frame():
    def f(x, idx, log):
        log.append(0)
        try:
            y = x[idx]
        except IndexError:
            log.append("caught")
            y = x.sum()
        return y + 1
    check(f, [(torch.randn(3), torch.tensor([1]), []), (torch.randn(3), torch.tensor([7]), [])],
          graphs=1)


def test_linalg_error_after_a_closure_write():
    def f(a):
        count = [0]

        def bump():
            count[0] += 1
            STATE["n"] += count[0]
        bump()
        return torch.linalg.inv(a), count
    check(f, [torch.eye(2) * 2, torch.zeros(2, 2), torch.eye(2)], globals=("STATE",), max_graphs=3)


def test_in_place_input_write_before_a_failing_op_with_aot_eager():
    def f(x, idx, log):
        log.append(len(log))
        x.add_(1)
        return x[idx]
    check(f, [(torch.zeros(3), torch.tensor([1]), []), (torch.zeros(3), torch.tensor([4]), [])],
          backend="aot_eager", graphs=1)


def test_failing_graph_before_a_break_and_in_a_resume_function():
    @frametrace.disable
    def opaque(t):
        return t

    def f(x, idx, log):
        log.append("a")
        y = opaque(x) + 1
        log.append("b")
        return y[idx]
    check(f, [(torch.randn(3), torch.tensor([1]), []), (torch.randn(3), torch.tensor([6]), [])],
          breaks=1)


def test_grad_mode_after_a_failure_inside_no_grad():
    def f(x, idx, log):
        log.append(torch.is_grad_enabled())
        with torch.no_grad():
            y = x[idx]
        log.append(torch.is_grad_enabled())
        return y
    check(f, [(torch.randn(3), torch.tensor([1]), []), (torch.randn(3), torch.tensor([6]), [])])
    assert torch.is_grad_enabled()


def test_method_of_an_object_with_closure_varargs_and_kwargs():
    k = torch.tensor(2.0)

    class M:
        def __init__(self):
            self.calls = 0

        def run(self, x, *idx, scale=1.0, **extra):
            self.calls += 1
            extra["seen"] = True
            return x[idx[0]] * scale * k

    def f(m, x, i, opts):
        return m.run(x, i, scale=3.0, **opts)
    check(f, [(M(), torch.randn(3), torch.tensor([1]), {}), (M(), torch.randn(3), torch.tensor([8]), {"a": 1})])


def test_keyboard_interrupt_from_a_graph_is_not_rerun():
    calls = []

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            raise KeyboardInterrupt
        return run

    def f(x, log):
        log.append(1)
        return x + 1
    log = []
    try:
        frametrace.optimize(backend=backend)(f)(torch.randn(2), log)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("KeyboardInterrupt was swallowed")
    assert calls == [1]


# The graph cannot simply run again from its start: what it changes is saved before
# each call and put back before the frame runs again in CPython (codegen.RerunState).
def test_in_place_input_write_before_a_failing_op_with_the_eager_backend():
    def f(x, idx, log):
        log.append(len(log))
        x.add_(1)
        return x[idx]
    check(f, [(torch.zeros(3), torch.tensor([1]), []), (torch.zeros(3), torch.tensor([4]), [])])


def test_random_numbers_before_a_failing_op():
    def f(x, idx, log):
        log.append(1)
        return (x + torch.rand(3))[idx]
    check(f, [(torch.zeros(3), torch.tensor([1]), []), (torch.zeros(3), torch.tensor([4]), [])])


def test_a_rerun_in_cpython_is_logged_once_as_a_warning(caplog):
    # a graph that raises runs the frame in CPython: said once per frame as a warning
    # (later ones at INFO), naming the frame and the error
    def f(x, idx):
        return x[idx] * 2
    compiled = frametrace.optimize(f)
    compiled(torch.randn(4), torch.tensor([1]))
    with caplog.at_level("INFO", logger="frametrace"):
        for _ in range(2):
            with pytest.raises(IndexError):
                compiled(torch.randn(4), torch.tensor([9]))
    reruns = [r for r in caplog.records if "the frame runs in CPython" in r.getMessage()]
    assert [r.levelname for r in reruns] == ["WARNING", "INFO"]
    assert "f (" in reruns[0].getMessage() and "IndexError" in reruns[0].getMessage()
