"""Ops that give their argument back and change nothing (contiguous() of a contiguous
tensor, to() its own dtype, dropout in eval) record no graph node: the traced value is
the argument itself, and a node every call would run for nothing is left out.  Ops that
give their argument back after writing it (in place, out=, requires_grad_) keep theirs."""
import pytest
import torch
import torch.nn.functional as F

import frametrace
from differential import Call, check


def targets(report):
    """The ops of the graphs compiled (each call's inputs may compile one)."""
    return sorted({str(n.target) for gm in report.counter.graphs for n in gm.graph.nodes
                   if n.op in ("call_function", "call_method")})


def test_no_op_calls_leave_no_nodes():
    def f(x, w):
        y = x.contiguous().to(torch.float32).float()
        y = F.dropout(y, 0.5, training=False)
        y = torch.nn.functional.dropout(y, p=0.5, training=False, inplace=False)
        return (y @ w).type_as(y)

    r = check(f, [(torch.randn(4, 3), torch.randn(3, 2)), (torch.randn(4, 3), torch.randn(3, 2))])
    assert targets(r) == ["<built-in function matmul>"], targets(r)


def test_writes_that_return_their_argument_stay_in_the_graph():
    def f(x, y):
        a = x.add_(1)                       # an input written in place
        b = torch.relu_(y.clone())
        c = F.relu(b, inplace=True)
        torch.mul(a, 2, out=y)              # an input written through out=
        d = x.clone()
        d.t_()                              # metadata changed in place
        e = F.dropout(d, 0.5, training=False, inplace=True)
        return a, c, d, e

    r = check(f, [(torch.randn(3, 3), torch.randn(3, 3)), (torch.randn(3, 3), torch.randn(3, 3))])
    ops = targets(r)
    assert "add_" in ops and any("relu" in t for t in ops) and "t_" in ops, ops


def test_requires_grad_of_a_graph_tensor_is_kept():
    def f(x):
        w = x.detach().clone()
        w.requires_grad_()
        return (w * 2).sum(), w.requires_grad

    check(f, [torch.randn(3), torch.randn(4)], max_graphs=4, graphs=None)


def test_inference_tensors_trace():
    # (an inference tensor has no version counter to compare)
    errors = frametrace.convert.counters["internal_error"]
    cnt = frametrace.testing.CompileCounter()
    f = frametrace.optimize(backend=cnt)(lambda x: x.contiguous().float() + 1)
    with torch.inference_mode():
        x = torch.randn(3)
        assert torch.equal(f(x), x + 1)
    assert frametrace.convert.counters["internal_error"] == errors and cnt.frame_count == 1


def test_eval_dropout_module_in_a_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3), torch.nn.ReLU()).eval()
    r = check(lambda m, x: m(x), [Call(model, torch.randn(2, 4)), Call(model, torch.randn(2, 4))])
    assert not any("dropout" in t for t in targets(r)), targets(r)


_LIB = torch.library.Library("ft_noop_test", "DEF")
_LIB.define("bump(Tensor(a!) x) -> Tensor(a!)")


def _bump(x):
    with torch.no_grad():
        x.add_(1)
    return x


_LIB.impl("bump", _bump, "CompositeExplicitAutograd")
torch.library.register_fake("ft_noop_test::bump", lambda x: x, lib=_LIB)   # (writes nothing on fakes)


def test_ops_whose_schema_writes_stay_in_the_graph():
    def f(x):
        y = x.clone()
        torch.ops.ft_noop_test.bump.default(y)
        torch.ops.ft_noop_test.bump(y)
        return y

    r = check(f, [torch.randn(3), torch.randn(3)], graphs=1)
    (gm,) = r.counter.graphs
    assert sum("bump" in str(n.target) for n in gm.graph.nodes) == 2, gm.code


def test_a_write_through_a_no_op_result_writes_the_argument():
    # to()/cpu()/type() of what the tensor already is give the tensor itself: writing the
    # result writes the caller's tensor, and the graph records the write
    def f(x):
        y = x.to(torch.float32).cpu().type(torch.float32)
        y.add_(1)
        return y is x, x * 2

    r = check(f, [torch.randn(3), torch.randn(3)], graphs=1)
    assert "add_" in targets(r) and "to" not in targets(r), targets(r)


@torch.compiler.allow_in_graph
def _scale_in_place(x):
    x.mul_(2)
    return x


def test_a_users_function_in_the_graph_stays():
    r = check(lambda x: _scale_in_place(x.clone()) + 1, [torch.randn(3), torch.randn(3)], graphs=1)
    assert any("_scale_in_place" in t for t in targets(r)), targets(r)


# -- layouts the fake does not know ------------------------------------------------
# Ops whose FakeTensor strides are not the kernel's (variables/tensor_layout.py): the
# fake of roll() of a channels-last tensor says contiguous, the kernel's result is
# channels-last.  contiguous() of such a result must run: dropped, the caller would
# get the op's result itself (writes leak into it) and a non-contiguous tensor.
def _cl(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


def _unpool(x):
    return F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)


UNSURE_PRODUCERS = {
    "roll_channels_last": (lambda x: torch.roll(x, 1, 1), lambda: _cl(2, 4, 3, 3)),
    "channel_shuffle": (lambda x: F.channel_shuffle(x, 2), lambda: _cl(2, 4, 3, 3)),
    "floor_divide_t": (lambda x: torch.floor_divide(x, torch.tensor(0.3)), lambda: torch.randn(5, 4).t()),
    "floordiv_op_t": (lambda x: x // torch.full((5,), 0.3), lambda: torch.randn(5, 4).t()),
    "div_floor_t": (lambda x: torch.div(x, torch.tensor(0.3), rounding_mode="floor"),
                    lambda: torch.randn(5, 4).t()),
    "copysign_t": (lambda x: torch.copysign(x, -torch.ones(5)), lambda: torch.randn(5, 4).t()),
    "xlogy_t": (lambda x: torch.xlogy(x, torch.full((4, 5), 2.0)), lambda: torch.randn(5, 4).t()),
    "xlogy_cl1d": (lambda x: torch.xlogy(x, torch.full((3, 4, 5), 2.0)),
                   lambda: torch.randn(3, 5, 4).transpose(1, 2)),
    "max_unpool2d": (_unpool, lambda: _cl(2, 4, 4, 4)),
    "batch_norm_t": (lambda x: F.batch_norm(x, torch.zeros(4), torch.ones(4)),
                     lambda: torch.randn(4, 5, 3).transpose(0, 1)),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", list(UNSURE_PRODUCERS))
def test_contiguous_of_an_unsure_layout_runs(name, backend):
    # Whether contiguous() copies (and so whether writes through its result reach r) is
    # the kernel's layout's to decide: CPython runs it, at a break.
    op, make = UNSURE_PRODUCERS[name]

    def f(x):
        noise = torch.rand(())          # (a graph that drew numbers cannot run again)
        r = op(x)
        y = r.contiguous()
        y.mul_(2)                       # a copy's write must not reach r; r's must
        return r, y.view(-1), y.is_contiguous(), y.stride(), y is r, noise

    r = check(f, [make(), make(), make()], backend=backend, graphs=2, breaks=1)
    assert any("contiguous" in why for why in r.reasons()), r


def test_to_memory_format_of_an_unsure_layout():
    def f(x):
        r = torch.roll(x, 1, 1)
        y = r.to(memory_format=torch.channels_last)      # the kernel's r already is
        y.add_(1)
        z = torch.roll(x, 2, 1).contiguous(memory_format=torch.channels_last)
        z.sub_(1)
        return r, y, z, y.stride(), z.stride()

    r = check(f, [_cl(2, 4, 3, 3), _cl(2, 4, 3, 3)], breaks=2)
    assert sum("cannot know" in why for why in r.reasons()) == 2, r


def test_sure_layouts_still_elide():
    # Inputs (strides guarded) and what trusted ops make of them: contiguous() of a
    # contiguous one is no node; of a transposed, channels-last or expanded one it runs.
    def f(x, y, e):
        a = x.contiguous()
        b = (x + 1).contiguous()
        c = y.contiguous()
        d = e.contiguous()
        return a is x, b.sum(), c.view(-1), d.stride(), torch.relu(y).contiguous().view(-1)

    make = lambda: (torch.randn(3, 4), torch.randn(4, 3).t(), torch.randn(1, 4).expand(3, 4))
    r = check(f, [make(), make()], graphs=1, breaks=0)
    (gm,) = r.counter.graphs
    assert sum(n.target == "contiguous" for n in gm.graph.nodes) == 3, gm.code


def test_the_elimination_can_be_turned_off():
    def f(x):
        y = x.contiguous().to(torch.float32)
        y.add_(1)                       # the same tensor: writes x
        return y is x, F.dropout(x, 0.5, training=False) is x

    old = frametrace.config.eliminate_noop_ops
    frametrace.config.eliminate_noop_ops = False
    try:
        r = check(f, [torch.randn(3), torch.randn(3)], graphs=1, breaks=0)
    finally:
        frametrace.config.eliminate_noop_ops = old
    assert {"contiguous", "to"} <= set(targets(r)), targets(r)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("how", ["reshape", "flatten", "reshape_as", "ravel"])
@pytest.mark.parametrize("name", ["roll_channels_last", "batch_norm_t", "copysign_t"])
def test_reshape_of_an_unsure_layout(name, how, backend):
    # reshape() views where the kernel's layout allows it, else copies: a write through
    # its result reaches r or not by the real strides, not the fake's.
    op, make = UNSURE_PRODUCERS[name]
    reshape = {"reshape": lambda t: t.reshape(-1), "flatten": lambda t: t.flatten(),
               "reshape_as": lambda t: t.reshape_as(torch.empty(t.numel())),
               "ravel": lambda t: t.ravel()}[how]

    def f(x):
        noise = torch.rand(())
        r = op(x)
        y = reshape(r)
        y.add_(1)
        return r, y, noise

    # (the break is in the lambda: its frame compiles a graph of its own)
    r = check(f, [make(), make()], backend=backend, max_graphs=3, breaks=1)
    # On the eager backend the reshape stays in the graph (the kernel decides) and the
    # write through its result is the break; AOTAutograd would decide from the fake,
    # so there the reshape is.
    want = "may or may not share memory" if backend == "eager" else how
    assert any(want in why for why in r.reasons()), r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ["roll_channels_last", "batch_norm_t", "copysign_t"])
def test_reshape_of_an_unsure_layout_with_no_write_stays_in_the_graph(name, backend):
    op, make = UNSURE_PRODUCERS[name]

    def f(x):
        r = op(x)
        y = r.reshape(-1)
        return r * 2, y + 1, y.flatten().sum()

    r = check(f, [make(), make(), make()], backend=backend, max_graphs=3,
              breaks=0 if backend == "eager" else 1)
    assert backend != "eager" or r.graphs == 1, r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_write_to_the_argument_of_a_reshape_of_an_unsure_layout_is_a_break(backend):
    op, make = UNSURE_PRODUCERS["batch_norm_t"]

    def f(x):
        r = op(x)
        y = r.reshape(-1)
        r[0].mul_(3)            # reaches y where reshape viewed, not where it copied
        return y * 1, r

    r = check(f, [make(), make()], backend=backend, max_graphs=3, breaks=1)
    want = "may or may not share memory" if backend == "eager" else "reshape"
    assert any(want in why for why in r.reasons()), r
