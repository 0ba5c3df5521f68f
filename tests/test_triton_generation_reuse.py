"""The triton backend's compile-time shortcuts leave every kernel and wrapper as they were:
the scheduler continuing a fusion candidate's generation from the kernel it joins
(config.reuse_generations, KernelCodegen.joined) and the index helpers' memo
(config.memo_indexing) give byte-identical sources, kernel arguments and tiles with
either switch off, and the compiled models match CPython.  With both on, far fewer
kernel sources are generated per final kernel (issue 31 item 5: each fusion candidate's
whole kernel was generated again, 2,529 generations for 304 kernels of EfficientNet-B0's
training graphs).  Not yet once: a candidate that changes the kernel's iteration space
(a pointwise chain joined by its reduction) or joins a kernel that writes an input in
place (BN's running statistics) is still generated whole, and foreach.groups groups a
training graph's items twice."""
import pytest
import torch
import torch.nn as nn

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config, kernel_source, tiling  # noqa: E402
from differential import check  # noqa: E402


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FRAMETRACE_TRITON_STRICT", "1")
    monkeypatch.setattr(frametrace.config, "cache_triton_results", False)
    backend.COMPILED.clear()


class Block(nn.Module):
    """An MBConv-like block: 1x1 conv + BN + SiLU, depthwise conv + BN + SiLU, a
    squeeze-excite gate, 1x1 conv + BN, residual (reductions, channel-wise broadcasts and
    BN's running statistics written in place when training)."""

    def __init__(self, c=8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, 1, 1, groups=2 * c, bias=False),
                                nn.BatchNorm2d(2 * c), nn.SiLU())
        self.se = nn.Sequential(nn.Conv2d(2 * c, 4, 1), nn.SiLU(), nn.Conv2d(4, 2 * c, 1))
        self.project = nn.Sequential(nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.dw(self.expand(x))
        y = y * self.se(y.mean((2, 3), keepdim=True)).sigmoid()
        return x + self.project(y)


def mlp(x, w1, w2, g):
    """A layer norm, a softmax over rows, a transposed operand (a tiled kernel)."""
    h = torch.nn.functional.layer_norm(x @ w1, (w1.shape[1],), g)
    p = torch.softmax(h, -1)
    return (p.t() + h.t()).relu() @ w2.t()[: x.shape[0]].t(), torch.logsumexp(h, 0)


def _sources() -> list:
    out = []
    for m in backend.COMPILED:
        out.append(m.source)
        for k in m.kernels:
            out.append((k.name, k.source, dict(k.args), list(k.symbols), repr(k.tile),
                        [c.name for c in k.stores]))
    return out


def _compile(run, settings) -> tuple:
    """(sources, calls, kernels) of `run()` compiled fresh with config `settings`; calls:
    the kernel sources made (`_source`) and the generations from scratch (`generate`)."""
    calls = {"sources": 0, "scratch": 0}
    undo = [(config, name, getattr(config, name)) for name in settings]
    for cls, attr, key in ((kernel_source.KernelCodegen, "_source", "sources"),
                           (tiling.TiledCodegen, "_source", "sources"),
                           (kernel_source.KernelCodegen, "generate", "scratch"),
                           (tiling.TiledCodegen, "generate", "scratch")):
        original = cls.__dict__[attr]

        def counted(self, *args, _original=original, _key=key):
            calls[_key] += 1
            return _original(self, *args)
        undo.append((cls, attr, original))
        setattr(cls, attr, counted)
    for name, value in settings.items():
        setattr(config, name, value)
    frametrace.reset()
    backend.COMPILED.clear()
    try:
        run()
    finally:
        for owner, attr, value in reversed(undo):
            setattr(owner, attr, value)
    return _sources(), calls, sum(len(m.kernels) for m in backend.COMPILED)


def _block_eval():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        check(model, [(x,)], backend="triton", atol=1e-4, rtol=1e-4)


def _block_train():
    torch.manual_seed(0)
    model = Block().train()
    compiled = frametrace.optimize(model, backend="triton")
    x = torch.randn(2, 8, 6, 6)
    twin = Block().train()
    twin.load_state_dict(model.state_dict())
    want = twin(x)
    want.square().sum().backward()
    got = compiled(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-3, rtol=1e-3, msg=name)
    for a, b in zip(model.buffers(), twin.buffers()):   # (running statistics, in place)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


class Dense(nn.Module):
    """DenseNet's block (issue 31 item 5): each layer reads the cat of every feature before
    it through BN + ReLU + a 1x1 conv; the cats' loads share all index terms but the
    channel's (indexing._expand's memo of an Add's terms)."""

    def __init__(self, c=4, growth=2, n=5):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(c + i * growth), nn.ReLU(), nn.Conv2d(c + i * growth, growth, 1))
            for i in range(n))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1).relu()


def _dense():
    torch.manual_seed(0)
    model = Dense().eval()
    for m in model.modules():   # (statistics of their own: BN's not an identity)
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        check(model, [(x,)], backend="triton", atol=1e-4, rtol=1e-4)


def _mlp():
    torch.manual_seed(0)
    args = (torch.randn(6, 16), torch.randn(16, 12), torch.randn(6, 12), torch.randn(12))
    check(mlp, [args], backend="triton", atol=1e-4, rtol=1e-4)


CASES = {"block_eval": _block_eval, "block_train": _block_train, "mlp": _mlp, "dense": _dense}
OFF = [{"reuse_generations": False}, {"memo_indexing": False},
       {"reuse_generations": False, "memo_indexing": False}]


@pytest.mark.parametrize("case", list(CASES))
def test_sources_are_the_same_with_the_shortcuts_off(case):
    """The same kernels and wrappers (and values matching CPython) with the scheduler's
    reuse of generations and the index memo on, and with each off."""
    on, calls_on, kernels = _compile(CASES[case], {})
    assert kernels > 0
    for settings in OFF:
        off, calls_off, _ = _compile(CASES[case], settings)
        assert off == on, settings
        if "reuse_generations" in settings:
            assert calls_off["sources"] > calls_on["sources"], (calls_off, calls_on)


def test_fewer_kernel_sources_are_generated():
    """EfficientNet-like blocks in training (where BN's running statistics are written in
    place and the backward joins many nodes into few kernels): the kernel sources made,
    candidates' included, stay a small multiple of the kernels launched (5.2 when this
    was written, 7.7 with config.reuse_generations off), and about half as many
    generations start from scratch."""
    def run():
        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block(), Block()).train()
        compiled = frametrace.optimize(model, backend="triton")
        compiled(torch.randn(2, 8, 4, 4)).sum().backward()
    _, on, kernels = _compile(run, {})
    _, off, _ = _compile(run, {"reuse_generations": False})
    assert on["sources"] <= 6 * kernels, (on, kernels)
    assert on["sources"] < off["sources"] and on["scratch"] < 0.6 * off["scratch"], (on, off)


def test_expanded_sums_are_sympys():
    """indexing._expand (an Add's terms expanded once a compile, config.memo_indexing) gives
    sympy.expand's expression, structure and all, for the index shapes a cat's loads make;
    and the memo is what it used (a second sum sharing terms finds them there)."""
    import sympy
    from frametrace.backends.triton import context, indexing
    x, y = indexing.XINDEX, indexing.YINDEX
    exprs = [8192 * indexing.ModIdx(indexing.FloorDiv(x, 64), 128) + 64 * (x % 64 + 3) - 2048,
             (x + 1) * (y + 2) + 4 * indexing.FloorDiv(x + y * 3, 8) + 7,
             3 * (x + 2) ** 2 + 2 * x * (y - 1) - x, x + 5, x * (y + 1)]
    ctx = context.CompileContext()
    with ctx.active():
        for e in exprs + exprs:
            got = indexing._expand(e)
            assert sympy.srepr(got) == sympy.srepr(sympy.expand(e)), e
    assert any(isinstance(k, tuple) and k[0] is indexing._expand for k in ctx.memo)
