"""backend="triton", config.eviction_hints (off by default): a looped kernel that reads an input in more than
one loop over the row (a looped norm: statistics, then output) loads it `evict_last` in all
but its last loop and `evict_first` in its last; other loads take no hint.  A hint changes
no value: every program here runs through Triton's interpreter against eager, with the
switch on and off, over several calls (rows looped in blocks of 16: conftest.short_loops),
on transposed, channels-last and expanded inputs, NaN and infinities, and the text the
pass rewrites (addresses with calls and brackets of their own) is checked directly."""
import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, config  # noqa: E402
from frametrace.backends.triton.kernel_source import eviction_hints  # noqa: E402
from conftest import short_loops  # noqa: E402
from triton_harness import triton_check  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered")


@pytest.fixture(autouse=True)
def _looped(triton_interpreter, monkeypatch):
    frametrace.reset()
    short_loops(monkeypatch)
    monkeypatch.setattr(config, "eviction_hints", True)   # (off by default: config.py says why)
    # (a persistent kernel's reloaded row takes hints of its own: test_triton_persistent_reload.py)
    monkeypatch.setattr(config, "persistent_reload", False)


def _r(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _gn(seed):
    x = _r(2, 6, 5, 7, seed=seed)
    if seed == 1:
        x = x.contiguous(memory_format=torch.channels_last)
    if seed == 2:
        x[1, 3, 2, 2] = float("nan")
        x[0, 0, 0, 0] = float("inf")
    return x, _r(6, seed=seed + 1), _r(6, seed=seed + 2)


def _rows(seed):
    x = _r(6, 40, seed=seed)
    if seed == 1:
        x = _r(40, 6, seed=seed).t()
    if seed == 2:
        x = _r(1, 40, seed=seed).expand(6, 40)
    return (x,)


PROGRAMS = {
    # statistics then output: x read in two loops
    "group_norm_silu": (lambda x, w, b: F.silu(F.group_norm(x, 3, w, b)), _gn),
    "l2_normalize": (lambda x: F.normalize(x, dim=-1), _rows),
    "softmax": (lambda x: torch.softmax(x * 2, -1), _rows),
    "layer_norm": (lambda x: F.layer_norm(x, (40,)), _rows),
    # x read twice, in one loop each, plus once more
    "centred_max": (lambda x: (x - x.mean(-1, keepdim=True)) / x.amax(-1, keepdim=True), _rows),
}


def hinted(mods):
    return [k for m in mods for k in m.kernels if "eviction_policy" in k.source]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hints_change_no_value(monkeypatch, name):
    fn, make = PROGRAMS[name]
    sources = {}
    for on in (True, False):
        monkeypatch.setattr(config, "eviction_hints", on)
        frametrace.reset()
        backend.COMPILED.clear()
        mod = triton_check(fn, calls=[make(seed) for seed in range(3)], atol=1e-5, rtol=1e-4)
        sources[on] = "\n".join(k.source for m in backend.COMPILED for k in m.kernels)
        assert bool(hinted(backend.COMPILED)) == on, mod.source
    assert sources[True] != sources[False]


def test_group_norm_hints_the_row_and_not_the_weight():
    """x: evict_last where the statistics read it, evict_first where the output does; the
    weight and bias, read in the output loop only, take none."""
    fn, make = PROGRAMS["group_norm_silu"]
    mod = triton_check(fn, calls=[make(0)], atol=1e-5, rtol=1e-4)
    (k,) = hinted([mod])
    loads = [line.strip() for line in k.source.splitlines() if "tl.load(" in line]
    x_loads = [line for line in loads if "in_ptr0 " in line]
    assert len(x_loads) == 2, k.source
    assert "evict_last" in x_loads[0] and "evict_first" in x_loads[1], k.source
    assert all("eviction_policy" not in line for line in loads if "in_ptr0 " not in line), k.source


def test_persistent_and_pointwise_kernels_take_none():
    """Rows in registers (one pass: nothing read again) and pointwise kernels: no hints."""
    mod = triton_check(lambda x: (F.normalize(x, dim=-1) + x.sin(), x.cos()),
                       calls=[(_r(6, 8, seed=s),) for s in range(2)], atol=1e-5, rtol=1e-4)
    assert len(mod.kernels) >= 1 and not hinted([mod]), mod.source


def test_the_rewrite_of_the_text():
    lines = [
        "acc0 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)",
        "for roffset in range(0, rnumel, RBLOCK):",
        "    rindex = roffset + rbase",
        "    tmp1 = tl.load(in_ptr0 + ((rindex + 40*(xindex // 3))), rmask & xmask, other=float('nan'))",
        "    tmp2 = tl.load(in_ptr1 + (tl.where(tmp1 < 0, 0, rindex)), rmask, other=0)",
        "tmp3 = tl.load(in_ptr0 + (xindex))",
        "    tmp9 = tl.load(in_ptr0 + (xindex))",   # indented, but after the loop ended: outside
        "while roffset < rnumel:",
        "    tmp4 = tl.load(in_ptr0 + ((rindex + 40*xindex)), rmask) + tl.load(in_ptr2 + (rindex), rmask)",
        "    roffset += RBLOCK",
    ]
    out = eviction_hints(lines)
    assert out[3] == ("    tmp1 = tl.load(in_ptr0 + ((rindex + 40*(xindex // 3))), rmask & xmask, "
                      "other=float('nan'), eviction_policy='evict_last')")
    assert out[4] == lines[4]          # read in one loop only
    assert out[5] == lines[5] and out[6] == lines[6]   # outside the loops
    assert out[8] == ("    tmp4 = tl.load(in_ptr0 + ((rindex + 40*xindex)), rmask, eviction_policy='evict_first')"
                      " + tl.load(in_ptr2 + (rindex), rmask)")
    assert [line for i, line in enumerate(out) if i not in (3, 8)] == \
        [line for i, line in enumerate(lines) if i not in (3, 8)]
