"""Programs that are right on the eager backend and went wrong through AOTAutograd
(`aot_eager`): concurrent compiles, a monkeypatched tensor method, a warning's
once-per-location rule.  Each runs on both backends, compiled vs CPython."""
import threading
import time
import warnings

import pytest
import torch

import frametrace
from differential import Then, check

BACKENDS = ["eager", "aot_eager"]


def _closures(n):
    # Distinct code objects: eight frames compiling at the same time, none sharing a
    # cache (one code would hit the cache limit, which is not what is tested here).
    fns = []
    for i in range(n):
        ns = {}
        exec(f"def f{i}(x):\n    return (x * {i}).sin() + x.cos() * 2 - {i}\n", {"torch": torch}, ns)
        fns.append(ns[f"f{i}"])
    return fns


@pytest.mark.parametrize("backend", BACKENDS)
def test_eight_threads_compiling_at_once(backend):
    fns = _closures(8)
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = [frametrace.optimize(f, backend=counter) for f in fns]
    shared = frametrace.optimize(_closures(1)[0], backend=counter)
    barrier = threading.Barrier(8)
    errors = []

    def run(i):
        try:
            barrier.wait(timeout=60)
            for n in range(2):
                x = torch.randn(4, requires_grad=bool(n))
                got = compiled[i](x)
                want = fns[i](x)
                assert torch.allclose(got, want), (i, n)
                if n:
                    got.sum().backward()
                    g = x.grad.clone()
                    x.grad = None
                    fns[i](x).sum().backward()
                    assert torch.allclose(g, x.grad), (i, "grad")
                # every thread also calls one function that all of them compile
                assert torch.allclose(shared(x.detach()), x.detach().cos() * 2)
        except BaseException as e:           # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, 240 - (time.monotonic() - start)))
    assert not any(t.is_alive() for t in threads), "compiles deadlocked"
    assert not errors, errors[0]
    # each function compiled once per grad mode, the shared one at most twice (one
    # thread compiled it; a thread that waited meanwhile ran that call in CPython)
    assert 16 <= counter.frame_count <= 18, counter.frame_count


_WARNS = """
import warnings
def f(x):
    warnings.warn("careful")
    return x + 1
"""


def _warning_module(name):
    # Its own globals, so its own __warningregistry__ (the once-per-location memory).
    g = {"__name__": name}
    exec(compile(_WARNS, f"<{name}>", "exec"), g)
    return g["f"]


def _quiet_aot_eager(gm, example_inputs):
    # A backend that silences warnings while it compiles, as much of torch does: the
    # first AOT compile of a process also imports modules that do.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return frametrace.backends.lookup_backend("aot_eager")(gm, example_inputs)


@pytest.mark.parametrize("backend", BACKENDS + [_quiet_aot_eager])
def test_a_warning_fires_once_per_location_across_the_first_compile(backend):
    plain = _warning_module("warns_in_cpython")
    counter = frametrace.testing.CompileCounter(inner=backend)
    compiled = frametrace.optimize(_warning_module("warns_compiled"), backend=counter)
    counts = []
    for fn in (plain, compiled):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            for n in (3, 3, 3, 5):
                assert torch.equal(fn(torch.ones(n)), torch.ones(n) + 1)
        counts.append([str(w.message) for w in seen])
    assert counts[0] == counts[1] == ["careful"], counts
    assert counter.frame_count >= 1


def test_filters_a_compile_adds_still_count():
    # A net change of the filters made while compiling (an import's filterwarnings) is
    # a change: the registry forgets, as it would in CPython.
    before = list(warnings.filters)
    try:
        from frametrace.convert import _warning_filters_kept
        reg = {"version": None}
        with _warning_filters_kept():
            warnings.filterwarnings("ignore", message="never-seen-message")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        version = reg["version"]
        with _warning_filters_kept():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        assert reg["version"] == version     # undone inside: no change
        with _warning_filters_kept():
            warnings.filterwarnings("ignore", message="another-never-seen-message")
        warnings.warn_explicit("x", UserWarning, "f.py", 1, registry=reg)
        assert reg["version"] != version
    finally:
        warnings.filters[:] = before
        warnings._filters_mutated()


# -- a tensor method replaced between calls --
class _Patch:
    """Replaces a class attribute when `on()` runs, puts it back at `off()` (and at
    the end of the test, whatever happened)."""

    def __init__(self, owner, name, value):
        self.owner, self.name, self.value = owner, name, value
        self.original = owner.__dict__[name] if name in owner.__dict__ else None

    def on(self):
        setattr(self.owner, self.name, self.value)

    def off(self):
        if self.original is None:
            if self.name in self.owner.__dict__:
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


@pytest.fixture
def patches():
    made = []
    yield lambda *a: made.append(_Patch(*a)) or made[-1]
    for p in reversed(made):
        p.off()


def _five_like(self, *args):
    return torch.full_like(self, 5.0)


def method_call(x):
    return x.sigmoid() + 1


def bound_method_read(x):
    m = x.sigmoid
    return m() * 2


def binary_operator(x, y):
    return (x + y) * 3


def reflected_operator(x):
    return 2 - x


def parameter_method(p):
    return p.sigmoid() - 1


def unary_operator(x):
    return -x * 2


def indexing(x):
    return x[1:] * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,name,arity", [
    (method_call, "sigmoid", 1), (bound_method_read, "sigmoid", 1),
    (binary_operator, "__add__", 2), (reflected_operator, "__rsub__", 1),
    (parameter_method, "sigmoid", 1), (unary_operator, "__neg__", 1), (indexing, "__getitem__", 1)])
def test_a_tensor_method_replaced_between_calls(backend, fn, name, arity, patches):
    patch = patches(torch.Tensor, name, _five_like)

    def args():
        if fn is parameter_method:
            return (torch.nn.Parameter(torch.randn(3)),)
        return tuple(torch.randn(3) for _ in range(arity))
    r = check(fn, [args(), Then(patch.on, *args()), args(), Then(patch.off, *args()), args()],
              backend=backend)
    # traced for torch's method, again once it was replaced (the replacement is the
    # user's code: CPython runs it, and compiles it as a frame of its own), and the
    # first entry serves once it is back
    mine = [rec for rec in r.records if rec.code is fn.__code__]
    assert [rec.outcome for rec in mine][0] == "compiled" and len(mine) == 2, r
    assert mine[1].outcome in ("break", "fallback"), r
    assert r.graphs >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_method_swapped_for_another_of_torchs(backend, patches):
    # Still a C method of TensorBase, so traced as a tensor method: by identity.
    patch = patches(torch.Tensor, "sigmoid", torch.Tensor.tanh)
    r = check(method_call, [torch.randn(3), Then(patch.on, torch.randn(3)), torch.randn(3),
                            Then(patch.off, torch.randn(3)), torch.randn(3)], backend=backend)
    assert r.compiles == 2 and r.graphs == 2 and r.breaks == 0, r


# -- dropout that gives its input back, with symbolic sizes --
def dropout_identity(x):
    y = torch.nn.functional.dropout(x, p=0.0, training=True)
    return y, y is x, y + 1


def dropout_then_write(x, p, training):
    y = torch.nn.functional.dropout(x, p=p, training=training)
    y.add_(1)                 # the same tensor as x where the kernel gave x back
    return y * 2


def dropout_module_eval(m, x):
    y = m(x)
    return y is x, torch.dropout(x, 0.0, True) is x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [None, True])
def test_dropout_gives_its_input_back(backend, dynamic):
    sizes = (4, 5, 7)
    r = check(dropout_identity, [torch.randn(n) for n in sizes], backend=backend, dynamic=dynamic)
    assert r.graphs >= 1 and r.breaks == 0, r
    # (both answers known while tracing: the frame computes nothing)
    r = check(dropout_module_eval, [(torch.nn.Dropout(0.5).eval(), torch.randn(n)) for n in sizes],
              backend=backend,
              dynamic=dynamic, graphs=0)
    assert r.breaks == 0 and r.fallbacks == 0, r
    r = check(dropout_then_write, [(torch.randn(n), 0.0, True) for n in sizes] +
              [(torch.randn(n), 0.5, False) for n in sizes], backend=backend, dynamic=dynamic)
    assert 1 <= r.graphs <= 6 and r.breaks == 0, r


def _run_bounded(target, seconds):
    errors = []

    def run():
        try:
            target()
        except BaseException as e:          # noqa: BLE001 (reported below)
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "deadlocked"
    assert not errors, errors[0]


def test_a_backend_that_calls_compiled_code_in_its_thread(monkeypatch):
    # No deadlock on the lock this thread holds (it is re-entrant, and the hook runs
    # the callback's own calls unhooked).
    def helper(x):
        return x * 3
    inner = frametrace.optimize(helper)
    seen = []

    def backend(gm, example_inputs):
        seen.append(inner(torch.ones(2)).tolist())
        return gm.forward

    def f(x):
        return x + 1
    compiled = frametrace.optimize(f, backend=backend)
    _run_bounded(lambda: seen.append(compiled(torch.zeros(2)).tolist()), 120)
    assert seen == [[3.0, 3.0], [1.0, 1.0]]


def test_a_compile_that_waits_on_a_thread_that_compiles(monkeypatch):
    # The other thread cannot take the lock while this compile holds it: after
    # config.compile_lock_timeout its call runs in CPython, and both finish.
    monkeypatch.setattr(frametrace.config, "compile_lock_timeout", 1.0)

    def helper(x):
        return x * 3
    inner = frametrace.optimize(helper)
    seen = []

    def backend(gm, example_inputs):
        t = threading.Thread(target=lambda: seen.append(inner(torch.ones(2)).tolist()))
        t.start()
        t.join(60)
        return gm.forward

    def f(x):
        return x + 1
    compiled = frametrace.optimize(f, backend=backend)
    _run_bounded(lambda: seen.append(compiled(torch.zeros(2)).tolist()), 120)
    assert seen == [[3.0, 3.0], [1.0, 1.0]]
    assert not frametrace._C.entries(helper.__code__)      # that call ran in CPython
    assert inner(torch.ones(2)).tolist() == [3.0, 3.0]
    assert frametrace._C.entries(helper.__code__)          # the next one compiled
