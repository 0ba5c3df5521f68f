"""Fewer launches in training graphs with the triton backend: a node joins an earlier
kernel past the externs (matmuls) that do not read it, so a bias gradient's column sum
runs in the kernel that stores the gradient and its cast to the parameter's dtype in the
sum's kernel; and independent pointwise kernels launch together.  Values (forward and
gradients) match eager, and the kernel counts are the fused ones."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend  # noqa: E402
from triton_harness import triton_check_grads  # noqa: E402

BF16 = dict(atol=6e-2, rtol=3e-2)  # (matmul outputs of a few units: bf16 steps of 0.03)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    backend.COMPILED.clear()


def module(kind):
    (m,) = [m for m in backend.COMPILED if m.kind == kind]
    return m


def train_step(fn, *args, tol=BF16):
    """fn compiled with the triton backend, forward and backward, matches eager (values
    and the gradients of every floating argument); returns (forward, backward) modules."""
    eager_graphs = backend.STATS["eager_graphs"]
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    triton_check_grads(lambda *a: fn(*a), *leaves, half_as_float=True, **tol)
    assert backend.STATS["eager_graphs"] == eager_graphs
    return module("forward"), module("backward")


def bf16_linear(x, w, b):
    """A Linear under autocast: fp32 parameters cast to bf16 for the matmul."""
    return F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16), b.to(torch.bfloat16))


def test_bias_grad_sum_and_cast_join_the_gradient_kernel():
    """The gradient of gelu's input, its column sum (the bias gradient) and that sum's cast
    to fp32 are one kernel, though the matmuls of the weight's and the input's gradients
    come between them in the graph."""
    x, w, b = torch.randn(32, 16), torch.randn(24, 16) * 0.2, torch.randn(24)
    fw, bw = train_step(lambda x, w, b: F.gelu(bf16_linear(x, w, b)).float(), x, w, b)
    sums = [k for k in bw.kernels if "tl.reduce(" in k.source]
    assert len(sums) == 1, bw.source
    # it stores the bf16 gradient (for the matmuls) and the fp32 bias gradient
    assert sorted(str(c.dtype) for c in sums[0].stores) == ["torch.bfloat16", "torch.float32"]
    assert len(bw.kernels) == 2, bw.source   # + the casts of the two matmuls' outputs, in one launch


def test_parameter_casts_share_kernels():
    """The casts of parameters of one size run in one kernel (nothing reads them first),
    independent pointwise kernels in a row are one launch, and a cast weight stored for
    the backward is the buffer its matmul reads transposed."""
    x = torch.randn(8, 16)
    w1, w2, w3 = (torch.randn(16, 16) * 0.3 for _ in range(3))
    b1, b2, b3 = (torch.randn(16) for _ in range(3))

    def mlp(x, w1, b1, w2, b2, w3, b3):
        h = torch.tanh(bf16_linear(x, w1, b1))
        h = torch.tanh(F.linear(h, w2.to(torch.bfloat16), b2.to(torch.bfloat16)))
        return F.linear(h, w3.to(torch.bfloat16), b3.to(torch.bfloat16)).float()
    fw, bw = train_step(mlp, x, w1, b1, w2, b2, w3, b3)
    # each weight's cast is stored once, though saved for the backward and transposed for
    # its matmul
    weights = [c for k in fw.kernels for c in k.stores if c.shape == (16, 16)]
    assert len(weights) == 3, fw.source
    # the casts (one combo launch), the two tanh, the output's cast
    assert len(fw.kernels) == 4, fw.source   # (11 before)
    # (10 before; 4 when the weight gradients' casts waited for the end: see below)
    assert len(bw.kernels) == 6, bw.source


def test_gradient_casts_run_where_their_matmul_ends():
    """A weight gradient's cast to its parameter's fp32 (a graph output) runs close after
    the matmul that computes it in bf16, which then dies there; stored at the graph's end
    instead, every bf16 gradient was alive beside every fp32 one (LLaMA-4 with autocast:
    0.4 GiB above Inductor's peak)."""
    from frametrace.backends.triton.ir import Extern
    x = torch.randn(8, 16)
    ws = [torch.randn(16, 16) * 0.3 for _ in range(3)]

    def mlp(x, *ws):
        h = x
        for w in ws:
            h = torch.tanh(F.linear(h.to(torch.bfloat16), w.to(torch.bfloat16)))
        return h.float()
    _, bw = train_step(mlp, x, *ws)
    # the wrapper's bf16 weight gradients (matmul outputs) alive at once, line by line
    grads = {o.name for e in bw.wrapper.schedule if isinstance(e, Extern)
             for o in (e.outputs if isinstance(e.outputs, (list, tuple)) else [e.outputs])
             if getattr(o, "dtype", None) == torch.bfloat16 and tuple(o.shape) == (16, 16)}
    live, most = set(), 0
    for line in bw.source.splitlines():
        name = line.split(" = ")[0].strip()
        if name in grads and " = aten_" in line:
            live.add(name)
        elif line.strip().startswith("del "):
            live -= {n.strip() for n in line.strip()[4:].split(",")}
        most = max(most, len(live))
    assert len(grads) == len(ws) and most <= 1, (most, bw.source)


def test_zero_fill_beside_a_column_sum_of_its_row_count():
    """A position embedding's gradient: the zeros its scatter-add starts from have as many
    elements as the sum over the batch has outputs, so they share its kernel, stored as a
    block of one value per row (a full block of the row's length did not compile, and the
    kernel's ops ran as aten calls)."""
    x, w, ids = torch.randn(4, 16, 32), torch.randn(16, 32), torch.arange(16).unsqueeze(0)
    fw, bw = train_step(lambda x, w: (x + F.embedding(ids, w)).sin(), x, w, tol=dict(atol=1e-4, rtol=1e-4))
    assert not bw.fallbacks, bw.fallbacks
    assert len(bw.kernels) <= 2, bw.source   # (1 where the fill also joins the sum: on a GPU)
    assert {str(op) for op in bw.extern_ops} == {"aten.index_put.default"}
