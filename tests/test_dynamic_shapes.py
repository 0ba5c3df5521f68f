"""Dynamic shapes: automatic dynamic (dynamic=None), dynamic=True/False, mark_dynamic and
mark_static, symbolic size arithmetic in graphs, sympy guards compiled to checks, and
the recompile log."""
import logging

import pytest
import torch

import frametrace
from frametrace import _C

from conftest import compile_counted, compiled_entries


def graph_targets(cnt, i=-1):
    return [n.target for n in cnt.graphs[i].graph.nodes]


def has_symbolic_size(gm) -> bool:
    """The graph was traced with a symbolic size (a size is not baked in)."""
    for n in gm.graph.nodes:
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in v.shape)):
            return True
    return False


def mlp(x, w):
    h = torch.relu(x @ w)
    b = x.shape[0]
    return h.view(b, -1, 2).sum(-1) * b


def test_batch_sizes_2_to_64_compile_at_most_twice():
    g, cnt = compile_counted(mlp, fullgraph=True)
    w = torch.randn(8, 6)
    for b in range(2, 65):
        x = torch.randn(b, 8)
        torch.testing.assert_close(g(x, w), mlp(x, w))
    assert cnt.frame_count == 2
    assert not has_symbolic_size(cnt.graphs[0])       # first compile: static
    assert has_symbolic_size(cnt.graphs[1])           # then the batch is symbolic
    assert len(compiled_entries(mlp)) == 2


def test_mark_dynamic_compiles_once():
    g, cnt = compile_counted(mlp, fullgraph=True)
    w = torch.randn(8, 6)
    for b in (3, 5, 17, 40):
        x = torch.randn(b, 8)
        frametrace.mark_dynamic(x, 0)
        torch.testing.assert_close(g(x, w), mlp(x, w))
    assert cnt.frame_count == 1 and has_symbolic_size(cnt.graphs[0])


def test_dynamic_true_compiles_once_and_specializes_zero_one():
    def f(x, y):
        return (x * 2).sum(1) + y.mean()

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for n, m in ((3, 4), (5, 9), (12, 2), (7, 7)):
        x, y = torch.randn(n, m), torch.randn(m)
        torch.testing.assert_close(g(x, y), f(x, y))
    assert cnt.frame_count == 1
    x, y = torch.randn(1, 4), torch.randn(4)        # size 1 broadcasts: its own graph
    torch.testing.assert_close(g(x, y), f(x, y))
    assert cnt.frame_count == 2


def test_dynamic_false_recompiles_for_every_shape():
    g, cnt = compile_counted(mlp, fullgraph=True, dynamic=False)
    w = torch.randn(8, 6)
    for b in (2, 3, 4, 5):
        x = torch.randn(b, 8)
        torch.testing.assert_close(g(x, w), mlp(x, w))
    assert cnt.frame_count == 4
    assert not any(has_symbolic_size(gm) for gm in cnt.graphs)


def test_mark_static_keeps_a_dimension_static():
    def f(x):
        return x.softmax(-1) * x.shape[1]

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for b, n in ((2, 4), (3, 4), (4, 6), (5, 6)):
        x = torch.randn(b, n)
        frametrace.mark_static(x, 1)
        torch.testing.assert_close(g(x), f(x))
    # batch symbolic throughout; each new last dimension a new entry
    assert cnt.frame_count == 2
    assert all(has_symbolic_size(gm) for gm in cnt.graphs)


def test_mark_dynamic_rejects_bad_dims():
    with pytest.raises(IndexError, match="out of range"):
        frametrace.mark_dynamic(torch.randn(2, 3), 2)
    with pytest.raises(TypeError):
        frametrace.mark_static([1, 2], 0)


def test_branch_on_size_recompiles_only_when_the_branch_flips():
    def f(x):
        if x.shape[0] > 16:
            return x * 2
        return x - 1

    g, cnt = compile_counted(f, fullgraph=True)
    for b in (4, 8, 12, 16):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2                       # static 4, then symbolic b <= 16
    for b in (20, 33, 64):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 3                       # the branch flipped once
    for b in (5, 40):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 3
    texts = [g.text for e in compiled_entries(f) for g in e.check.guards]
    # the branch's guard refines the size's range (a redundant copy is not kept)
    assert "2 <= x.shape[0] <= 16 (symbolic)" in texts and "17 <= x.shape[0] (symbolic)" in texts
    assert "x.shape[0] > 16" not in texts


def test_size_arithmetic_stays_symbolic():
    def f(x, y):
        n = x.shape[1]
        a = x.view(-1, n // 2)                       # floor division of a size
        b = x.reshape(x.shape[:-1] + (2, -1))       # torch.Size arithmetic
        c = x[:, : n // 2]                           # slicing by a size
        d = torch.zeros(x.shape[0], 3) + x.numel()   # factories and numel
        e = y.new_ones(y.size()) * len(y)
        return a.sum() + b.sum() + c.sum() + d.sum() + e.sum(), x.shape[0] * 2, x.size()

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for rows, cols, m in ((2, 4, 3), (3, 6, 5), (5, 10, 2), (7, 8, 9)):
        x, y = torch.randn(rows, cols), torch.randn(m, 11)
        got, expected = g(x, y), f(x, y)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:] and type(got[2]) is torch.Size
    assert cnt.frame_count == 1
    code = cnt.graphs[0].code
    assert "floordiv" in code and "sym_size" in code


def test_int_argument_becomes_symbolic_after_it_changes():
    def f(x, n):
        return x.view(-1, n) * n + 1

    g, cnt = compile_counted(f, fullgraph=True)
    for n in (2, 3, 4, 6, 8):
        x = torch.randn(48)
        torch.testing.assert_close(g(x, n), f(x, n))
    assert cnt.frame_count == 2
    placeholders = [nd for nd in cnt.graphs[1].graph.nodes if nd.op == "placeholder"]
    assert isinstance(placeholders[1].meta["example_value"], torch.SymInt)
    assert g(torch.randn(48), 12).shape == (4, 12)
    assert cnt.frame_count == 2
    # 48 // 48 == 1 is a size-1 dimension: a different program, so a new entry
    torch.testing.assert_close(g(torch.ones(48), 48), f(torch.ones(48), 48))
    assert cnt.frame_count == 3


def test_int_used_as_python_value_is_specialized_correctly():
    def f(x, n):
        out = x
        for _ in range(n):          # range() needs the number: the symbol is pinned
            out = out + 1
        return out

    g, cnt = compile_counted(f, fullgraph=True)
    for n in (2, 3, 3, 4):
        x = torch.randn(3)
        torch.testing.assert_close(g(x, n), f(x, n))
    assert cnt.frame_count == 3     # 2 static, 3 pinned, 4 pinned; 3 again hits


def test_recompile_log_names_the_size_guard_with_old_and_new_values():
    def f(x):
        if x.shape[0] > 16:
            return x * 2
        return x - 1

    g, cnt = compile_counted(f)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("frametrace.recompiles")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for b in (4, 8, 20):
            g(torch.randn(b))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert len(messages) == 2 and cnt.frame_count == 3
    assert "x: Tensor float32[4]" in messages[0] and "float32[8]" in messages[0]
    assert "2 <= x.shape[0] <= 16" in messages[1] and "x.shape[0] = 20, traced with 8" in messages[1]


def test_shape_guards_are_compiled_python_checks():
    def f(x, y):
        return x + y                 # broadcasting: x.shape[0] == y.shape[0]

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(g(x, y), x + y)
    check = compiled_entries(f)[0].check
    assert "sympy" not in check.source and ":=" in check.source
    # a pair that breaks the learned equality is a miss, not a wrong answer
    assert check(x, y, f) is True
    assert check(torch.randn(6, 3), torch.randn(5, 3), f) is False
    assert check(torch.randn(6, 4), torch.randn(6, 4), f) is True
    with pytest.raises(RuntimeError):
        g(torch.randn(6, 3), torch.randn(5, 3))     # eager's own error, from CPython


def test_aot_eager_with_symbolic_sizes_matches_eager_gradients():
    def f(x, w):
        return (x @ w).tanh().view(x.shape[0], -1).sum(1)

    cnt = frametrace.testing.CompileCounter(inner="aot_eager")
    g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    w = torch.randn(4, 6, requires_grad=True)
    for b in (3, 5, 9):
        x = torch.randn(b, 4, requires_grad=True)
        g(x, w).sum().backward()
        got = (x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        f(x, w).sum().backward()
        torch.testing.assert_close(got[0], x.grad)
        torch.testing.assert_close(got[1], w.grad)
        w.grad = None
    assert cnt.frame_count == 2


def test_symbolic_sizes_across_a_graph_break():
    def f(x):
        b = x.shape[0]
        y = x * b
        print(end="")                 # graph break: b is live across it
        return y + b

    g, cnt = compile_counted(f)
    for n in (2, 3, 4, 5, 6):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), f(x))
    # two graphs per compile of the frame (before and after the break), static then
    # symbolic: no compile per size
    assert cnt.frame_count == 4


def test_data_dependent_shapes_still_break():
    def f(x):
        return x[x > 0].sum() + 1

    g, cnt = compile_counted(f)
    x = torch.randn(10)
    torch.testing.assert_close(g(x), f(x))
    with pytest.raises(frametrace.Unsupported, match="data-dependent"):
        frametrace.optimize(fullgraph=True)(f)(x)


def test_explain_shows_symbolic_guards():
    def f(x):
        return x.view(x.shape[0], -1).sum(1)

    x = torch.randn(3, 4)
    frametrace.mark_dynamic(x, 0)
    f_out = frametrace.explain(f)(x)
    text = "\n".join(f_out.guards)
    assert "x: Tensor float32[*, 4]" in text and "2 <= x.shape[0] (symbolic)" in text
    assert f_out.graph_count == 1


def test_size_idioms_do_not_specialize():
    import torch.nn.functional as F

    def f(x):
        b, s = x.shape
        half = int(s * 0.5)                          # int() of a symbolic float
        m = max(s, 4) + min(b, s)                    # sym_max / sym_min
        pos = torch.arange(s).expand(b, -1)
        y = F.pad(x, (0, 2))[:, :s]                 # a composite op: Python decomposition
        z = torch.cat([x, x], 1).view(b, 2, s).sum(1)
        parts = x.split(s // 2, dim=1)
        return y + z + pos + half + m + parts[0].sum(), float(s)

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for b, s in ((2, 8), (3, 10), (4, 12), (5, 6)):
        x = torch.randn(b, s)
        got, expected = g(x), f(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1] and type(got[1]) is float
    assert cnt.frame_count == 1
    texts = [g.text for g in compiled_entries(f)[0].check.guards]
    assert not any(t in ("x.shape[0] == 2", "x.shape[1] == 8") for t in texts)


def test_strides_of_symbolic_inputs_are_guarded():
    def f(x):
        return x * 2 + x.shape[0]

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for a, b in ((6, 4), (8, 5), (3, 7)):
        x = torch.randn(a, b).t()                   # strides (1, size 0)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    for x in (torch.randn(6, 4), torch.randn(3, 6, 4)[1]):   # contiguous, with an offset
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 2
    texts = [[g.text for g in e.check.guards] for e in compiled_entries(f)]
    assert any("x.stride()[1] == x.shape[0]" in t for t in texts)
    assert any("x.stride()[0] == x.shape[1]" in t for t in texts)


def test_a_failure_with_symbolic_sizes_falls_back_to_static_compiles():
    seen = []

    def static_only_backend(gm, example_inputs):
        if any(isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in v.shape)
               for v in (n.meta.get("example_value") for n in gm.graph.nodes)):
            raise NotImplementedError("this backend needs static shapes")
        seen.append(gm)
        return gm.forward

    g = frametrace.optimize(backend=static_only_backend)(mlp)
    w = torch.randn(8, 6)
    for b in (2, 3, 4, 3):
        x = torch.randn(b, 8)
        torch.testing.assert_close(g(x, w), mlp(x, w))
    # the symbolic attempt failed once; the frame stays static: one graph per shape,
    # never a frame left to CPython
    assert len(seen) == 3 and len(compiled_entries(mlp)) == 3
    # with fullgraph=True and dynamic=True too: the static retry compiles, nothing raises
    seen.clear()
    frametrace.reset()
    h = frametrace.optimize(backend=static_only_backend, fullgraph=True, dynamic=True)(mlp)
    x = torch.randn(5, 8)
    torch.testing.assert_close(h(x, w), mlp(x, w))
    assert len(seen) == 1


def test_python_semantics_of_size_values_are_kept():
    """Types and values as CPython gives them, and no needless pinning of sizes."""
    def f(x):
        return (x + 1, max(x.shape[0], 2.5), min(x.shape[0], 3), (1,) + x.shape,
                torch.zeros(torch.Size([x.shape[0], 3])).shape, x[slice(x.shape[0] // 2)],
                x.nbytes)

    g, cnt = compile_counted(f, fullgraph=True)
    for n in (4, 5, 6, 9):
        x = torch.arange(float(n))
        got, expected = g(x), f(x)
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[5], expected[5])
        for a, b in zip(got[1:5] + got[6:], expected[1:5] + expected[6:]):
            assert a == b and type(a) is type(b), (a, b)
    assert cnt.frame_count == 2


def test_storage_offset_read_by_the_trace_is_guarded():
    big = torch.arange(100.)

    def f(x):
        return x * 2 if x.storage_offset() > 3 else x * 3

    g, cnt = compile_counted(f, dynamic=True)
    for sl in (slice(5, 10), slice(0, 5), slice(7, 12), slice(1, 6), slice(5, 10)):
        torch.testing.assert_close(g(big[sl]), f(big[sl]))
    assert cnt.frame_count == 4          # one entry per offset read; a repeat hits
    assert "x.storage_offset() == 5" in {gd.text for e in compiled_entries(f)
                                         for gd in e.check.guards}
    # a graph that never reads the offset shares one entry for views at any offset
    h, hcnt = compile_counted(lambda x: x * 2)
    for i in range(5):
        h(big[i:i + 4])
    assert hcnt.frame_count == 1


def test_recompile_log_shows_both_sides_of_a_size_equality():
    def f(a, b):
        return a + b

    g, cnt = compile_counted(f, dynamic=True)
    g(torch.randn(5), torch.randn(5))
    failure = compiled_entries(f)[0].check.guard_set.first_failure(
        (torch.randn(6), torch.randn(7)), f)
    assert failure.startswith("b.shape[0] == a.shape[0]")
    assert "b.shape[0] = 7, traced with 5" in failure and "a.shape[0] = 6, traced with 5" in failure


def test_explain_does_not_change_what_later_compiles_make_symbolic():
    def f(x):
        return x * 2

    frametrace.explain(f)(torch.randn(5))
    g, cnt = compile_counted(f)
    g(torch.randn(4))
    assert not has_symbolic_size(cnt.graphs[0])      # still static first


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_math_of_sizes_stays_symbolic(backend):
    import math
    import operator

    def f(x):
        d = x.shape[-1]
        blocks = math.ceil(x.shape[0] / 4)
        return x / math.sqrt(d) + blocks + operator.mul(d, 2), blocks

    cnt = frametrace.testing.CompileCounter(inner=backend)
    g = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    for n in (3, 5, 8, 13):
        x = torch.randn(n, n + 1)
        got, expected = g(x), f(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1] and type(got[1]) is int
    assert cnt.frame_count == 2


def _check_with_cxx_reads(check, x, f, on):
    from frametrace import _tensor_reads
    was = _C.set_tensor_reads(_tensor_reads.api if on else None)
    try:
        return check(x, f)
    finally:
        _C.set_tensor_reads(_tensor_reads.api if was else None)


@pytest.mark.parametrize("in_c", [True, False], ids=["c_tensor_guard", "python_tensor_guard"])
def test_symbolic_tensor_guard_stays_as_strict(in_c, monkeypatch):
    # dynamic=True's tensor guard is a C check with the ranges folded in
    # (config.symbolic_tensor_guards_in_c): each static fact must still miss.
    monkeypatch.setattr(frametrace.config, "symbolic_tensor_guards_in_c", in_c)
    monkeypatch.setattr(frametrace.config, "cache_size_limit", 16)   # a recompile per miss

    def f(x):
        return x * 2 + 1

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for n, m in ((5, 3), (7, 2), (4, 9), (2, 2)):
        x = torch.randn(n, 1, m)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    [entry] = compiled_entries(f)
    residual = entry.check.residual
    # (the strides' equalities to sizes stay Python; the dtype's check does not, in C)
    assert ("dtype" in residual.source) is not in_c
    misses = {"static size": torch.randn(5, 2, 3), "size 1, below the range": torch.randn(1, 1, 3),
              "rank": torch.randn(5, 3), "dtype": torch.randn(5, 1, 3, dtype=torch.float64),
              "device": torch.randn(5, 1, 3, device="meta"),
              "requires_grad": torch.randn(5, 1, 3, requires_grad=True),
              "stride order": torch.randn(3, 1, 5).permute(2, 1, 0),
              "class": torch.nn.Parameter(torch.randn(5, 1, 3), requires_grad=False),
              "neg bit": torch.randn(5, 1, 3, dtype=torch.complex64).conj().imag}
    for cxx in (True, False) if frametrace.guards.TENSOR_READS_IN_CXX else (False,):
        assert _check_with_cxx_reads(entry.check, torch.randn(6, 1, 4), f, cxx) is True
        for what, x in misses.items():
            assert _check_with_cxx_reads(entry.check, x, f, cxx) is False, (what, cxx)
    frames = cnt.frame_count
    for what, x in misses.items():
        if x.device.type == "meta":
            continue
        x = x.detach().requires_grad_(x.requires_grad) if what != "class" else x
        torch.testing.assert_close(g(x), f(x))
        assert cnt.frame_count == frames + 1, what      # a recompile, not the first entry
        frames = cnt.frame_count


@pytest.mark.parametrize("in_c", [True, False], ids=["c_tensor_guard", "python_tensor_guard"])
def test_one_symbolic_size_has_no_python_check(in_c, monkeypatch):
    # A size no other shape guard names: its range is checked in C with the tensor.
    monkeypatch.setattr(frametrace.config, "symbolic_tensor_guards_in_c", in_c)

    def f(x):
        return x + 1

    g, cnt = compile_counted(f, fullgraph=True, dynamic=True)
    for n in (4, 9, 2, 33):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 1
    [entry] = compiled_entries(f)
    assert (entry.check.residual is None) is in_c
    assert "2 <= x.shape[0] (symbolic)" in [g.text for g in entry.check.guards]
    for x in (torch.randn(1), torch.randn(0), torch.randn(4, 1), torch.randn(8)[::2]):
        assert entry.check(x, f) is False
        torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == 5
