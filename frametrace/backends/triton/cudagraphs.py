"""Replays a compiled graph as one CUDA graph, so that the wrapper's Python launch cost
is paid once at capture instead of on every call.

Inputs whose memory was the same on the two calls before capture (parameters, buffers)
are captured in place and must stay there: if one moves, that call runs the wrapper
directly.  Other inputs are copied into buffers the graph owns.  Outputs are copied out
of the graph's memory, which the next replay overwrites.

Whether replaying pays is measured, not assumed from a launch count: the wrapper's
direct call is timed (wall clock, synchronized, and its host part) on the second and
third calls, the best of two; a call the GPU is the bottleneck of (host time under half
its wall time) keeps launching.  Otherwise the direct call is timed once more before
capture, then the captured graph's second replay with its copies in and out; the graph
is kept when it is faster by a margin (many small launches, as in batch-1 decoding,
where the host is the bottleneck); else it is dropped and the wrapper launches directly
from then on.  Where the host is most of the direct call's time (HOST_SATURATED) the
replay cannot lose, and the graph is captured and kept without the timed runs, at its
third call (on the H200 a BERT length's measured capture took 18 ms, against 2 ms
untimed; a server's length that recurs pays two direct calls before its replays, not
four).  Its one timed call may still include building the fast launcher, which only
makes the host's share look larger: the cost of a wrong trust is a replay's copies in
and out on a graph the GPU bounds.

Runners of one graph's sets of sizes (`Sized`) share a `Verdict`: once one set's replay
was measured faster, the others (same kernels, same launch count: the host cost that a
replay saves is the same) capture at their third call, after one timed direct call that
still decides whether that set is GPU-bound, and skip the timed run before capture and
the timed replays after it, which cost a BERT length's capture more than its launches.
Until one has measured, the first set to reach its third call measures there, not at
its `capture_at` (`config.sized_early_verdict`): sizes that recur in rounds (decoding's
lengths, one call per `generate()`) reach each call count together, and the verdict
must come before the round of their third calls to let them capture in it.

A capture runs on a side stream kept per device, ordered after the current stream by an
event (`config.graph_capture_direct`): `torch.cuda.graph` synchronizes the device and
empties the caching allocator's cache on every capture, to give the graph free memory;
over a server's many lengths that paid a full sync per capture and made the calls after
it allocate from the driver again (on the H200, BERT's round after the captures ran
1.43-1.65 ms a call against 1.21-1.33 the round after).  Our graphs draw from a pool of
their own, so nothing another stream still uses is handed to them.

A call made while the caller captures its own CUDA graph (a serving loop capturing a
decode step) launches directly, so that the kernels land in the caller's graph: replaying
ours inside a capture is not allowed, and timing would synchronize the capturing stream.
"""
from __future__ import annotations

import logging
import time
import warnings

import torch

from . import config

log = logging.getLogger("frametrace")

# a graph must beat launching by this factor to be kept (both sides are the best of two
# timed calls; one call's time moves by a few percent)
KEEP_BELOW = 0.95
# a graph is tried only when the host's share of a direct call's time is at least this
HOST_BOUND = 0.5
# from this host share on, a replay is kept without being timed (`config.graph_trust_saturated`):
# its GPU work is the direct call's (at most the other 20% of its time) plus copies in
# and out of no more bytes than the kernels themselves write, so it cannot lose; such a
# call's time follows the host's speed and load (ConvNeXt-Tiny at batch 64: host 3.7 of
# 4.1 ms), a replay's does not
HOST_SATURATED = 0.8
# ... where its launches are at least this many times the replay's own (copies in and
# out, the replay): a graph of a few launches may lose to them on the host
TRUST_LAUNCHES = 4


class Verdict:
    """What the first measured sibling found: `kept` is True once a replay of one set of
    sizes was measured faster than its direct call (`config.sized_shared_verdict`).
    `early` (`config.sized_early_verdict`): until a sibling has measured a replay
    (`tried`), the first to reach its third call measures there, not at its `capture_at`."""
    __slots__ = ("kept", "early", "tried")

    def __init__(self, early=False):
        self.kept, self.early, self.tried = False, early, False


class CudaGraphRunner:
    __slots__ = ("call", "calls", "last_ptrs", "graph", "static", "stable", "outputs", "misses",
                 "launches", "host_us", "gpu_us", "decision", "pool", "ints", "capture_at",
                 "verdict", "trust_saturated", "capture_direct", "outs")

    def __init__(self, call, launches=1, pool=None, verdict=None, settings=None):
        self.call, self.calls, self.last_ptrs = call, 0, None
        self.pool = pool    # a SharedPool with other graphs (None: a pool of its own)
        self.ints = ()      # positions of int arguments (sizes): a replay needs the same
        self.graph = self.static = self.stable = self.outputs = None
        self.misses, self.launches = 0, launches
        # the direct call's best wall time (`gpu_us`, synchronized) and host time, in us
        self.host_us = self.gpu_us = None
        self.outs = 0           # tensors a direct call returned (each a copy out of a replay)
        self.decision = "not yet measured"
        self.capture_at = 4     # the call that captures (after the timed 2nd and 3rd)
        self.verdict = verdict  # shared with sibling sets of sizes (None: measured alone)
        # (a module's own settings, optimize(options=), over the global config)
        settings = settings or {}
        self.trust_saturated = settings.get("graph_trust_saturated", config.graph_trust_saturated)
        self.capture_direct = settings.get("graph_capture_direct", config.graph_capture_direct)

    @property
    def launch_us(self):
        """Host microseconds per launch of the wrapper without a graph (measured)."""
        return None if self.host_us is None else self.host_us / max(self.launches, 1)

    def __call__(self, args):
        if _capturing():
            return self.call(args)
        if self.graph is None:
            return self._warm(args)
        static, stable = self.static, self.stable
        for i in self.ints:
            if args[i] != static[i]:
                return self.call(args)  # (other sizes: not this graph's)
        for i, a in enumerate(args):
            s = static[i]
            if stable[i] is None:
                continue
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

    def _timed(self, fn, args):
        """(fn(args), wall microseconds, host microseconds) with the GPU synchronized."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(args)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) * 1e6, (t1 - t0) * 1e6

    def _note(self, wall, host):
        self.gpu_us = wall if self.gpu_us is None else min(self.gpu_us, wall)
        self.host_us = host if self.host_us is None else min(self.host_us, host)

    def _warm(self, args):
        """The first call runs directly (it tunes and compiles), the second and third are
        timed (the best of two: the second still pays for building the fast launcher),
        the `capture_at`-th (the fourth, unless set later) captures, times a replay against
        the direct call and keeps the faster; calls between run directly.  A graph trusted
        without timing (a sibling's verdict, or a saturated host) captures at its third, and
        so does, timed, the first of its siblings there while none has measured (`early`)."""
        if self.calls < 0:  # replaying was given up
            return self.call(args)
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        self.calls += 1
        if not all(isinstance(a, torch.Tensor) and a.is_cuda or type(a) is int for a in args):
            self.last_ptrs = ptrs
            return self.call(args)
        trusted = saturated = early = False
        if self.calls >= 3 and self.gpu_us is not None and self.last_ptrs is not None:
            stable = [None if p is None else p == q for p, q in zip(ptrs, self.last_ptrs)]
            copied = sum(keep is False for keep in stable)
            verdict = self.verdict
            trusted = verdict is not None and verdict.kept
            early = verdict is not None and verdict.early and not verdict.tried
            # (a replay's own host work: a copy launch per moved input and per output and
            # the replay itself; where launches are many times that, the host time it
            # saves dwarfs it)
            saturated = self.trust_saturated and self.host_us >= HOST_SATURATED * self.gpu_us \
                and self.launches >= TRUST_LAUNCHES * (copied + self.outs + 2)
        if self.calls < self.capture_at and not (trusted or saturated or early):
            self.last_ptrs = ptrs
            if self.calls == 1 or self.calls >= 4:
                return self.call(args)  # (4 and later, before capture_at: timed enough)
            out, wall, host = self._timed(self.call, args)
            self._note(wall, host)
            self.outs = sum(isinstance(o, torch.Tensor) for o in out)
            return out
        if self.host_us is not None and self.host_us < HOST_BOUND * self.gpu_us:
            # the GPU is the bottleneck: a replay saves host time the call does not wait on,
            # and its copies in and out cost GPU time
            self.decision = (f"GPU-bound: direct {self.gpu_us:.0f} us, of which host "
                             f"{self.host_us:.0f} us ({self.launches} launches)")
            log.info("triton backend: CUDA graph not used: %s", self.decision)
            self.calls = -10 ** 9
            return self.call(args)
        if self.verdict is not None and not trusted:
            self.verdict.tried = True   # (whatever this measurement finds, it is the one)
        stable = [None if p is None else p == q for p, q in zip(ptrs, self.last_ptrs)]
        static = [a if keep is not False else a.clone() for a, keep in zip(args, stable)]
        ints = tuple(i for i, keep in enumerate(stable) if keep is None)
        graph = torch.cuda.CUDAGraph()
        try:
            if not (trusted or saturated):  # (its direct calls warmed up and were timed)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    _, wall, host = self._timed(self.call, list(static))
                torch.cuda.current_stream().wait_stream(side)
                self._note(wall, host)
            outputs = _capture(graph, self.pool, self.call, list(static), self.capture_direct)
        except Exception as e:  # an op that syncs with the host, say
            log.info("triton backend: CUDA graph capture failed (%s); running launches", e)
            self.calls = -10 ** 9
            return self.call(args)
        self.graph, self.static, self.stable, self.outputs = graph, static, stable, outputs
        self.ints = ints
        out = self(list(args))  # (a graph's first replay uploads it: not a fair time)
        if trusted or saturated:
            why = "a sibling's replay was faster" if trusted else "the host is most of the direct call"
            self.decision = f"{why}; direct {self.gpu_us:.0f} us (host {self.host_us:.0f} us)"
            if self.verdict is not None:
                self.verdict.kept = True
            log.info("triton backend: replaying as a CUDA graph: %s", self.decision)
            return out
        replay = min(self._timed(self, list(args))[1] for _ in range(2))
        self.decision = (f"direct {self.gpu_us:.0f} us ({self.launches} launches, host "
                         f"{self.host_us:.0f} us) vs replay {replay:.0f} us")
        keep = 1.0 if self.host_us >= HOST_SATURATED * self.gpu_us else KEEP_BELOW
        if replay < keep * self.gpu_us:
            if self.verdict is not None:
                self.verdict.kept = True
            log.info("triton backend: replaying as a CUDA graph: %s", self.decision)
        else:
            log.info("triton backend: CUDA graph not used: %s", self.decision)
            self.graph = self.static = self.outputs = None
            self.calls = -10 ** 9
        return out


_capturing = torch.cuda.is_current_stream_capturing
_streams = {}   # device index -> the side stream captures run on


class SharedPool:
    """A memory pool that several graphs (one `Sized`'s sets of sizes) capture into, kept
    alive by a one-kernel graph of its own for as long as this object lives.  The caching
    allocator keeps a pool whose graphs have all died (its use count 0) until its cache
    is emptied, and a capture into such a pool fails inside `capture_begin`; without
    `torch.cuda.graph`'s `empty_cache` before each capture, a dropped replay left that
    state for its siblings' captures."""
    __slots__ = ("handle", "keeper")

    def __init__(self):
        self.handle, self.keeper = torch.cuda.graph_pool_handle(), None


def _capture(graph, pool, fn, args, direct=True):
    """fn(args) captured into `graph`, drawing from `pool` (a SharedPool; None: the graph's
    own).  `direct`: on a side stream that waits for the current one, without
    `torch.cuda.graph`'s device synchronize and `empty_cache` first."""
    handle = None
    if pool is not None:
        if pool.keeper is None:
            keeper = torch.cuda.CUDAGraph()
            _begin_end(keeper, pool.handle, lambda: torch.zeros(1, device="cuda"), direct)
            pool.keeper = keeper
        handle = pool.handle
    return _begin_end(graph, handle, lambda: fn(args), direct)


def _begin_end(graph, handle, run, direct):
    try:
        if not direct:
            with torch.cuda.graph(graph, pool=handle):
                return run()
        device = torch.cuda.current_device()
        side = _streams.get(device)
        if side is None:
            side = _streams[device] = torch.cuda.Stream()
        current = torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            graph.capture_begin(*(() if handle is None else (handle,)))
            try:
                out = run()
            finally:
                graph.capture_end()
        current.wait_stream(side)
        return out
    except BaseException:
        _clear_generator_capture()
        raise


def _clear_generator_capture():
    """`capture_begin` marks the CUDA generator as capturing before its checks, and
    `capture_end` clears the mark only after a valid capture: a capture that failed in
    either left every later random op of the process raising ("Offset increment outside
    graph capture").  An empty capture of our own sets and clears the mark again."""
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # ("the CUDA graph is empty")
            with torch.cuda.stream(torch.cuda.Stream()):
                graph.capture_begin()
                graph.capture_end()
    except Exception as e:  # (nothing more to do; the failed capture is logged by the caller)
        log.info("triton backend: could not reset the CUDA generator after a failed capture: %s", e)
