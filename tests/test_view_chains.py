"""The eager backend runs a chain of view ops as one `as_strided`
(frametrace/backends/view_chains.py, frametrace/_C/views.cpp).

Every test compares with CPython on fresh inputs over several calls: values, and
what views carry besides values (sizes, strides, storage offset, which storage they
share with the inputs, conj bits, gradients).  Each also checks the shortcut was
really built and taken (a plan that remembers a geometry), or really declined where
it must be."""
import itertools

import pytest
import torch

import frametrace
from differential import check
from frametrace.backends import view_chains
from frametrace.backends.eager import eager as eager_backend

views = view_chains._module()
needs_cxx = pytest.mark.skipif(views is None, reason="frametrace._views not built")


class Made:
    """A backend that is the eager backend, keeping the graph modules it made."""

    __frametrace_backend__ = True
    __frametrace_runs_ops_as_traced__ = True

    def __init__(self):
        self.modules = []

    def __call__(self, gm, example_inputs):
        fn = eager_backend(gm, example_inputs)
        self.modules.append(fn.__self__)
        return fn

    def plans(self):
        return [getattr(m, n.target) for m in self.modules for n in m.graph.nodes
                if n.op == "get_attr" and n.target.startswith("_view_plan_")]

    def ops(self):
        return [n.target for m in self.modules for n in m.graph.nodes
                if n.op in ("call_function", "call_method")]


def geometry(t):
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.is_conj()


def run_both(fn, inputs, backend=None):
    """fn in CPython and compiled on copies of each input tuple; values, geometry and
    storage sharing with the inputs compared for every tensor returned."""
    backend = backend or Made()
    compiled = frametrace.optimize(backend)(fn)
    for args in inputs:
        a = [x.clone() if isinstance(x, torch.Tensor) and x._base is None else x for x in args]
        b = [x.clone() if isinstance(x, torch.Tensor) and x._base is None else x for x in args]
        want, got = fn(*a), compiled(*b)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(want) == len(got)
        for i, (w, g) in enumerate(zip(want, got)):
            assert geometry(w) == geometry(g), (i, geometry(w), geometry(g))
            torch.testing.assert_close(g.resolve_conj(), w.resolve_conj(), rtol=0, atol=0)
            for x, y in zip(a, b):
                if isinstance(x, torch.Tensor):
                    assert (w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == \
                        (g.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()), i
    return backend


def attention_heads(x, w, b):
    qkv = torch.addmm(b, x.view(-1, x.size(-1)), w).view(1, x.size(1), 3 * 16)
    q, k, v = qkv.split(16, dim=2)
    q = q.view(1, x.size(1), 4, 4).transpose(1, 2)
    k = k.view(1, x.size(1), 4, 4).transpose(1, 2)
    v = v.view(1, x.size(1), 4, 4).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return o.transpose(1, 2).reshape(1, x.size(1), 16).view(-1, 16), k, v


@needs_cxx
def test_attention_heads_are_one_as_strided_each_and_the_shortcut_is_taken():
    inputs = [(torch.randn(1, 3, 8), torch.randn(8, 48), torch.randn(48)) for _ in range(4)]
    made = Made()
    with torch.no_grad():
        run_both(attention_heads, inputs, backend=made)
    assert len(made.modules) == 1
    plans = made.plans()
    # q, k, v each from addmm in one step; the output's transpose/reshape/view in one.
    assert len(plans) == 4, made.ops()
    assert "split" not in made.ops() and "transpose" not in made.ops(), made.ops()
    assert all(views.known(p) and views.hits(p) == 3 for p in plans)
    with torch.no_grad():
        check(attention_heads, inputs, backend=made, graphs=1, breaks=0)
    # With grad on, one of split's outputs is not a view as_strided could make (autograd
    # refuses to write it in place): q, k and v run their chains; the output's is one
    # as_strided still.
    made = run_both(attention_heads, inputs)
    assert sorted(views.hits(p) for p in made.plans()) == [0, 0, 0, 3]
    check(attention_heads, inputs, backend=made, graphs=1, breaks=0)


@needs_cxx
def test_a_root_whose_storage_offset_moves_between_calls_is_still_right():
    # Guards check sizes and strides; the offset of a slice of a larger buffer is not
    # theirs to check.  The plan sees the root's geometry change and runs the chain.
    def f(x):
        return x.view(2, 6).t().unsqueeze(0).narrow(2, 1, 1)

    buf = torch.arange(40.0)
    made = Made()
    compiled = frametrace.optimize(made)(f)
    for start in (0, 3, 3, 7, 0, 12):
        x = buf[start:start + 12]
        want, got = f(x), compiled(x)
        assert geometry(want) == geometry(got)
        assert torch.equal(want, got)
        assert got.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    (plan,) = made.plans()
    assert views.known(plan)
    assert len(made.modules) == 1, "an offset change should not need a new graph"


@needs_cxx
def test_the_chains_end_written_in_place_writes_the_input():
    def f(x):
        y = x.view(3, 4).transpose(0, 1)[1:3]
        y.mul_(10)
        return y

    inputs = [(torch.randn(12),) for _ in range(3)]
    made = run_both(f, inputs)
    assert len(made.plans()) == 1
    check(f, inputs, backend=Made(), graphs=1)


@needs_cxx
def test_a_reshape_that_copies_ends_the_chain():
    def f(x):
        y = x.t().reshape(-1)            # a copy: x.t() is not contiguous
        return y.view(4, 3).transpose(0, 1).unsqueeze(0), x.t().unsqueeze(1).squeeze(1)

    inputs = [(torch.randn(3, 4),) for _ in range(3)]
    made = run_both(f, inputs)
    for p in made.plans():
        assert views.known(p)
    assert "reshape" in made.ops()
    check(f, inputs, backend=Made(), graphs=1)


@needs_cxx
def test_chains_of_every_view_op_match_eager():
    steps = [
        lambda t: t.view(-1),
        lambda t: t.transpose(0, -1),
        lambda t: t.unsqueeze(1),
        lambda t: t.squeeze(),
        lambda t: t.flatten(),
        lambda t: t.permute(*reversed(range(t.dim()))),
        lambda t: t.narrow(0, 0, max(1, t.shape[0] // 2)),
        lambda t: t.select(0, 0) if t.dim() > 1 else t,
        lambda t: t.expand(2, *t.shape),
        lambda t: t.movedim(0, -1),
        lambda t: t.split(1, dim=0)[0],
        lambda t: t.chunk(2, dim=-1)[-1],
        lambda t: t.unbind(0)[0] if t.dim() > 1 else t,
        lambda t: t[..., None, ::2],
        lambda t: t.diagonal() if t.dim() >= 2 else t,
        lambda t: t.unfold(-1, 1, 1),
    ]
    multi = {steps[10], steps[11], steps[12]}     # split, chunk, unbind: several outputs
    plans = []
    single = 0
    for i, (s1, s2, s3) in enumerate(itertools.islice(itertools.product(steps, repeat=3), 0, None, 29)):
        def f(x, s1=s1, s2=s2, s3=s3):
            a = torch.sin(x)            # the root: made in the graph
            return s3(s2(s1(a))), s2(s1(x))
        try:
            f(torch.randn(4, 6))
        except RuntimeError:
            continue                    # not a valid chain in eager either
        frametrace.reset()              # one code object for every f: a fresh cache each
        with torch.no_grad():
            made = run_both(f, [(torch.randn(4, 6),), (torch.randn(4, 6),)])
        assert len(made.modules) == 1, i
        plans += made.plans()
        # With grad on, a chain with one of several outputs in it runs its chain.
        frametrace.reset()
        made = run_both(f, [(torch.randn(4, 6),), (torch.randn(4, 6),)])
        if not {s1, s2, s3} & multi:
            single += len(made.plans())
            assert all(views.known(p) for p in made.plans()), i
    assert len(plans) > 100 and single > 30, (len(plans), single)
    assert all(views.known(p) for p in plans)


@needs_cxx
def test_a_root_that_requires_grad_runs_the_chain_and_gradients_match():
    def f(x, w):
        h = (x @ w).view(2, 3, 4).transpose(1, 2)[:, 1]
        return (h * h).sum(), h

    def inputs():
        return [(torch.randn(6, 5), torch.randn(5, 4, requires_grad=True)) for _ in range(3)]

    made = Made()
    compiled = frametrace.optimize(made)(f)
    for (x, w) in inputs():
        w2 = w.detach().clone().requires_grad_()
        (loss, h), (loss2, h2) = f(x, w), compiled(x, w2)
        assert geometry(h) == geometry(h2) and h2.requires_grad and h2.grad_fn is not None
        loss.backward(), loss2.backward()
        torch.testing.assert_close(w2.grad, w.grad)
    assert made.plans()
    assert not any(views.known(p) for p in made.plans())   # the chain ran every time


@needs_cxx
def test_under_no_grad_a_parameter_root_takes_the_shortcut():
    lin = torch.nn.Linear(4, 12)

    def f(x):
        return lin(x).view(2, 3, 4).transpose(1, 2)[0], lin.weight.t().unsqueeze(0)

    made = Made()
    with torch.no_grad():
        run_both(f, [(torch.randn(2, 4),) for _ in range(3)], backend=made)
    assert made.plans() and all(views.known(p) for p in made.plans())
    # The same compiled graph with grad on runs the chain for the parameter.
    got = frametrace.optimize(made)(f)(torch.randn(2, 4))
    assert got[1].requires_grad and got[1].grad_fn is not None


@needs_cxx
def test_a_dispatch_mode_sees_the_views_not_as_strided():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    def f(x):
        return torch.cos(x).view(2, 6).t().unsqueeze(0)

    made = Made()
    compiled = frametrace.optimize(made)(f)
    x = torch.randn(12)
    compiled(x), compiled(x)
    assert views.known(made.plans()[0])
    with Log() as log:
        got = compiled(x)
    assert torch.equal(got, f(x)) and geometry(got) == geometry(f(x))
    assert "aten.as_strided" not in log.ops and "aten.t" in log.ops, log.ops
    assert len(made.modules) == 1      # the graph compiled before the mode, run under it


@needs_cxx
def test_conjugate_and_batched_roots_run_the_chain():
    def f(x):
        return x.view(2, 6).t().unsqueeze(0).squeeze(0)

    made = run_both(f, [(torch.randn(12, dtype=torch.complex64).conj(),),
                        (torch.randn(12, dtype=torch.complex64),),
                        (torch.randn(12, dtype=torch.complex64).conj(),)])
    assert made.plans()
    xs = torch.randn(3, 12)
    torch.testing.assert_close(torch.vmap(frametrace.optimize(Made())(f))(xs), torch.vmap(f)(xs))


@needs_cxx
def test_forward_mode_tangents_follow_the_chain():
    import torch.autograd.forward_ad as fwAD

    def f(x):
        return torch.sin(x).view(3, 4).t()[1:].unsqueeze(0)

    made = Made()
    compiled = frametrace.optimize(made)(f)
    x = torch.randn(12)
    compiled(x), compiled(x)
    assert views.known(made.plans()[0])
    # A tangent strided unlike its primal: as_strided with the primal's strides
    # would read the wrong elements of it.
    for t in (torch.randn(12), torch.randn(24)[::2]):
        with fwAD.dual_level():
            want = fwAD.unpack_dual(f(fwAD.make_dual(x, t)))
            got = fwAD.unpack_dual(compiled(fwAD.make_dual(x, t)))
        torch.testing.assert_close(got.primal, want.primal)
        torch.testing.assert_close(got.tangent, want.tangent)


def test_a_graph_that_moves_geometry_in_place_is_left_as_it_is():
    def f(x):
        y = x.view(3, 4)
        y.t_()
        return y.unsqueeze(0).transpose(1, 2), y

    made = run_both(f, [(torch.randn(12),) for _ in range(3)])
    assert made.plans() == []
    assert view_chains.collapse(made.modules[0]) is None


def test_without_the_cxx_module_each_view_runs(monkeypatch):
    monkeypatch.setattr(view_chains, "_module", lambda: None)
    made = run_both(attention_heads, [(torch.randn(1, 3, 8), torch.randn(8, 48), torch.randn(48))])
    assert made.plans() == [] and "split" in made.ops()


@needs_cxx
def test_dynamic_shapes_stay_right():
    def f(x):
        return x.view(x.shape[0], 2, -1).transpose(1, 2).unsqueeze(0)[0]

    made = run_both(f, [(torch.randn(n, 8),) for n in (2, 3, 5, 7, 3)],
                    backend=Made())
    assert made.modules


def test_ci_builds_the_views_module():
    # The eager backend's per-call speed on whole models rests on it: a build that
    # silently dropped it would pass every other test here as skipped.
    import os
    if os.environ.get("FRAMETRACE_NO_CXX"):
        pytest.skip("built without C++ on purpose")
    assert views is not None


@needs_cxx
@pytest.mark.parametrize("grad", [False, True], ids=["shortcut", "chain"])
def test_many_calls_keep_memory_and_refcounts_flat(grad):
    from test_leaks import HIT_BYTES, assert_flat, measure, refcounts

    def f(x):
        return torch.cos(x).view(2, 6).t().unsqueeze(0)

    made = Made()
    compiled = frametrace.optimize(made)(f)
    x = torch.randn(12, requires_grad=grad)
    compiled(x)
    (plan,) = made.plans()
    assert views.known(plan) is not grad

    def run(n):
        for _ in range(n):
            compiled(x)

    growth = measure(run, 20_000, warmup=500, refs=lambda: refcounts(x=x, plan=plan))
    assert_flat(growth, HIT_BYTES)
    assert len(made.modules) == 1


@needs_cxx
def test_a_graph_with_a_pytree_signature_keeps_it():
    # The eager backend may be handed any FX graph, say one traced with concrete_args.
    def f(d):
        return d["x"].view(2, 6).t().unsqueeze(0), d["y"] + 1

    from torch.fx._symbolic_trace import PH
    gm = torch.fx.symbolic_trace(f, concrete_args={"d": {"x": PH, "y": PH}})
    x, y = torch.randn(12), torch.randn(3)

    class Record(torch.fx.Interpreter):   # the example values the backend reads
        def run_node(self, n):
            n.meta["example_value"] = out = super().run_node(n)
            return out

    Record(gm).run(x, y)
    new = view_chains.collapse(gm)
    assert new is not None and len(new.graph.find_nodes(op="get_attr")) == 1
    got, want = new.forward({"x": x, "y": y}), f({"x": x, "y": y})
    assert torch.equal(got[0], want[0]) and geometry(got[0]) == geometry(want[0])
    assert torch.equal(got[1], want[1])


# -- a write through a view of a chunk output (found by the program fuzzer) --
def write_through_a_chunk_view(x, w):
    v = x.chunk(2)[0]
    u = v.t()
    u.add_(w.sum())
    return (v * w.sum()).sum()


def test_write_through_a_view_of_a_chunk_output_with_an_operand_that_requires_grad():
    # (views family; 8 of 80 programs on 32f4331, none on main) a multi-output view's
    # view written in place with an operand that requires grad: eager raises "...is a
    # view and is being modified inplace...", the view-chain shortcut raised another error
    calls = [(torch.arange(12.0).view(4, 3), torch.ones(2, requires_grad=True)),
             (torch.arange(12.0).view(4, 3) - 5, torch.ones(2, requires_grad=True)),
             (torch.arange(12.0).view(4, 3), torch.ones(2))]
    r = check(write_through_a_chunk_view, calls)
    assert r.graphs >= 1
