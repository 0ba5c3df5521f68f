"""What a real training loop adds around the compiled step: gradient clipping
(`clip_grad_norm_`, `clip_grad_value_`) and zero_grad inside the compiled function, less
common torch.optim optimizers (RAdam, ASGD, NAdam with decoupled weight decay, Adafactor,
SparseAdam) and a hand-written Adafactor, and many optimizer instances (a model each, or
one per layer) sharing one step code.

Differential: each loop runs in CPython and with its step compiled, on copies of the
same models and batches; the returned losses (and norms), the models afterwards
(parameters and their .grad) and, where `run_steps` is used, the optimizer state are
compared after every step; then graphs, breaks, fallbacks and compiles are asserted, so
that nothing passes by running in CPython."""
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace
from frametrace import convert
from differential import Call, Report, check
from test_optimizer_step import backward, mlp, run_steps, step

STEPS = 3


@pytest.fixture
def backend(training_backend):
    return training_backend


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(F.gelu(self.l1(x)))


def batches(n=STEPS):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(n)]


def train_check(loop, step_fn, model, backend="aot_eager", atol=1e-5, **kw):
    """check() of `loop(step, model, data)` in CPython against the same loop with `step`
    compiled (the loop itself runs in CPython on both sides).  (Compiled, AdamW's bias
    corrections are float32 tensor arithmetic on the step tensor where CPython uses
    Python floats, as under torch.compile: a few ulps, which lr magnifies.)"""
    return check(lambda m, d: loop(step_fn, m, d), [(model, batches())], backend=backend,
                 compiled=lambda counter: lambda m, d: loop(frametrace.optimize(backend=counter)(step_fn), m, d),
                 atol=atol, **kw)


def adamw_loop(step_fn, model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    return [step_fn(model, opt, x, y) for x, y in data]


def graph_code(r):
    return "\n".join(g.code for g in r.counter.graphs)


# -- gradient clipping ----------------------------------------------------------------------
def clip_norm(foreach=None, norm_type=2.0):
    def clipped_step(model, opt, x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
        opt.step()
        return loss.detach(), norm
    return clipped_step


@pytest.mark.parametrize("foreach,norm_type", [(None, 2.0), (True, 2.0), (False, 2.0),
                                               (None, float("inf")), (False, 1.0)])
def test_clip_grad_norm_between_backward_and_step_is_in_the_graph(foreach, norm_type):
    r = train_check(adamw_loop, clip_norm(foreach, norm_type), Net())
    # The one break is backward(); the clipping, the step and zero_grad are graphs.
    assert r.breaks == 2 and r.fallbacks == 0 and all("backward" in w for w in r.reasons()), r
    code = graph_code(r)
    assert ("_foreach_norm" if foreach is not False else "linalg_vector_norm") in code, code
    assert "lerp_" in code and ("_foreach_mul_" in code or "mul_" in code), code


def test_clip_grad_norm_and_value_with_the_triton_backend(backend):
    def clipped_step(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        nn.utils.clip_grad_value_(model.parameters(), 0.02)
        opt.step()
        return loss.detach(), norm
    r = train_check(adamw_loop, clipped_step, Net(), backend)
    assert r.fallbacks == 0 and all("backward" in w for w in r.reasons()), r
    assert "_foreach_norm" in graph_code(r) and "_foreach_clamp_min_" in graph_code(r)


@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_value_in_the_compiled_step(foreach):
    def clipped_step(model, opt, x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_value_(model.parameters(), 0.01, foreach=foreach)
        opt.step()
        opt.zero_grad()
        return loss.detach()
    r = train_check(adamw_loop, clipped_step, Net())
    assert r.breaks == 1 and r.fallbacks == 0 and "backward" in r.reasons()[0], r
    assert "clamp" in graph_code(r)


def test_clip_grad_norm_over_parameters_of_two_dtypes():
    # torch groups the gradients by (device, dtype); the groups' order is eager's (the
    # norms are stacked in it), and the dict of groups is guarded by its keys.
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 4)
            self.b = nn.Linear(8, 4).double()

        def forward(self, x):
            return self.a(x) + self.b(x.double()).float()

    def clipped_step(model, opt, x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        return loss.detach(), norm
    r = train_check(adamw_loop, clipped_step, Mixed())
    assert r.breaks == 1 and r.fallbacks == 0, r


def test_clip_grad_norm_error_if_nonfinite_raises_as_eager():
    # The finiteness test reads the norm's value: a break there, and the error raised
    # in CPython as eager raises it.
    def clipped(model, x):
        model(x).sum().backward()
        return nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)

    def inputs(scale):
        torch.manual_seed(0)
        m = Net()
        m.l1.weight.data[0, 0] = scale
        return (m, torch.randn(4, 8))
    r = check(clipped, [inputs(1.0), inputs(float("inf"))])
    assert r.internal_errors == 0 and any("branching on a tensor" in w for w in r.reasons()), r


# -- zero_grad inside the compiled step -----------------------------------------------------
@pytest.mark.parametrize("owner", ["model", "optimizer"])
@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("where", ["first", "last"])
def test_zero_grad_inside_a_clipped_training_step(owner, set_to_none, where):
    def zero(model, opt):
        (model if owner == "model" else opt).zero_grad(set_to_none=set_to_none)

    def clipped_step(model, opt, x, y):
        if where == "first":
            zero(model, opt)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        if where == "last":
            zero(model, opt)
        return loss.detach()
    r = train_check(adamw_loop, clipped_step, Net())
    assert r.fallbacks == 0 and all("backward" in w for w in r.reasons()), r
    if not set_to_none:
        assert "zero_" in graph_code(r)


# -- other optimizers -----------------------------------------------------------------------
@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name,make", [
    ("radam", lambda ps, fe: torch.optim.RAdam(ps, lr=0.01, foreach=fe)),
    ("radam_decoupled", lambda ps, fe: torch.optim.RAdam(ps, lr=0.01, weight_decay=0.1,
                                                         decoupled_weight_decay=True, foreach=fe)),
    ("asgd", lambda ps, fe: torch.optim.ASGD(ps, lr=0.01, foreach=fe)),
])
def test_data_dependent_optimizers_stop_recompiling(name, make, foreach):
    # On the CPU (not capturable) RAdam branches on its rectification term and ASGD reads
    # its step counts: graph breaks, as under torch.compile.  The loops over the
    # per-call dict of parameter groups cross those breaks: after the first steps (and
    # RAdam's switch to the rectified update at step 6) nothing recompiles.
    def factory():
        m = mlp()
        return m, make(m.parameters(), foreach)
    # (Compiled, the step count stays a float32 tensor where eager reads a Python float:
    # RAdam's rectification term then differs by ulps, growing ~1e-6 a step.)
    r = run_steps(factory, step, steps=8, prep=backward, backend="aot_eager", atol=1e-4)
    assert r.fallbacks == 0 and r.graphs >= 2, r
    tail = r.per_step[2:5] + r.per_step[6:]
    assert sum(tail) == 0, (r, r.per_step)


@pytest.mark.parametrize("foreach", [False, True])
def test_nadam_with_decoupled_weight_decay_is_one_graph(foreach):
    def factory():
        m = mlp()
        return m, torch.optim.NAdam(m.parameters(), lr=0.01, weight_decay=0.1,
                                    decoupled_weight_decay=True, foreach=foreach)
    r = run_steps(factory, step, steps=4, prep=backward, backend="aot_eager", atol=1e-5)
    assert r.breaks == 0 and r.per_step == [1, 1, 0, 0], (r, r.per_step)


def test_hand_written_adafactor_with_a_step_counter_in_its_state():
    # transformers' Adafactor keeps `state["step"]` (a Python int) per parameter, in the
    # optimizer's dict keyed by tensors, and decays with math.pow(step, -0.8): the
    # counter becomes symbolic from its third value, math.pow stays symbolic.
    optimization = pytest.importorskip("transformers.optimization")

    def factory():
        m = mlp()
        return m, optimization.Adafactor(m.parameters(), lr=0.01, relative_step=False,
                                         scale_parameter=False)
    r = run_steps(factory, step, steps=6, prep=backward, backend="aot_eager", atol=1e-5)
    assert r.breaks == 0 and r.fallbacks == 0, r
    assert r.per_step == [1, 1, 1, 0, 0, 0], r.per_step


def test_math_pow_of_a_counter_is_symbolic_and_raises_as_eager_for_a_negative_base():
    def decay(x, st):
        st["step"] += 1
        return x * (1.0 - math.pow(st["step"], -0.8))
    # 1 and 2 specialized, then one symbolic graph for every positive counter
    r = check(decay, [Call(torch.randn(3), {"step": s}) for s in range(8)], atol=1e-5)
    assert r.graphs == 3 and r.breaks == 0, r
    # math.pow(-1, -0.8) raises ValueError (** would give a complex number): the base
    # is guarded positive
    r = check(decay, [Call(torch.randn(3), {"step": s}) for s in (0, 1, 2, 3, -2, 4, -5)], atol=1e-5)
    assert r.internal_errors == 0 and any("ValueError" in w for w in r.reasons()), r


def test_sparse_adam_is_a_clean_graph_break():
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 3, sparse=True)

        def forward(self, idx):
            return self.e(idx)

    def factory():
        m = Emb()
        return m, torch.optim.SparseAdam(m.parameters(), lr=0.01)

    def prep(m, opt, x):
        m(torch.tensor([1, 2, 2, 5])).sum().backward()
    r = run_steps(factory, step, steps=3, prep=prep, backend="aot_eager")
    assert r.breaks >= 1 and any("sparse" in w for w in r.reasons()), r
    assert r.internal_errors == 0 and sum(r.per_step[1:]) == 0, (r, r.per_step)


# -- many optimizer instances ---------------------------------------------------------------
def many_models_loop(step_fn, models, data):
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in models]
    return [[step_fn(m, o, x, y) for m, o in zip(models, opts)] for x, y in data]


def train_and_step(model, opt, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def _no_limit_warning(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    assert not [w for w in seen if "cache_size_limit" in str(w.message)], [str(w.message) for w in seen]
    return out


def test_sixteen_models_each_with_its_own_adamw():
    # The step holds each model across backward()'s break (guarded by identity): an
    # entry per model, counted per model, none of them run in CPython.
    torch.manual_seed(0)
    models = [Net() for _ in range(16)]
    r = _no_limit_warning(lambda: check(lambda ms, d: many_models_loop(train_and_step, ms, d),
                                        [(models, batches())], atol=1e-5,
                                        compiled=lambda counter: lambda ms, d: many_models_loop(
                                            frametrace.optimize(backend=counter)(train_and_step), ms, d)))
    assert r.fallbacks == 0 and r.breaks == 16, r
    assert r.compiles == 16 + 2, r          # one entry per model, the resume twice


def test_per_layer_optimizers_of_different_shapes():
    # sixteen layers, an AdamW each: one step code, entries per instance (their shapes
    # differ), two each (state made, then read), never CPython
    def make():
        torch.manual_seed(0)
        layers = [nn.Linear(4 + i, 3 + i) for i in range(16)]
        return layers, [torch.optim.AdamW(l.parameters(), lr=0.01) for l in layers]

    def run(step_fn):
        layers, opts = make()
        out = []
        for s in range(STEPS):
            for i, (l, o) in enumerate(zip(layers, opts)):
                l(torch.randn(5, 4 + i, generator=torch.Generator().manual_seed(s))).sum().backward()
                step_fn(o)
            out.append([p.detach().clone() for l in layers for p in l.parameters()])
        return out, [o.state_dict() for o in opts]

    def one_step(opt):
        opt.step()
        opt.zero_grad()
    want = run(one_step)
    counter = frametrace.testing.CompileCounter()
    records = []
    convert.record_observers.append(records.append)
    try:
        got = _no_limit_warning(lambda: run(frametrace.optimize(backend=counter)(one_step)))
    finally:
        convert.record_observers.remove(records.append)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    r = Report(counter, records, 0)
    assert r.breaks == 0 and r.fallbacks == 0 and r.compiles == 32, r


def compiles_of(fn, calls):
    """How many times `fn`'s own code was compiled while running `calls()` (warnings
    recorded)."""
    records = []
    convert.record_observers.append(records.append)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            calls()
    finally:
        convert.record_observers.remove(records.append)
    return sum(r.code is fn.__code__ for r in records), [str(w.message) for w in seen]


def test_recompiles_for_one_instance_still_stop_at_the_limit():
    # The limit counts the entries of the same instance: a module whose own attribute
    # changes on every call still runs in CPython after cache_size_limit entries.
    m = Net()
    x = torch.randn(2, 8)

    def f(m, x):
        return m(x) * int(m.tag)
    g = frametrace.optimize(backend="eager")(f)

    def calls():
        for i in range(12):
            m.tag = str(i)          # a string attribute of a module: a constant
            torch.testing.assert_close(g(m, x), f(m, x))
    n, seen = compiles_of(f, calls)
    assert n == frametrace.config.cache_size_limit
    assert any("cache_size_limit" in w for w in seen), seen


def test_accumulated_limit_caps_entries_over_instances(monkeypatch):
    monkeypatch.setattr(frametrace.config, "accumulated_cache_size_limit", 10)
    models = [Net() for _ in range(14)]
    x = torch.randn(2, 8)

    def f(m, x):
        return m(x).relu()
    g = frametrace.optimize(backend="eager")(f)

    def calls():
        for m in models:
            for _ in range(2):
                torch.testing.assert_close(g(m, x), f(m, x))
    n, seen = compiles_of(f, calls)
    assert n == 10 and any("accumulated_cache_size_limit" in w for w in seen), (n, seen)


# -- max-pool backward in the triton backend -------------------------------------------------
@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
                                dict(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True),
                                dict(kernel_size=3, stride=1, padding=1)])
def test_max_pool2d_backward_is_a_kernel(triton_interpreter, kw):
    # Exactly eager's gradients (windows overlap where stride < kernel; ties are
    # resolved by the saved indices) from a kernel, not an aten call.
    pytest.importorskip("triton")
    from frametrace.backends.triton import last_compiled
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 2:5, 2:5] = 1.0
    out, idx = F.max_pool2d(x, return_indices=True, **kw)
    g = torch.randn_like(out)
    k = kw["kernel_size"]
    k = [k, k] if isinstance(k, int) else list(k)
    s = kw.get("stride", k)
    s = [s, s] if isinstance(s, int) else list(s)
    p = [kw.get("padding", 0)] * 2

    def backward_of_pool(g, x, idx):
        return torch.ops.aten.max_pool2d_with_indices_backward(g * 2, x, k, s, p, [1, 1],
                                                               kw.get("ceil_mode", False), idx)
    got = frametrace.optimize(backend="triton", fullgraph=True)(backward_of_pool)(g, x, idx)
    assert torch.equal(got, backward_of_pool(g, x, idx))
    assert last_compiled().externs == [], last_compiled().source
