"""`with` over context managers beyond grad mode: objects of user classes (__enter__ and
__exit__ inlined), @contextlib.contextmanager generators, torch's mode contexts, and
graph breaks inside their blocks (the real __exit__ runs once, with the exception)."""
import contextlib

import pytest
import torch

import frametrace
from differential import check


class Boom(Exception):
    pass


@frametrace.disable
def opaque_raise(y):
    # Not traced: the frame breaks at this call, which raises in CPython inside the
    # `with` block.
    raise Boom(f"boom {y.shape[0]}")


@frametrace.disable
def opaque(y):
    return y + 1


def own(report, fn):
    """Outcomes of the compiles of fn and its resume functions (not of the functions
    CPython calls from them, such as an __exit__ run at a break)."""
    name = fn.__code__.co_qualname
    return [r.outcome for r in report.records
            if r.code.co_qualname == name or r.code.co_qualname.startswith(name + ".<resume")]


class Logged:
    """Appends to a log on enter and exit; exit records the exception type."""

    def __init__(self, log, tag="c"):
        self.log = log
        self.tag = tag
        self.entries = 0

    def __enter__(self):
        self.entries += 1
        self.log.append(f"enter {self.tag}")
        return self.tag

    def __exit__(self, typ, exc, tb):
        self.log.append(f"exit {self.tag} {typ.__name__ if typ else None}")


class NoGradCtx:
    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


class Suppress:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, typ, exc, tb):
        self.log.append(f"exit {typ.__name__ if typ else None}")
        return True


@contextlib.contextmanager
def logged_gen(log, value):
    log.append("gen enter")
    try:
        yield value * 2
    finally:
        log.append("gen exit")


@contextlib.contextmanager
def grad_gen(mode):
    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(mode)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(prev)


def _x():
    return torch.randn(3, requires_grad=True)


def _grad_is_on():
    assert torch.is_grad_enabled()


# ------------------------------------------------------------------ user classes, traced
def test_user_context_made_in_frame_is_inlined_in_one_graph():
    def f(x, log):
        with Logged(log) as tag:
            y = x * 2
            log.append(tag)
        return y + 1

    # (the log list is only appended to: its length is not guarded, one graph for both)
    check(f, [(_x(), []), (_x(), ["a"])], graphs=1, breaks=0, fullgraph=True)


def test_user_context_passed_in_is_inlined_and_its_state_written_back():
    def f(x, ctx):
        with ctx as tag:
            y = x.sin()
        with ctx:
            y = y + len(tag)
        return y

    r = check(f, [(_x(), Logged([])), (_x(), Logged(["z"], tag="d"))], breaks=0, fullgraph=True)
    assert r.graphs >= 1


def test_user_context_switching_grad_mode_in_enter_and_exit():
    def f(x):
        with NoGradCtx(False):
            y = x * 2
        z = x * 3
        return y, z, torch.is_grad_enabled()

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)
    _grad_is_on()


def test_user_context_returned_from_frame():
    def f(x):
        cm = NoGradCtx(False)
        with cm:
            y = x + 1
        return cm, y

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)
    _grad_is_on()


def test_object_without_context_protocol_is_a_type_error_in_cpython():
    class NotCtx:
        pass

    def f(x):
        with NotCtx():
            return x + 1

    check(f, [_x()], graphs=0)


# ------------------------------------------------------------------ contextlib
def test_contextmanager_generator_is_inlined_to_its_yield_and_end():
    def f(x, log):
        with logged_gen(log, 3) as v:
            y = x * v
        log.append("after")
        return y

    check(f, [(_x(), []), (_x(), [])], graphs=1, breaks=0, fullgraph=True)


def test_contextmanager_generator_switching_grad_mode():
    def f(x):
        with grad_gen(False):
            y = x * 2
            inner = torch.is_grad_enabled()
        return y, inner, x * 3

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)
    _grad_is_on()


def test_nullcontext_binds_its_value():
    def f(x):
        with contextlib.nullcontext(5) as v:
            return x + v

    check(f, [_x()], graphs=1, breaks=0, fullgraph=True)


# ------------------------------------------------------------------ graph breaks inside
def test_graph_break_inside_user_context_resumes_and_exits_once():
    def f(x, log):
        with Logged(log) as tag:
            y = x * 2
            y = opaque(y)
            log.append(tag)
            y = y * 3
        return y

    r = check(f, [(_x(), []), (_x(), [])])
    assert own(r, f) == ["break", "compiled"]


def test_exception_at_a_break_inside_user_context_reaches_exit_once():
    def f(x, log):
        with Logged(log):
            y = x * 2
            opaque_raise(y)
        return y

    r = check(f, [(_x(), []), (_x(), ["a"])])
    assert set(own(r, f)) == {"break"}


def test_exception_at_a_later_break_inside_user_context_reaches_exit_once():
    # The second break is in the resume function, which has the __exit__ as an argument.
    def f(x, log, fail):
        with Logged(log):
            y = opaque(x * 2)
            if fail:
                opaque_raise(y)
            y = opaque(y)
        return y

    r = check(f, [(_x(), [], True), (_x(), [], False), (_x(), [], True)])
    assert "fallback" not in own(r, f) and "break" in own(r, f)


def test_exception_at_a_later_break_inside_no_grad_restores_grad_mode():
    def f(x, fail):
        with torch.no_grad():
            y = opaque(x * 2)
            if fail:
                opaque_raise(y)
            y = opaque(y)
        return y

    r = check(f, [(_x(), True), (_x(), False), (_x(), True)])
    assert "fallback" not in own(r, f) and "break" in own(r, f)
    _grad_is_on()


def test_nested_user_contexts_with_a_break_exit_innermost_first():
    def f(x, log, fail):
        with Logged(log, "outer"):
            with Logged(log, "inner"):
                y = opaque(x * 2)
                if fail:
                    opaque_raise(y)
            log.append("between")
        return y

    r = check(f, [(_x(), [], False), (_x(), [], True)])
    assert "fallback" not in own(r, f) and "break" in own(r, f)


def test_break_inside_a_context_that_may_swallow_exceptions_breaks_at_its_with():
    def f(x, log, fail):
        y = x.cos()
        with Suppress(log):
            y = y * 2
            if fail:
                opaque_raise(y)
            log.append("body")
        return x + 1

    r = check(f, [(_x(), [], True), (_x(), [], False)])
    # The break goes to the `with`: what comes before it is compiled.
    assert own(r, f)[0] == "break"


def test_break_inside_contextmanager_generator_breaks_at_its_with():
    def f(x, log):
        y = x.cos()
        with logged_gen(log, 1):
            y = opaque(y * 2)
        return y

    r = check(f, [(_x(), []), (_x(), [])])
    assert own(r, f)[0] == "break"


def test_break_in_enter_of_user_context_runs_enter_once():
    def f(x, log):
        y = x.cos()
        with BreakingEnter(log):
            y = y * 2
        return y

    r = check(f, [(_x(), []), (_x(), [])])
    # CPython enters it at the break; the block and the exit are compiled after it.
    assert own(r, f) == ["break", "compiled"]


class BreakingEnter(Logged):
    def __enter__(self):
        print(end="")
        return super().__enter__()


def test_break_inside_a_block_resumed_after_a_break_at_its_with():
    def f(x, log, fail):
        y = x.cos()
        with BreakingEnter(log):            # break here: CPython enters it
            y = opaque(y * 2)               # its __exit__ is handed over here
            if fail:
                opaque_raise(y)
            y = y + 1
        return y

    r = check(f, [(_x(), [], False), (_x(), [], True)])
    assert "fallback" not in own(r, f)


# ------------------------------------------------------------------ torch's contexts
def test_inference_mode_block_makes_inference_tensors():
    def f(x):
        with torch.inference_mode():
            y = x * 2
            inside = torch.is_grad_enabled()
        z = x * 3
        return y, y.is_inference(), z, z.is_inference(), inside

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)
    assert not torch.is_inference_mode_enabled()


def test_sdpa_kernel_selects_the_backend_at_run_time():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q):
        with sdpa_kernel([SDPBackend.MATH]):
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return out * 2

    q = torch.randn(1, 2, 4, 8)
    g = frametrace.optimize(backend="eager", fullgraph=True)(f)
    want = f(q)
    assert torch.allclose(g(q), want)
    # Run where the math kernel is off outside: only a graph that switches backends
    # when it runs finds one.
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert torch.allclose(g(q), want)
        assert torch.nn.attention._cur_sdpa_kernel_backends() == [SDPBackend.EFFICIENT_ATTENTION]
    assert SDPBackend.MATH in torch.nn.attention._cur_sdpa_kernel_backends()


def test_disable_saved_tensors_hooks_as_context_and_restored():
    def f(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
            with torch.autograd.graph.disable_saved_tensors_hooks("inner"):
                y = x.sin()
            y = y * 2
        return y.cos()

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)
    assert torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() is None


def test_profiler_ranges_are_no_ops_and_a_break_inside_resumes():
    def f(x):
        y = x ** 2
        with torch.profiler.profile():
            y = y + 2
            with torch.autograd.profiler.record_function("inner"):
                z = opaque(y ** 3)
                z = z + 1
        return z

    r = check(f, [_x(), _x()])
    assert own(r, f) == ["break", "compiled"]


def test_catch_warnings_and_disable_torch_function_subclass_are_no_ops():
    import warnings

    def f(x):
        with warnings.catch_warnings():
            y = x + 1
        with torch._C.DisableTorchFunctionSubclass():
            y = y * 2
        return y

    check(f, [_x()], graphs=1, breaks=0, fullgraph=True)


def test_break_inside_catch_warnings_breaks_at_its_with():
    import warnings

    @frametrace.disable
    def quiet_filters():
        warnings.simplefilter("ignore")

    def f(x):
        before = len(warnings.filters)
        x = x.cos()
        with warnings.catch_warnings():
            quiet_filters()
            y = x + 1
        return y, len(warnings.filters) == before

    r = check(f, [_x(), _x()])
    assert own(r, f)[0] == "break"


def test_grad_mode_decorated_function_returned_from_frame():
    def f(x, mode_on):
        def inner(y):
            return y * 2
        deco = torch.enable_grad() if mode_on else torch.no_grad()
        return deco(inner)

    for mode_on in (True, False):
        fn = frametrace.optimize(backend="eager", fullgraph=True)(f)(_x(), mode_on)
        with torch.set_grad_enabled(not mode_on):
            out = fn(_x())
        assert out.requires_grad == mode_on
    _grad_is_on()


@torch.no_grad()
def _scaled_without_grad(y):
    return y * 2, torch.is_grad_enabled()


@torch.enable_grad()
def _scaled_with_grad(y):
    return y * 3, torch.is_grad_enabled()


def test_functions_decorated_at_module_level_run_in_their_grad_mode_in_the_graph():
    # torch's decorate_context, called from the frame (as clip_grad_norm_'s grouping of
    # the gradients by device and dtype is): from torch 2.15 each decorated function has
    # its own copy of that code, named after the context manager; either way the call is
    # the inner function in that mode.
    def f(x):
        a, a_on = _scaled_without_grad(x)
        with torch.no_grad():
            b, b_on = _scaled_with_grad(x)
        return a, a_on, b, b_on

    check(f, [_x(), _x()], graphs=1, breaks=0, fallbacks=0, fullgraph=True)
    _grad_is_on()


def test_set_grad_enabled_as_decorator_does_not_switch_the_mode():
    def f(x, mode):
        with torch.set_grad_enabled(not mode):
            @torch.set_grad_enabled(mode)
            def inner(y):
                return y.sin()
            outside = torch.is_grad_enabled()
        with torch.set_grad_enabled(not mode):
            return inner(x), outside, torch.is_grad_enabled()

    check(f, [(_x(), True), (_x(), False)], breaks=0, fullgraph=True)
    _grad_is_on()


def test_grad_mode_class_called_on_a_function_decorates_it():
    def f(x, mode_on):
        def inner(y):
            return y.sin()
        inner = torch.enable_grad(inner) if mode_on else torch.no_grad(inner)
        with torch.set_grad_enabled(not mode_on):
            return inner(x)

    check(f, [(_x(), True), (_x(), False)], breaks=0, fullgraph=True)
    _grad_is_on()


def test_disable_saved_tensors_hooks_as_decorator():
    def f(x):
        @torch.autograd.graph.disable_saved_tensors_hooks("not here")
        def inner(a, b):
            return a * b

        return inner(x, x + 1)

    check(f, [_x()], graphs=1, breaks=0, fullgraph=True)
    assert torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() is None


def _saved_tensors_hooks_enabled():
    return torch._C._autograd._saved_tensors_hooks_is_enabled()


def test_context_decorated_function_that_raises_exits_its_context():
    def f(x):
        @torch.autograd.graph.disable_saved_tensors_hooks("not here")
        def inner(a):
            a = a * 2
            raise ValueError("boom")

        try:
            inner(x)
        except ValueError:
            pass
        return x + 1, _saved_tensors_hooks_enabled()

    check(f, [_x(), _x()], graphs=1, breaks=0)
    assert _saved_tensors_hooks_enabled()


@pytest.mark.parametrize("make", ["set_grad_enabled", "no_grad", "enable_grad", "nullcontext"])
def test_context_made_before_a_break_and_entered_after_it(make):
    def f(x, log):
        x = x + 1
        if make == "set_grad_enabled":
            ctx = torch.set_grad_enabled(False)     # switches the mode already
        elif make == "no_grad":
            ctx = torch.no_grad()
        elif make == "enable_grad":
            ctx = torch.enable_grad()
        else:
            ctx = contextlib.nullcontext(3)
        log.append(torch.is_grad_enabled())
        opaque(x)
        with ctx as v:
            x = x * 2
            log.append(torch.is_grad_enabled())
        log.append(v)
        return x, torch.is_grad_enabled()

    r = check(f, [(_x(), []), (_x(), [])])
    assert own(r, f) == ["break", "compiled"]
    _grad_is_on()


def test_set_grad_enabled_object_entered_after_the_mode_changed():
    def f(x):
        ctx = torch.set_grad_enabled(False)
        torch._C._set_grad_enabled(True)
        with ctx:
            y = x * 2
        return y, torch.is_grad_enabled()

    check(f, [_x()], graphs=1, breaks=0, fullgraph=True)
    _grad_is_on()


def test_graph_that_only_switches_grad_mode_is_not_compiled():
    def gn(z):
        with torch.no_grad():
            z = opaque(z)
            return torch.sin(z)

    def f(x, y, z):
        a = torch.mm(x, y)
        z = gn(z)
        return a, z

    r = check(f, [(torch.randn(3, 1, requires_grad=True), torch.randn(1, 3, requires_grad=True), _x())])
    # f up to the call, then gn after its break: gn's part before it computes nothing.
    assert r.graphs == 2
    _grad_is_on()


def test_suppress_without_an_exception_is_traced_and_a_break_inside_goes_to_its_with():
    def f(x, fail):
        y = x.cos()
        with contextlib.suppress(Boom, KeyError):
            y = y * 2
        with contextlib.suppress(Boom):
            y = y + 1
            if fail:
                opaque_raise(y)         # swallowed: CPython runs this block
            y = y * 3
        return y

    r = check(f, [(_x(), False), (_x(), True), (_x(), False)])
    # (the resume function, inside the block, has suppress's __exit__, which may
    # swallow the exception raised at its break: it runs in CPython)
    assert "break" in own(r, f)


def test_fork_rng_restores_the_generator_state_at_run_time():
    def f(x):
        with torch.random.fork_rng():
            a = torch.rand(3)
        b = torch.rand(3)             # drawn from the state before the block again
        return x + a, x + b

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)


def test_suppress_and_catch_warnings_blocks_are_traced_in_one_graph():
    import warnings

    def f(x):
        with contextlib.suppress(KeyError, Boom):
            y = x * 2
        with warnings.catch_warnings():
            y = y + 1
        return y

    check(f, [_x(), _x()], graphs=1, breaks=0, fullgraph=True)


class SneakySuppress(Logged):
    def __exit__(self, typ, exc, tb):
        super().__exit__(typ, exc, tb)
        return typ is Boom or None          # a return of None textually, but not only


def test_exit_returning_a_value_that_may_be_true_is_not_handed_over():
    def f(x, log, fail):
        y = x.cos()
        with SneakySuppress(log):
            y = opaque(y)
            if fail:
                opaque_raise(y)
        log.append("after")
        return y

    check(f, [(_x(), [], False), (_x(), [], True)])


# -- saved-tensor hooks around a compiled call --
def test_saved_tensor_hooks_do_not_run_while_tracing():
    # The pack hook ran on the trace's FakeTensors too: one call packed twice.
    counts = {"pack": 0, "unpack": 0}

    def pack(t):
        counts["pack"] += 1
        return t

    def unpack(t):
        counts["unpack"] += 1
        return t

    def f(x, y):
        return x * y

    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    for backend in ("eager", "aot_eager"):
        frametrace.reset()
        counts.update(pack=0, unpack=0)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = frametrace.optimize(backend)(f)(x, y)
            assert counts == {"pack": 1, "unpack": 0}, (backend, counts)
            out.sum().backward()
            assert counts == {"pack": 1, "unpack": 1}, (backend, counts)
    check(f, [(x, y)], backend="aot_eager")
