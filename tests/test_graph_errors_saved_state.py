"""A compiled graph that raises at run time and cannot simply run again from its start
(it drew random numbers, entered autocast, wrote an input): what it changes is saved
before the call and put back, and the frame runs again in CPython, so the program's
effects before the failing op happen, once, in order, and none after it.  Compiled vs
CPython on both backends; each program also reads the random generator and autocast
after the call, so that a state left behind shows."""
import functools

import pytest
import torch

import frametrace
from differential import check

BACKENDS = ["eager", "aot_eager"]


def observed(f):
    """f's result or exception, with what the program sees afterwards: the next
    random numbers and whether autocast is on."""
    @functools.wraps(f)
    def run(*args):
        try:
            out, exc = f(*args), None
        except (IndexError, RuntimeError) as e:
            out, exc = None, f"{type(e).__name__}: {e}"
        return out, exc, torch.rand(2), torch.is_autocast_enabled("cpu")
    return run


def check_observed(f, inputs, backend, **kw):
    return check(observed(f), inputs, backend=backend,
                 compiled=lambda counter: observed(frametrace.optimize(backend=counter)(f)), **kw)


def _calls(make):
    # a call that succeeds, one that fails, one that succeeds
    return [make(1), make(7), make(2)]


def random_then_fail(x, idx, log):
    noise = torch.rand(3)
    log.append(1)
    y = (x + noise)[idx]
    log.append(2)
    return y


def write_then_fail(x, idx, log):
    log.append(len(log))
    x.mul_(2)
    log.append("written")
    y = x[idx]
    log.append("after")
    return y


def random_write_then_fail(x, idx, log):
    x.add_(torch.rand(3))
    log.append(1)
    return x[idx] + 1


def autocast_then_fail(x, idx, log):
    with torch.autocast("cpu"):
        log.append(torch.is_autocast_enabled("cpu"))
        y = (x @ x.t())[idx]
    log.append("left")
    return y


class Box:
    pass


def attribute_and_random(x, idx, box):
    box.seen = box.seen + 1
    box.noise = torch.randn(2)
    return torch.gather(x, 0, idx) * box.noise.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_numbers_then_a_python_effect_then_a_failure(backend):
    r = check_observed(random_then_fail, _calls(lambda i: (torch.zeros(3), torch.tensor([i]), [])),
                       backend)
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_then_a_failure(backend):
    r = check_observed(write_then_fail, _calls(lambda i: (torch.ones(3), torch.tensor([i]), ["x"])),
                       backend)
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_numbers_written_into_an_input_then_a_failure(backend):
    # (aot_eager: the write is deferred to the end of the graph, which never came)
    r = check_observed(random_write_then_fail,
                       _calls(lambda i: (torch.zeros(3), torch.tensor([i]), [])), backend)
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_entered_then_a_failure(backend):
    r = check_observed(autocast_then_fail, _calls(lambda i: (torch.randn(3, 3), torch.tensor([i]), [])),
                       backend)
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_attribute_written_and_random_numbers_before_a_failing_gather(backend):
    def box():
        b = Box()
        b.seen = 0
        return b
    r = check_observed(attribute_and_random,
                       [(torch.randn(4), torch.tensor([0, 1]), box()),
                        (torch.randn(4), torch.tensor([0, 9]), box()),
                        (torch.randn(4), torch.tensor([3, 2]), box())], backend)
    assert r.graphs == 1 and r.breaks == 0, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_of_an_input_written_then_a_failure(backend):
    def f(x, idx, log):
        x[1:].add_(1)
        log.append(x.shape[0])
        return x[idx]
    base = torch.zeros(6)
    r = check_observed(f, _calls(lambda i: (base[2:], torch.tensor([i]), [])), backend)
    assert r.graphs == 1 and r.breaks == 0, r


def test_the_switch_turns_the_saving_off(monkeypatch):
    # Off: the failure raises at once; the Python effect before it is lost (the
    # documented cost of turning it off), the input written before it is written.
    monkeypatch.setattr(frametrace.config, "rerun_failed_graphs_from_saved_state", False)
    c = frametrace.optimize(write_then_fail)
    x, log = torch.ones(3), []
    c(x, torch.tensor([0]), log)
    x, log = torch.ones(3), []
    with pytest.raises(IndexError):
        c(x, torch.tensor([5]), log)
    assert log == [] and x.tolist() == [2.0, 2.0, 2.0]


def test_a_graph_that_cannot_lose_anything_saves_nothing():
    # Random numbers, no Python effect, an eager-order backend: raising as it is is
    # already right, and no state is read per call.
    from frametrace.convert import graph_modules
    def f(x, idx):
        return (x + torch.rand(3))[idx]
    c = frametrace.optimize(f)
    c(torch.zeros(3), torch.tensor([1]))
    code = frametrace._C.entries(f.__code__)[0].code
    assert "___rerun_state" not in code.co_varnames
    assert graph_modules


@frametrace.disable
def _opaque(t):
    return t


@pytest.mark.parametrize("backend", BACKENDS)
def test_failures_before_a_break_and_in_the_resume_function(backend):
    def f(x, idx, j, log):
        log.append("a")
        x.add_(torch.rand(3))
        y = _opaque(x[idx]) + 1              # fails before the break, or not
        log.append("b")
        z = (y + torch.rand(1))[j]           # fails in the resume function, or not
        log.append("c")
        return z
    r = check_observed(f, [(torch.zeros(3), torch.tensor([1]), torch.tensor([0]), []),
                           (torch.zeros(3), torch.tensor([5]), torch.tensor([0]), []),
                           (torch.zeros(3), torch.tensor([1]), torch.tensor([4]), []),
                           (torch.zeros(3), torch.tensor([2]), torch.tensor([0]), [])], backend)
    assert r.breaks == 1 and r.graphs == 2, r


def cuda_random_then_fail(a, log):
    noise = torch.rand(2, 2, device=a.device) * 0
    log.append(1)
    y = torch.linalg.inv(a + noise)         # singular: raises (after a sync)
    log.append(2)
    return y, torch.rand(1, device=a.device)


def test_cuda_generators_are_saved_too():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    def after_too(f):
        @functools.wraps(f)
        def run(*args):
            out = f(*args)
            return out, torch.rand(2, device="cuda")
        return run
    inputs = [(torch.eye(2, device="cuda") * 2, []), (torch.zeros(2, 2, device="cuda"), []),
              (torch.eye(2, device="cuda"), [])]
    r = check(after_too(observed(cuda_random_then_fail)), inputs,
              compiled=lambda counter: after_too(observed(frametrace.optimize(backend=counter)(
                  cuda_random_then_fail))))
    assert r.graphs == 1, r


def _saves(fn, *args):
    frametrace.reset()
    c = frametrace.optimize(fn)
    c(*args)
    (entry,) = frametrace._C.entries(fn.__code__)
    return "___rerun_state" in entry.code.co_varnames


def count_after_every_op(x, idx, box):
    x.add_(torch.rand(3))
    y = x[idx] * 2
    box.calls = box.calls + 1          # after the graph's last op, in program order
    return y


def count_before_an_op(x, idx, box):
    x.add_(torch.rand(3))
    box.calls = box.calls + 1
    return x[idx] * 2


@pytest.mark.parametrize("fn", [count_after_every_op, count_before_an_op])
@pytest.mark.parametrize("shortcut", [True, False])
def test_effects_after_every_op_need_no_saving(fn, shortcut, monkeypatch):
    monkeypatch.setattr(frametrace.config, "rerun_skips_effects_after_every_op", shortcut)

    def box():
        b = Box()
        b.calls = 0
        return b
    r = check_observed(fn, _calls(lambda i: (torch.zeros(3), torch.tensor([i]), box())), "eager")
    assert r.graphs == 1 and r.breaks == 0, r
    saves = _saves(fn, torch.zeros(3), torch.tensor([1]), box())
    assert saves == (fn is count_before_an_op or not shortcut)


# --- a backend that writes inputs only after the rest of its graph (AOTAutograd) ---
# A failure before its writes runs the frame again (tests above); one after them, in
# the backend's own epilogue, must not: the rerun would write the inputs a second time.
# The exception goes on, the inputs written once.

def write_and_view(x, y):
    x.mul_(2)
    return x[1:], y + 1


def test_a_failure_after_aot_autograds_writes_does_not_run_the_frame_again(monkeypatch, caplog):
    from torch._functorch._aot_autograd import runtime_wrappers
    real = runtime_wrappers.gen_alias_from_base
    fail = []

    def regenerate(*args, **kwargs):        # (AOTAutograd's view replay of an output
        if fail:                            # that aliases an input, after its writes)
            raise RuntimeError("regeneration failed")
        return real(*args, **kwargs)
    monkeypatch.setattr(runtime_wrappers, "gen_alias_from_base", regenerate)
    frametrace.reset()
    c = frametrace.optimize(backend="aot_eager")(write_and_view)
    for n in (3, 4):                        # (the second size: a symbolic graph)
        x = torch.ones(n)
        out, _ = c(x, torch.zeros(2))
        assert x.tolist() == [2.0] * n and out.tolist() == [2.0] * (n - 1)
        out.add_(1)
        assert x.tolist() == [2.0] + [3.0] * (n - 1)          # (the output aliases x)
    fail.append(1)
    x = torch.ones(5)
    with pytest.raises(RuntimeError, match="regeneration failed"):
        c(x, torch.zeros(2))
    assert x.tolist() == [2.0] * 5                           # written once, not twice
    assert "could write them twice" in caplog.text
    fail.clear()
    x = torch.ones(5)                                        # the entry still serves
    out, _ = c(x, torch.zeros(2))
    assert x.tolist() == [2.0] * 5 and out.tolist() == [2.0] * 4


def test_a_failure_before_aot_autograds_writes_still_runs_the_frame_again():
    def f(x, idx):
        x.mul_(2)
        return x[1:], x[idx]
    r = check(f, [(torch.ones(4), torch.tensor([1])), (torch.ones(4), torch.tensor([9])),
                  (torch.ones(5), torch.tensor([2]))], backend="aot_eager")
    assert r.graphs >= 1 and r.breaks == 0, r


def _deferring_backend(fail):
    """A backend that runs the graph, then fails if told to: as a backend that writes
    inputs at the end and fails after (its outputs made from them) would."""
    def backend(gm, example_inputs):
        def run(*args):
            out = gm.forward(*args)
            if fail:
                raise RuntimeError("after the writes")
            return out
        return run
    backend.__frametrace_defers_input_mutations__ = True
    return backend


@pytest.mark.parametrize("requires_grad", [False, True])
def test_any_deferring_backend_failing_after_its_writes_raises(requires_grad):
    fail = []
    c = frametrace.optimize(backend=_deferring_backend(fail))(write_then_fail)
    w = torch.ones(3, requires_grad=requires_grad)
    x, log = w.detach().clone() if not requires_grad else w.clone(), []
    c(x, torch.tensor([0]), log)
    fail.append(1)
    x, log = torch.ones(3), []
    with pytest.raises(RuntimeError, match="after the writes"):
        c(x, torch.tensor([1]), log)
    assert x.tolist() == [2.0, 2.0, 2.0]
    # (the Python effects replayed after the graph are lost: the graph raised, and
    # what CPython does instead cannot be known; nothing ran twice)
    assert log == []


def test_under_inference_mode_a_failure_before_the_writes_still_runs_the_frame_again():
    with torch.inference_mode():
        c = frametrace.optimize(backend="aot_eager")(write_then_fail)
        x, log = torch.ones(3), []
        c(x, torch.tensor([0]), log)
        x, log = torch.ones(3), []
        with pytest.raises(IndexError):
            c(x, torch.tensor([7]), log)
        assert x.tolist() == [2.0, 2.0, 2.0] and log == [0, "written"]


def test_a_training_graph_failing_before_its_writes_runs_the_frame_again():
    # (the forward runs inside AOTAutograd's autograd.Function: the mark must get out)
    def f(w, buf, idx, log):
        buf.add_(1)
        log.append("written")
        return (w * 2)[idx].sum()
    r = check(f, [(torch.ones(3, requires_grad=True), torch.zeros(3), torch.tensor([i]), [])
                  for i in (1, 7, 2)], backend="aot_eager")
    assert r.graphs >= 1 and r.breaks == 0, r


def _inference_tensor():
    with torch.inference_mode():
        return torch.ones(3)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "aot_eager_decomp_partition"])
@pytest.mark.parametrize("needs_grad", [False, True])
def test_a_write_that_raises_is_not_a_failure_before_the_writes(backend, needs_grad):
    # (eager: the saved copies are put back into the inference tensor inside
    # inference mode, the only place it can be written)
    # An inference tensor written outside inference mode: the in-place kernel writes,
    # then raises; in AOTAutograd's inference graph (and a training graph's buffer) that
    # write is a copy_ among its last ops.  CPython's writes happen once; so must ours.
    # (By hand: the harness's fresh copies of an inference tensor are normal tensors.)
    def f(w, x, y, log):
        log.append(1)
        x.mul_(2)
        y.mul_(2)
        log.append(2)
        return (w * x).sum() + y.sum()
    w = torch.ones(3, requires_grad=needs_grad)
    frametrace.reset()
    c = frametrace.optimize(backend=backend)(f)
    for make_y in (lambda: torch.ones(3), _inference_tensor, lambda: torch.ones(3)):
        seen = []
        for fn in (f, c):
            x, y, log = torch.ones(3), make_y(), []
            try:
                out, exc = fn(w, x, y, log), None
            except RuntimeError as e:
                out, exc = None, str(e)
            seen.append((None if out is None else out.item(), exc, x.tolist(), y.tolist(), log))
        # (where the write raised, the Python effects the trace replays after its graph
        # are lost, as for any failure that cannot run again: the log stays empty)
        if seen[0][1] is not None and backend != "eager":     # (eager runs in order)
            assert seen[1][4] == [], seen
            seen = [v[:4] for v in seen]
        assert seen[0] == seen[1], seen
    assert frametrace._C.entries(f.__code__), "nothing compiled"


def test_marks_stop_at_the_first_write():
    from frametrace.backends import write_marks
    from frametrace.exc import raised_before_input_writes

    def graph(x, i):
        y = torch.ops.aten.mul.Tensor(x, 2)
        torch.ops.aten.copy_.default(x, y)
        return (torch.ops.aten.index.Tensor(y, [i]),)
    run = write_marks.boxed(torch.fx.symbolic_trace(graph))
    with pytest.raises(IndexError) as e:
        run([torch.ones(3), torch.tensor([5])])
    assert not raised_before_input_writes(e.value)          # (after the copy_)

    def graph2(x, i):
        y = torch.ops.aten.index.Tensor(x, [i])
        torch.ops.aten.copy_.default(x, x * 2)
        return (y,)
    run = write_marks.boxed(torch.fx.symbolic_trace(graph2))
    x = torch.ones(3)
    with pytest.raises(IndexError) as e:
        run([x, torch.tensor([5])])
    assert raised_before_input_writes(e.value) and x.tolist() == [1.0] * 3


def test_the_functionalized_fallbacks_marks_follow_version_counters():
    from frametrace.backends import write_marks
    from frametrace.exc import raised_before_input_writes

    def reads(x, i):
        return x[i]

    def writes_then_raises(x, i):
        x.add_(1)
        return x[i]
    for fn, x, marked in [(reads, torch.ones(3), True), (writes_then_raises, torch.ones(3), False),
                          (reads, _inference_tensor(), False)]:
        with pytest.raises(IndexError) as e:
            write_marks.unboxed(fn)(x, torch.tensor([7]))
        assert raised_before_input_writes(e.value) is marked, fn
