"""Random numbers inside kernels: Philox-4x32-10, the generator of Triton's tl.rand and
tl.randn, seeded from torch's generator.

The decompositions turn every random op of a graph (rand, randn and their `_like` forms,
bernoulli, uniform_, normal_, native_dropout) into `frametrace::philox_rand(seed, offset,
size, normal, dtype)`, whose element i is a function of (seed, offset + i) only: the same
element gets the same number whatever kernel, block size or layout computes it.  A graph
draws its seed once per call, per device, from torch's default generator of that device
(`frametrace::philox_seed`, which advances it: a seeded run is reproducible, consecutive
calls differ, and eager code after the call does not replay the graph's numbers); its
random ops take consecutive ranges of counters from that seed.

Deterministic given the seed, `philox_rand` is recomputable (partition.RECOMPUTABLE_OPS):
a partitioner that recomputes has the backward recompute a dropout mask from the saved
seed instead of the forward saving it.  Its eager implementation gives the kernels'
numbers bit for bit, so that a kernel in the forward and an eager recomputation in the
backward agree: on CUDA it runs the same Triton code; elsewhere Philox runs as int64
torch ops (exact: only integer arithmetic and one float32 multiply), and the normal
transform as NumPy float32 functions, which are what Triton's interpreter evaluates
tl.log/tl.cos/tl.sqrt with.

Only the triton backend uses these decompositions: eager and aot_eager keep torch's ops.
Triton's own tl.rand is not called from generated kernels: its interpreter cannot call
Triton's jit functions when TRITON_INTERPRET was set after Triton was imported, so the
kernels carry a copy of the same arithmetic (`HELPERS`).
"""
from __future__ import annotations

import math
import weakref
from typing import Sequence

import torch
from torch._prims import rng_prims
from torch.fx.experimental.proxy_tensor import get_proxy_mode
import numpy as np

from . import config, indexing, kernel_source
from .indexing import flatten, pexpr
from .ir import Buffer, Extern, Unsupported
from .loader import launch, load_kernel
from .lowering_base import compute_dtype, pointwise, register, val_of
from .partition import RECOMPUTABLE_OPS

aten = torch.ops.aten

# Philox-4x32 (Random123's constants, as in Triton's philox_impl)
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_ROUNDS = 10
_M32 = 0xFFFFFFFF
# tl.rand's scale: the largest with (2**31 - 1) * scale < 1 in float32
_SCALE = 4.6566127342e-10
_SEED_BOUND = 2 ** 62

HELPERS = f'''@triton.jit
def _philox(seed, c0, c1):
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = c0 * 0
    c3 = c0 * 0
    for _ in tl.static_range({_ROUNDS}):
        a = c0
        b = c2
        c0 = tl.umulhi({_ROUND_B:#x}, b) ^ c1 ^ k0
        c2 = tl.umulhi({_ROUND_A:#x}, a) ^ c3 ^ k1
        c1 = b * {_ROUND_B:#x}
        c3 = a * {_ROUND_A:#x}
        k0 = k0 + {_KEY_A:#x}
        k1 = k1 + {_KEY_B:#x}
    return c0, c1, c2, c3


@triton.jit
def _philox_float(r):
    x = r.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, ~x, x)
    return x.to(tl.float32) * {_SCALE!r}


@triton.jit
def _philox_uniform(seed, c0, c1):
    r, _, _, _ = _philox(seed, c0, c1)
    return _philox_float(r)


@triton.jit
def _philox_normal(seed, c0, c1):
    r0, r1, _, _ = _philox(seed, c0, c1)
    u = tl.maximum(1.0e-7, _philox_float(r0))
    th = 6.283185307179586 * _philox_float(r1)
    return tl.sqrt(-2.0 * tl.log(u)) * tl.cos(th)


@triton.jit
def _box_muller(ra, rb, odd):
    u = tl.maximum(1.0e-7, _philox_float(ra))
    th = 6.283185307179586 * _philox_float(rb)
    rad = tl.sqrt(-2.0 * tl.log(u))
    return tl.where(odd, rad * tl.sin(th), rad * tl.cos(th))


@triton.jit
def _philox_at(seed, c, c_hi, NORMAL: tl.constexpr):
    """Counter (c_hi, c)'s number: word c % 4 of Philox at counter c // 4 (uniform), or of
    the Box-Muller pair of words (0, 1) or (2, 3) that holds it (normal: cos, then sin)."""
    q = (c >> 2) | (c_hi << 30)
    r0, r1, r2, r3 = _philox(seed, q, c_hi >> 2)
    j = c & 3
    if NORMAL:
        hi = j >= 2
        return _box_muller(tl.where(hi, r2, r0), tl.where(hi, r3, r1), (j & 1) == 1)
    return _philox_float(tl.where(j == 0, r0, tl.where(j == 1, r1, tl.where(j == 2, r2, r3))))


@triton.jit
def _philox_block(seed, start, c, NORMAL: tl.constexpr, BLOCK: tl.constexpr):
    """The numbers of the BLOCK consecutive counters from `start` (a multiple of 4, below
    2**32; `c` each lane's counter): one Philox call per four lanes, its words
    interleaved into lane order; the same numbers as `_philox_at`."""
    if BLOCK >= 4:
        q = (start >> 2) + tl.arange(0, BLOCK // 4).to(tl.uint32)
        r0, r1, r2, r3 = _philox(seed, q, q * 0)
        if NORMAL:
            v0 = _box_muller(r0, r1, False)
            v1 = _box_muller(r0, r1, True)
            v2 = _box_muller(r2, r3, False)
            v3 = _box_muller(r2, r3, True)
        else:
            v0 = _philox_float(r0)
            v1 = _philox_float(r1)
            v2 = _philox_float(r2)
            v3 = _philox_float(r3)
        return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [BLOCK])
    else:
        return _philox_at(seed, c, c * 0, NORMAL)


'''
# emitted with every kernel that draws numbers (beside the reductions' combine functions)
kernel_source.COMBINE["_philox"] = HELPERS

_FILL = HELPERS + '''@triton.jit
def _philox_fill(seed_ptr, out_ptr, offset, numel, NORMAL: tl.constexpr, WORDS4: tl.constexpr,
                 XBLOCK: tl.constexpr):
    xindex = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)
    c = xindex + offset
    seed = tl.load(seed_ptr)
    if WORDS4:
        v = _philox_at(seed, c.to(tl.uint32), (c >> 32).to(tl.uint32), NORMAL)
    elif NORMAL:
        v = _philox_normal(seed, c.to(tl.uint32), (c >> 32).to(tl.uint32))
    else:
        v = _philox_uniform(seed, c.to(tl.uint32), (c >> 32).to(tl.uint32))
    tl.store(out_ptr + xindex, v, xindex < numel)
'''


# -- the ops ---------------------------------------------------------------------------------
@torch.library.custom_op("frametrace::philox_seed", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def philox_seed(*, device: torch.device) -> torch.Tensor:
    """A Philox key drawn from torch's default generator of `device` (advancing it).
    `device` is keyword-only: a checkpointed region's draw is wrapped in
    run_and_save_rng_state, which finds the device to save the state of there."""
    return torch.randint(0, _SEED_BOUND, (), dtype=torch.int64, device=device)


@philox_seed.register_fake
def _(*, device):
    return torch.empty((), dtype=torch.int64, device=device)


@torch.library.custom_op("frametrace::philox_rand", mutates_args=())
def philox_rand(seed: torch.Tensor, offset: int, size: Sequence[int], normal: bool,
                dtype: torch.dtype) -> torch.Tensor:
    """Uniform [0, 1) (or normal) numbers of shape `size`, element i from Philox's counter
    offset + i under the key `seed` (an int64 scalar tensor): tl.rand (tl.randn)."""
    numel = math.prod(size)
    if numel == 0:
        out = torch.empty(size, dtype=torch.float32, device=seed.device)
    elif seed.device.type == "cuda":
        out = _fill_triton(seed, offset, numel, normal).view(size)
    else:
        out = _fill_torch(int(seed), offset, numel, normal, seed.device).view(size)
    return finish(out, dtype, normal)


@philox_rand.register_fake
def _(seed, offset, size, normal, dtype):
    return torch.empty(size, dtype=dtype, device=seed.device)


RECOMPUTABLE_OPS.add(torch.ops.frametrace.philox_rand.default)
SEED, RAND = torch.ops.frametrace.philox_seed.default, torch.ops.frametrace.philox_rand.default
_GRAPHSAFE = rng_prims.graphsafe_run_with_rng_state


def finish(u, dtype, normal):
    """float32 numbers in `dtype`.  A uniform number rounded to a half type may round up
    to 1, which [0, 1) excludes: it is 0 instead."""
    if not dtype.is_floating_point:
        raise RuntimeError(f"philox_rand: {dtype} is not a floating point type")
    out = u.to(dtype)
    if dtype in (torch.float16, torch.bfloat16) and not normal:
        out = torch.where(out >= 1, torch.zeros((), dtype=dtype, device=out.device), out)
    return out


def _fill_triton(seed, offset, numel, normal):
    out = torch.empty(numel, dtype=torch.float32, device=seed.device)
    block = 1024
    with torch.cuda.device(seed.device):
        launch(load_kernel("_philox_fill", _FILL), (math.ceil(numel / block),),
               (seed, out, offset, numel), {"NORMAL": normal, "WORDS4": _words4(), "XBLOCK": block})
    return out


def _mulhilo(a: int, b):
    """(high, low) 32 bits of a * b, a < 2**32 a constant and b int64 values < 2**32, in
    int64 arithmetic that cannot overflow (b in 16-bit halves)."""
    hi, lo = a * (b >> 16), a * (b & 0xFFFF)
    return (hi + (lo >> 16)) >> 16, (((hi & 0xFFFF) << 16) + lo) & _M32


def philox(seed: int, counter):
    """Philox-4x32-10 of the counters (counter, counter >> 32, 0, 0) (int64 tensor) under
    the key `seed`: four int64 tensors of uint32 values, as Triton's randint4x."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1 = counter & _M32, (counter >> 32) & _M32
    c2 = c3 = torch.zeros_like(counter)
    for _ in range(_ROUNDS):
        hb, lb = _mulhilo(_ROUND_B, c2)
        ha, la = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hb ^ c1 ^ k0, lb, ha ^ c3 ^ k1, la
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def _to_float(r):
    """tl.rand's uint32 -> [0, 1): the int32 bit pattern folded to non-negative, scaled."""
    x = torch.where(r >= 2 ** 31, _M32 - r, r).to(torch.int32).to(torch.float32)
    return x * torch.tensor(_SCALE, dtype=torch.float32, device=x.device)


def _words4() -> bool:
    return config.philox_four_words


def _fill_torch(seed, offset, numel, normal, device):
    counter = torch.arange(numel, dtype=torch.int64, device=device) + offset
    odd = None
    if _words4():
        # word counter % 4 of Philox at counter // 4 (`_philox_at`)
        j = counter & 3
        r0, r1, r2, r3 = philox(seed, counter >> 2)
        if normal:
            hi = j >= 2
            r0, r1, odd = torch.where(hi, r2, r0), torch.where(hi, r3, r1), (j & 1) == 1
        else:
            r0 = torch.where(j == 0, r0, torch.where(j == 1, r1, torch.where(j == 2, r2, r3)))
    else:
        r0, r1, _, _ = philox(seed, counter)
    u = _to_float(r0)
    if not normal:
        return u
    v = _to_float(r1)
    if device.type == "cpu":
        u, v = u.numpy(), v.numpy()
        f32 = np.float32
        u = np.maximum(f32(1.0e-7), u)
        rad, th = np.sqrt(f32(-2.0) * np.log(u)), f32(6.283185307179586) * v
        n = rad * np.cos(th) if odd is None else np.where(odd.numpy(), rad * np.sin(th), rad * np.cos(th))
        return torch.from_numpy(n)
    u = torch.clamp_min(u, 1.0e-7)
    rad, th = torch.sqrt(-2.0 * torch.log(u)), 6.283185307179586 * v
    return rad * torch.cos(th) if odd is None else torch.where(odd, rad * torch.sin(th), rad * torch.cos(th))


# -- decompositions --------------------------------------------------------------------------
# per trace (the proxy mode building one graph): {device: [seed, next free counter]}
_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _device(device) -> torch.device:
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def draw(device, numel):
    """(seed, offset) for a random op of `numel` elements: one seed per device and graph
    (drawn once per call), and the next `numel` counters after the graph's earlier ops'."""
    mode = get_proxy_mode()
    state = {} if mode is None else _TRACES.setdefault(mode, {})
    device = _device(device)
    entry = state.get(device)
    if entry is None:
        entry = state[device] = [SEED(device=device), 0]
    seed, offset = entry
    # (a multiple of 4 each: a block of counters starts at a Philox call's first word)
    entry[1] = offset + (-(-numel // 4) * 4 if isinstance(numel, int) else numel)
    return seed, offset


def _random(size, normal, dtype=None, layout=None, device=None):
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point or layout not in (None, torch.strided):
        return NotImplemented
    seed, offset = draw(device, math.prod(size))
    return RAND(seed, offset, list(size), normal, dtype)


def _rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _random(size, False, dtype, layout, device)


def _randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _random(size, True, dtype, layout, device)


def _like(normal):
    def like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        # (contiguous whatever x's layout: which element gets which number is immaterial)
        return _random(x.shape, normal, x.dtype if dtype is None else dtype,
                       x.layout if layout is None else layout, x.device if device is None else device)
    return like


# Where eager raises (a probability outside [0, 1], a negative std, an empty range) or
# draws from a generator of the caller's, the op stays aten's.
def _bernoulli(x, p=0.5, *, generator=None):
    if generator is not None or not 0 <= p <= 1:
        return NotImplemented
    return (_random(x.shape, False, torch.float32, None, x.device) < p).to(x.dtype)


def _uniform(x, low=0.0, high=1.0, *, generator=None):
    if generator is not None or not x.dtype.is_floating_point or not low <= high:
        return NotImplemented
    v = (_random(x.shape, False, torch.float32, None, x.device) * (high - low) + low).to(x.dtype)
    return torch.where(v == high, low, v)  # rounded up to the excluded bound: ATen's choice


def _normal(x, mean=0.0, std=1.0, *, generator=None):
    if generator is not None or not x.dtype.is_floating_point or not std >= 0:
        return NotImplemented
    return (_random(x.shape, True, torch.float32, None, x.device) * std + mean).to(x.dtype)


def _normal_tensor_float(mean, std=1.0, *, generator=None):
    if generator is not None or not mean.dtype.is_floating_point or not std >= 0:
        return NotImplemented
    return (_random(mean.shape, True, torch.float32, None, mean.device) * std + mean).to(mean.dtype)


def _normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                        pin_memory=None):
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if generator is not None or not std >= 0 or not dtype.is_floating_point:
        return NotImplemented
    n = _random(size, True, torch.float32, layout, device)
    return NotImplemented if n is NotImplemented else (n * std + mean).to(dtype)


def _native_dropout(x, p, train):
    """ATen's: each element kept with probability 1 - p and scaled by 1 / (1 - p); `train`
    None trains."""
    if train is not None and not train:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if not x.dtype.is_floating_point or not 0 <= p <= 1:
        return NotImplemented
    mask = _random(x.shape, False, torch.float32, None, x.device) >= p
    return x * mask * (0.0 if p == 1 else 1.0 / (1.0 - p)), mask


def decompositions() -> dict:
    return {
        aten.rand.default: _rand, aten.randn.default: _randn,
        aten.rand_like.default: _like(False), aten.randn_like.default: _like(True),
        aten.bernoulli.p: _bernoulli, aten.uniform.default: _uniform,
        aten.normal_functional.default: _normal, aten.native_dropout.default: _native_dropout,
        aten.normal.Tensor_float: _normal_tensor_float, aten.normal.float_float: _normal_float_float,
    }


def hoist_seeds(gm) -> None:
    """The seed draws first in the graph (they read nothing): an aten call ends the kernel
    before it, so a draw where the graph's first random op was traced would split the
    kernel that fuses the nodes around it (a softmax and the dropout after it)."""
    nodes = list(gm.graph.nodes)
    heads = [n for n in nodes if n.op == "placeholder"]
    # (a draw under a checkpoint, in a graph-safe RNG state: it reads only its generator)
    seeds = [n for n in nodes if n.op == "call_function" and (n.target is SEED or (
        n.target is _GRAPHSAFE and n.args and n.args[0] is SEED and len(n.args) == 1 and
        all(a.op == "placeholder" for a in n.all_input_nodes)))]
    start = nodes.index(heads[-1]) + 1 if heads else 0
    if nodes[start:start + len(seeds)] == seeds:
        return
    for n in seeds:
        if heads:
            heads[-1].append(n)
        elif n is not nodes[0]:
            nodes[0].prepend(n)
        heads.append(n)
    gm.recompile()


# -- lowerings -------------------------------------------------------------------------------
@register(SEED)
def _lower_seed(L, node, *, device):
    """The wrapper draws the seed (a call per graph call, by design not a fallback)."""
    name = L.name()
    out = Buffer(name, (), (), torch.int64, L.device)
    L.items.append(Extern(name, node.target, (), {"device": device}, out))
    return out


@register(RAND)
def _lower_rand(L, node, seed, offset, size, normal, dtype):
    shape, dtype = val_of(node)
    numel = math.prod(shape)
    if compute_dtype(dtype) not in (torch.float32, torch.float64):
        raise Unsupported(f"random numbers in {dtype}")

    def fn(k, idx):
        s = seed.load(k, [])
        flat = flatten(idx, shape)
        c0, c1 = _counters(k, flat, offset, numel, s)
        k.helpers.add("_philox")
        if not _words4():
            v = k.op(f"_philox_{'normal' if normal else 'uniform'}({s}, {c0}, {c1})")
        elif _one_call_per_four(k, flat, offset, numel):
            start = k.op(f"(xoffset + {int(offset)}).to(tl.uint32)", level=0)
            v = k.op(f"_philox_block({s}, {start}, {c0}, {normal}, XBLOCK)")
        else:
            v = k.op(f"_philox_at({s}, {c0}, {c1}, {normal})")
        if dtype in (torch.float16, torch.bfloat16) and not normal:
            r = k.op(f"{v}.to({k.tl(dtype)}).to(tl.float32)")  # as `finish`
            return k.op(f"tl.where({r} >= 1.0, 0.0, {r})")
        return k.op(f"{v}.to(tl.float64)") if dtype == torch.float64 else v
    return pointwise(shape, dtype, fn, seed)


def _one_call_per_four(k, flat, offset, numel) -> bool:
    """Whether the kernel's lanes are consecutive counters (a 1-D pointwise kernel whose
    index is the random tensor's flat index), blocks start at multiples of 4 and every
    counter fits 32 bits: then one Philox call makes four lanes' numbers."""
    return (k.BLOCK == "[XBLOCK]" and not k.group.reduction and getattr(k, "tile", None) is None
            and str(flat) == "xindex" and indexing.is_static(offset) and indexing.is_static(numel)
            and int(offset) % 4 == 0 and int(offset) + int(numel) + 4096 <= 2 ** 31
            and all(c.xblock % 4 == 0 for c in k.configs))


def _counters(k, flat, offset, numel, seed):
    """The Philox counter words (c0, c1) of the element at flat index `flat`: offset + flat,
    in int32 arithmetic while the graph's counters fit."""
    f = k.index(flat)
    static = indexing.is_static(offset) and indexing.is_static(numel)
    narrow = static and int(offset) + int(numel) <= 2 ** 31
    if f not in k.levels:  # one element: its counter as a tensor
        f, narrow = k.op(f"{seed} * 0 + {f}"), False
    off = int(offset) if indexing.is_static(offset) else k.op(pexpr(offset), level=0)
    if narrow:
        c0 = k.op(f"({f} + {off}).to(tl.uint32)" if off else f"{f}.to(tl.uint32)")
        return c0, k.op(f"{c0} * 0")
    c = k.op(f"{f}.to(tl.int64) + {off}" if off else f"{f}.to(tl.int64)")
    return k.op(f"{c}.to(tl.uint32)"), k.op(f"({c} >> 32).to(tl.uint32)")

