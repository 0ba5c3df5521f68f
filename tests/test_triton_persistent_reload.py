"""backend="triton", config.persistent_reload: a persistent kernel with one reduction (an L2
or RMS norm) loads its row again after the reduction instead of keeping it in registers
across it (`evict_last` on the first load, `evict_first` on the second); kernels of chained
reductions (softmax, var_mean) keep their rows.  Every program runs through Triton's
interpreter against eager with the switch on and off, over several calls: in-place
normalisation (the reload must read the old row, before the kernel's own store), stored
residuals, branches (a cat of the normalized row), argmax, NaN/inf rows, transposed,
channels-last, expanded and offset inputs, half dtypes and symbolic batch sizes."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered",
                                        "ignore:divide by zero")


@pytest.fixture(autouse=True)
def _fresh(triton_interpreter):
    frametrace.reset()
    backend.COMPILED.clear()


def _r(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def rms_norm(h, r, w):
    h = h + r
    v = h.float().pow(2).mean(-1, keepdim=True)
    return (h.float() * torch.rsqrt(v + 1e-6)).to(h.dtype) * w, h


def _rows(seed, dtype=torch.float32):
    """Rows of 48 (a masked block of 64): plain, transposed, expanded, with NaN and inf,
    sliced at an offset."""
    x = _r(6, 48, seed=seed, dtype=dtype)
    if seed == 1:
        x = _r(48, 6, seed=seed, dtype=dtype).t()
    elif seed == 2:
        x = _r(1, 48, seed=seed, dtype=dtype).expand(6, 48)
    elif seed == 3:
        x[1, 0], x[2, 47], x[3, 5] = float("nan"), float("inf"), float("-inf")
    elif seed == 4:
        x = _r(7, 50, seed=seed, dtype=dtype)[1:, 2:]
    return x


def _norm_inputs(seed, dtype=torch.float32):
    return _rows(seed, dtype), _rows(seed + 10, dtype), _r(48, seed=seed + 20, dtype=dtype)


def _in_place(x):
    return x.div_(x.norm(dim=-1, keepdim=True).clamp_min(1e-6))


PROGRAMS = {
    "l2_normalize": (lambda x: F.normalize(x, dim=-1), lambda s, d: (_rows(s, d),)),
    "rms_norm_residual": (rms_norm, _norm_inputs),
    "scaled_by_sum": (lambda x: x * x.abs().sum(-1, keepdim=True), lambda s, d: (_rows(s, d),)),
    "cat_of_normalized": (lambda x: torch.cat([F.normalize(x, dim=-1), x], -1), lambda s, d: (_rows(s, d),)),
    "is_row_max": (lambda x: (x == x.amax(-1, keepdim=True)).float() + x, lambda s, d: (_rows(s, d),)),
    "argmax_and_row": (lambda x: (x.argmax(-1), x.sin()), lambda s, d: (_rows(s, d),)),
    "in_place": (_in_place, lambda s, d: (_rows(s, d).contiguous(),)),
    "channels_last_sum": (lambda x: x / (1 + x.sum(1, keepdim=True).abs()),
                          lambda s, d: (_r(2, 8, 3, 5, seed=s, dtype=d).contiguous(memory_format=torch.channels_last),)),
    # chained reductions: no reload
    "softmax": (lambda x: torch.softmax(x, -1), lambda s, d: (_rows(s, d),)),
    "layer_norm": (lambda x: F.layer_norm(x, (48,)), lambda s, d: (_rows(s, d),)),
}
CHAINED = ("softmax", "layer_norm")


def loads_of_input(mod) -> list:
    return [line.strip() for k in mod.kernels for line in k.source.splitlines()
            if "tl.load(in_ptr0 " in line]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_values(monkeypatch, name, on):
    monkeypatch.setattr(config, "persistent_reload", on)
    fn, make = PROGRAMS[name]
    triton_check(fn, calls=[make(s, torch.float32) for s in range(5)], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["l2_normalize", "rms_norm_residual", "in_place"])
def test_half_values(name, dtype):
    fn, make = PROGRAMS[name]
    triton_check(fn, calls=[make(s, dtype) for s in (0, 3)], atol=2e-2, rtol=2e-2, half_as_float=True)


def test_symbolic_batch():
    """Batch sizes that change between calls: the recompiled graph's kernels take a
    symbolic row count, the row length static (still persistent, still reloaded)."""
    fn, make = PROGRAMS["rms_norm_residual"]
    calls = [(_r(n, 48, seed=n), _r(n, 48, seed=n + 1), _r(48, seed=2)) for n in (3, 5, 9)]
    mod = triton_check(fn, calls=calls, atol=1e-5, rtol=1e-4)
    assert any(k.symbols for k in mod.kernels), mod.source
    assert len(loads_of_input(mod)) == 2, mod.source


@pytest.mark.parametrize("name", ["l2_normalize", "rms_norm_residual", "in_place", "scaled_by_sum"])
def test_one_reduction_reads_its_row_twice(monkeypatch, name):
    """The row's input: loaded for the reduction with evict_last, again after it with
    evict_first; with the switch off, once, without hints."""
    fn, make = PROGRAMS[name]
    got = {}
    for on in (True, False):
        monkeypatch.setattr(config, "persistent_reload", on)
        frametrace.reset()
        mod = triton_check(fn, calls=[make(0, torch.float32)], atol=1e-5, rtol=1e-4)
        got[on] = loads_of_input(mod)
    assert len(got[True]) == 2, got[True]
    assert "evict_last" in got[True][0] and "evict_first" in got[True][1], got[True]
    assert len(got[False]) == 1 and "eviction_policy" not in got[False][0], got[False]


@pytest.mark.parametrize("name", CHAINED)
def test_chained_reductions_keep_their_rows(name):
    fn, make = PROGRAMS[name]
    mod = triton_check(fn, calls=[make(0, torch.float32)], atol=1e-5, rtol=1e-4)
    loads = loads_of_input(mod)
    assert len(loads) == 1 and "eviction_policy" not in loads[0], loads


def test_in_place_reload_reads_the_old_row():
    """The kernel writes x in place: both loads precede its store."""
    fn, make = PROGRAMS["in_place"]
    mod = triton_check(fn, calls=[make(s, torch.float32) for s in range(2)], atol=1e-5, rtol=1e-4)
    (k,) = [k for k in mod.kernels if "tl.load(in_ptr0 " in k.source]
    lines = k.source.splitlines()
    loads = [i for i, line in enumerate(lines) if "tl.load(in_ptr0 " in line]
    stores = [i for i, line in enumerate(lines) if "tl.store(" in line]
    assert len(loads) == 2 and max(loads) < min(stores), k.source
