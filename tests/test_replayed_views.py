"""Outputs viewing an input through a dtype view (replayed_views.py), against CPython: values, shapes, strides, the memory they share
with the input, over sizes that make the graph symbolic; and what the backend compiled.

AOTAutograd (torch.compile's aot_eager and Inductor alike) regenerates such an output
with `as_strided` counted in the input's elements once sizes are symbolic:
`x.view(torch.float64).flatten()` came back with n elements instead of 2n, and
`x.view(torch.uint8)` raised at every call (the frame then ran in CPython), and
`x.view(torch.int32).flatten()[:6]` came back float32.
"""
from __future__ import annotations

import copy

import pytest
import torch

import frametrace
from frametrace import config, convert, replayed_views, warm_cache
from frametrace.testing import CompileCounter

SIZES = (3, 5, 7, 6)


def _same_bits(a, b) -> bool:
    """Equal element for element in their bits (NaN payloads, -0.0 and 0.0 told apart)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                       b.reshape(-1).contiguous().view(torch.uint8))


def _sharing(outs, args):
    """For each output: the index of the argument whose memory it shares, or None."""
    def key(t):
        return t.untyped_storage().data_ptr()
    return [next((j for j, a in enumerate(args) if isinstance(a, torch.Tensor) and key(a) == key(o)), None)
            for o in outs]


def run(fn, make, backend="aot_eager", sizes=SIZES):
    """fn compiled against CPython on fresh copies of the inputs; returns the counter."""
    frametrace.reset()
    records = []
    convert.record_observers.append(records.append)
    counter = CompileCounter(inner=backend)
    compiled = frametrace.optimize(backend=counter)(fn)
    try:
        for n in sizes:
            args = make(n)
            want_args, got_args = copy.deepcopy(args), copy.deepcopy(args)
            want, got = fn(*want_args), compiled(*got_args)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            assert len(want) == len(got)
            for a, b in zip(want + tuple(want_args), got + tuple(got_args)):
                assert (a.shape, a.dtype, a.stride(), a.storage_offset(), a.requires_grad) == \
                    (b.shape, b.dtype, b.stride(), b.storage_offset(), b.requires_grad), n
                assert _same_bits(a, b), n
            assert _sharing(got, got_args) == _sharing(want, want_args), n
            # a write through the returned view reaches the argument, as in CPython
            for a, b, wa, ga in zip(want, got, _sharing(want, want_args), _sharing(got, got_args)):
                if wa is not None and a.numel():
                    with torch.no_grad():
                        a[(0,) * a.dim()] = 1
                        b[(0,) * b.dim()] = 1
                    assert _same_bits(want_args[wa], got_args[ga]), n
    finally:
        convert.record_observers.remove(records.append)
    assert not any(r.outcome == "fallback" for r in records), [r.reason for r in records]
    assert counter.frame_count == 2, counter.frame_count     # (static, then symbolic sizes)
    return counter


def _rows(n):
    return (torch.randn(n, 4),)


CASES = {
    "float64 flattened": lambda x: x.view(torch.float64).flatten(),
    "bytes flattened": lambda x: x.view(torch.uint8).flatten(),
    "bytes": lambda x: x.view(torch.uint8),
    "int16 of a slice": lambda x: x[1:].view(torch.int16)[:, 1:],
    "float64 transposed": lambda x: x.view(torch.float64).t(),
    "float64 reshaped": lambda x: x.view(torch.float64).reshape(-1, 1),
    "int32 sliced (same element size)": lambda x: x.view(torch.int32).flatten()[:6],
    "bool of bytes": lambda x: x.view(torch.uint8).view(torch.bool)[1:],
    "detached": lambda x: x.detach().view(torch.float64).flatten(),
    "Tensor.flatten as a function": lambda x: torch.Tensor.flatten(x.view(torch.float64)),
}


@pytest.mark.parametrize("backend", ["aot_eager", "aot_eager_decomp_partition"])
@pytest.mark.parametrize("case", list(CASES))
def test_dtype_view_of_an_input_as_cpython(case, backend):
    run(CASES[case], _rows, backend)


def test_replayed_outputs_land_at_their_places_among_the_others():
    """Two replayed outputs between computed ones, and an input mutated in the graph
    first: the views see the written values."""
    def fn(x, y):
        x.mul_(2)
        return x.sum(), x.view(torch.float64).flatten(), y + 1, y.view(torch.int8), x.view(torch.int32)
    run(fn, lambda n: (torch.randn(n, 4), torch.randn(n, 2)))


def test_special_values_and_equal_but_different_bits():
    """NaN, inf, -0.0 and 0.0 read as bytes: the bits, not the values, must match."""
    def make(n):
        x = torch.randn(n, 4)
        x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 0.0])
        return (x,)
    run(lambda x: x.view(torch.int32).flatten()[:6], make)
    run(lambda x: x.view(torch.uint8).flatten(), make)


def test_channels_last_and_expanded_inputs():
    run(lambda x: x.view(torch.int16).flatten(1),
        lambda n: (torch.randn(2, n, 3, 4).contiguous(memory_format=torch.channels_last)
                   .permute(0, 2, 3, 1).contiguous(),))
    run(lambda x: x.view(torch.float64)[1:], lambda n: (torch.randn(1, 4).expand(n, 4),))
    run(lambda x: x.view(torch.int16).t(), lambda n: (torch.randn(n, 6)[:, :4],))


def test_the_backend_compiles_the_graph_without_the_replayed_outputs():
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
        return gm.forward

    def fn(x):
        return x + 1, x.view(torch.float64).flatten()
    frametrace.reset()
    compiled = frametrace.optimize(backend=backend)(fn)
    x = torch.randn(3, 4)
    a, b = compiled(x)
    assert seen == [1]
    assert b.shape == (6,) and b.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_switch_off_hands_every_output_to_the_backend(monkeypatch):
    monkeypatch.setattr(config, "replay_dtype_views", False)
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
        return gm.forward
    frametrace.reset()
    compiled = frametrace.optimize(backend=backend)(lambda x: (x + 1, x.view(torch.float64).flatten()))
    compiled(torch.randn(3, 4))
    assert seen == [2]


def test_what_is_not_replayed():
    """A view of an intermediate, a view whose size the graph computes, and an input
    whose metadata the graph changes in place are left to the backend; each still
    matches CPython."""
    def intermediate(x):
        return (x * 2).view(torch.float64).flatten()

    def computed_size(x):
        return x.view(torch.float64).view(x.shape[0] * 2)

    def metadata_written(x):
        x.unsqueeze_(0)
        return x.view(torch.float64)
    for fn in (intermediate, computed_size, metadata_written):
        gm = torch.fx.symbolic_trace(fn)
        assert replayed_views.find(gm, [torch.randn(3, 4)]) == []
    run(intermediate, _rows)
    run(metadata_written, _rows)


def _warm(tmp_path, monkeypatch, fn, make, cold_sizes, warm_sizes):
    """fn compiled at `cold_sizes`, its entries saved, then loaded as by another process
    and called at `warm_sizes` against CPython; returns the warm calls' records."""
    path = str(tmp_path / "c.ftcache")
    frametrace.reset()
    compiled = frametrace.optimize(backend="aot_eager")(fn)
    for n in cold_sizes:
        compiled(*make(n))
    assert frametrace.save_cache(path) >= 1
    frametrace.reset()
    monkeypatch.setattr(warm_cache, "_written_keys", set())    # (as another process)
    assert frametrace.load_cache(path) >= 1
    records = []
    convert.record_observers.append(records.append)
    try:
        compiled = frametrace.optimize(backend="aot_eager")(fn)
        for n in warm_sizes:
            args = make(n)
            want_args, got_args = copy.deepcopy(args), copy.deepcopy(args)
            want, got = fn(*want_args), compiled(*got_args)
            for a, b in zip((*want, *want_args), (*got, *got_args)):
                assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride()), n
                assert _same_bits(a, b), n
    finally:
        convert.record_observers.remove(records.append)
    return records


def test_warm_start_replays_views_of_inputs_sharing_memory(tmp_path, monkeypatch):
    """Static sizes, but the inputs share memory and one is written: AOTAutograd makes
    the outputs from a synthetic base with as_strided, wrong for a dtype view.  The
    cached graph comes back without its nodes' example values; the replay is found
    from its code and the inputs."""
    def fn(x, y):
        y.add_(1)
        return x.view(torch.int16).flatten(), y.view(torch.float64)

    def make(n):
        b = torch.randn(n, 4)
        return b, b[1:]
    records = _warm(tmp_path, monkeypatch, fn, make, (3,), (3,))
    assert records and records[0].from_cache


def test_warm_start_compiles_the_cached_graph_with_the_replays(tmp_path, monkeypatch):
    path = str(tmp_path / "c.ftcache")

    def fn(x):
        return x.view(torch.float64).flatten(), x.sum()
    frametrace.reset()
    compiled = frametrace.optimize(backend="aot_eager")(fn)
    for n in (3, 5):
        compiled(torch.randn(n, 4))
    assert frametrace.save_cache(path) >= 1
    frametrace.reset()
    # (as another process: this one's own entries are never read back by it)
    monkeypatch.setattr(warm_cache, "_written_keys", set())
    assert frametrace.load_cache(path) >= 1
    records = []
    convert.record_observers.append(records.append)
    try:
        compiled = frametrace.optimize(backend="aot_eager")(fn)
        for n in (3, 7, 9):     # (the static entry is cached; symbolic ones are not)
            x = torch.randn(n, 4)
            a, s = compiled(x)
            want = fn(x)[0]
            assert a.shape == want.shape == (2 * n,) and _same_bits(a, want)
            assert a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    finally:
        convert.record_observers.remove(records.append)
    assert records and records[0].from_cache


def test_inputs_that_need_grad():
    """A view that cannot need grad (an integer result, an element size changed) is
    replayed; a complex input's real view, which autograd goes through, is left to the
    backend.  requires_grad of every output matches CPython's."""
    def grad_rows(n):
        return (torch.randn(n, 4, requires_grad=True),)
    run(lambda x: x.view(torch.int32).flatten()[:6], grad_rows)
    run(lambda x: x.view(torch.float64).flatten(), grad_rows)

    def under_no_grad(x):
        with torch.no_grad():
            return x.view(torch.float64).flatten()
    run(under_no_grad, grad_rows)
    run(lambda x: (torch.view_as_real(x).flatten(), x * 2),
        lambda n: (torch.randn(n, 4, dtype=torch.complex64, requires_grad=True),))


def test_a_metadata_writer_called_as_an_aten_op_keeps_the_view_in_the_graph():
    """`aten.t_.default(v)` changes v before `v[1:]`: replaying the chain without it was
    wrong (the writer's name is `t_.default` there)."""
    def transposed(x):
        v = x.view(torch.int32)
        torch.ops.aten.t_.default(v)
        return v[1:]

    def unsqueezed(x):
        v = x.view(torch.int32)
        torch.ops.aten.unsqueeze_.default(v, 0)
        return v[0]
    for fn in (transposed, unsqueezed):
        assert replayed_views.find(torch.fx.symbolic_trace(fn), [torch.randn(3, 4)]) == []
        run(fn, _rows)


def test_a_copy_of_the_wrapper():
    wrapper = replayed_views.WithReplays(lambda x: [x], [])
    assert copy.copy(wrapper)(1) == [1]
