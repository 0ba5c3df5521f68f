"""The values a training forward saves for its backward, stored in the layout the
forward computed them in (config.saved_values_own_layout): the backward is built for
those strides from the start, the user's outputs keep eager's strides, and a backward
whose saved values come in other strides than recorded is built again, never read
wrong.  Attacked with transposed, channels-last, expanded and offset inputs, outputs
that are saved values too, dynamic sizes and the link between the graphs cut."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config, layout  # noqa: E402
from triton_harness import triton_check_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
REBUILT = "other strides than traced"
CL = torch.channels_last


def _inputs(kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "transposed":
        x = torch.randn(6, 5, generator=g).t()
    elif kind == "expanded":
        x = torch.randn(1, 6, generator=g).expand(5, 6)
    elif kind == "offset":
        x = torch.randn(7, 8, generator=g)[1:6, 2:8]
    else:
        x = torch.randn(5, 6, generator=g)
    w = torch.randn(6, 4, generator=g)
    return x.clone().requires_grad_() if kind != "expanded" else x.detach().requires_grad_(), w.requires_grad_()


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "expanded", "offset"])
def test_saved_values_of_any_input_layout_give_eagers_gradients_with_one_backward_build(caplog, kind):
    # a pointwise value saved for a matmul's backward, one saved for sin's and one
    # returned to the caller as well (eager's strides for the caller, whatever the saved
    # copy's)
    def f(x, w):
        h = (x * 0.5 - 1).exp()
        y = torch.tanh(h @ w)
        return y, h.t()
    with caplog.at_level("INFO", logger="frametrace"):
        triton_check_grads(f, calls=[_inputs(kind, s) for s in range(3)])
    assert REBUILT not in caplog.text


def _conv_net(x, w1, w2):
    y = F.conv2d(x, w1, padding=1)
    h = F.relu(y)
    return y, F.conv2d(h, w2).sin()


def _conv_inputs(fmt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 6, 6, generator=g).contiguous(memory_format=fmt).requires_grad_()
    return x, torch.randn(4, 3, 3, 3, generator=g).requires_grad_(), torch.randn(5, 4, 1, 1, generator=g).requires_grad_()


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
def test_channels_last_convs_saved_and_returned_keep_eagers_strides_for_the_caller(monkeypatch, caplog, fmt):
    # y is returned and saved (conv2d's input gradient of h needs relu's mask): the
    # caller gets eager's strides, the backward what the forward stored
    monkeypatch.setattr(config, "channels_last_convs", True)
    with caplog.at_level("INFO", logger="frametrace"):
        calls = [_conv_inputs(fmt, s) for s in range(2)]
        triton_check_grads(_conv_net, calls=calls)
        x, w1, w2 = _conv_inputs(fmt, 5)
        y, _ = frametrace.optimize(backend="triton")(_conv_net)(x, w1, w2)
        assert y.stride() == _conv_net(x, w1, w2)[0].stride()
    assert REBUILT not in caplog.text


def test_a_backward_without_the_forwards_layouts_is_built_again_and_right(monkeypatch, caplog):
    # the link cut (a graph AOTAutograd's own partitioner split, an old entry): the
    # backward is built for eager's strides, meets the forward's at its first call, and
    # is built again for them
    monkeypatch.setattr(config, "channels_last_convs", True)
    monkeypatch.setattr(layout, "backward_examples", lambda gm, examples: examples)
    with caplog.at_level("INFO", logger="frametrace"):
        triton_check_grads(_conv_net, calls=[_conv_inputs(torch.contiguous_format, s) for s in range(2)])
    assert REBUILT in caplog.text


def test_switched_off_the_forward_saves_eagers_strides(monkeypatch):
    monkeypatch.setattr(config, "channels_last_convs", True)
    monkeypatch.setattr(config, "saved_values_own_layout", False)
    backend.COMPILED.clear()
    triton_check_grads(_conv_net, calls=[_conv_inputs(torch.contiguous_format, s) for s in range(2)])
    fw = [m for m in backend.COMPILED if m.kind == "forward"][-1]
    # every 4-d buffer it returns is NCHW (the relu mask's input and the activations)
    ret = fw.source.strip().splitlines()[-1]
    names = ret[ret.index("[") + 1:ret.rindex("]")].split(", ")
    for line in fw.source.splitlines():
        for n in names:
            if line.strip().startswith(f"{n} = empty_strided(") and line.count(",") > 6:
                sizes = line.split("((")[1].split(")")[0]
                strides = line.split("), (")[1].split(")")[0]
                dims = [int(v) for v in sizes.split(",") if v.strip()]
                if len(dims) == 4:
                    want = torch.empty(dims).stride()
                    assert tuple(int(v) for v in strides.split(",") if v.strip()) == want, line


def test_dynamic_sizes_keep_traced_strides_for_saved_values(caplog):
    # symbolic sizes: the backward is built for its traced strides, so the forward
    # stores saved values in them (no free layout), at every batch size
    def f(x, w):
        h = (x.t() * 0.5).exp()
        return torch.tanh(h @ w)
    g = torch.Generator().manual_seed(0)
    calls = [(torch.randn(6, n, generator=g).requires_grad_(), torch.randn(6, 3, generator=g).requires_grad_())
             for n in (5, 7, 9)]
    with caplog.at_level("INFO", logger="frametrace"):
        triton_check_grads(f, calls=calls)
    assert REBUILT not in caplog.text


def _cl_conv_inputs(seed, extra=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 5, generator=g).requires_grad_()
    w1 = torch.randn(4, 3, 3, 3, generator=g).requires_grad_()
    w2 = torch.randn(4, 4, 3, 3, generator=g).requires_grad_()
    return (x, w1, w2) + tuple(torch.randn(*s, generator=g).requires_grad_() for s in extra)


def test_a_saved_value_the_backward_reads_through_as_strided_keeps_eagers_strides(monkeypatch, caplog):
    # as_strided addresses memory, not positions: the backward recomputes this view of
    # the saved relu output from it, which must then be laid out as eager's (a
    # channels-last copy gave gradients off by 8)
    monkeypatch.setattr(config, "channels_last_convs", True)

    def f(x, w1, w2):
        y = F.conv2d(x, w1, padding=1).relu()
        a = F.conv2d(y, w2, padding=1)
        z = y.as_strided((y.numel() // 2,), (2,))
        return a.sum() + z.sin().sum()
    with caplog.at_level("INFO", logger="frametrace"):
        triton_check_grads(f, calls=[_cl_conv_inputs(s) for s in range(2)], atol=1e-4, rtol=1e-4)
    assert REBUILT not in caplog.text


def test_a_saved_value_viewed_as_another_dtype_stays_compiled(monkeypatch):
    # a dtype view of another element size needs eager's dense last dim: the forward
    # keeps eager's strides for that saved value instead of failing its first call
    monkeypatch.setattr(config, "channels_last_convs", True)
    failures = []
    give_up = backend._give_up
    monkeypatch.setattr(backend, "_give_up", lambda gm, e: (failures.append(e), give_up(gm, e))[1])

    def f(x, w1, w2, v):
        y = F.conv2d(x, w1, padding=1).relu()
        a = F.conv2d(y, w2, padding=1)
        return a.sum() + (v * (y.view(torch.int16).float() * 1e-4)).sum()
    triton_check_grads(f, calls=[_cl_conv_inputs(s, [(2, 4, 5, 10)]) for s in range(2)], atol=1e-3, rtol=1e-4)
    assert not failures, failures


def test_as_strided_of_a_channels_last_convolution_reads_eagers_memory(monkeypatch):
    # the convolution ran channels-last for speed; as_strided must see the memory eager's
    # NCHW result has (a copy in that layout), forward and inference alike
    monkeypatch.setattr(config, "channels_last_convs", True)

    def f(x, w):
        y = F.conv2d(x, w, padding=1)
        return y.as_strided((y.numel() // 2,), (2,)).sum(), y.sum()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 5, 5, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    with torch.no_grad():
        got = frametrace.optimize(backend="triton")(f)(x, w)
        want = f(x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
