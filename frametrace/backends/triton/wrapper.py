"""The generated Python wrapper: allocates the buffers kernels store, launches kernels and
extern aten calls in order, returns the graph's outputs.  Kernels are compiled from their
source once per process (identical sources share one Triton function)."""
from __future__ import annotations

import linecache
import math

import torch

from . import autotune
from .ir import Buffer, Extern
from .scheduler import Kernel

_JITTED: dict = {}   # source -> Triton function


def load_kernel(name: str, source: str):
    fn = _JITTED.get(source)
    if fn is None:
        import triton
        import triton.language as tl
        # Triton reads a kernel's source back through `inspect`, hence linecache.
        filename = f"<frametrace-triton {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        ns = {"triton": triton, "tl": tl, "__name__": "frametrace_triton_kernels"}
        exec(compile(source, filename, "exec"), ns)
        fn = _JITTED[source] = ns[name]
    return fn


class Launcher:
    """Launches one kernel; picks its block sizes on the first call."""
    __slots__ = ("name", "fn", "xnumel", "rnumel", "reduction", "configs", "grid", "kwargs")

    def __init__(self, kernel: Kernel, configs):
        g = kernel.group
        self.name, self.fn = kernel.name, load_kernel(kernel.name, kernel.source)
        self.xnumel, self.rnumel, self.reduction = g.xnumel, g.rnumel, g.reduction
        self.configs, self.grid, self.kwargs = configs, None, None

    def _launch(self, config, args):
        grid = (math.ceil(self.xnumel / config.xblock),)
        self.fn[grid](*args, **config.kwargs(self.reduction))

    def __call__(self, *args):
        if self.kwargs is None:
            best = autotune.pick(self.name, self.xnumel, self.rnumel, self.configs,
                                 lambda c: self._launch(c, args))
            self.grid, self.kwargs = (math.ceil(self.xnumel / best.xblock),), best.kwargs(self.reduction)
        self.fn[self.grid](*args, **self.kwargs)


def _reinterpret(t, size, stride, offset):
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _ensure_layout(t, stride):
    """An extern's output with the strides the kernels were generated for."""
    if t is None or t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


class WrapperCodegen:
    def __init__(self, lowered, schedule):
        self.lowered, self.schedule = lowered, schedule
        self.ns = {"torch": torch, "empty_strided": torch.empty_strided, "device": lowered.device,
                   "reinterpret": _reinterpret, "ensure_layout": _ensure_layout}
        self.ns.update(lowered.constants)
        self.lines: list[str] = []

    def const(self, value, prefix="c") -> str:
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name

    def expr(self, a) -> str:
        if isinstance(a, Buffer):
            if not a.is_view:
                return a.name
            return f"reinterpret({a.name}, {tuple(a.shape)}, {tuple(a.stride)}, {a.offset})"
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.expr(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if a is None or isinstance(a, (bool, str)) or (isinstance(a, int)):
            return repr(a)
        if isinstance(a, float) and math.isfinite(a):
            return repr(a)
        return self.const(a)

    def generate(self):
        L = self.lowered
        w = self.lines.append
        w("def call(args):")
        if L.inputs:
            w(f"    {', '.join(L.inputs)}, = args")
        w("    args.clear()")
        kernels, externs = [], []
        for item in self.schedule:
            if isinstance(item, Extern):
                externs.append(str(item.op))
                self.extern(item)
            else:
                kernels.append(item)
                launcher = self.const(Launcher(item, self._configs(item)), "kernel")
                for c in item.stores:
                    w(f"    {c.name} = empty_strided({tuple(c.shape)}, {c.buffer.stride}, "
                      f"dtype={c.dtype}, device=device)")
                w(f"    {launcher}({', '.join(item.args)})  # {item.name}")
        w(f"    return [{', '.join(self.expr(o) for o in L.outputs)}]")
        return "\n".join(self.lines) + "\n", kernels, externs

    @staticmethod
    def _configs(kernel):
        g = kernel.group
        return autotune.candidates(g.xnumel, g.rnumel, g.reduction)

    def extern(self, e: Extern):
        op = self.const(e.op, "aten_")
        args = [self.expr(a) for a in e.args] + [f"{k}={self.expr(v)}" for k, v in e.kwargs.items()]
        self.lines.append(f"    {e.name} = {op}({', '.join(args)})")

        def unpack(out, path):
            if isinstance(out, Buffer):
                ref = e.name + "".join(f"[{i}]" for i in path)
                self.lines.append(f"    {out.name} = ensure_layout({ref}, {tuple(out.stride)})")
            elif isinstance(out, (list, tuple)):
                for i, o in enumerate(out):
                    unpack(o, path + (i,))
        unpack(e.outputs, ())
