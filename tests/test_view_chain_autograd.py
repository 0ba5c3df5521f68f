"""The eager backend's view-chain shortcut (one `as_strided` for a chain of views,
frametrace/backends/view_chains.py and _C/views.cpp) against what autograd knows about
a view besides its geometry: its base, its version counter and its CreationMeta (made
with grad on, in no_grad, in inference mode, as one of several outputs of
split/unbind/chunk), which decide whether an in-place op on it may run.

Each test is differential (CPython and compiled on fresh copies, several calls); the
helper `observe` also writes the returned views in place afterwards on both sides, as
a caller would, and compares what each returned tensor carries: strides, offset,
`_base` (which argument, by identity), `_is_view()`, CreationMeta, requires_grad,
grad_fn's kind.  Each test also counts the shortcuts really taken (`views.hits`), so
that running every view op could not pass for the shortcut being right."""
import contextlib
import functools

import pytest
import torch

import frametrace
import test_view_chains
from differential import Then, check
from frametrace.backends import view_chains

views = view_chains._module()
pytestmark = pytest.mark.skipif(views is None, reason="frametrace._views not built")


class Made(test_view_chains.Made):
    """The eager backend, keeping the graph modules it made (and so their plans)."""

    def hits(self):
        return [views.hits(p) for p in self.plans()]


def grad_graph(t, depth=4):
    """The kinds of the autograd nodes behind `t`, breadth first (a few levels)."""
    names, level = [], [t.grad_fn]
    for _ in range(depth):
        level = [f for f in level if f is not None]
        names.append([type(f).__name__ for f in level])
        level = [g for f in level for g, _ in f.next_functions]
    return names


def describe(t, args):
    """What a returned tensor carries besides its values: geometry, base (which argument,
    by identity), view-ness, CreationMeta, autograd state, version."""
    if not isinstance(t, torch.Tensor):
        return t
    base = t._base
    which = next((i for i, a in enumerate(args) if a is base), "another" if base is not None else None)
    meta = str(torch._C._autograd._get_creation_meta(t)) if t._is_view() else None
    return (t.detach().clone(), t.stride(), t.storage_offset(), t._is_view(), which, meta,
            t.requires_grad, t.is_leaf, grad_graph(t), t.is_inference(), t._version)


def attempt(fn, *args):
    """None, or what fn(*args) raised (type and message): each write a caller makes is
    tried and recorded, so that one refused write does not hide what the next does."""
    try:
        fn(*args)
    except Exception as e:  # compared between the two runs
        return type(e).__name__, str(e)
    return None


def observe(fn, after=None, mode=contextlib.nullcontext):
    """fn called under `mode`; then `after(outputs, args)` (a caller using what it got
    back, after the call returned); each returned tensor described before and after."""
    @functools.wraps(fn)
    def run(*args):
        with mode():
            out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        seen = [describe(o, args) for o in outs]
        effects = after(outs, args) if after is not None else None
        return seen, effects, [describe(o, args) for o in outs]
    return run


def check_observed(f, inputs, made, after=None, mode=contextlib.nullcontext, **kw):
    """`check` of f observed (see `observe`) on both sides, compiled by `made`."""
    return check(observe(f, after, mode), inputs, backend=made,
                 compiled=lambda counter: observe(frametrace.optimize(backend=counter)(f), after, mode),
                 **kw)


def writes(operand=lambda args: args[-1], grad=True):
    """A caller writing each returned tensor in place (times `operand(args)`, by default
    the last argument, which requires grad), with grad on or off."""
    def after(outs, args):
        with torch.set_grad_enabled(grad):
            return [attempt(o.mul_, operand(args)) for o in outs if isinstance(o, torch.Tensor)]
    return after


def needs_grad(args):
    return torch.ones(1, requires_grad=True)


MULTI = {
    "split": lambda r: r.view(4, 3).split(2)[1],
    "split_dim": lambda r: r.view(3, 4).split(2, dim=1)[1],
    "unbind": lambda r: r.view(3, 4).unbind(0)[2],
    "chunk": lambda r: r.view(4, 3).chunk(3, 1)[2],
    "split_view": lambda r: r.split(6)[1].view(2, 3),
    "unbind_t": lambda r: r.view(2, 6).unbind(1)[1].unsqueeze(0).t(),
    "chunk_view_t": lambda r: r.chunk(2)[0].view(2, 3).t(),
}


def assert_hits(made, taken, declined=0):
    """`taken` plans took the shortcut (from the second call on: the first runs the
    chain), `declined` never did."""
    hits = sorted(made.hits())
    assert len(hits) == taken + declined, hits
    assert hits[:declined] == [0] * declined and all(h >= 2 for h in hits[declined:]), hits


@pytest.mark.parametrize("name", list(MULTI))
def test_in_place_on_a_multi_output_view_with_grad_raises_as_in_cpython(name):
    take = MULTI[name]

    def f(x, w):
        # x needs no grad: one of split's outputs, written with w (which does) and grad
        # on, raises in CPython (the trace breaks there; the op runs on the graph's
        # output).  `y` is a chain of single views: its shortcut is right.
        v = take(torch.cos(x))
        y = torch.sin(x).view(3, 4).t()[1:]
        v.mul_(w[:1])
        return v, y

    made = Made()
    inputs = [(torch.randn(12), torch.randn(3, requires_grad=True)) for _ in range(3)]
    check_observed(f, inputs, made)
    assert_hits(made, taken=1, declined=1)


@pytest.mark.parametrize("name", list(MULTI))
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_a_caller_writing_returned_multi_output_views(name, mode):
    take = MULTI[name]

    def f(x, w):
        return take(torch.cos(x)), take(x), torch.sin(x).view(3, 4).t()[1:], w

    made = Made()
    inputs = [(torch.randn(12), torch.randn(1, requires_grad=True)) for _ in range(3)]
    context = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad,
               "inference_mode": torch.inference_mode}[mode]
    # With grad on, writing one of split's outputs (made with grad on) raises, and its
    # chain must run; made in no_grad or inference mode it is a plain view of its mode
    # (written with grad on, it raises for that reason), and one as_strided.
    check_observed(f, inputs, made, after=writes(), mode=context, graphs=1)
    assert_hits(made, taken=3 if mode != "grad" else 1, declined=2 if mode == "grad" else 0)


def test_the_multi_output_plan_takes_the_shortcut_only_with_grad_off():
    def f(x):
        return torch.cos(x).view(2, 6).split(3, dim=1)[1].t()

    made = Made()
    calls = [(torch.randn(12),) for _ in range(3)]
    check_observed(f, calls, made, mode=torch.no_grad, graphs=1)
    (plan,) = made.plans()
    assert views.hits(plan) >= 2
    before = views.hits(plan)
    check_observed(f, calls, made, after=writes(needs_grad), graphs=1)
    assert views.hits(plan) == before     # with grad on it ran the chain every time


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_chain_straddling_no_grad_keeps_each_steps_mode(requires_grad):
    def f(x, w):
        with torch.no_grad():
            a = torch.cos(x).view(3, 4)
            b = x.view(3, 4).t()               # two steps, both in no_grad: one as_strided
            e = x.view(12)
        c = a.t()[1:].unsqueeze(0)             # made with grad on, from a no_grad view
        d = torch.sin(x).view(2, 6).t()[1:]    # all with grad on
        g = e.view(2, 6).t()                   # from x's no_grad view, with grad on
        return b, c, d, g, w

    made = Made()
    inputs = [(torch.randn(12, requires_grad=requires_grad), torch.randn(1, requires_grad=True))
              for _ in range(3)]
    check_observed(f, inputs, made, after=writes(), graphs=1)
    if requires_grad:
        # b's root needs grad, but grad is off where b is made: the shortcut; c's root,
        # `a`, needs none; d and g record autograd: their chains run.
        assert_hits(made, taken=2, declined=2)
    else:
        assert_hits(made, taken=4)


def test_a_chain_straddling_enable_grad_under_a_no_grad_caller():
    def f(x):
        a = x.view(3, 4)                       # no_grad: the caller's
        with torch.enable_grad():
            b = a.t()[1:]                       # grad on, from a no_grad view
            c = x.view(4, 3).t()[0]             # grad on
        return b, c

    inputs = [(torch.randn(12, requires_grad=True),) for _ in range(3)]
    made = Made()
    check_observed(f, inputs, made, after=writes(needs_grad), mode=torch.no_grad, graphs=1)
    # x requires grad and grad is on where b and c are made: their chains run.
    assert_hits(made, taken=0, declined=2)
    inputs = [(torch.randn(12),) for _ in range(3)]
    made = Made()
    check_observed(f, inputs, made, after=writes(needs_grad), mode=torch.no_grad, graphs=1)
    assert_hits(made, taken=2)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_chain_straddling_a_mode_block(mode):
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]

    def f(x):
        with context():
            a = x.view(3, 4)
        return a.t()[1:].unsqueeze(0), x.view(2, 6).t()[0]

    made = Made()
    inputs = [(torch.randn(12),) for _ in range(3)]
    check_observed(f, inputs, made, after=writes(needs_grad))
    if mode == "no_grad":
        assert_hits(made, taken=2)
    # (a graph that enters inference mode is left as it is: no plan to count)


def test_a_write_between_steps_ends_the_chain():
    def f(x, w):
        v = x.view(3, 2)           # x needs no grad yet
        x.mul_(w)                  # now it does: v's autograd history is rebased
        y = torch.cos(w).view(2, 3).t()[1]
        return v.t().unsqueeze(0), y

    made = Made()
    inputs = [(torch.randn(6), torch.randn(6, requires_grad=True)) for _ in range(3)]
    check_observed(f, inputs, made, graphs=1)
    # After the write, the chain starts anew from v; v and cos(w) need grad: both run.
    assert_hits(made, taken=0, declined=2)
    made = Made()
    check_observed(f, [(torch.randn(6), torch.randn(6)) for _ in range(3)], made, graphs=1)
    assert_hits(made, taken=2)


def test_a_write_between_a_split_and_its_view():
    def f(x, w):
        v = x.split(2)[1]          # one of several outputs, x needing no grad
        x.mul_(w)                  # CPython raises at v's next view
        return v.view(-1), torch.cos(w).view(2, 3).t()[1]

    made = Made()
    inputs = [(torch.randn(6), torch.randn(6)) for _ in range(3)]
    check_observed(f, inputs, made, graphs=1)
    assert_hits(made, taken=1)
    made = Made()
    check_observed(f, [(torch.randn(6), torch.randn(6, requires_grad=True)) for _ in range(3)], made)


def test_base_identity_and_version_of_returned_views():
    def f(x, y):
        with torch.no_grad():
            a = x.view(3, 4)
        return a.t().unsqueeze(0)[0], y.t().unsqueeze(0).squeeze(0), y[1:].view(-1)[::2], \
            y.unbind(1)[0].view(2, 2)

    made = Made()
    inputs = [(torch.randn(12), torch.randn(4, 3)) for _ in range(3)]
    # Each write bumps the version the view shares with its base; split's output
    # refuses a write with grad.
    check_observed(f, inputs, made, after=writes(needs_grad), graphs=1)
    assert_hits(made, taken=3, declined=1)


@pytest.mark.parametrize("layout", ["transposed", "expanded", "channels_last", "offset"])
def test_roots_of_every_layout(layout):
    def root():
        if layout == "transposed":
            return torch.randn(6, 4).t()
        if layout == "expanded":
            return torch.randn(4, 1).expand(4, 6)
        if layout == "channels_last":
            return torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last)
        return torch.randn(30)[5:29].view(4, 6)

    def f(r, w):
        a = r.permute(1, 0, *range(2, r.dim())).unsqueeze(0)[0].narrow(0, 1, 2)
        b = r.unbind(0)[1].unsqueeze(0).transpose(0, -1)
        return a, b, w

    inputs = [(root(), torch.randn(1, requires_grad=True)) for _ in range(3)]
    made = Made()
    check_observed(f, inputs, made, after=writes())
    assert_hits(made, taken=1, declined=1)
    made = Made()
    check_observed(f, inputs, made, mode=torch.no_grad, after=writes())
    assert_hits(made, taken=2)


def test_root_requires_grad_toggled_between_calls():
    def f(x):
        return x.view(3, 4).t()[1:], x.split(6)[1].view(2, 3)

    made = Made()
    x = torch.randn(12)

    def toggle():
        x.requires_grad_(not x.requires_grad)

    inputs = [(x,), (x,), Then(toggle, x), Then(toggle, x), (x,), Then(toggle, x), (x,)]
    check_observed(f, inputs, made, after=writes(needs_grad), max_graphs=2)
    assert max(made.hits()) >= 2, made.hits()


def test_grad_mode_toggled_between_calls():
    def f(x):
        return x.split(4)[2].view(2, 2).t(), x.view(3, 4).t()[0]

    made = Made()
    state = {"grad": True}

    def flip():
        state["grad"] = not state["grad"]

    inputs = [(torch.randn(12),), (torch.randn(12),), Then(flip, torch.randn(12)),
              (torch.randn(12),), Then(flip, torch.randn(12)), Then(flip, torch.randn(12)),
              (torch.randn(12),)]
    check_observed(f, inputs, made, after=writes(needs_grad),
                   mode=lambda: torch.set_grad_enabled(state["grad"]), max_graphs=2)
    assert torch.is_grad_enabled()
    assert max(made.hits()) >= 2, made.hits()


def test_requires_grad_hooks_and_retain_grad_on_returned_views():
    def f(x):
        return torch.cos(x).view(3, 4).t()[1:], x.split(6)[0].view(2, 3)

    made = Made()
    inputs = [(torch.randn(12),) for _ in range(3)]

    def use(outs, args):
        a, b = outs
        a.requires_grad_()                 # a leaf now (its base needs no grad)
        grads = []
        a.register_hook(lambda g: grads.append(g.clone()))
        (a * 3).sum().backward()
        b.requires_grad_()
        b.retain_grad()
        with torch.no_grad():
            b.mul_(2)                      # fine in no_grad, whatever b's CreationMeta
        return grads, a.grad, attempt(b.add_, torch.ones(1, requires_grad=True))

    check_observed(f, inputs, made, after=use, graphs=1)
    assert_hits(made, taken=1, declined=1)


@pytest.mark.parametrize("outputs", [1, 2])
def test_a_custom_function_returning_a_compiled_view(outputs):
    # Its views come out IN_CUSTOM_FUNCTION (one output) or MULTI_OUTPUT_NODE (two).
    def inner(x):
        both = x.view(3, 4).t()[1:], x.chunk(2)[1].view(2, 3)
        return both if outputs == 2 else both[1]

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, run):
            return run(x)

        @staticmethod
        def backward(ctx, *g):
            return g[0].new_ones(12), None

    made = Made()
    compiled_inner = frametrace.optimize(made)(inner)
    for _ in range(3):
        x1 = torch.randn(12, requires_grad=True)
        x2 = x1.detach().clone().requires_grad_()
        want, got = F.apply(x1, inner), F.apply(x2, compiled_inner)
        if outputs == 1:
            want, got = (want,), (got,)
        for w, g in zip(want, got):
            assert describe(w, (x1,))[1:] == describe(g, (x2,))[1:]
            assert attempt(w.mul_, 2) == attempt(g.mul_, 2)
    # In forward grad is off: each chain is one as_strided.
    assert_hits(made, taken=outputs)


def test_the_switch_turns_the_shortcut_off(monkeypatch):
    def f(x):
        return torch.cos(x).view(3, 4).t()[1:], x.split(6)[1].view(2, 3)

    monkeypatch.setattr(frametrace.config, "view_chain_shortcut", False)
    made = Made()
    check_observed(f, [(torch.randn(12),) for _ in range(3)], made, after=writes(needs_grad))
    assert made.plans() == []
    ops = [n.target for m in made.modules for n in m.graph.nodes if n.op == "call_method"]
    assert "view" in ops and "t" in ops and "split" in ops


def test_view_replay_keeps_each_views_function():
    # With view replay on, each view records how to remake itself from its base, and
    # autograd remakes it so once the base is written: t() and narrow(), not as_strided.
    def f(x):
        return torch.cos(x).view(3, 4).t().narrow(0, 1, 2), x.view(4, 3).t()[1:]

    def write_bases(outs, args):
        args[0].mul_(torch.ones(1, requires_grad=True))    # x needs grad now
        return [grad_graph(o) for o in outs]

    made = Made()
    inputs = [(torch.randn(12),) for _ in range(3)]
    check_observed(f, inputs, made, after=write_bases,
                   mode=lambda: torch.autograd._force_original_view_tracking(True), graphs=1)
    assert_hits(made, taken=0, declined=2)
    # Without it, autograd remakes a view with as_strided: the shortcut is taken.
    made = Made()
    check_observed(f, inputs, made, after=write_bases, graphs=1)
    assert_hits(made, taken=2)


def test_a_chain_that_ends_on_one_of_its_own_steps():
    # flatten of a 1-d tensor is that tensor: here `b` is `a` itself, in CPython.
    def f(x):
        a = torch.cos(x).view(12)
        b = a.flatten().flatten()
        c = x.view(3, 4).t().flatten(0, 0)     # the flatten gives t()'s view itself
        return a, b, b is a, c, x.view(3, 4).t()[1:]

    made = Made()
    check_observed(f, [(torch.randn(12),) for _ in range(3)], made, after=writes(needs_grad))
    assert_hits(made, taken=2)
