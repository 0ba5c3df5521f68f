"""Facts about a tensor input that the trace reads at trace time (a branch on them, a
number from them) change between calls, and the compiled function notices: a
recompile, a graph break, or CPython's answer.

Leafness, view-ness, inference and shared memory are not in the tensor guard (most
traces never read them): they are guarded where read.  Tensors that are not leaves,
views or inference tensors do not survive the harness's deep copy as what they are, so
`through` makes them from each call's copied arguments, on both sides alike.  The
tests at the end are facts the tensor guard already covered (kept as regression
tests)."""
import pytest
import torch

import frametrace
from differential import Call, check
from frametrace import _C, convert

_OP_NAMES = {v: k for k, v in _C.GUARD_OPS.items()}


def _make(kind, x):
    if kind == "leaf":
        return x.requires_grad_()
    if kind == "nonleaf":
        return x.requires_grad_() * 2
    if kind == "plain":
        return x
    if kind == "view":
        return torch.cat([x, x])[: x.shape[0]]      # offset 0, same sizes and strides
    if kind == "inference":
        with torch.inference_mode():
            return x.clone()
    if kind == "shared":
        return x.share_memory_()
    if kind == "mkldnn":
        return x.to_mkldnn()
    if kind == "sparse":
        return x.to_sparse()
    raise ValueError(kind)


def through(f, inputs, **kw):
    """`check` of f on tensors made by `_make` from each call's (kind, x, ...)."""
    def prep(kind, *xs):
        return [_make(kind, x) for x in xs]

    def eager(kind, *xs):
        return f(*prep(kind, *xs))

    def compiled(counter):
        g = frametrace.optimize(backend=counter)(f)
        return lambda kind, *xs: g(*prep(kind, *xs))
    return check(eager, [Call(kind, *xs) for kind, *xs in inputs], compiled=compiled, **kw)


def calls(*kinds, n=3):
    return [(k, torch.randn(n)) for k in kinds]


def c_ops(fn) -> set:
    ops = set()
    for e in _C.entries(fn.__code__):
        if isinstance(e.check, _C.GuardCheck):
            ops |= {_OP_NAMES[i[0]] for i in e.check.program}
    return ops


# -- leafness --
def branch_on_leaf(x):
    if x.is_leaf:
        return x + 1
    return x - 1


@pytest.mark.parametrize("order", [("leaf", "nonleaf", "leaf"), ("nonleaf", "leaf", "nonleaf")])
def test_is_leaf_of_an_input_that_needs_grad_is_guarded(order):
    r = through(branch_on_leaf, calls(*order), breaks=0)
    assert r.compiles == 2, r


def test_is_leaf_guard_runs_in_c_and_only_when_read():
    frametrace.reset()
    g = frametrace.optimize(branch_on_leaf)
    g(torch.randn(3, requires_grad=True))
    assert {"ATTR", "IS"} <= c_ops(branch_on_leaf)
    assert all(e.check.residual is None for e in _C.entries(branch_on_leaf.__code__))

    def no_read(x):
        return x + 1
    records = []
    convert.record_observers.append(records.append)
    try:
        frametrace.optimize(no_read)(torch.randn(3, requires_grad=True))
    finally:
        convert.record_observers.remove(records.append)
    # the tensor guard, and Tensor.__add__'s identity (a patched method must not be
    # ignored): no is_leaf read
    assert not any("is_leaf" in g for g in records[0].guards), records[0].guards


def test_is_leaf_of_an_input_made_non_leaf_by_an_inplace_op():
    def f(x, w):
        x.mul_(w)
        return x * 2 if x.is_leaf else x * 3
    check(f, [(torch.randn(3), torch.randn(3)),
              (torch.randn(3), torch.randn(3, requires_grad=True)),
              (torch.randn(3), torch.randn(3))])


def test_grad_fn_of_a_leaf_is_none_and_of_a_non_leaf_is_not():
    def f(x):
        if x.grad_fn is None:
            return x + 1
        return x - 1
    through(f, calls("leaf", "nonleaf", "leaf", "plain"))


def test_reading_grad_of_an_input_that_became_non_leaf():
    def f(x):
        return x * 2 if x.grad is None else x.grad + x
    through(f, calls("leaf", "nonleaf"))


# -- view-ness --
def test_is_view_of_an_input_is_guarded():
    def f(x):
        return x + 1 if x._is_view() else x - 1
    r = through(f, calls("plain", "view", "plain"), breaks=0)
    assert r.compiles == 2, r


def test_is_view_of_an_op_that_returns_its_input():
    def f(x):
        y = x.contiguous()
        return x + 1 if y._is_view() else x - 1
    through(f, calls("view", "plain", "view"))


# -- inference tensors, shared memory --
def test_is_inference_of_an_input_is_guarded():
    def f(x):
        return x + 1 if x.is_inference() else x - 1
    r = through(f, calls("plain", "inference", "plain"), breaks=0)
    assert r.compiles == 2, r


def test_torch_is_inference_of_an_input_is_guarded():
    def f(x):
        y = x * 2
        return y if torch.is_inference(x) else y + 1
    through(f, calls("inference", "plain"))


def test_is_inference_read_inside_inference_mode():
    def f(x):
        with torch.inference_mode():
            return x + 1 if x.is_inference() else x - 1
    through(f, calls("plain", "inference"))


def test_is_inference_of_a_view_of_an_input_is_guarded_on_the_input():
    def f(x):
        y = x * 2
        return y + 1 if x.view(-1).is_inference() else y - 1
    r = through(f, calls("plain", "inference", "plain"), breaks=0)
    assert r.compiles == 2, r


def test_is_inference_of_new_tensors_follows_the_mode_they_were_made_in():
    def f(x):
        with torch.inference_mode():
            y = x * 2
        z = x * 3
        return y, y.is_inference(), z, z.is_inference()
    through(f, calls("plain", "inference", "plain"), breaks=0)


def test_is_shared_of_an_input_and_of_its_view():
    def f(x):
        a = 1 if x.is_shared() else 2
        b = 1 if x[1:].is_shared() else 2
        return x * a + b
    r = through(f, calls("plain", "shared", "plain"), breaks=0)
    assert r.compiles == 2, r


def test_is_shared_of_a_new_tensor_is_a_break():
    def f(x):
        y = x * 2
        return y + 1 if y.is_shared() else y - 1
    r = through(f, calls("plain", "shared"))
    assert r.breaks >= 1, r


def test_guard_of_a_method_fact_runs_in_python():
    def f(x):
        return x + 1 if x.is_shared() else x - 1
    frametrace.reset()
    frametrace.optimize(f)(torch.randn(3))
    src = [e.check.residual.source for e in _C.entries(f.__code__)]
    assert any(".is_shared() is False" in s for s in src), src


# -- layouts --
def test_layout_of_an_input_is_guarded_where_read():
    # An mkldnn tensor has the sizes, strides, dtype and device of a dense one.
    def f(x):
        return (x.layout, x.is_mkldnn, x.is_sparse, torch.ones(2))
    r = through(f, calls("plain", "mkldnn", "plain"), graphs=1)
    assert r.compiles == 2 and r.fallbacks == 1, r     # (an mkldnn input is not traced)


def test_layout_of_a_tensor_computed_from_an_input_is_guarded():
    def f(x):
        y = x + 1
        return y, y.layout == torch.strided
    r = through(f, calls("plain", "mkldnn", "plain"), graphs=1)
    assert r.compiles == 2 and r.fallbacks == 1, r


def test_is_sparse_of_a_grad_adds_no_guard():
    # Sparse tensors fail the tensor guard (no strides): is_sparse is covered by it.
    def f(p):
        return p * 2 if p.grad.is_sparse else p * 3
    frametrace.reset()
    t = torch.randn(3, requires_grad=True)
    t.grad = torch.randn(3)
    frametrace.optimize(f)(t)
    texts = [g.text for e in _C.entries(f.__code__) for g in e.check.guards]
    assert not any("layout" in s for s in texts), texts
    check(f, [_with_grad(torch.randn(3, requires_grad=True)),
              _with_grad(torch.randn(3, requires_grad=True), sparse=True)])


def test_a_sparse_input_is_a_clean_fallback():
    def f(x):
        return x.is_sparse, torch.ones(2)
    r = through(f, calls("plain", "sparse", "plain"), graphs=1)
    assert r.fallbacks == 1, r


# -- aliasing read through storage --
@pytest.mark.skipif(not hasattr(torch.Tensor, "const_data_ptr"), reason="torch without const_data_ptr")
def test_const_data_ptr_comparison_is_not_folded():
    def f(x, y):
        return x + 1 if x.const_data_ptr() == y.const_data_ptr() else x - 1
    r = check(f, [(torch.randn(3), torch.randn(3))])
    assert r.breaks >= 1, r


def test_is_set_to_between_inputs_is_not_folded():
    def f(x, y):
        return x + 1 if x.is_set_to(y) else x - 1
    t = torch.randn(3)
    r = check(f, [(torch.randn(3), torch.randn(3)), (t, t)])
    assert r.breaks >= 1, r


# -- which inputs are one object --
def test_set_membership_of_tensor_inputs_sees_them_become_one_object():
    def f(x, y):
        return x + 1 if x in {y} else x - 1
    t = torch.randn(3)
    r = check(f, [(torch.randn(3), torch.randn(3)), (t, t), (torch.randn(3), torch.randn(3))])
    assert r.compiles == 2, r


def test_dict_keyed_by_tensor_inputs_sees_them_become_one_object():
    def f(x, y):
        d = {x: 1, y: 2}
        return x * len(d) + d[x]
    t = torch.randn(3)
    r = check(f, [(torch.randn(3), torch.randn(3)), (t, t), (t, torch.randn(3))])
    assert r.compiles == 2, r


def test_identity_between_inputs():
    def f(x, y):
        return x + 1 if x is y else x - 1
    t = torch.randn(3)
    r = check(f, [(torch.randn(3), torch.randn(3)), (t, t), (torch.randn(3), torch.randn(3))])
    assert r.compiles == 2, r


# -- already covered by the tensor guard (regression tests) --
def _branch(read):
    def f(x):
        return x + 1 if read(x) else x - 1
    return f


@pytest.mark.parametrize("read, a, b", [
    (lambda x: x.requires_grad, lambda: torch.randn(3), lambda: torch.randn(3, requires_grad=True)),
    (lambda x: x.is_contiguous(), lambda: torch.randn(3, 4), lambda: torch.randn(4, 3).t()),
    (lambda x: x.is_contiguous(memory_format=torch.channels_last), lambda: torch.randn(1, 3, 2, 2),
     lambda: torch.randn(1, 3, 2, 2).to(memory_format=torch.channels_last)),
    (lambda x: x.stride(0) == 4, lambda: torch.randn(3, 4), lambda: torch.randn(4, 3).t()),
    (lambda x: x.storage_offset() == 0, lambda: torch.randn(3), lambda: torch.randn(4)[1:]),
    (lambda x: x.itemsize * x.nbytes * x.element_size() == 48, lambda: torch.randn(3),
     lambda: torch.randn(3, dtype=torch.float64)),
    (lambda x: x.grad is None, lambda: torch.randn(3, requires_grad=True),
     lambda: _with_grad(torch.randn(3, requires_grad=True))),
    (lambda x: x.is_neg(), lambda: torch.randn(3, dtype=torch.cfloat).imag,
     lambda: torch.randn(3, dtype=torch.cfloat).conj().imag),
], ids=["requires_grad", "is_contiguous", "channels_last", "stride", "storage_offset",
        "itemsize", "grad", "is_neg"])
def test_facts_the_tensor_guard_covers(read, a, b):
    r = check(_branch(read), [a(), b(), a()])
    assert r.compiles == 2, r


def _with_grad(t, sparse=False):
    t.grad = torch.ones_like(t).to_sparse() if sparse else torch.ones_like(t)
    return t
