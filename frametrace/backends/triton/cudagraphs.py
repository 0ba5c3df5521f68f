"""Replays a compiled graph as one CUDA graph, so that the wrapper's Python launch cost
is paid once at capture instead of on every call.

Inputs whose memory was the same on the two calls before capture (parameters, buffers)
are captured in place and must stay there: if one moves, that call runs the wrapper
directly.  Other inputs are copied into buffers the graph owns.  Outputs are copied out
of the graph's memory, which the next replay overwrites.

Whether replaying pays is measured, not assumed from a launch count: the second call
times the wrapper on the host and its launches on the GPU; a graph is captured when the
host is the bottleneck (many small launches, as in batch-1 decoding) and the copies in
and out cost less than the host time they save.
"""
from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("frametrace")

# Rough costs of the copies a replay adds: bytes a second through memory (read + write),
# and host time of one eager copy launch relative to a wrapper's launch.
COPY_BANDWIDTH = 1.5e12


class CudaGraphRunner:
    __slots__ = ("call", "calls", "last_ptrs", "graph", "static", "stable", "outputs", "misses",
                 "launches", "host_us", "gpu_us", "decision")

    def __init__(self, call, launches=1):
        self.call, self.calls, self.last_ptrs = call, 0, None
        self.graph = self.static = self.stable = self.outputs = None
        self.misses, self.launches = 0, launches
        # measured on the second call: the wrapper's host time and its GPU time (us)
        self.host_us = self.gpu_us = None
        self.decision = "not yet measured"

    @property
    def launch_us(self):
        """Host microseconds per launch of the wrapper without a graph (measured)."""
        return None if self.host_us is None else self.host_us / max(self.launches, 1)

    def __call__(self, args):
        if self.graph is None:
            return self._warm(args)
        static, stable = self.static, self.stable
        for i, a in enumerate(args):
            s = static[i]
            if stable[i]:
                if a.data_ptr() != s.data_ptr():
                    return self._miss(args)
            elif a.data_ptr() != s.data_ptr():
                s.copy_(a)
        args.clear()
        self.graph.replay()
        outs = self.outputs
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        if not tensors:
            return list(outs)
        fresh = [torch.empty_like(o) for o in tensors]
        torch._foreach_copy_(fresh, tensors)   # one launch for all outputs
        it = iter(fresh)
        return [next(it) if isinstance(o, torch.Tensor) else o for o in outs]

    def _miss(self, args):
        self.misses += 1
        if self.misses > 8:
            log.info("triton backend: inputs keep moving; this graph stops using CUDA graphs")
            self.graph = None
            self.calls = -10 ** 9
        return self.call(args)

    def _measure(self, args):
        """The second call: run it directly, timing the host and the GPU."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = self.call(args)
        self.host_us = (time.perf_counter() - t0) * 1e6
        end.record()
        end.synchronize()
        self.gpu_us = start.elapsed_time(end) * 1e3
        return out

    def pays(self, static_inputs, outputs) -> bool:
        """Whether replays beat launching: the copies in and out against the host time saved."""
        host, gpu = self.host_us, self.gpu_us
        copied = [a for a in static_inputs] + [o for o in outputs if isinstance(o, torch.Tensor)]
        nbytes = sum(t.numel() * t.element_size() for t in copied)
        copy_gpu = 2 * nbytes / COPY_BANDWIDTH * 1e6
        copy_host = (len(static_inputs) + 2) * (self.launch_us or 5.0) + 2.0 * len(copied)
        direct = max(host, gpu)
        replay = max(copy_host, gpu + copy_gpu)
        self.decision = (f"direct {direct:.0f} us (host {host:.0f}, GPU {gpu:.0f}, {self.launches} "
                         f"launches) vs replay ~{replay:.0f} us")
        return replay < 0.9 * direct

    def _warm(self, args):
        """The first call runs directly (it tunes and compiles), the second is timed, the
        third captures if replaying pays."""
        if self.calls < 0:  # replaying was given up
            return self.call(args)
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        self.calls += 1
        if self.calls < 3 or not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            self.last_ptrs = ptrs
            return self._measure(args) if self.calls == 2 else self.call(args)
        stable = [p == q for p, q in zip(ptrs, self.last_ptrs)]
        static = [a if keep else a.clone() for a, keep in zip(args, stable)]
        graph = torch.cuda.CUDAGraph()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                warm = self.call(list(static))
            torch.cuda.current_stream().wait_stream(side)
            if not self.pays([a for a, keep in zip(static, stable) if not keep], warm):
                log.info("triton backend: CUDA graph not used: %s", self.decision)
                self.calls = -10 ** 9
                return self.call(args)
            with torch.cuda.graph(graph):
                outputs = self.call(list(static))
        except Exception as e:  # an op that syncs with the host, say
            log.info("triton backend: CUDA graph capture failed (%s); running launches", e)
            self.calls = -10 ** 9
            return self.call(args)
        log.info("triton backend: replaying as a CUDA graph: %s", self.decision)
        self.graph, self.static, self.stable, self.outputs = graph, static, stable, outputs
        return self(args)
