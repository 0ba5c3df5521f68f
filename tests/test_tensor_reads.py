"""The tensor guard's C++ reads (frametrace/_C/tensor_reads.cpp) answer exactly what the
Python getters answer: for every pair of (traced tensor, tensor passed later) in a
matrix of dtypes, devices, layouts, geometries, autograd and lazy bits, subclasses,
nested, sparse and functorch-wrapped tensors, the check with C++ reads gives the same
result as the check with Python reads.  A compiled model's check does take the C++
path (CI builds it), and a whole model's parameter changes are still seen with it."""
import os

import pytest
import torch

import frametrace
from differential import Then, check
from frametrace import _C, guards

_OPS = _C.GUARD_OPS


class Sub(torch.Tensor):
    pass


class Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def tensors():
    torch.manual_seed(0)
    a = torch.randn(3, 4)
    z = torch.randn(3, 4, dtype=torch.complex64)
    with torch.inference_mode():
        inference = torch.randn(3, 4)
    return {
        "a": a, "a_again": torch.randn(3, 4), "double": a.double(), "half": a.half(),
        "wider": torch.randn(3, 5), "transposed": torch.randn(4, 3).t(),
        "expanded": torch.randn(1, 4).expand(3, 4), "sliced": torch.randn(3, 8)[:, ::2],
        "scalar": torch.tensor(1.0), "empty": torch.randn(0, 4), "flat": torch.randn(12),
        "requires_grad": torch.randn(3, 4, requires_grad=True),
        "non_leaf": torch.randn(3, 4, requires_grad=True) * 2,
        "parameter": torch.nn.Parameter(torch.randn(3, 4)),
        "frozen_parameter": torch.nn.Parameter(torch.randn(3, 4), requires_grad=False),
        "complex": z, "conj": z.conj(), "neg": z.conj().imag, "imag": z.imag,
        "meta": torch.empty(3, 4, device="meta"), "sparse": a.to_sparse(),
        "nested": torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]),
        "subclass": a.clone().as_subclass(Sub), "inference": inference,
        "int": torch.arange(12).reshape(3, 4), "bool": a > 0,
        **({"cuda": a.cuda(), "cuda_t": torch.randn(4, 3, device="cuda").t()}
           if torch.cuda.is_available() else {}),
    }


def program(t):
    """The tensor guard of one argument traced as `t`, as guards.py makes it."""
    spec = (type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad,
            t.is_conj() if t.is_complex() else None, t.is_neg(), t.layout)
    return [(_OPS["ARG"], 0, -1, 0, None, None), (_OPS["TENSOR"], 0, -1, 0, spec, None)]


def answers(pairs, cxx):
    """Each pair's check result with the C++ reads on or off."""
    was = _C.set_tensor_reads(_tensor_reads_api() if cxx else None)
    try:
        return [_C.GuardCheck(2, prog)(t, None) for prog, t in pairs]
    finally:
        _C.set_tensor_reads(_tensor_reads_api() if was else None)


def _tensor_reads_api():
    from frametrace import _tensor_reads
    return _tensor_reads.api


needs_cxx = pytest.mark.skipif(not guards.TENSOR_READS_IN_CXX, reason="frametrace._tensor_reads not built")


def test_ci_builds_the_cxx_reads():
    # The speed of every model's check rests on it: a build that silently dropped it
    # would pass every other test.
    if os.environ.get("FRAMETRACE_NO_CXX"):
        pytest.skip("built without C++ on purpose")
    assert guards.TENSOR_READS_IN_CXX


def _strided(t):
    return t.layout is torch.strided and not t.is_nested


@needs_cxx
def test_cxx_and_python_reads_agree_on_every_pair():
    ts = tensors()
    pairs, names = [], []
    for traced_name, traced in ts.items():
        if not _strided(traced):
            continue        # no spec is made for these: their guards are not tensor guards
        prog = program(traced)
        for name, t in ts.items():
            pairs.append((prog, t))
            names.append((traced_name, name))
    cxx, py = answers(pairs, True), answers(pairs, False)
    wrong = [(n, c, p) for n, c, p in zip(names, cxx, py) if c != p]
    assert not wrong
    # The matrix is not trivial: every traced tensor matches itself and some others fail.
    assert sum(cxx) >= len(ts) - 3 and cxx.count(False) > len(cxx) // 2


@needs_cxx
def test_reads_agree_under_a_torch_function_mode_and_inside_vmap():
    ts = tensors()
    pairs = [(program(ts["a"]), t) for t in ts.values()]
    with Mode():
        assert answers(pairs, True) == answers(pairs, False)
    # A batched tensor is an exact torch.Tensor whose sizes are the logical ones.
    seen = []
    row_like, matrix_like = program(torch.randn(4)), program(torch.randn(3, 4))

    def per_row(row):
        pairs = [(row_like, row), (matrix_like, row)]
        seen.append((answers(pairs, True), answers(pairs, False)))
        return row

    torch.func.vmap(per_row)(torch.randn(3, 4))
    ((cxx, py),) = seen
    assert cxx == py == [True, False]


@needs_cxx
def test_parameter_metadata_changed_in_place_is_seen():
    # The changes a dict-version shortcut would miss: the parameter object and every
    # dict holding it are unchanged, its metadata is not.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    lin = model[0]
    changes = [
        lambda: setattr(lin.weight, "data", lin.weight.data.t()),
        lambda: lin.bias.requires_grad_(False),
        lambda: setattr(lin.bias, "data", torch.randn(1)),
        lambda: torch.utils.swap_tensors(lin.bias, torch.nn.Parameter(torch.randn(8)[::2])),
    ]
    calls = [torch.randn(2, 4)]
    for change in changes:
        calls += [Then(change, torch.randn(2, 4)), torch.randn(2, 4)]
    before = _C.tensor_reads_count()
    r = check(model, calls, compiled=lambda c: frametrace.optimize(backend=c)(model))
    assert r.compiles == 1 + len(changes), r
    # The passing calls were answered by the C++ reads (two tensors each).
    assert _C.tensor_reads_count() - before >= 2 * len(changes)


@needs_cxx
def test_cxx_answers_only_what_it_can_read():
    ts = tensors()
    for name in ("subclass", "nested"):
        before = _C.tensor_reads_count()
        answers([(program(ts[name] if name == "subclass" else ts["a"]), ts[name])], True)
        assert _C.tensor_reads_count() == before, name
    before = _C.tensor_reads_count()
    answers([(program(ts["a"]), ts["a_again"]), (program(ts["a"]), ts["parameter"])], True)
    assert _C.tensor_reads_count() == before + 1     # a Parameter is not traced as a Tensor
    with Mode():
        before = _C.tensor_reads_count()
        answers([(program(ts["a"]), ts["a_again"])], True)
        assert _C.tensor_reads_count() == before
