"""Logging calls, warnings and asserts in compiled code stay in the graph's frame
(issue 30, item 3): no graph break, the effect kept.

- a log record is made after the graph with the logger, level, message, arguments and
  the user's file, line and function CPython gives it, in order with the other
  effects; a logger disabled at trace time is guarded (enabling it recompiles);
- a warning is issued with the user's file and line and its category, the filters and
  the once-per-location registries consulted when the call runs;
- `assert t, "msg"` on a tensor is a check in the graph, raising AssertionError("msg")
  on a later call whose data violates it, on the eager and aot_eager backends.

Differential: records and warnings are captured into the global EVENTS on both sides
(CPython and compiled) and compared, and what was compiled is counted.

PYTEST_DONT_REWRITE: the asserts below are the program's, compiled as CPython compiles
them (pytest's rewriting would make their messages computed ones)."""
import contextlib
import logging
import warnings

import pytest
import torch

import frametrace
from differential import Call, Then, check

EVENTS = []
log = logging.getLogger("frametrace_tests.model")
log.propagate = False


class Capture(logging.Handler):
    def emit(self, record):
        EVENTS.append(("log", record.name, record.levelno, record.msg, record.args,
                       record.pathname, record.lineno, record.funcName, record.getMessage(),
                       getattr(record, "tag", None)))


log.addHandler(Capture())


class Stdout:
    def write(self, text):
        if text.strip():
            EVENTS.append(("print", text))

    def flush(self):
        pass


def show_warning(message, category, filename, lineno, file=None, line=None):
    EVENTS.append(("warning", str(message), category, filename, lineno))


@pytest.fixture(autouse=True)
def captured():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # (a frame CPython runs again after a graph raised calls it hooked, and under
        # fullgraph=True str() of the warning would be refused there)
        warnings.showwarning = frametrace.disable(show_warning)
        log.setLevel(logging.INFO)
        frametrace.reset()
        EVENTS.clear()
        yield
    log.setLevel(logging.NOTSET)


BACKENDS = ["eager", "aot_eager"]


# ----------------------------------------------------------------------- logging
def logs_shape(x):
    y = x.sin()
    log.info("shape %s of %s", tuple(x.shape), "x")
    log.debug("not shown %s", 1)                        # disabled: dropped, guarded
    log.log(logging.WARNING, "level %d", 30, extra={"tag": "t"})
    return y * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_records_as_cpython_makes_them(backend):
    r = check(logs_shape, [torch.randn(3), torch.randn(3), torch.randn(5, 2)],
              backend=backend, globals=("EVENTS",), graphs=None, breaks=0, fallbacks=0)
    assert 1 <= r.graphs <= 2 and r.compiles <= 2, r
    # (the harness compared EVENTS after each call: make sure there was something)
    EVENTS.clear()
    logs_shape(torch.randn(2))
    assert [e[3] for e in EVENTS] == ["shape %s of %s", "level %d"]
    assert EVENTS[0][5] == __file__ and EVENTS[0][7] == "logs_shape"


def test_fullgraph_accepts_logging_warnings_and_asserts():
    def f(x):
        log.info("shape %s", tuple(x.shape))
        warnings.warn("careful")
        assert (x > -100).all(), "msg"
        return x + 1

    cnt = frametrace.testing.CompileCounter()
    g = frametrace.optimize(f, backend=cnt, fullgraph=True)
    for _ in range(3):
        g(torch.randn(4))
    assert cnt.frame_count == 1
    assert [e[0] for e in EVENTS] == ["log", "warning"] * 3
    with pytest.raises(AssertionError, match="^msg$"):
        g(torch.full((4,), -1000.0))
    assert cnt.frame_count == 1


def logs_progress(x, step, lr):
    y = x.sin() * lr
    msg = f"step {step:>4} lr {lr:.3e}"           # symbolic numbers, formatted at run time
    log.info(msg)
    log.info(f"{step!r}|{lr}")
    return y + step, msg, [f"s{step}"]          # strings returned: formatted at run time


@pytest.mark.parametrize("backend", BACKENDS)
def test_f_strings_of_changing_numbers_compile_once(backend):
    # a step counter and an lr formatted into log lines recompiled every step (each
    # formatted value was guarded); now 0 and 1 specialize, then one symbolic entry
    r = check(logs_progress, [(torch.randn(3), i, 0.1 / (i + 1)) for i in range(8)],
              backend=backend, globals=("EVENTS",), breaks=0, fallbacks=0)
    assert r.compiles <= 3, r


def enable_debug():
    log.setLevel(logging.DEBUG)


def logs_debug(x):
    log.debug("debug %s", x.dim())
    return x + 1


def test_a_logger_enabled_later_recompiles():
    r = check(logs_debug, [torch.randn(2), torch.randn(2), Then(enable_debug, torch.randn(2)),
                           torch.randn(2)], globals=("EVENTS",), graphs=2, breaks=0)
    assert r.compiles == 2
    assert len(EVENTS) == 2                 # the two calls after enabling, on each side


def silence():
    log.setLevel(logging.ERROR)


def add_handler_level():
    log.handlers[0].setLevel(logging.CRITICAL)


def logs_info(x):
    log.info("info %s", x.dim())
    return x + 1


def test_levels_and_handlers_changed_later_are_honoured_when_the_call_runs():
    try:
        r = check(logs_info, [torch.randn(2), Then(silence, torch.randn(2)),
                              Then(enable_debug, torch.randn(2)), Then(add_handler_level, torch.randn(2))],
                  globals=("EVENTS",), graphs=1, breaks=0, compiles=1)
    finally:
        log.handlers[0].setLevel(logging.NOTSET)
    assert r.graphs == 1


def logs_through_module_functions(x):
    logging.warning("root %s", "warning")
    return x * 3


def test_module_level_logging_functions():
    root = logging.getLogger()
    handler = Capture()
    root.addHandler(handler)
    try:
        check(logs_through_module_functions, [torch.randn(2)] * 3, globals=("EVENTS",), graphs=1,
              breaks=0)
    finally:
        root.removeHandler(handler)


def appends_around_log(x, out):
    out.append(1)
    EVENTS.append("before")
    log.info("between")
    y = x + 1
    print("printed")
    log.warning("after print")
    EVENTS.append("after")
    return y * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_order_with_prints_and_list_appends(backend):
    with contextlib.redirect_stdout(Stdout()):
        r = check(appends_around_log, [(torch.randn(2), []), (torch.randn(2), [])], backend=backend,
                  globals=("EVENTS",), graphs=None, fallbacks=0)
        EVENTS.clear()
        appends_around_log(torch.randn(2), [])
    # at the print, and at the append after a logging call (side_effects.fence), on each
    # compile (EVENTS grows: its length is guarded)
    assert r.breaks >= 2 and all(why.startswith("print()") or "after a logging call" in why
                                 for why in r.reasons()), r
    kinds = [e if isinstance(e, str) else e[0] if e[0] != "log" else e[3] for e in EVENTS]
    assert kinds == ["before", "between", "print", "after print", "after"]


def tensor_argument(x):
    log.info("value %s", x)
    return x + 1


def test_a_tensor_argument_is_left_to_cpython():
    r = check(tensor_argument, [torch.randn(2)], globals=("EVENTS",), graphs=None)
    # (the handler then runs in CPython, and its frame is compiled on its own)
    assert r.breaks >= 1 and "tensor argument" in r.reasons()[0]


# ----------------------------------------------------------------------- warnings
def warns(x):
    warnings.warn("careful")
    warnings.warn("deprecated", DeprecationWarning)
    warnings.warn(message="kw", category=RuntimeWarning, stacklevel=1)
    return x + 1


def helper_warns_for_caller():
    warnings.warn("from the caller's line", stacklevel=2)


def warns_through_helper(x):
    y = x * 2
    helper_warns_for_caller()
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [warns, warns_through_helper])
def test_warnings_with_the_users_line_and_category(backend, fn):
    check(fn, [torch.randn(2)] * 3, backend=backend, globals=("EVENTS",), graphs=1, breaks=0)
    EVENTS.clear()
    fn(torch.randn(2))
    assert all(e[3] == __file__ for e in EVENTS)
    assert EVENTS[-1][4] > warns_through_helper.__code__.co_firstlineno or fn is warns


@pytest.mark.parametrize("action,shown", [("default", 1), ("once", 1), ("always", 3), ("ignore", 0)])
def test_warning_filters_and_registry_at_call_time(action, shown):
    def f(x):
        warnings.warn("registry")
        return x + 1

    g = frametrace.optimize(f, backend=frametrace.testing.CompileCounter())
    for run in (f, g):
        EVENTS.clear()
        warnings.simplefilter(action)        # (resets the once-per-location memory)
        for _ in range(3):
            run(torch.randn(2))
        assert len(EVENTS) == shown, (run, EVENTS)


def test_a_warning_the_filters_make_an_error_raises_it():
    warnings.simplefilter("error")
    r = check(warns, [torch.randn(2)] * 2, graphs=None)
    assert r.breaks + r.fallbacks >= 1
    # changed to "error" after the compile: the guard on the filters fails
    warnings.simplefilter("always")
    cnt = frametrace.testing.CompileCounter()
    g = frametrace.optimize(warns, backend=cnt)
    g(torch.randn(2))
    warnings.simplefilter("error")
    with pytest.raises(UserWarning, match="careful"):
        g(torch.randn(2))


def warns_in_catch_warnings(x):
    with warnings.catch_warnings():
        warnings.warn("inside")
    return x + 1


def test_a_warning_inside_catch_warnings_is_left_to_cpython():
    r = check(warns_in_catch_warnings, [torch.randn(2)] * 2, globals=("EVENTS",), graphs=None)
    assert r.breaks + r.fallbacks >= 1


# ----------------------------------------------------------------------- asserts
def asserts(x):
    y = x.relu()
    assert (x > -100).all(), "values out of range"
    return y + 1


def asserts_no_message(x):
    assert x.sum() > -50
    return x * 2


def asserts_not(x):
    assert not torch.isnan(x).any(), "nan"
    return x - 1


def asserts_after_dropout(x):
    # random numbers drawn: no rerun in CPython, the graph's own AssertionError
    y = torch.nn.functional.dropout(x, 0.5, training=True)
    assert (x > -100).all(), "values out of range"
    return y


def asserts_after_effect(x, out):
    out.append(x.shape[0])
    log.info("before the assert")
    assert (x > -100).all(), "values out of range"
    return x + 1


def bad(n=4):
    return torch.full((n,), -1000.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [asserts, asserts_no_message, asserts_after_dropout])
def test_a_violated_assert_raises_on_a_later_call(backend, fn):
    r = check(fn, [torch.randn(4), torch.randn(4), bad(), torch.randn(4), bad()], backend=backend,
              graphs=1, breaks=0, compiles=1)
    gm = r.counter.graphs[0]
    assert "assert_true" in gm.code


@pytest.mark.parametrize("backend", BACKENDS)
def test_assert_not_and_nan(backend):
    nan = torch.tensor([1.0, float("nan")])
    check(asserts_not, [torch.randn(2), nan, torch.randn(2), nan], backend=backend, graphs=1, breaks=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_violated_assert_keeps_the_effects_before_it(backend):
    check(asserts_after_effect, [(torch.randn(3), []), (bad(3), []), (torch.randn(3), [])],
          backend=backend, globals=("EVENTS",), graphs=1, breaks=0)


def asserts_computed_message(x):
    assert (x > 0).all(), f"bad {x.shape}"
    return x


def test_a_computed_message_still_breaks():
    r = check(asserts_computed_message, [torch.rand(2) + 1, torch.rand(2) + 1], graphs=None)
    assert r.breaks + r.fallbacks >= 1


def test_a_warning_from_a_module_without_source():
    # `python - < script.py`: __main__'s loader cannot give its source.  warnings.warn
    # (in C) does not ask it; neither does the replay.
    import importlib.machinery
    namespace = {"__name__": "__main__", "__loader__": importlib.machinery.BuiltinImporter,
                 "warnings": warnings}
    exec(compile("def f(x):\n    warnings.warn('no source')\n    return x + 1\n", "<stdin>", "exec"),
         namespace)
    check(namespace["f"], [torch.randn(2)] * 2, graphs=1, breaks=0)
    assert [e[1] for e in EVENTS] == ["no source"] * 4           # 2 calls, both sides


def warns_in_resumed_catch_warnings(x):
    with warnings.catch_warnings():
        print("a break inside the block")
        warnings.warn("inside, resumed")
    return x + 1


def test_a_warning_inside_a_resumed_catch_warnings_is_left_to_cpython():
    with contextlib.redirect_stdout(Stdout()):
        check(warns_in_resumed_catch_warnings, [torch.randn(2)] * 2, globals=("EVENTS",), graphs=None)


def logs_tensor_facts(x, n):
    log.info("shape %s size0 %d n %s dtype %s device %s", x.shape, x.size(0), n, x.dtype, x.device)
    return x + n


@pytest.mark.parametrize("backend", BACKENDS)
def test_sizes_dtypes_devices_and_symbolic_sizes_as_arguments(backend):
    r = check(logs_tensor_facts, [(torch.randn(k, 3), k) for k in (2, 3, 4, 5)], backend=backend,
              globals=("EVENTS",), graphs=None, breaks=0, fallbacks=0)
    assert r.graphs <= 2, r                 # static, then symbolic sizes
    EVENTS.clear()
    logs_tensor_facts(torch.randn(6, 3), 6)
    assert EVENTS[0][8] == "shape torch.Size([6, 3]) size0 6 n 6 dtype torch.float32 device cpu"


def logs_bad_extra(x):
    y = x + 1
    log.info("x", extra={"lineno": 3})          # KeyError in makeRecord, at the call
    return y


def test_an_extra_key_that_overwrites_the_record_raises_at_the_call():
    r = check(logs_bad_extra, [torch.randn(2)] * 2, globals=("EVENTS",), graphs=None)
    assert r.breaks == 1 and r.graphs == 1 and "extra key" in r.reasons()[0]


@pytest.mark.parametrize("switch", ["trace_logging_calls", "asserts_in_graph"])
def test_switches_turn_it_off(monkeypatch, switch):
    from frametrace import config
    monkeypatch.setattr(config, switch, False)
    fn = logs_shape if switch == "trace_logging_calls" else asserts
    r = check(fn, [torch.randn(4), bad()] if fn is asserts else [torch.randn(4)] * 2,
              globals=("EVENTS",), graphs=None)
    assert r.breaks >= 1, r
