"""Higher-order operators (torch.cond and its call forms, torch.while_loop, map and
torch._higher_order_ops' map, wrap, checkpoint, torch.func.jvp and functional_call): bodies
speculated into subgraphs of one graph, refused bodies breaking the graph at the call."""
import pytest
import torch
from functorch.experimental import control_flow
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.wrap import wrap

import frametrace
from differential import check

W = torch.randn(4)
LOG = []


@pytest.fixture(autouse=True)
def _grad_mode_on():
    # Gradients are what several tests compare: they must not depend on a grad mode an
    # earlier test left behind.
    with torch.enable_grad():
        yield


def _pos_neg():
    return [(torch.randn(4).abs(),), (-torch.rand(4) - 0.1,), (torch.randn(4).abs() + 1,)]


def test_cond_tensor_pred_one_graph_no_recompile_on_flip():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a.sin() + 1, lambda a: a.cos() * 2, (x,))
    r = check(f, _pos_neg(), fullgraph=True)
    assert r.graphs == 1 and r.compiles == 1 and r.breaks == 0


def test_cond_branches_read_closures_globals_and_frame_tensors():
    def f(x, y):
        z = x * 3

        def tb(a):
            return (a.sin() + W, z * 1)

        def fb(a):
            return (a * y, a + 1)
        return torch.cond(x.sum() > 0, tb, fb, (x,))
    for backend in ("eager", "aot_eager"):
        r = check(f, [(x, torch.randn(4)) for (x,) in _pos_neg()], fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1


def test_cond_module_branch_parameters_lifted():
    m = torch.nn.Linear(4, 4)

    def f(x):
        return torch.cond(x.sum() > 0, m, lambda a: a.cos(), (x,))
    r = check(f, _pos_neg(), fullgraph=True, backend="aot_eager")
    assert r.graphs == 1 and r.compiles == 1


def test_cond_python_bool_pred_traces_one_branch():
    def f(x, p):
        return torch.cond(p, lambda a: a.sin() * 2, lambda a: a.cos(), (x,))
    r = check(f, [(torch.randn(4), True), (torch.randn(4), True), (torch.randn(4), False)], fullgraph=True)
    assert r.graphs == 2 and r.breaks == 0


def test_cond_branch_appending_to_a_list_breaks_the_graph():
    def f(x):
        def tb(a):
            LOG.append(1)
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,)) + 1
    r = check(f, _pos_neg(), globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())


def test_cond_branch_mutating_a_frame_list_breaks_the_graph():
    def f(x):
        acc = []

        def tb(a):
            acc.append(a)
            return a.sin()
        out = torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,))
        return out, len(acc)
    r = check(f, _pos_neg())
    assert r.breaks >= 1


def test_cond_gradients_match_cpython():
    m = torch.nn.Linear(4, 4)

    def f(x):
        return torch.cond(x.sum() > 0, lambda a: (m(a) * a.sin()).sum(), lambda a: a.cos().sum(), (x,))
    for backend in ("eager", "aot_eager"):
        c = frametrace.optimize(backend=backend, fullgraph=True)(f)
        for (xi,) in _pos_neg():
            a, b = xi.clone().requires_grad_(), xi.clone().requires_grad_()
            m.zero_grad()
            f(a).backward()
            want_w = m.weight.grad.clone()
            m.zero_grad()
            c(b).backward()
            torch.testing.assert_close(a.grad, b.grad)
            torch.testing.assert_close(want_w, m.weight.grad)


def test_cond_symbolic_size_pred_keeps_both_branches():
    def f(x):
        return torch.cond(x.shape[0] > 4, lambda a: a.sin(), lambda a: a.cos(), (x,))
    r = check(f, [(torch.randn(3),), (torch.randn(6),), (torch.randn(8),), (torch.randn(2),)],
              fullgraph=True, dynamic=True)
    assert r.graphs == 1 and r.compiles == 1


def test_nested_cond_lifts_through_both_levels():
    def f(x, y):
        def inner(a):
            return torch.cond(a.mean() > 0, lambda b: b * y, lambda b: b - y, (a,))
        return torch.cond(x.sum() > 0, inner, lambda a: a.cos(), (x,))
    r = check(f, [(x, torch.randn(4)) for (x,) in _pos_neg()], fullgraph=True, backend="aot_eager")
    assert r.graphs == 1 and r.compiles == 1


def test_cond_branch_with_graph_break_breaks_the_outer_graph():
    def f(x):
        def tb(a):
            print("side")
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,)) * 2
    r = check(f, _pos_neg())
    assert r.breaks >= 1 and any("torch.cond true_fn cannot be traced" in s for s in r.reasons())


def test_cond_branch_writing_its_input_in_place_breaks_the_graph():
    def f(x):
        def tb(a):
            a.add_(1)
            return a.sin()
        return torch.cond(x.sum() > 0, tb, lambda a: a.cos(), (x,))
    r = check(f, _pos_neg())
    assert r.breaks >= 1 and any("writes in place to an input" in s for s in r.reasons())


def test_while_loop_one_graph_with_lifted_closure():
    def f(i, x, w):
        def body(i, x):
            return i + 1, x * w + 1
        return torch.while_loop(lambda i, x: i < 4, body, (i, x))
    for backend in ("eager", "aot_eager"):
        r = check(f, [(torch.tensor(0), torch.randn(3), torch.randn(3)),
                      (torch.tensor(2), torch.randn(3), torch.randn(3))], fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1


def test_while_loop_body_changing_shape_breaks_the_graph():
    def f(x):
        return torch.while_loop(lambda x: x.sum() < 100, lambda x: (x.repeat(2),), (x,))
    r = check(f, [(torch.ones(2),)], graphs=None)
    # (Only f's own compiles: CPython's while_loop runs torch's compiler, during which a
    # GC callback another library installed may be traced too.)
    mine = [x for x in r.records if x.code is f.__code__]
    assert [x.outcome for x in mine] == ["break"] and "metadata" in mine[0].reason
    assert mine[0].graph_module is None or not any(
        n.op == "call_function" for n in mine[0].graph_module.graph.nodes)


def _checkpoint_case():
    from torch.utils.checkpoint import checkpoint
    lin = torch.nn.Linear(8, 8)

    def region(a, b):
        return (lin(a).relu() * b).sin().cos()

    def f(x, y):
        return checkpoint(region, x, y, use_reentrant=False).sum()

    def plain(x, y):
        return region(x, y).sum()
    return lin, f, plain


def test_checkpoint_values_and_gradients_match_cpython():
    lin, f, _ = _checkpoint_case()
    r = check(f, [(torch.randn(4, 8), torch.randn(4, 8)), (torch.randn(4, 8), torch.randn(4, 8))],
              fullgraph=True)
    assert r.graphs == 1
    for backend in ("eager", "aot_eager"):
        c = frametrace.optimize(backend=backend, fullgraph=True)(f)
        for _ in range(2):
            x, y = torch.randn(4, 8), torch.randn(4, 8)
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            lin.zero_grad()
            f(a, y).backward()
            want = lin.weight.grad.clone()
            lin.zero_grad()
            c(b, y).backward()
            torch.testing.assert_close(a.grad, b.grad)
            torch.testing.assert_close(want, lin.weight.grad)


def test_checkpoint_region_is_recomputed_in_the_aot_eager_backward():
    _, f, plain = _checkpoint_case()

    def saved_by(fn):
        saved = []
        x = torch.randn(4, 8, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn(x, torch.randn(4, 8))
        out.backward()
        return len(saved)
    with_ckpt = saved_by(frametrace.optimize(backend="aot_eager", fullgraph=True)(f))
    without = saved_by(frametrace.optimize(backend="aot_eager", fullgraph=True)(plain))
    # Only the region's inputs (x, y, weight, bias) are kept; its intermediates are not.
    assert with_ckpt == 4 and without > with_ckpt


def test_checkpoint_over_random_ops_compiles():
    # (its recompute draws the forward's numbers again: tests/test_model_loops.py)
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(lambda a: torch.nn.functional.dropout(a, 0.5).sin(), x,
                          use_reentrant=False) + 1
    r = check(f, [(torch.randn(8),), (torch.randn(8),)])
    assert r.breaks == 0 and r.graphs == 1, r


# ------------------------------------------- wrap, map, cond call forms, jvp, functional_call
G = torch.randn(3)


def _xy(n=3):
    return [(torch.randn(3), torch.randn(3)) for _ in range(n)]


def _wrap_nodes(r):
    return [n for gm in r.counter.graphs for n in gm.graph.nodes if n.target is wrap]


def _grads_match(f, inputs, backend):
    c = frametrace.optimize(backend=backend, fullgraph=True)(f)
    for args in inputs:
        a = [t.clone().requires_grad_() for t in args]
        b = [t.clone().requires_grad_() for t in args]
        sum(o.sum() for o in torch.utils._pytree.tree_leaves(f(*a))).backward()
        sum(o.sum() for o in torch.utils._pytree.tree_leaves(c(*b))).backward()
        for u, v in zip(a, b):
            torch.testing.assert_close(u.grad, v.grad)


# ---------------------------------------------------------------- wrap
def test_wrap_lifts_closures_globals_and_module_parameters_into_one_node():
    m = torch.nn.Linear(3, 3)

    def f(x, y):
        z = x * 2

        def body(a, b=None):
            return a.sin() + G + z, m(b)
        return wrap(body, x, b=y)
    for backend in ("eager", "aot_eager"):
        r = check(f, _xy(), fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1 and r.breaks == 0
        (node,) = _wrap_nodes(r)
        # The body's module, then x and y, then the lifted z, G and m's parameters.
        assert node.args[0].op == "get_attr" and len(node.args) == 1 + 2 + 4
        _grads_match(f, _xy(2), backend)


def test_wrap_body_side_effect_breaks_the_graph_and_runs_in_cpython():
    def f(x):
        def body(a):
            LOG.append(1)
            return a.cos()
        return wrap(body, x) + 1
    r = check(f, [(torch.randn(3),), (torch.randn(3),)], globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())
    assert not _wrap_nodes(r)


def test_wrap_body_writing_its_input_in_place_breaks_the_graph():
    def f(x):
        return wrap(lambda a: a.add_(1) * 2, x)
    r = check(f, [(torch.randn(3),), (torch.randn(3),)])
    assert r.breaks >= 1 and any("in place" in s for s in r.reasons()) and not _wrap_nodes(r)


def test_wrap_returns_a_passed_tensor_as_that_object_and_dict_results():
    def f(x, y):
        out = wrap(lambda a: (a, {"s": a.sin(), "c": y * 2}), x)
        return out[0] is x, out[1]["s"] + out[1]["c"], sorted(out[1])
    r = check(f, _xy(), fullgraph=True)
    assert r.graphs == 1 and len(_wrap_nodes(r)) == 1


def test_wrap_returning_a_view_of_its_input_aliases_it():
    def f(x):
        n = x.size(0) - 1
        v = wrap(lambda a: a[1:], x)
        w = wrap(lambda a, k: a.view(k, -1), x, n + 1)
        v.mul_(2)
        return x + 0, w * 1, v.sum()
    for backend in ("eager", "aot_eager"):
        r = check(f, [(torch.randn(4),), (torch.randn(5),), (torch.randn(6),)], backend=backend,
                  fullgraph=True)
        assert r.breaks == 0 and 1 <= r.graphs <= 2


class _Box:
    def __init__(self, t):
        self.val = t


def test_wrap_takes_any_argument_and_lifts_the_tensors_it_reads():
    def f(x, box):
        return wrap(lambda z, flag=True: z[0].sin() * z[1].val.cos() if flag else z[0], (x, box))
    r = check(f, [(torch.randn(3), _Box(torch.randn(3))) for _ in range(3)], fullgraph=True)
    assert r.graphs == 1 and r.compiles == 1


def test_nested_wrap_lifts_through_both_levels():
    def f(x):
        return wrap(lambda a: wrap(lambda b: b * G, a) + x.cos(), x)
    r = check(f, [(torch.randn(3),), (torch.randn(3),)], fullgraph=True, backend="aot_eager")
    assert r.graphs == 1 and len(_wrap_nodes(r)) == 1


def test_lambda_with_constant_defaults_in_a_compiled_frame():
    def f(x):
        g = lambda a, k=2, s=None: a * k if s is None else a
        return g(x) + 1
    r = check(f, [(torch.randn(3),), (torch.randn(3),)], fullgraph=True)
    assert r.graphs == 1


# ---------------------------------------------------------------- map
def test_map_over_leading_dim_with_extra_args_and_globals():
    def f(xs, y):
        return control_flow.map(lambda x, y: (x.sin() * y + G, {"a": x.cos()}["a"]), xs, y)
    inputs = [(torch.randn(2, 3), torch.randn(3)), (torch.randn(4, 3), torch.randn(3)),
              (torch.randn(4, 3), torch.randn(3))]
    for backend in ("eager", "aot_eager"):
        r = check(f, inputs, fullgraph=True, backend=backend)
        assert r.graphs >= 1 and r.breaks == 0
        assert any(n.target is torch.ops.higher_order.map_impl
                   for gm in r.counter.graphs for n in gm.graph.nodes)
        _grads_match(f, inputs, backend)


def test_map_pytree_xs_and_pytree_result():
    def f(a, b):
        out = hop_map(lambda d: {"sum": d["p"][0] + d["q"], "prod": [d["p"][0] * d["q"]]},
                      {"p": (a,), "q": b})
        return out["sum"], out["prod"][0]
    r = check(f, [(torch.randn(2, 3), torch.randn(2, 3)) for _ in range(3)], fullgraph=True)
    assert r.graphs == 1 and r.breaks == 0


def test_map_body_side_effect_breaks_the_graph():
    def f(xs):
        def body(x):
            LOG.append(0)
            return x + 1
        return control_flow.map(body, xs * 2)
    r = check(f, [(torch.randn(2, 3),)], globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())


# ---------------------------------------------------------------- torch.cond call forms
def test_cond_without_operands_reads_closures():
    def f(p, x):
        return torch.cond(p, lambda: x.sin(), lambda: x.cos())

    def g(p, x):
        return torch.cond(p, lambda: x.sin() + G, lambda: x.cos(), ())
    for fn in (f, g):
        r = check(fn, [(torch.tensor(True), torch.randn(3)), (torch.tensor(False), torch.randn(3))],
                  fullgraph=True)
        assert r.graphs == 1 and r.compiles == 1


def test_cond_pytree_operands():
    def f(x, d):
        return torch.cond(x.sum() > 0, lambda d: d["a"] + d["b"][0][0], lambda d: d["a"] - d["b"][1],
                          (d,))

    def inp(sign):
        return (sign * torch.rand(3) + 0.1 * sign,
                {"a": torch.randn(3), "b": ([torch.randn(3)], torch.randn(3))})
    for backend in ("eager", "aot_eager"):
        r = check(f, [inp(1), inp(-1), inp(1)], fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1


# ---------------------------------------------------------------- torch.func.jvp
def test_jvp_of_closures_builtins_and_has_aux_in_one_graph():
    def f(x, v, y):
        a = torch.func.jvp(lambda x, y: (x.sin() * y + G, x.cos()), (x, y), (v, v))
        b = torch.func.jvp(torch.sin, (x,), (v,))
        c = torch.func.jvp(lambda x: (x * 2, {"aux": x + 1}), (x,), (v,), has_aux=True)
        return a, b, c
    inputs = [(torch.randn(3), torch.randn(3), torch.randn(3)) for _ in range(3)]
    for backend in ("eager", "aot_eager"):
        r = check(f, inputs, fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1 and r.breaks == 0
        _grads_match(f, inputs[:2], backend)


def test_jvp_body_side_effect_breaks_the_graph():
    def f(x, v):
        def body(a):
            LOG.append(1)
            return a * 2
        return torch.func.jvp(body, (x * 1,), (v,))
    r = check(f, [(torch.randn(3), torch.randn(3))], globals=("LOG",))
    assert r.breaks >= 1 and any("side effect" in s for s in r.reasons())


# ---------------------------------------------------------------- torch.func.functional_call
_SEQ = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _params(names=None, cls=torch.nn.Parameter):
    return {k: cls(torch.randn_like(v)) for k, v in _SEQ.named_parameters()
            if names is None or k in names}


def test_functional_call_uses_the_given_parameters_and_the_module_s_for_the_rest():
    def f(params, x, t):
        pred = torch.func.functional_call(_SEQ, params, (x,))
        return torch.nn.functional.mse_loss(pred, t)
    full = [(_params(), torch.randn(4, 3), torch.randn(4, 2)) for _ in range(3)]
    for backend in ("eager", "aot_eager"):
        r = check(f, full, fullgraph=True, backend=backend)
        assert r.graphs == 1 and r.compiles == 1
        c = frametrace.optimize(backend=backend, fullgraph=True)(f)
        for params, x, t in full:
            ga = torch.autograd.grad(f(params, x, t), list(params.values()))
            gb = torch.autograd.grad(c(params, x, t), list(params.values()))
            for u, v in zip(ga, gb):
                torch.testing.assert_close(u, v)
    # Some parameters given, the others the module's own (a recompile for the other keys).
    r = check(f, [(_params({"0.weight"}), torch.randn(4, 3), torch.randn(4, 2)) for _ in range(2)],
              fullgraph=True)
    assert r.graphs == 1


def test_functional_call_with_mismatched_shapes_breaks_the_graph():
    # Traced with the given tensors: the shape error is CPython's, raised there.
    def f(params, x):
        return torch.func.functional_call(_SEQ, params, x * 1)
    bad = {"0.weight": torch.nn.Parameter(torch.randn(3, 3)), "0.bias": torch.nn.Parameter(torch.randn(5))}
    r = check(f, [(bad, torch.randn(4, 3))])
    assert r.breaks >= 1


def test_functional_call_with_plain_tensors_for_parameters_compiles():
    # The module's code sees the given Tensors, as CPython's call swaps them in.
    def f(params, x):
        return torch.func.functional_call(_SEQ, params, x * 1)
    r = check(f, [(_params(cls=lambda t: t.requires_grad_()), torch.randn(4, 3)) for _ in range(2)])
    assert r.breaks == 0 and r.graphs == 1, r


def test_wrap_passes_only_the_inputs_its_body_reads():
    def f(x, y):
        return wrap(lambda a, b, c=None: (G.sin(), b * 2), x, y)
    r = check(f, _xy(), fullgraph=True)
    (node,) = _wrap_nodes(r)
    assert r.graphs == 1 and len(node.args) == 1 + 2      # the body, y and G


def test_nested_hints_wrapper_one_graph_with_hints_kept():
    from torch._higher_order_ops.hints_wrap import hints_wrapper

    def f(x, y):
        x = x + y

        def inner(x, y):
            return torch.relu(x) + y

        def outer(x, y):
            return torch.abs(hints_wrapper(inner, (x, y), {}, hints={"inner": True}))
        return hints_wrapper(outer, (x, y), {}, hints={"outer": True})
    for backend in ("eager", "aot_eager"):
        r = check(f, [(torch.randn(2, 4), torch.randn(4)) for _ in range(3)], fullgraph=True,
                  backend=backend)
        assert r.graphs == 1 and r.compiles == 1
    nodes = [n for gm in r.counter.graphs for n in gm.graph.nodes if n.target is hints_wrapper]
    assert [n.kwargs["hints"] for n in nodes] == [{"outer": True}]


def test_map_body_reading_strides_breaks_the_graph():
    def f(xs):
        return control_flow.map(lambda x: x * 2 if x.is_contiguous() else x + 1, xs.t())
    r = check(f, [(torch.randn(3, 2),)])
    assert r.breaks >= 1 and any("layout" in s for s in r.reasons())


class _Obj:
    pass


GOBJ = _Obj()
GOBJ.a = 1
GMOD = torch.nn.Linear(3, 3)
GNUM = 2.0
GT = torch.zeros(3)


def _body_side_effects():
    def set_attr(a):
        GOBJ.a = 5
        return a + 1

    def del_attr(a):
        del GOBJ.a
        return a + 1

    def new_attr_module(a):
        GMOD.extra = 3
        return a + 1

    def global_num(a):
        global GNUM
        GNUM += 1
        return a * GNUM

    def global_tensor_in_place(a):
        GT.add_(1)
        return a + GT

    return [set_attr, del_attr, new_attr_module, global_num, global_tensor_in_place]


@pytest.mark.parametrize("body", _body_side_effects(), ids=lambda b: b.__name__)
def test_wrap_body_changing_outside_state_breaks_the_graph(body):
    def f(x):
        y = x * 2
        return wrap(body, y)
    r = check(f, [(torch.randn(3),), (torch.randn(3),)], globals=("GNUM", "GT", "GOBJ"))
    assert r.breaks >= 1 and not _wrap_nodes(r)
    assert any("the function given to wrap" in s for s in r.reasons())


def test_wrap_body_mutating_a_nonlocal_breaks_the_graph():
    def f(x):
        count = 0
        acc = []

        def body(a):
            nonlocal count
            count += 1
            acc.append(a)
            return a.sin()
        out = wrap(body, x * 1)
        return out, count, len(acc)
    r = check(f, [(torch.randn(3),), (torch.randn(3),)])
    assert r.breaks >= 1 and not _wrap_nodes(r)
    assert any("side effect" in s for s in r.reasons())
