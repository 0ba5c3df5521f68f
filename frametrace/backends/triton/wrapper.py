"""The generated Python wrapper: allocates the buffers kernels store, launches kernels and
extern aten calls in order, returns the graph's outputs.  Kernels are compiled from their
source once per process (identical sources share one Triton function)."""
from __future__ import annotations

import math
import re

import sympy
import torch
import torch.utils._pytree as pytree

from . import autotune, config, derived, foreach, indexing
from .indexing import pycode
from .fallback import wrapped_op
from .ir import Buffer, Extern, GraphObject, Unsupported
from .layout import ATTENTION_ALIGNMENT, ATTENTION_OPS, aligned_strides
from .kernel_source import Kernel, configs_for
from .loader import build_kernel, launch, launch_static, load_kernel  # noqa: F401  (load_kernel: also the tests' way to load a kernel)
from .static_launch import current_raw_stream, launch_key, static_kernel

# A launcher with symbolic extents keeps the grid and block sizes of at most this many
# extents (`Launcher.tuned`): a server sees many lengths; each is a dict lookup and a
# ceil away from its bucket's choice, which `picked` keeps.
TUNED_LIMIT = 4096


class Launcher:
    """Launches one kernel; picks its block sizes on the first call and keeps the compiled
    kernel of its last launch (`compiled`), which a fast wrapper launches directly."""
    __slots__ = ("name", "fn", "xnumel", "rnumel", "reduction", "configs", "grid", "kwargs",
                 "compiled", "numel", "nsym", "tuned", "bucketed", "memo", "picked")

    def __init__(self, kernel: Kernel, configs):
        g = kernel.group
        self.name, self.fn = kernel.name, load_kernel(kernel.name, kernel.source)
        self.xnumel, self.rnumel, self.reduction = g.xnumel, g.rnumel, g.reduction
        self.configs, self.grid, self.kwargs, self.compiled = configs, None, None, None
        self.memo = {}      # launch_key -> (StaticKernel, compiled) (config.memo_launches)
        self.picked = {}    # symbolic extents: bucket -> the Config picked for it
        # symbolic extents: the shape symbols' values come last in the arguments; the
        # block sizes are picked (and cached) per actual (xnumel, rnumel)
        self.numel = self.nsym = self.tuned = None
        self.bucketed = False
        if not (indexing.is_static(g.xnumel) and indexing.is_static(g.rnumel)):
            self.nsym, self.tuned = len(kernel.symbols), {}
            self.numel = eval(f"lambda {', '.join(kernel.symbols)}: "
                              f"({pycode(g.xnumel)}, {pycode(g.rnumel)})")
            # a size the data decides (u0: tokens per expert) takes another value on most
            # calls: block sizes are tuned once per power-of-two bucket of the extents;
            # other sizes too unless config.tune_each_size (a server's lengths)
            # (so does a size derived from one: derived.py)
            late = {s.name for s in g.ctx.derived.late} if getattr(g, "ctx", None) is not None else set()
            self.bucketed = not config.tune_each_size or \
                any(_UNBACKED.fullmatch(s) or s in late for s in kernel.symbols)

    def _launch(self, choice, args, xnumel=None):
        grid = (math.ceil((xnumel or self.xnumel) / choice.xblock),)
        launch(self.fn, grid, args, choice.kwargs(self.reduction))

    def _build(self, choice, args, xnumel=None):
        """Compile for the block sizes `choice` and these arguments without launching."""
        grid = (math.ceil((xnumel or self.xnumel) / choice.xblock),)
        build_kernel(self.fn, grid, args, choice.kwargs(self.reduction))

    def __call__(self, *args):
        if self.numel is not None:
            extents = self.numel(*args[len(args) - self.nsym:])
            x, r = extents
            if x == 0:
                self.grid = None    # (a sized fast wrapper launches nothing for it)
                return  # (a size the data decides is 0: nothing to compute, no grid)
            got = self.tuned.get(extents)
            if got is None:
                key = (autotune.next_pow2(x), autotune.next_pow2(r)) if self.bucketed else extents
                best = self.picked.get(key)
                if best is None and config.tuned_buckets and len(self.picked) >= config.tuned_buckets:
                    # (masked, looped rows: any candidate computes any extents)
                    best = self.picked[min(self.picked, key=lambda k: _distance(k, key))]
                elif best is None:
                    best = self.picked[key] = autotune.pick(
                        self.name, *key, self.configs,
                        lambda c: self._launch(c, args, x), lambda c: self._build(c, args, x))
                if len(self.tuned) >= TUNED_LIMIT:
                    self.tuned.clear()  # (a server's lengths: a bound, the choices stay in `picked`)
                got = self.tuned[extents] = ((math.ceil(x / best.xblock),), best.kwargs(self.reduction))
            self.grid, self.kwargs = got
        elif self.kwargs is None:
            best = autotune.pick(self.name, self.xnumel, self.rnumel, self.configs,
                                 lambda c: self._launch(c, args), lambda c: self._build(c, args))
            self.grid, self.kwargs = (math.ceil(self.xnumel / best.xblock),), best.kwargs(self.reduction)
        self._go(args)

    def _go(self, args):
        """Launch with the grid and block sizes picked: the kernel remembered for these
        block sizes and this launch's specialization, else through `launch` (Triton's
        JIT), remembering what it compiled (config.memo_launches).  (The grid is the
        launch's own: extents of one set of block sizes share a kernel.)"""
        key = launch_key(tuple(self.kwargs.items()), args) if config.memo_launches else None
        if key is not None:
            got = self.memo.get(key)
            if got is not None:
                got[0].launch(self.grid, args, current_raw_stream(key[0]))
                self.compiled = got[1]
                return
        self.compiled, kernel = launch_static(self.fn, self.grid, args, self.kwargs)
        if key is not None and kernel is not None:
            self.memo[key] = (kernel, self.compiled)

    def constexprs(self) -> list:
        """The values of the kernel's constexpr parameters, in order (after its pointers)."""
        return [self.kwargs["XBLOCK"]] + ([self.kwargs["RBLOCK"]] if self.reduction else [])

    def description(self) -> tuple:
        """What `restore` makes this launcher again from (the result cache, result_cache.py):
        static extents only."""
        if self.numel is not None:
            raise ValueError("symbolic extents")
        return (type(self).__name__, self.name, self.xnumel, self.rnumel, self.reduction,
                self.configs, getattr(self, "tile", None))

    @staticmethod
    def restore(description, source):
        """A launcher from `description()` and its kernel's source, as `__init__` makes one."""
        kind, name, xnumel, rnumel, reduction, configs, tile = description
        cls = TiledLauncher if kind == "TiledLauncher" else Launcher
        self = cls.__new__(cls)
        self.name, self.fn = name, load_kernel(name, source)
        self.xnumel, self.rnumel, self.reduction = xnumel, rnumel, reduction
        self.configs, self.grid, self.kwargs, self.compiled = configs, None, None, None
        self.numel = self.nsym = self.tuned = None
        self.bucketed = False
        self.memo, self.picked = {}, {}
        if cls is TiledLauncher:
            self.tile = tile
        return self


class TiledLauncher(Launcher):
    """Launches a tiled pointwise kernel over its 2-D grid (`kernel.tile`, static sizes)."""
    __slots__ = ("tile",)

    def __init__(self, kernel: Kernel, configs):
        super().__init__(kernel, configs)
        self.tile = kernel.tile

    def _launch(self, choice, args, xnumel=None):
        launch(self.fn, self.tile.grid(choice), args, choice.kwargs())

    def _build(self, choice, args, xnumel=None):
        build_kernel(self.fn, self.tile.grid(choice), args, choice.kwargs())

    def __call__(self, *args):
        if self.kwargs is None:
            t = self.tile
            best = autotune.pick(self.name, t.xnumel, t.ynumel, self.configs,
                                 lambda c: self._launch(c, args), lambda c: self._build(c, args))
            self.grid, self.kwargs = t.grid(best), best.kwargs()
        self._go(args)

    def constexprs(self) -> list:
        return [self.kwargs["YBLOCK"], self.kwargs["XBLOCK"]]


def _distance(a, b) -> float:
    """How far apart two (xnumel, rnumel) keys are, in powers of two."""
    return sum(abs(math.log2(max(1, u)) - math.log2(max(1, v))) for u, v in zip(a, b))


def _reinterpret(t, size, stride, offset):
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _unviewed(t):
    """An output that is an extern's result (or a view of one) which may share a graph
    input's memory: the same memory, sizes, strides and offset, without autograd's record
    of a view.  AOTAutograd regenerates an output that aliases an input (with symbolic
    sizes, where it has no view ops to replay) from the output's `_base` and `_view_func`
    where it has them, in the input's dtype: a view taken of `x.view(torch.int32)` (an
    extern) came back float32.  Without the record it takes the output's strides and
    offset (`as_strided`) and then its dtype."""
    if not isinstance(t, torch.Tensor) or not t._is_view():
        return t
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


# Copies `ensure_layout` made: an extern returned other strides than the lowering
# predicted (a cost on every call; tests assert it stays 0 where layouts are known).
LAYOUT_COPIES = [0]


def _ensure_layout(t, stride):
    """An extern's output with the strides the kernels were generated for."""
    if t is None or t.stride() == stride or t.numel() <= 1:
        return t
    LAYOUT_COPIES[0] += 1
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _align_attention(t):
    """`t` with strides an attention kernel accepts: a view when only size-1 dims' strides
    are off (they address nothing), else a copy whose rows are padded to the alignment."""
    if t.dim() == 0 or aligned_strides(t.shape, t.stride()):
        return t
    n, step = t.shape[-1], ATTENTION_ALIGNMENT
    if t.shape[-1] <= 1 or t.stride()[-1] == 1:
        fixed = [s if size > 1 else step for size, s in zip(t.shape[:-1], t.stride()[:-1])]
        if all(s % step == 0 for s in fixed):
            return t.as_strided(t.shape, (*fixed, 1), t.storage_offset())
    padded = torch.empty(*t.shape[:-1], -(-n // step) * step, dtype=t.dtype, device=t.device)
    return padded[..., :n].copy_(t)


_UNBACKED = re.compile(r"u\d+")   # (the ShapeEnv's names of sizes the data decides)

_ALLOC = "empty_strided({shape}, {stride}, dtype={dtype}, device=device)"
# `fast`'s source before the first call: its checks and each launch are placeholders
# (a launch's placeholder names the arguments it passes, for `_free_dead`), filled in
# once the kernels are compiled (`fast_source`)
_CHECKS = "    __fast_checks__"
_LAUNCH_LINE = re.compile(r"^(\s*)__fast_launch__(\w+)\(.*?\)(  # .*)?$")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_ASSIGN = re.compile(r"    (\w+) = ")


def _free_dead(lines, inputs) -> list[str]:
    """`lines` with each input and buffer deleted after the line that last uses it (those
    returned kept): a backward's saved activations and gradients go back to the allocator
    as soon as they are dead, not when the wrapper returns, as in eager."""
    start = lines.index("    args.clear()") + 1
    body, ret = lines[start:-1], lines[-1]
    tracked = set(inputs) | {m.group(1) for m in map(_ASSIGN.match, body) if m}
    last = dict.fromkeys(inputs, -1)
    for i, line in enumerate(body):
        for name in _NAME.findall(line.split("  #")[0]):
            if name in tracked:
                last[name] = i
    kept = set(_NAME.findall(ret))
    dead: dict = {}
    for name, i in last.items():
        if name not in kept:
            dead.setdefault(i, []).append(name)
    out = lines[:start] + ([f"    del {', '.join(dead[-1])}"] if -1 in dead else [])
    for i, line in enumerate(body):
        out.append(line)
        if i in dead:
            out.append(f"    del {', '.join(dead[i])}")
    return out + [ret]


_ALLOC_LINE = re.compile(r"    (\w+) = (empty_strided\(.*\))$")


def _reuse_dead(lines, unsafe) -> list[str]:
    """`lines` (after `_free_dead`) with each allocation that a dead buffer of the same
    shape, strides and dtype can serve given that buffer (`new = dead`) instead: an
    allocation costs the host microseconds on every call, and the caching allocator would
    hand the same block back anyway.  Buffers in `unsafe` (read by an aten call that may
    return a view of them) are never given again: their memory may outlive their name."""
    out, free, alloc_of = [], {}, {}
    for line in lines:
        m = _ALLOC_LINE.match(line)
        if m:
            name, alloc = m.groups()
            pool = free.get(alloc)
            if pool:
                donor, at = pool.pop()
                left = [n for n in out[at][8:].split(", ") if n != donor]
                out[at] = f"    del {', '.join(left)}" if left else None
                out += [f"    {name} = {donor}", f"    del {donor}"]
            else:
                out.append(line)
            alloc_of[name] = alloc
            continue
        out.append(line)
        if line.startswith("    del "):
            for n in line[8:].split(", "):
                if n in alloc_of and n not in unsafe:
                    free.setdefault(alloc_of[n], []).append((n, len(out) - 1))
    return [line for line in out if line is not None]


def _nonzeros(*tensors) -> tuple:
    """Each tensor's nonzero, from one nonzero of them stacked: (k, n) indices whose first
    column says which tensor, split by their counts.  One wait for the GPU, and a few aten
    calls, where a nonzero each waits once."""
    stacked = torch.stack(tensors)
    counts = stacked.ne(0).flatten(1).sum(1)
    found = stacked.nonzero()
    # each part a tensor of its own in the layout nonzero gives its (n, d) result ((1, n)
    # strides on the CPU and CUDA, (d, 1) where nonzero returns rows): a view of `found`
    # would keep found's strides where ensure_layout leaves it (a part of one row or none)
    # and share its memory with the other parts the graph returns
    columns = found.stride() == (1, found.shape[0])
    d = found.shape[1] - 1
    parts = []
    for part in found[:, 1:].split(counts.tolist()):
        n = part.shape[0]
        out = torch.empty_strided((n, d), (1, n) if columns else (d, 1), dtype=part.dtype,
                                  device=part.device)
        parts.append(out.copy_(part))
    return parts


def nonzero_batches(schedule, inputs) -> dict:
    """Extern name -> (batch variable, position, batch) for each aten.nonzero that can be
    a part of one nonzero of several stacked tensors (`_nonzeros`).  A nonzero joins the
    batch of an earlier one when its argument has that one's shape, dtype and device, its
    memory is already written at that earlier one and nothing writes it between the two:
    its part there is its nonzero where it runs.  Each nonzero waits for the GPU to learn
    its size; a Mixtral expert loop runs one per expert and layer (16 waits a call), its
    router's masks all known before the first: one wait a layer.  Batches of one stay
    plain nonzero calls, as do nonzeros of 0-d tensors."""
    made: dict = {name: -1 for name in inputs}   # buffer -> position of the item writing it
    writes: dict = {}                              # buffer -> positions of the items writing it
    for at, item in enumerate(schedule):
        names = _written(item)
        for name in names:
            made.setdefault(name, at)
            writes.setdefault(name, []).append(at)
    batches, current = [], None
    for at, item in enumerate(schedule):
        if not (isinstance(item, Extern) and item.op is torch.ops.aten.nonzero.default
                and len(item.args) == 1 and not item.kwargs and isinstance(item.args[0], Buffer)
                and len(item.args[0].shape) > 0 and isinstance(item.outputs, Buffer)):
            continue
        src = item.args[0].name
        if current is not None and made.get(src, at) < current[0] and \
                _stackable(item.args[0], current[1][0].args[0]) and \
                not any(current[0] < w < at for w in writes.get(src, ())):
            current[1].append(item)
        else:
            current = (at, [item])
            batches.append(current)
    out = {}
    for n, (_, members) in enumerate(b for b in batches if len(b[1]) > 1):
        for i, e in enumerate(members):
            out[e.name] = (f"nonzeros{n}", i, members)
    return out


def _stackable(a: Buffer, b: Buffer) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _written(item) -> list:
    """The buffers an item of the schedule writes: a kernel's stores, an extern's
    results and the arguments its op writes in place."""
    if not isinstance(item, Extern):
        return [c.name for c in item.stores]
    names = [item.name] + [b.name for b in pytree.tree_leaves(item.outputs) if isinstance(b, Buffer)]
    schema = getattr(item.op, "_schema", None)
    if schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        names += sorted(item.reads())   # (in place, or unknown: as if it wrote all it reads)
    return names


def _binding_lines(e: Extern) -> list[str]:
    """The wrapper's lines binding the sizes an extern's result decides (`u0 = buf3.shape[0]`),
    right after the line that makes it."""
    lines = []
    for symbol, (name, path, dim) in e.binds.items():
        ref = name + "".join(f"[{i}]" for i in path)
        lines.append(f"    {symbol.name} = {ref}" + ("" if dim is None else f".shape[{dim}]"))
    return lines


def base_namespace(device) -> dict:
    """What every wrapper's source reads besides its constants, launchers and ops."""
    return {"torch": torch, "empty_strided": torch.empty_strided, "device": device,
            "reinterpret": _reinterpret, "unviewed": _unviewed, "ensure_layout": _ensure_layout,
            "align_attention": _align_attention, "nonzeros": _nonzeros,
            **derived.NAMESPACE}


class WrapperCodegen:
    """`call(args)`: the wrapper every first call runs (it tunes and compiles kernels);
    `fast_source(...)`: once every kernel is compiled, the same steps with each kernel's
    low-level launcher called directly, grids and block sizes as literals."""

    def __init__(self, lowered, schedule):
        self.lowered, self.schedule = lowered, schedule
        self.ns = base_namespace(lowered.device)
        self.ns.update(lowered.constants)
        self.launchers: list[str] = []   # namespace names of the Launchers, in launch order
        self._externs: dict[str, list[str]] = {}
        self.ops: dict = {}              # namespace name -> the op its C++ function is
        self.extern_items: dict = {}     # namespace name of an op -> the Extern calling it
        self.launch_args: dict = {}      # launcher's name -> the arguments it passes
        self.fast_template = None        # `fast`'s source, placeholders for the launches
        self.generated_names = ()        # the namespace's names after `generate`

    def const(self, value, prefix="c") -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def expr(self, a) -> str:
        if isinstance(a, GraphObject):
            return a.name   # (each call's own object, never the example's)
        if hasattr(a, "pycode"):
            return a.pycode()   # (a lowering.SizeCondition: Python over the size variables)
        if isinstance(a, Buffer):
            if not a.is_view:
                return a.name
            if a.offset == 0:   # (as_strided keeps the base's own storage offset)
                return f"{a.name}.as_strided({pycode(a.shape)}, {pycode(a.stride)})"
            return f"reinterpret({a.name}, {pycode(a.shape)}, {pycode(a.stride)}, {pycode(a.offset)})"
        if isinstance(a, sympy.Basic) and a.is_Integer:
            return repr(int(a))
        if isinstance(a, sympy.Basic) and not a.is_number:  # a size: the symbols are locals
            return pycode(a)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.expr(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if a is None or isinstance(a, (bool, str)) or (isinstance(a, int)):
            return repr(a)
        if isinstance(a, float) and math.isfinite(a):
            return repr(a)
        return self.const(a)

    def generate(self):
        kernels, externs = [], []
        for item in self.schedule:
            if isinstance(item, Extern):
                externs.append(str(item.op))
            else:
                kernels.append(item)
                configs = item.tile.configs if item.tile else self._configs(item)
                if foreach.in_place(item):
                    configs = configs[:1]  # (timing candidates would apply the update again)
                launcher = TiledLauncher(item, configs) if item.tile else Launcher(item, configs)
                self.launchers.append(self.const(launcher, "kernel"))
                self.launch_args[self.launchers[-1]] = list(item.args) + item.symbols
        source = self._function("call", [], self._launch, _ALLOC)
        # (symbolic sizes: a template for the fast wrappers of given sizes; none where a
        # size is known only midway through a call)
        if not self.lowered.late_symbols:
            self.fast_template = self._function(
                "fast", [_CHECKS], lambda name, item: f"__fast_launch__{name}({', '.join(item.args)})",
                _ALLOC)
        self.generated_names = tuple(self.ns)
        if self.lowered.ctx.hints:
            names = {s.name for s in self.lowered.ctx.hints}
            bound = {s.name for s in (*self.lowered.symbol_sources, *self.lowered.late_symbols,
                                      *self.lowered.ctx.derived.sources)}
            unbound = (names & set(re.findall(r"\b[A-Za-z_]\w*\b", source))) - bound
            if unbound:
                raise Unsupported(f"sizes {sorted(unbound)} that no input gives")
        return source, kernels, externs

    def _function(self, name, checks, launch, alloc) -> str:
        L = self.lowered
        lines = [f"def {name}(args):"]
        if L.inputs:
            lines.append(f"    {', '.join(L.inputs)}, = args")
        lines += [f"    {s.name} = {src}" for s, src in L.symbol_sources.items()]
        derived_at = len(lines)
        lines += checks
        lines.append("    args.clear()")
        launchers = iter(self.launchers)
        batches = nonzero_batches(self.schedule, L.inputs) if config.batch_nonzero else {}
        for item in self.schedule:
            if isinstance(item, Extern):
                batch = batches.get(item.name)
                if batch is not None:
                    lines += self._batched_nonzero(item, *batch)
                    continue
                lines += self.extern(item)
                continue
            for c in item.stores:
                if c.name in self.lowered.inputs:
                    continue  # a write into the input's own memory
                lines.append(f"    {c.name} = " + alloc.format(
                    shape=pycode(c.shape), stride=pycode(c.buffer.stride), dtype=c.dtype))
            lines.append(f"    {launch(next(launchers), item)}  # {item.name}")
        # (an output on an extern's memory that may alias an input: see _unviewed)
        # (not across a dtype view of another element size: AOTAutograd's as_strided would
        # take the output's strides in the input's elements; there it keeps the record)
        aliased = {b.name for e in self.schedule if isinstance(e, Extern) and e.may_alias
                   for b in pytree.tree_leaves(e.outputs) if isinstance(b, Buffer) and
                   all(a.dtype.itemsize == b.dtype.itemsize for a in pytree.tree_leaves((e.args, e.kwargs))
                       if isinstance(a, Buffer))}
        outs = (f"unviewed({self.expr(o)})" if isinstance(o, Buffer) and o.name in aliased else self.expr(o)
                for o in L.outputs)
        lines.append(f"    return [{', '.join(outs)}]")
        # the derived sizes this function or its kernels use, from the symbols just bound
        # (a derived size only reads shape symbols the inputs give)
        used = set(_NAME.findall("\n".join(lines))) | {
            n for item in self.schedule if not isinstance(item, Extern) for n in item.symbols}
        needed = [(s, src) for s, (src, _) in L.ctx.derived.sources.items()
                  if s.name in used and s not in L.symbol_sources]
        late = L.ctx.derived.late
        for s, src in reversed([(s, src) for s, src in needed if s in late]):
            # after the line that binds the last of the sizes it reads (an aten call's)
            at = max(i for i, line in enumerate(lines)
                     if any(line.startswith(f"    {u.name} = ") for u in late[s]))
            lines.insert(at + 1, f"    {s.name} = {src}")
        lines[derived_at:derived_at] = [f"    {s.name} = {src}" for s, src in needed if s not in late]
        unsafe = {n for e in self.schedule if isinstance(e, Extern) and e.may_alias for n in e.reads()}
        return "\n".join(_reuse_dead(_free_dead(lines, L.inputs), unsafe)) + "\n"

    @staticmethod
    def _launch(launcher, item) -> str:
        return f"{launcher}({', '.join(list(item.args) + item.symbols)})"

    def _aligned_expr(self, a) -> str:
        """An attention operand: a buffer whose strides may break the kernels' alignment
        contract is passed through `align_attention` (a copy only when a real dim's are)."""
        if isinstance(a, Buffer) and (a.symbolic or not aligned_strides(a.shape, a.stride)):
            return f"align_attention({self.expr(a)})"
        return self.expr(a)

    def fast_source(self, inputs, ns=None, table=False) -> str | None:
        """`fast(args)`, or None where it cannot be had (CPU, Triton's interpreter, a
        Triton without these launcher attributes).  `inputs`: the first call's, whose
        pointer alignment (mod 16) the kernels were compiled for: a call whose inputs
        differ there runs `call`, which compiles what they need.  Symbolic sizes: the
        fast wrapper of the sizes of the call that just ran (its grids, block sizes and
        kernels), with its kernels in `ns` (a copy of the wrapper's namespace, one per
        set of sizes); the caller runs it only for those sizes (compiled_module.Sized).
        `table`: `fast(args, T)` instead, each launch's kernel, grid, warps and shared
        memory read from `T` (`sized_table`), one function for every set of sizes with
        the same `sized_table` signature (None where a kernel needs Triton's launcher)."""
        device = self.lowered.device
        if device.type != "cuda" or autotune.interpreted() or self.fast_template is None or \
                (self.lowered.hints and ns is None):
            return None
        from triton import knobs  # (lazy: Triton, on CUDA only)
        from triton.runtime import driver  # (lazy: as above)
        ns = self.ns if ns is None else ns
        index = device.index if device.index is not None else torch.cuda.current_device()
        static = {}
        for name in self.launchers:
            if ns[name].grid is None:
                continue
            k = ns[name].compiled
            static[name] = static_kernel(k, index)
            if static[name] is not None:
                ns["static_launch"] = static[name].launcher()
                ns[f"fn_{name}"] = static[name].function
            else:
                ns[f"run_{name}"], ns[f"fn_{name}"], ns[f"meta_{name}"] = k.run, k.function, k.packed_metadata
        ns.update(get_stream=driver.active.get_current_stream, get_device=getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device),
                  launch_hooks=(knobs.runtime.launch_enter_hook,
                                                               knobs.runtime.launch_exit_hook))
        tensors = [(n, t) for n, t in zip(self.lowered.inputs, inputs) if isinstance(t, torch.Tensor)]
        aligned = [n for n, t in tensors if t.data_ptr() % 16 == 0]
        other = [f"{n}.data_ptr() % 16 != {t.data_ptr() % 16}" for n, t in tensors if t.data_ptr() % 16]
        if aligned:
            other.insert(0, f"({' | '.join(f'{n}.data_ptr()' for n in aligned)}) & 15")
        other.append(f"get_device() != {index}")
        # a profiler's launch hooks need Triton's own launch path
        other.append("launch_hooks[0].calls or launch_hooks[1].calls")
        checks = [f"    if {' or '.join(other)}:", "        return call(args)",
                  f"    stream = get_stream({index})"]

        if table and any(ns[n].grid is None or static[n] is None for n in self.launchers):
            return None
        slots = {n: j for j, n in enumerate(self.launchers)}

        def launch(name):
            launcher = ns[name]
            if launcher.grid is None:
                return "pass"   # (a size 0 for these sizes: launched nothing)
            args = self.launch_args[name] + [repr(v) for v in launcher.constexprs()]
            grid = tuple(launcher.grid) + (1, 1)
            s = static[name]
            if table:
                passed = s.args_of(args)
                return f"static_launch(*T[{slots[name]}], {s.types!r}, ({''.join(f'{a}, ' for a in passed)}), stream)"
            if s is not None:
                # torch's launcher: only the arguments the compiled kernel takes
                passed = s.args_of(args)
                return (f"static_launch(fn_{name}, {grid[0]}, {grid[1]}, {grid[2]}, {s.num_warps}, "
                        f"{s.shared}, {s.types!r}, ({''.join(f'{a}, ' for a in passed)}), stream)")
            return (f"run_{name}({grid[0]}, {grid[1]}, {grid[2]}, stream, fn_{name}, meta_{name}, "
                    f"None, None, None, {', '.join(args)})")
        out = []
        for line in self.fast_template.splitlines():
            m = _LAUNCH_LINE.match(line)
            if line == _CHECKS:
                out += checks
            elif m:
                out.append(f"{m.group(1)}{launch(m.group(2))}{m.group(3) or ''}")
            else:
                out.append(line)
        if table:
            out[0] = "def fast(args, T):"
        return "\n".join(out) + "\n"

    def sized_table(self, inputs):
        """(signature, T) for the sizes of the call that just ran with `inputs`, or None:
        T holds each launch's (kernel, grid x, y, z, warps, shared memory) for torch's
        launcher; sizes whose signature is equal (device, the inputs' alignment, each
        kernel's argument types and the arguments it takes) share one `fast(args, T)`
        (`fast_source(table=True)`), so a set of sizes costs a tuple, not a compile."""
        device = self.lowered.device
        if device.type != "cuda" or autotune.interpreted() or self.fast_template is None:
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        table, kinds = [], []
        for name in self.launchers:
            launcher = self.ns[name]
            s = static_kernel(launcher.compiled, index) if launcher.grid is not None else None
            if s is None:
                return None
            grid = tuple(launcher.grid) + (1, 1)
            table.append((s.function, grid[0], grid[1], grid[2], s.num_warps, s.shared))
            kinds.append((s.types, s.passed, s.extra))
        align = tuple(t.data_ptr() % 16 for t in inputs if isinstance(t, torch.Tensor))
        return (index, align, tuple(kinds)), tuple(table)

    @staticmethod
    def _configs(kernel):
        return getattr(kernel.group, "configs", None) or configs_for(kernel.group)

    def _batched_nonzero(self, e: Extern, batch: str, i: int, members) -> list[str]:
        """A nonzero of a batch (`nonzero_batches`): at the batch's first, the one nonzero
        of them all; each member its part of it."""
        lines = []
        if i == 0:
            lines.append(f"    {batch} = nonzeros({', '.join(self.expr(m.args[0]) for m in members)})")
        lines.append(f"    {e.name} = {batch}[{i}]")
        lines += _binding_lines(e)
        lines.append(f"    {e.outputs.name} = ensure_layout({e.name}, {pycode(e.outputs.stride)})")
        return lines

    def extern(self, e: Extern) -> list[str]:
        lines = self._externs.get(e.name)
        if lines is not None:
            return lines
        if e.op is torch.ops.aten._assert_scalar.default and hasattr(e.args[0], "pycode") and \
                config.python_size_asserts:
            # a check on the wrapper's size variables (u0 <= 64 after a nonzero): a Python
            # comparison, as aten's op raises it, not a dispatcher call (two per expert and
            # layer of a MoE loop)
            msg = e.args[1] if len(e.args) > 1 else e.kwargs.get("assert_msg", "")
            # (one line: the passes over the wrapper's lines put a `del` of the sizes the
            # condition reads after the line that last names them, which an `if` block's
            # body would not name when the message does not: torch._check(a == b))
            lines = self._externs[e.name] = [
                f"    if not ({self.expr(e.args[0])}): raise RuntimeError({msg!r})",
                f"    {e.name} = None"]
            return lines
        # the OpOverload's C++ function: its Python __call__ only forwards to it
        op = self.const(getattr(e.op, "_op", e.op), "aten_")
        self.ops[op] = e.op
        self.extern_items[op] = e
        expr = self.expr
        if getattr(wrapped_op(e.op, e.args)[0], "overloadpacket", None) in ATTENTION_OPS:
            expr = self._aligned_expr
        args = [(self.expr if i in e.exact else expr)(a) for i, a in enumerate(e.args)] + \
            [f"{k}={expr(v)}" for k, v in e.kwargs.items()]
        lines = self._externs[e.name] = [f"    {e.name} = {op}({', '.join(args)})"] + _binding_lines(e)

        def unpack(out, path):
            if isinstance(out, Buffer):
                ref = e.name + "".join(f"[{i}]" for i in path)
                lines.append(f"    {out.name} = ensure_layout({ref}, {pycode(out.stride)})")
            elif isinstance(out, (list, tuple)):
                for i, o in enumerate(out):
                    unpack(o, path + (i,))
        unpack(e.outputs, ())
        return lines
