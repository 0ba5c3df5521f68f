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
replay saves is the same) skip the timed run before capture and the timed replays after
it, which cost a BERT length's capture more than its launches.  When they capture
depends on `config.sized_capture_first`:

- On (the default): the verdict is measured at the first set's first call, right after
  it (the call tuned and compiled; a graph is captured over that call's own inputs,
  timed and dropped), so it is known before any set's second call.  Once it is kept, a
  new set captures right after its first call, taking as moving the inputs whose memory
  differs from the last call of a sibling (a bet that the set recurs: a server's
  lengths, or decoding's in the next `generate()`), and a set not captured so captures
  at its second call.  A bet costs one capture, about one direct call's launches; bets
  stop while those not replayed yet number `config.sized_capture_first_limit` more than
  the sets that recurred (sizes that never recur), and resume as sets recur.  A graph
  found GPU-bound at the first call measures again at the next set's, twice at most.
- Off: a sibling captures at its third call, after one timed direct call that still
  decides whether that set is GPU-bound.  Until one has measured, the first set to
  reach its third call measures there, not at its `capture_at`
  (`config.sized_early_verdict`): sizes that recur in rounds reach each call count
  together, and the verdict must come before the round of their third calls.

On the H200 a BERT server's 12 lengths called in rounds captured in the round of their
third calls, at about 2.7 ms a length, more than two rounds of replays saved.

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
# a replay whose inputs taken to stay in place moved captures again, with them copied in,
# where they are at most this many (`config.sized_capture_first`): fresh inputs the
# caching allocator had put where a sibling call's were
REPAIR_INPUTS = 4


class Verdict:
    """What the first measured sibling found: `kept` is True once a replay of one set of
    sizes was measured faster than its direct call (`config.sized_shared_verdict`).
    `early` (`config.sized_early_verdict`): until a sibling has measured a replay
    (`tried`), the first to reach its third call measures there, not at its `capture_at`.
    `first` (`config.sized_capture_first`): measured at a set's first call (until two sets
    were found GPU-bound there: `gpu_bound`), and sets capture at their first call
    (`ptrs`: a sibling's last pointers) while the bets not replayed yet (`unpaid`) are
    fewer than `limit` plus the sets that recurred (`recurred`: a bet's first replay, any
    other set's second call), so that sizes seen once stop the bets and recurring ones
    resume them.
    `moved`: positions whose input was seen at another address than the call before's
    (any sets): copied in, even where a call finds one at its sibling's address (the
    caching allocator hands a fresh input of one size the block another size's freed)."""
    __slots__ = ("kept", "early", "tried", "first", "limit", "ptrs", "unpaid", "recurred", "moved",
                 "gpu_bound")

    def __init__(self, early=False, first=False, limit=16):
        self.kept, self.early, self.tried = False, early, False
        self.first, self.limit = first, limit
        self.ptrs = None            # the inputs' pointers at a sibling's last call
        self.unpaid = self.recurred = self.gpu_bound = 0
        self.moved = set()

    def saw(self, ptrs) -> list | None:
        """Note a call's input pointers; the call before's (None: none yet)."""
        before, self.ptrs = self.ptrs, ptrs
        if before is not None:
            self.moved.update(i for i, (p, q) in enumerate(zip(ptrs, before)) if p != q)
        return before

    def stable(self, ptrs, before) -> list:
        """Per input: None (a size), True (at `before`'s address and never seen moving),
        False (copied in)."""
        moved = self.moved
        return [None if p is None else p == q and i not in moved
                for i, (p, q) in enumerate(zip(ptrs, before))]

    def may_bet(self) -> bool:
        return self.first and self.kept and self.unpaid < self.limit + self.recurred


class CudaGraphRunner:
    __slots__ = ("call", "calls", "last_ptrs", "graph", "static", "stable", "ptrs", "outputs", "misses",
                 "launches", "host_us", "gpu_us", "decision", "pool", "ints", "capture_at",
                 "verdict", "trust_saturated", "capture_direct", "outs", "bet", "replays")

    def __init__(self, call, launches=1, pool=None, verdict=None, settings=None):
        self.call, self.calls, self.last_ptrs = call, 0, None
        self.pool = pool    # a SharedPool with other graphs (None: a pool of its own)
        self.ints = ()      # positions of int arguments (sizes): a replay needs the same
        self.graph = self.static = self.stable = self.outputs = None
        # the addresses the graph reads its in-place inputs at, as captured: the caller's
        # tensor object may since hold other memory (`param.data = ...`), so its
        # data_ptr() now is no record of what the graph reads
        self.ptrs = None
        self.misses, self.launches = 0, launches
        # the direct call's best wall time (`gpu_us`, synchronized) and host time, in us
        self.host_us = self.gpu_us = None
        self.outs = 0           # tensors a direct call returned (each a copy out of a replay)
        self.decision = "not yet measured"
        self.capture_at = 4     # the call that captures (after the timed 2nd and 3rd)
        self.verdict = verdict  # shared with sibling sets of sizes (None: measured alone)
        self.bet = False        # captured at its first call, not replayed yet
        self.replays = 0        # (with `calls`: how hot the set is, for Sized's eviction)
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
        static, stable, ptrs = self.static, self.stable, self.ptrs
        for i in self.ints:
            if args[i] != static[i]:
                return self.call(args)  # (other sizes: not this graph's)
        for i, a in enumerate(args):
            keep = stable[i]
            if keep is None:
                continue
            if keep:
                if a.data_ptr() != ptrs[i]:
                    return self._miss(args)
            else:
                s = static[i]
                if a.data_ptr() != s.data_ptr():
                    s.copy_(a)
        if self.bet:
            self.bet = False
            self.verdict.unpaid -= 1
            self.verdict.recurred += 1
        self.replays += 1
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
        verdict = self.verdict
        if verdict is not None and verdict.first and self.misses <= 2:
            # inputs taken to stay where they were moved: a fresh input the caching
            # allocator had put at a sibling's or an earlier call's address, or a
            # parameter given other memory.  Where they are few the graph is captured
            # again; many (a state dict loaded by assignment) keep missing, and the
            # graph is dropped after 8
            moved = [i for i, (a, keep) in enumerate(zip(args, self.stable))
                     if keep and a.data_ptr() != self.ptrs[i]]
            if len(moved) <= REPAIR_INPUTS:
                # (the same tensor object with other memory, a parameter given `.data`, is
                # read in place at its new address; another tensor is a fresh input)
                fresh = [i for i in moved if args[i] is not self.static[i]]
                verdict.moved.update(fresh)
                stable = [False if i in fresh else keep for i, keep in enumerate(self.stable)]
                try:
                    self._capture_with(args, stable)
                except Exception as e:  # (as at a first capture)
                    self._give_up(e)
                    return self.call(args)
                return self(args)
        if self.misses > 8:
            log.info("triton backend: inputs keep moving; this graph stops using CUDA graphs")
            self.graph = self.static = self.stable = self.outputs = self.ptrs = None
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

    def first(self, args):
        """After a `Sized` set's first call, which ran the general wrapper with `args` (it
        tuned and compiled what these sizes need).  With `config.sized_capture_first`: if
        no sibling has measured a replay, this set measures one now; once one was kept,
        this set captures now, betting that it recurs.  A failure leaves the set
        launching, never reaches the caller (its call has run already)."""
        self.calls = 1
        verdict = self.verdict
        if verdict is None or not verdict.first or _capturing() or not _graphable(args):
            return
        ptrs = self.last_ptrs = _pointers(args)
        sibling = verdict.saw(ptrs)
        try:
            if not verdict.tried:
                if verdict.gpu_bound < 2:   # (then: timed at calls 2 and 3, as without it)
                    self._measure_first(args)
            elif sibling is not None and verdict.may_bet():
                # (an input a sibling's call had at the same address is taken to stay there;
                # one that moves after all makes a replay's check miss, and runs directly)
                self._capture_with(args, verdict.stable(ptrs, sibling))
                self.bet = True
                verdict.unpaid += 1
                self.decision = "a sibling's replay was faster; captured at its first call"
        except Exception as e:  # an op that syncs with the host, say
            self._give_up(e)

    def _give_up(self, e):
        """A capture failed: this set launches its kernels directly from now on."""
        log.info("triton backend: CUDA graph capture failed (%s); running launches", e)
        self.graph = self.static = self.stable = self.outputs = None
        self.calls = -10 ** 9

    def _measure_first(self, args):
        """The graph's verdict, measured at a set's first call: its direct call timed twice,
        then a graph captured over these very inputs (none copied in), replayed twice,
        timed and dropped (the set captures its own at its second call, once it knows
        which inputs move).  Costs about six calls, in a call that compiled."""
        for _ in range(2):
            out, wall, host = self._timed(self.call, list(args))
            self._note(wall, host)
        self.outs = sum(isinstance(o, torch.Tensor) for o in out)
        if self.host_us < HOST_BOUND * self.gpu_us:
            self._gpu_bound()
            self.verdict.gpu_bound += 1
            return
        self.verdict.tried = True
        self._capture_with(args, [None if p is None else True for p in _pointers(args)])
        self(list(args))    # (a graph's first replay uploads it: not a fair time)
        replay = min(self._timed(self, list(args))[1] for _ in range(2))
        self.graph = self.static = self.stable = self.outputs = None
        self.ints = ()
        self._decide(replay, "its first call")

    def _decide(self, replay, when):
        """Keep replaying (the verdict kept) or give graphs up, on a replay's time."""
        self.decision = (f"direct {self.gpu_us:.0f} us ({self.launches} launches, host "
                         f"{self.host_us:.0f} us) vs replay {replay:.0f} us, at {when}")
        keep = 1.0 if self.host_us >= HOST_SATURATED * self.gpu_us else KEEP_BELOW
        if replay < keep * self.gpu_us:
            if self.verdict is not None:
                self.verdict.kept = True
            log.info("triton backend: replaying as a CUDA graph: %s", self.decision)
            return True
        log.info("triton backend: CUDA graph not used: %s", self.decision)
        self.graph = self.static = self.outputs = None
        self.calls = -10 ** 9
        return False

    def _gpu_bound(self):
        # the GPU is the bottleneck: a replay saves host time the call does not wait on,
        # and its copies in and out cost GPU time
        self.decision = (f"GPU-bound: direct {self.gpu_us:.0f} us, of which host "
                         f"{self.host_us:.0f} us ({self.launches} launches)")
        log.info("triton backend: CUDA graph not used: %s", self.decision)
        self.calls = -10 ** 9

    def _capture_with(self, args, stable):
        """Capture the call over `args`: those `stable` marks True are read where they are
        (and must stay there), False ones copied into buffers of the graph's, None ones
        (sizes) matched by value."""
        static = [a if keep is not False else _buffer_like(a) for a, keep in zip(args, stable)]
        ptrs = [a.data_ptr() if keep else None for a, keep in zip(static, stable)]
        graph = torch.cuda.CUDAGraph()
        self.outputs = _capture(graph, self.pool, self.call, list(static), self.capture_direct)
        self.graph, self.static, self.stable, self.ptrs = graph, static, stable, ptrs
        self.ints = tuple(i for i, keep in enumerate(stable) if keep is None)

    def _warm(self, args):
        """The first call runs directly (it tunes and compiles), the second and third are
        timed (the best of two: the second still pays for building the fast launcher),
        the `capture_at`-th (the fourth, unless set later) captures, times a replay against
        the direct call and keeps the faster; calls between run directly.  A graph trusted
        without timing (a sibling's verdict, or a saturated host) captures at its third (its
        second with `config.sized_capture_first`), and so does, timed, the first of its
        siblings there while none has measured (`early`)."""
        if self.calls < 0:  # replaying was given up
            return self.call(args)
        ptrs = _pointers(args)
        self.calls += 1
        verdict = self.verdict
        if verdict is not None and verdict.first:
            verdict.saw(ptrs)       # (what the next set's first call compares with)
            if self.calls == 2:
                verdict.recurred += 1
        if not _graphable(args):
            self.last_ptrs = ptrs
            return self.call(args)
        trusted = saturated = early = False
        ready = self.calls >= 3 and self.gpu_us is not None or \
            verdict is not None and verdict.first and verdict.kept
        if ready and self.last_ptrs is not None:
            stable = [None if p is None else p == q for p, q in zip(ptrs, self.last_ptrs)]
            copied = sum(keep is False for keep in stable)
            trusted = verdict is not None and verdict.kept
            early = verdict is not None and verdict.early and not verdict.tried \
                and self.gpu_us is not None
            # (a replay's own host work: a copy launch per moved input and per output and
            # the replay itself; where launches are many times that, the host time it
            # saves dwarfs it)
            saturated = self.trust_saturated and self.host_us is not None and \
                self.host_us >= HOST_SATURATED * self.gpu_us and \
                self.launches >= TRUST_LAUNCHES * (copied + self.outs + 2)
        if self.calls < self.capture_at and not (trusted or saturated or early):
            self.last_ptrs = ptrs
            if self.calls == 1 or self.calls >= 4:
                return self.call(args)  # (4 and later, before capture_at: timed enough)
            out, wall, host = self._timed(self.call, args)
            self._note(wall, host)
            self.outs = sum(isinstance(o, torch.Tensor) for o in out)
            return out
        if self.host_us is not None and self.host_us < HOST_BOUND * self.gpu_us:
            self._gpu_bound()
            return self.call(args)
        if self.verdict is not None and not trusted:
            self.verdict.tried = True   # (whatever this measurement finds, it is the one)
        stable = verdict.stable(ptrs, self.last_ptrs) if verdict is not None and verdict.first \
            else [None if p is None else p == q for p, q in zip(ptrs, self.last_ptrs)]
        try:
            if not (trusted or saturated):  # (its direct calls warmed up and were timed)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    _, wall, host = self._timed(self.call, list(args))
                torch.cuda.current_stream().wait_stream(side)
                self._note(wall, host)
            self._capture_with(args, stable)
        except Exception as e:  # an op that syncs with the host, say
            self._give_up(e)
            return self.call(args)
        out = self(list(args))  # (a graph's first replay uploads it: not a fair time)
        if trusted or saturated:
            if "vs replay" in self.decision:    # (this set measured the verdict itself)
                self.decision += f"; captured at call {self.calls}"
            else:
                why = "a sibling's replay was faster" if trusted else "the host is most of the direct call"
                direct = "" if self.gpu_us is None else \
                    f"; direct {self.gpu_us:.0f} us (host {self.host_us:.0f} us)"
                self.decision = f"{why}{direct}, at call {self.calls}"
            if self.verdict is not None:
                self.verdict.kept = True
            log.info("triton backend: replaying as a CUDA graph: %s", self.decision)
            return out
        replay = min(self._timed(self, list(args))[1] for _ in range(2))
        self._decide(replay, f"call {self.calls}")
        return out


def _buffer_like(a):
    """A buffer of the graph's for an input copied in at each call: `a`'s sizes and
    strides (a kernel may have them as literals: `clone()` makes a sliced row contiguous),
    `a`'s values.  An input whose elements overlap (an expanded one) cannot be copied
    into: the capture fails and the set launches directly."""
    reach = 0
    for st, n in sorted((st, n) for n, st in zip(a.shape, a.stride()) if n > 1):
        if st <= reach:
            raise ValueError("an input whose elements overlap (expanded) moves between calls")
        reach += (n - 1) * st
    return torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device).copy_(a)


def _pointers(args) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


def _graphable(args) -> bool:
    """Whether a capture can take these arguments: CUDA tensors and sizes."""
    return all(isinstance(a, torch.Tensor) and a.is_cuda or type(a) is int for a in args)


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
