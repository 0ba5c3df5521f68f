"""The cheap paths of the C guard check stay sound: a tensor's metadata is read through
getters resolved once per class (re-resolved when the class changes), and every way
of changing a tensor in place without a new object (``.data =``, ``resize_``,
in-place view ops, ``requires_grad_``) is still seen after many passing calls, since
nothing about a tensor is skipped.  (``torch.utils.swap_tensors`` refuses a tensor
that a compiled entry has seen: the trace's weak references to it.)"""
import dis
import gc

import pytest
import torch

import frametrace
from differential import Then, check
from frametrace import _C

_OP_NAMES = {v: k for k, v in _C.GUARD_OPS.items()}


def c_ops(fn) -> set:
    code = (type(fn).forward if isinstance(fn, torch.nn.Module) else fn).__code__
    return {_OP_NAMES[i[0]] for e in _C.entries(code) if isinstance(e.check, _C.GuardCheck)
            for i in e.check.program}


class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, v):
        return self.lin(v) + self.shift


def _changes():
    def resize_buffer(m):
        with torch.no_grad():
            m.shift.resize_(1)
            m.shift.fill_(2.0)

    def transpose_in_place(m):
        with torch.no_grad():
            m.lin.weight.t_()                   # same object and shape, new strides

    def unsqueeze_buffer_in_place(m):
        m.shift.unsqueeze_(0)

    def as_strided_buffer_in_place(m):
        m.shift.as_strided_((2,), (2,))

    def requires_grad_of_a_buffer(m):
        m.shift.requires_grad_(True)

    return {f.__name__: f for f in (resize_buffer,
                                     transpose_in_place, unsqueeze_buffer_in_place,
                                     as_strided_buffer_in_place, requires_grad_of_a_buffer)}


@pytest.mark.parametrize("change", list(_changes()))
def test_tensor_changed_in_place_after_many_calls_is_seen(change):
    m = Lin()
    action = _changes()[change]

    def inputs():
        return torch.randn(2, 4)

    calls = [inputs() for _ in range(30)] + [Then(lambda: action(m), torch.randn(2, 4)),
                                            torch.randn(2, 4)]
    r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert sum(rec.code is Lin.forward.__code__ for rec in r.records) == 2, r
    assert "TENSOR" in c_ops(m)


def scaled(v):
    return v * 2


def test_tensor_class_changed_between_calls_is_still_checked():
    # The class's reads are re-resolved after it changes (its version tag moves);
    # a shape change right after is still seen.
    g = frametrace.optimize("eager", dynamic=False)(scaled)
    p = torch.nn.Parameter(torch.randn(3))
    try:
        for _ in range(3):
            torch.testing.assert_close(g(p), scaled(p))
        torch.nn.Parameter.probe_attribute = 1      # a new version tag for the class
        torch.testing.assert_close(g(p), scaled(p))
        p.data = torch.randn(5)
        torch.testing.assert_close(g(p), scaled(p))
        del torch.nn.Parameter.probe_attribute
        p.data = torch.randn(3).double()
        torch.testing.assert_close(g(p), scaled(p))
    finally:
        if hasattr(torch.nn.Parameter, "probe_attribute"):
            del torch.nn.Parameter.probe_attribute
    assert len(_C.entries(scaled.__code__)) == 3 and "TENSOR" in c_ops(scaled)


def test_tensor_check_reads_the_tensor_not_an_instance_attribute():
    # A `stride` set on the instance changes nothing about the tensor: the entry
    # still applies, and a real stride change is still seen.
    g = frametrace.optimize("eager", dynamic=False)(scaled)
    t = torch.randn(3, 4)
    torch.testing.assert_close(g(t), scaled(t))
    t.stride = lambda *a: (1, 3)
    torch.testing.assert_close(g(t), scaled(t))
    u = torch.randn(4, 3).t()
    torch.testing.assert_close(g(u), scaled(u))
    assert len(_C.entries(scaled.__code__)) == 2


def test_many_tensors_checked_under_collections_are_safe(young_heap):
    # Collections forced between calls, with the class's reads resolved: the reads
    # borrow nothing a collection can free.
    m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])
    g = frametrace.optimize("eager")(m)
    x = torch.randn(2, 4)
    for i in range(20):
        gc.collect()
        torch.testing.assert_close(g(x), m(x))
    m[3].weight.data = torch.randn(4, 4).t().contiguous().t()
    torch.testing.assert_close(g(x), m(x))
    assert len(_C.entries(type(m).forward.__code__)) == 2


# -- the loads of a graph's inputs --
class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
        self.head = torch.nn.Linear(4, 2)

    def forward(self, v):
        return self.head(torch.relu(self.inner(v)))


def test_parameters_under_one_module_are_loaded_through_one_read_of_it():
    m = Stack()

    def replace_layer():
        m.inner[1] = torch.nn.Linear(4, 4)

    def set_bias():
        with torch.no_grad():
            m.inner[2].bias.fill_(3.0)

    calls = [torch.randn(2, 4), torch.randn(2, 4), Then(replace_layer, torch.randn(2, 4)),
             Then(set_bias, torch.randn(2, 4))]
    r = check(m, calls, compiled=lambda c: frametrace.optimize(backend=c)(m))
    assert sum(rec.code is Stack.forward.__code__ for rec in r.records) == 2, r
    (code, *_) = [e.code for e in _C.entries(Stack.forward.__code__) if e.code is not None]
    # self._modules['inner'] is read once for its 6 parameters, not once per parameter
    reads = [i for i in dis.get_instructions(code) if i.opname == "LOAD_ATTR" and i.argval == "_modules"]
    assert len(reads) == 2      # self._modules, self._modules['inner']._modules (14 before)
