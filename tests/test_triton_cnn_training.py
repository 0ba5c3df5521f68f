"""CNN training through the triton backend (issue 31 item 4): what the forward saves for
the backward (max pooling's indices as int8 offsets in their windows, not int64 flat
indices), and training steps of a ResNet bottleneck block (BatchNorm with its running
statistics, max pooling, SGD with momentum) against eager over several steps, with
channels-last inputs and under autocast."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from triton_harness import triton_check_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
F32 = dict(atol=1e-5, rtol=1e-5)


def _saved_dtypes(fw):
    """The dtypes of the buffers the forward returns beyond its first output."""
    ret = fw.source.strip().splitlines()[-1]
    names = ret[ret.index("[") + 1:ret.rindex("]")].split(", ")
    dtypes = {}
    for line in fw.source.splitlines():
        for n in names:
            if line.strip().startswith(f"{n} = empty_strided("):
                dtypes[n] = line.split("dtype=")[1].split(",")[0]
    return dtypes


@pytest.mark.parametrize("kernel, stride, padding, dilation, shape", [
    (3, 2, 1, 1, (2, 3, 9, 11)),     # ResNet's stem pooling
    (2, 2, 0, 1, (2, 2, 8, 8)),      # windows that do not overlap
    (3, 1, 1, 2, (1, 2, 7, 9)),      # dilated, overlapping
    ((2, 3), (1, 2), (1, 1), 1, (3, 6, 7)),   # unbatched, rectangular
])
def test_max_pool_backward_reads_int8_offsets(kernel, stride, padding, dilation, shape):
    def f(x):
        return F.max_pool2d(x * 2, kernel, stride, padding, dilation).sin()
    calls = [(torch.randn(*shape, generator=torch.Generator().manual_seed(s)).requires_grad_(),) for s in range(2)]
    # (ties: integers make several maxima in one window; the first one wins, as in eager)
    calls.append((torch.randint(-2, 3, shape, generator=torch.Generator().manual_seed(9)).float().requires_grad_(),))
    backend.COMPILED.clear()
    triton_check_grads(f, calls=calls, **F32)
    fw = [m for m in backend.COMPILED if m.kind == "forward"][-1]
    saved = _saved_dtypes(fw)
    assert "torch.int8" in saved.values() and "torch.int64" not in saved.values(), fw.source


def test_max_pool_indices_saved_as_they_are_when_switched_off(monkeypatch):
    monkeypatch.setattr(config, "pool_offsets", False)
    backend.COMPILED.clear()
    triton_check_grads(lambda x: F.max_pool2d(x, 3, 2, 1).sin(), torch.randn(2, 3, 9, 9, requires_grad=True), **F32)
    fw = [m for m in backend.COMPILED if m.kind == "forward"][-1]
    assert "torch.int64" in _saved_dtypes(fw).values(), fw.source


def test_max_pool_indices_returned_to_the_caller_stay_indices():
    def f(x):
        out, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return out.sin(), idx
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    out, idx = frametrace.optimize(backend="triton")(f)(x)
    want, want_idx = f(x.detach().clone())
    assert idx.dtype == torch.int64 and torch.equal(idx, want_idx)
    torch.testing.assert_close(out, want, **F32)


class Bottleneck(nn.Module):
    """ResNet-50's block after its stem (conv, BatchNorm, ReLU, max pooling)."""

    def __init__(self, cin=4, width=4, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, width * 4, 1, bias=False), nn.BatchNorm2d(width * 4)
        self.down = nn.Sequential(nn.Conv2d(cin, width * 4, 1, bias=False), nn.BatchNorm2d(width * 4))
        self.fc = nn.Linear(width * 4, classes)

    def forward(self, x, y):
        x = self.stem(x)
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = F.relu(self.bn3(self.conv3(h)) + self.down(x))
        return F.cross_entropy(self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)), y)


def _train(model, step_fn, batches, amp):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    losses = []
    for x, y in batches:
        with torch.autocast("cpu", torch.bfloat16, enabled=amp):
            loss = step_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    return torch.stack(losses)


def _setup(channels_last):
    torch.manual_seed(0)
    model = Bottleneck()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 16, 16, generator=g).contiguous(memory_format=fmt),
                torch.randint(0, 5, (4,), generator=g)) for _ in range(3)]
    return model.to(memory_format=fmt), batches


def _compiled_run(model, batches, amp):
    ours = copy.deepcopy(model)
    backend.COMPILED.clear()
    losses = _train(ours, frametrace.optimize(backend="triton")(ours), batches, amp)
    assert {m.kind for m in backend.COMPILED} >= {"forward", "backward"}
    return losses, ours.state_dict()


def _eager_run(model, batches, amp):
    ref = copy.deepcopy(model)
    return _train(ref, ref, batches, amp), ref.state_dict()


@pytest.mark.parametrize("channels_last", [False, True])
def test_bottleneck_training_steps_match_eager(channels_last):
    model, batches = _setup(channels_last)
    got, got_state = _compiled_run(model, batches, amp=False)
    want, want_state = _eager_run(model, batches, amp=False)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for name, a in got_state.items():
        # weights after three SGD steps, and BatchNorm's running statistics and counts
        torch.testing.assert_close(a, want_state[name], atol=1e-4, rtol=1e-4, msg=name)


def test_bottleneck_training_under_autocast_is_as_close_as_eager_and_pool_offsets_change_nothing(monkeypatch):
    """Under bf16 autocast, after three steps, the weights and running statistics are
    as close to fp32 training as eager's bf16 training is (the largest difference over
    the tensors, each relative to its largest magnitude: kernels keep autocast's
    intermediates unrounded where eager rounds each op, so the two bf16 runs differ
    tensor by tensor about as much as each differs from fp32); and saving max pooling's
    indices as int8 offsets leaves every number as it was."""
    model, batches = _setup(False)
    got, got_state = _compiled_run(model, batches, amp=True)
    want_state = _assert_bf16_as_close_as_eagers(model, batches, got, got_state)
    assert all(torch.equal(a, want_state[n]) for n, a in got_state.items() if not a.is_floating_point())
    monkeypatch.setattr(config, "pool_offsets", False)
    before, before_state = _compiled_run(model, batches, amp=True)
    assert torch.equal(got, before)
    for name, a in got_state.items():
        assert torch.equal(a, before_state[name]), name


def _assert_bf16_as_close_as_eagers(model, batches, got, got_state) -> dict:
    """Compiled bf16 training (losses `got`, state after) is as close to fp32 training as
    eager's bf16 training is: the losses, and the largest difference over the tensors,
    each relative to its largest magnitude.  Returns eager's bf16 state."""
    want, want_state = _eager_run(model, batches, amp=True)
    exact, exact_state = _eager_run(model, batches, amp=False)
    assert (got - exact).abs().max() <= 2 * (want - exact).abs().max() + 1e-3

    def worst(state):
        return max(((a - exact_state[n]).abs().max() / exact_state[n].abs().max().clamp_min(1e-6)).item()
                   for n, a in state.items() if a.is_floating_point())
    assert worst(got_state) <= 1.5 * worst(want_state), (worst(got_state), worst(want_state))
    return want_state


def _allocated_bytes(mod):
    """Bytes of the buffers a module's wrapper allocates, by dtype name."""
    import re
    out = {}
    for m in re.finditer(r"empty_strided\(\(([^)]*)\),.*dtype=torch\.(\w+)", mod.source):
        n = 1
        for size in filter(str.strip, m.group(1).split(",")):
            n *= int(size)
        out[m.group(2)] = out.get(m.group(2), 0) + n * getattr(torch, m.group(2)).itemsize
    return out


def test_batchnorm_backward_can_store_the_bf16_gradient_not_its_fp32_upcast(monkeypatch):
    """BatchNorm's backward upcasts the bf16 gradient it gets (after ReLU's mask) for its
    three kernels (two sums and the input gradient): with config.store_before_upcast the
    gradient is stored before the cast, in half the bytes, rounded to bf16 as eager's
    is, and training stays as close to fp32 training as eager's bf16 training is."""
    model, batches = _setup(False)
    off = _compiled_run(model, batches, amp=True)
    off_bytes = _allocated_bytes([m for m in backend.COMPILED if m.kind == "backward"][-1])
    monkeypatch.setattr(config, "store_before_upcast", True)
    got, got_state = _compiled_run(model, batches, amp=True)
    on_bytes = _allocated_bytes([m for m in backend.COMPILED if m.kind == "backward"][-1])
    assert sum(on_bytes.values()) < 0.9 * sum(off_bytes.values()), (on_bytes, off_bytes)
    assert on_bytes["float32"] < off_bytes["float32"], (on_bytes, off_bytes)
    _assert_bf16_as_close_as_eagers(model, batches, got, got_state)
    assert (got - off[0]).abs().max() < 1e-2     # (bf16 rounding apart)


# -- channels-last training (on CUDA `channels_last_convs="auto"` picks it for ResNets) --
def _conv_backward_operands(mod):
    """(grad_output, input, weight) of each convolution_backward the backward calls."""
    from frametrace.backends.triton.ir import Extern
    return [e.args[:3] for e in mod.wrapper.schedule
            if isinstance(e, Extern) and "convolution_backward" in str(e.op)]


def _is_cl(b):
    want = torch.empty(b.shape).contiguous(memory_format=torch.channels_last).stride()
    return all(s == t for n, s, t in zip(b.shape, b.stride, want) if n != 1)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw_input", "channels_last_input"])
def test_channels_last_training_steps_match_eager_and_cudnn_gets_channels_last_operands(
        monkeypatch, caplog, channels_last):
    """Forced on (CPU), the forward saves the activations channels-last as it computed
    them, the backward is built for those strides (once: not again at its first call),
    and every convolution_backward gets its gradient and activation channels-last: cuDNN
    transposes nothing.  Losses, weights, running statistics and the gradients' strides
    (eager's, NCHW parameters) match eager's over three SGD steps."""
    monkeypatch.setattr(config, "channels_last_convs", True)
    model, batches = _setup(channels_last)
    with caplog.at_level("INFO", logger="frametrace"):
        got, got_state = _compiled_run(model, batches, amp=False)
    assert "other strides than traced" not in caplog.text
    bw = [m for m in backend.COMPILED if m.kind == "backward"][-1]
    operands = _conv_backward_operands(bw)
    assert len(operands) == 5
    for g, x, _ in operands:
        assert _is_cl(g) and _is_cl(x), (g, x)
    want, want_state = _eager_run(model, batches, amp=False)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for name, a in got_state.items():
        torch.testing.assert_close(a, want_state[name], atol=1e-4, rtol=1e-4, msg=name)

    # the gradients' strides are eager's (a weight's cuDNN gives channels-last is copied)
    ours, ref = copy.deepcopy(model), copy.deepcopy(model)
    step = frametrace.optimize(backend="triton")(ours)
    x, y = batches[0]
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    step(xs[0], y).backward()
    ref(xs[1], y).backward()
    assert xs[0].grad.stride() == xs[1].grad.stride()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, **F32)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert all(s == t for n, s, t in zip(p.shape, p.grad.stride(), q.grad.stride()) if n != 1), name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_channels_last_training_under_autocast_stores_the_weight_copies_channels_last(monkeypatch):
    """Under autocast the bf16 copies of the weights are computed by the graph: they are
    stored channels-last for the convolutions (no transpose by cuDNN), forward and
    backward, and training stays as close to fp32 training as eager's bf16 training."""
    monkeypatch.setattr(config, "channels_last_convs", True)
    model, batches = _setup(False)
    got, got_state = _compiled_run(model, batches, amp=True)
    bw = [m for m in backend.COMPILED if m.kind == "backward"][-1]
    for g, x, w in _conv_backward_operands(bw):
        assert _is_cl(g) and _is_cl(x) and _is_cl(w), (g, x, w)
    _assert_bf16_as_close_as_eagers(model, batches, got, got_state)


def test_saved_values_in_eagers_layout_when_switched_off(monkeypatch, caplog):
    """config.saved_values_own_layout off: the forward saves eager's (NCHW) strides, the
    backward copies them channels-last for cuDNN; the same numbers."""
    monkeypatch.setattr(config, "channels_last_convs", True)
    model, batches = _setup(False)
    on, on_state = _compiled_run(model, batches, amp=False)
    on_kernels = len([m for m in backend.COMPILED if m.kind == "backward"][-1].kernels)
    monkeypatch.setattr(config, "saved_values_own_layout", False)
    with caplog.at_level("INFO", logger="frametrace"):
        off, off_state = _compiled_run(model, batches, amp=False)
    assert "other strides than traced" not in caplog.text
    off_kernels = len([m for m in backend.COMPILED if m.kind == "backward"][-1].kernels)
    assert off_kernels > on_kernels     # (the copies of the saved activations)
    torch.testing.assert_close(on, off, **F32)
    for name, a in on_state.items():
        torch.testing.assert_close(a, off_state[name], **F32, msg=name)
