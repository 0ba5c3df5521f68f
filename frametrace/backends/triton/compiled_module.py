"""What the backend made of one graph, at run time: a `CompiledModule` (its wrapper's
namespace, kernels and aten calls, the fast wrapper made after its first launch), the
boxed function AOTAutograd calls, settled on the fast path after a first good call, and
what that first call needs to know (the layouts the kernels were made for; a rehearsal on
copies of inputs the graph writes; whether a failed wrapper had already written an
input).  Both backend.py, which builds modules, and result_cache.py, which restores them
in a warm process, use these; neither is imported here."""
from __future__ import annotations

import functools
import itertools
import logging
import re

import torch

from . import config
from .cudagraphs import CudaGraphRunner, SharedPool
from .cudagraphs import Verdict as CudaGraphVerdict
from .foreach import in_place
from .ir import Extern

output_code = logging.getLogger("frametrace.output_code")
log = logging.getLogger("frametrace")


class CompiledModule:
    """What the backend made of one graph (`kind`: inference, forward or backward).  `kernels`: one entry per launch
    (`.name`, `.source`); `externs`: aten ops called as they are; `fallbacks`: the FX
    nodes among those that kernels could have run (`lowering.Fallback`s: node, op, why)."""

    def __init__(self, wrapper, source, kernels, externs, fallback_ops, extern_ops=(), fallbacks=()):
        self.wrapper, self.source, self.namespace = wrapper, source, wrapper.ns
        self.kernels, self.externs, self.fallback_ops = kernels, externs, fallback_ops
        self.extern_ops, self.fallbacks = extern_ops, list(fallbacks)
        # symbolic sizes: the wrapper reads the shape symbols from its inputs
        self.symbolic = bool(wrapper.lowered.hints)
        self.call = self.namespace["call"]
        self.fast = None    # `fast(args)`, once the first call has compiled every kernel
        self.runner = None  # a CudaGraphRunner, when launches are replayed as a CUDA graph
        self.kind = "inference"
        self.settings = {}  # config values this module keeps (optimize(mode=, options=))

    @property
    def graphable(self) -> bool:
        """Worth replaying as a CUDA graph, and safe to: no op mutates its inputs (symbolic
        sizes: one graph per set of sizes, `Sized`)."""
        return not self.symbolic and self.graphable_per_size

    @property
    def graphable_per_size(self) -> bool:
        """`graphable`, whatever the sizes."""
        settings = self.settings
        return (settings.get("cudagraphs", config.cudagraphs) and self.namespace["device"].type == "cuda"
                and not self.wrapper.lowered.off_device  # host work a replay would skip
                and not getattr(self.wrapper.lowered, "generators", ())  # (a capture must register them)
                and len(self.kernels) + len(self.externs) >=
                settings.get("cudagraph_min_launches", config.cudagraph_min_launches)
                and not any(op._schema.is_mutable for op in self.extern_ops)
                and not any(in_place(k) for k in self.kernels))  # (inputs are copied in)

    @property
    def unique_kernels(self) -> list[str]:
        return sorted({k.source for k in self.kernels})

    def make_fast(self, inputs):
        """After a first call with `inputs`: the wrapper that calls each compiled kernel's
        launcher directly (on the GPU), or None.  Symbolic sizes: a `Sized` dispatcher,
        which makes such a wrapper for each set of sizes that recurs."""
        if not self.settings.get("fast_launch", config.fast_launch):
            return None
        if self.symbolic:
            self.fast = Sized.make(self, inputs)
            return self.fast
        try:
            source = self.wrapper.fast_source(inputs)
        except AttributeError as e:  # another Triton's launcher
            log.info("triton backend: launches go through Triton's JIT (%s)", e)
            return None
        if source is None:
            return None
        exec(compile(source, "<frametrace-triton fast wrapper>", "exec"), self.namespace)
        self.fast_source = source
        self.fast = self.namespace["fast"]
        output_code.debug("triton backend, fast wrapper:\n%s", source)
        return self.fast

    def __call__(self, args):
        return (self.fast or self.call)(args)


class Sized:
    """A symbolic graph's calls, dispatched on the values of its shape symbols: sizes
    called `config.sized_fast_after` times get a fast wrapper of their own (the static
    graph's kind: grids, block sizes and compiled kernels as literals, for those sizes
    only), made right after such a call ran the general wrapper, which leaves every
    launcher holding what it launched for those sizes.  Other sizes run the general
    wrapper (`call`).  The fast wrapper still checks what the sizes do not fix: the
    inputs' alignment, the device, launch hooks (else it runs `call`).

        >>> run = Sized.make(mod, first_inputs)    # None where no fast wrapper can be had
        >>> run(args)                              # `call`, or the fast wrapper of args' sizes
    """
    __slots__ = ("mod", "key", "fast", "seen", "after", "limit", "sources", "pool", "shared",
                 "verdict")

    def __init__(self, mod, key, after, limit):
        self.mod, self.key, self.after, self.limit = mod, key, after, limit
        # inference graphs: each set of sizes' fast wrapper replayed as a CUDA graph where
        # that pays (cudagraphs.py decides per set), the graphs sharing one memory pool
        # (a replay's outputs are copied out, its temporaries dead once it returns)
        self.pool = None
        get = mod.settings.get
        self.verdict = CudaGraphVerdict(
            get("sized_early_verdict", config.sized_early_verdict),
            get("sized_capture_first", config.sized_capture_first),
            get("sized_capture_first_limit", config.sized_capture_first_limit)) \
            if get("sized_shared_verdict", config.sized_shared_verdict) else None
        self.fast = {}      # sizes -> that sizes' fast wrapper
        self.seen = {}      # sizes -> calls so far (those without a fast wrapper)
        self.sources = {}   # sizes -> the fast wrapper's source (tests, output_code)
        self.shared = {}    # WrapperCodegen.sized_table's signature -> `fast(args, T)`

    @staticmethod
    def make(mod, inputs):
        """The dispatcher of `mod` (symbolic), after its first call with `inputs` (which
        counts as one call of their sizes), or None: sizes only the data decides, CPU
        or Triton's interpreter, `config.sized_fast_after` 0."""
        w = mod.wrapper
        L = w.lowered
        after = mod.settings.get("sized_fast_after", config.sized_fast_after)
        if not after or w.fast_template is None or L.late_symbols or not L.symbol_sources or \
                L.device.type != "cuda":
            return None
        position = {name: i for i, name in enumerate(L.inputs)}
        exprs = [re.sub(r"\b[A-Za-z_]\w*\b", lambda m: f"args[{position[m.group(0)]}]"
                        if m.group(0) in position else m.group(0), src)
                 for src in L.symbol_sources.values()]
        key = eval(f"lambda args: ({', '.join(exprs)},)")   # (the names are the graph's own)
        self = Sized(mod, key, after, mod.settings.get("sized_fast_limit", config.sized_fast_limit))
        if after <= 1:
            self._build(key(inputs), inputs)
        else:
            self.seen[key(inputs)] = 1
        return self

    def __call__(self, args):
        fast = self.fast.get(self.key(args))
        return fast(args) if fast is not None else self.miss(args)

    def miss(self, args):
        sizes, kept = self.key(args), list(args)
        n = self.seen.get(sizes, 0) + 1
        if n < self.after:
            self._count(sizes, n)
            return self.mod.call(args)
        out = self.mod.call(args)       # (tunes and compiles what these sizes need)
        self.seen.pop(sizes, None)
        self._build(sizes, kept, n)
        return out

    def _count(self, sizes, n):
        if len(self.seen) >= 16 * self.limit:
            self.seen.clear()       # (a bound: sizes that never recur)
        self.seen[sizes] = n

    def _build(self, sizes, inputs, n=1):
        """Make the fast wrapper of `sizes`, just called for the `n`-th time with `inputs`.
        A table costs a tuple; a source of its own costs a compile (~4 ms), made only
        for sizes called twice (a set seen once is counted instead)."""
        mod = self.mod
        try:
            run, source = self._shared(inputs)
            if run is None and n < 2:
                self._count(sizes, n)
                return
            if run is None:     # (a kernel that Triton's launcher runs: a source of its own)
                ns = dict(mod.namespace)
                source = mod.wrapper.fast_source(inputs, ns)
                if source is not None:
                    exec(compile(source, "<frametrace-triton fast wrapper>", "exec"), ns)
                    run = ns["fast"]
        except AttributeError as e:  # another Triton's launcher
            log.info("triton backend: launches go through Triton's JIT (%s)", e)
            run = None
        if len(self.fast) >= self.limit:
            self._evict()
        if run is None:
            self.fast[sizes] = mod.call
            return
        if mod.kind == "inference" and mod.graphable_per_size:
            if self.pool is None:
                self.pool = SharedPool()
            run = CudaGraphRunner(run, len(mod.kernels) + len(mod.externs), self.pool, self.verdict,
                                  mod.settings)
            run.capture_at = max(4, mod.settings.get("sized_capture_at", config.sized_capture_at))
            run.first(inputs)   # (its first call, the one that made it, ran already)
        self.fast[sizes], self.sources[sizes] = run, source

    def _evict(self):
        """Drop one set of sizes: of the oldest quarter made, the one called least (a
        runner's direct calls while it warms up, and its replays; one that gave graphs up
        or a plain wrapper counts 0 calls), so that more sets in rotation than the limit
        push out cold ones, not the captures of hot ones (oldest-first dropped a hot size
        every `limit` new ones, to capture it again; a set captured at its first call has
        made one call however often it replays)."""
        window = itertools.islice(self.fast.items(), max(1, self.limit // 4))
        sizes = min(window, key=lambda kv: max(getattr(kv[1], "calls", 0), 0) +
                    getattr(kv[1], "replays", 0))[0]
        del self.fast[sizes]
        self.sources.pop(sizes, None)

    def _shared(self, inputs):
        """(the fast wrapper of the sizes just called, as `fast(args, T)` with their table
        bound, its source), or (None, None) where these sizes need a source of their own."""
        w = self.mod.wrapper
        got = w.sized_table(inputs)
        if got is None:
            return None, None
        signature, table = got
        shared = self.shared.get(signature)
        if shared is None:
            ns = dict(self.mod.namespace)
            source = w.fast_source(inputs, ns, table=True)
            if source is None:
                return None, None
            exec(compile(source, "<frametrace-triton fast wrapper>", "exec"), ns)
            shared = self.shared[signature] = (ns["fast"], source)
            output_code.debug("triton backend, fast wrapper for symbolic sizes:\n%s", source)
        return functools.partial(shared[0], T=table), shared[1]


def layouts(inputs) -> list:
    """Each tensor input's dtype, device, sizes and strides (size-1 dims' strides left
    out: they address nothing; a symbolic size is no guard's business here, its stride is
    kept), None for others: what a module's kernels were made for."""
    return [(str(t.dtype), str(t.device), tuple(t.shape),
             tuple(None if type(n) is int and n == 1 else s for n, s in zip(t.shape, t.stride())))
            if isinstance(t, torch.Tensor) else None for t in inputs]


def boxed(first, current):
    """A graph's boxed function: it calls `first` until that replaces `run.target`
    (with the module's fast path once its kernels have launched); `current()`: the
    CompiledModule the graph runs now (the result cache stores it)."""
    def run(args):
        return run.target(args)
    run.target = first
    run._boxed_call = True
    run.current_module = current
    return run


def settle(run, mod, kept):
    """After a module's first good launch: later calls go straight to its fast wrapper
    (a launcher with the checks of the first call's layouts), through the CUDA-graph
    runner where the module has one."""
    fast = mod.make_fast(kept)
    if mod.runner is not None:
        run.target = mod.runner
        mod.runner.call = fast or mod.call
    else:
        run.target = fast or mod.call


def rehearsal(mod, args) -> list | None:
    """For the first call of a graph that writes its inputs (an optimizer step): the
    arguments with each tensor copied (same sizes, strides and values), for a run that
    compiles every kernel before any writes the caller's memory, so that a kernel
    failing to compile is replaced by aten calls instead of reaching the user half
    way through the writes.  None where not needed or not safe: no input written, a
    random draw (a second run would advance the generator), an op outside aten, or
    copies that would take more than half the GPU's free memory."""
    ops = mod.extern_ops
    writes = any(in_place(k) for k in mod.kernels) or \
        any(getattr(getattr(op, "_schema", None), "is_mutable", True) for op in ops)
    if not writes or any(torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()) or
                         getattr(op, "namespace", None) != "aten" for op in ops):
        return None     # (other namespaces: a collective run twice on one rank would hang)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    need = sum(t.untyped_storage().nbytes() for t in tensors if t.is_cuda)
    try:
        if need and (torch.cuda.is_current_stream_capturing() or need > torch.cuda.mem_get_info()[0] // 2):
            return None     # (a caller's capture records what we allocate)
        return [torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device).copy_(a)
                if isinstance(a, torch.Tensor) else a for a in args]
    except Exception:   # (an overlapping layout copy_ refuses, say): run as before
        return None


def mutated_before(mod, e) -> bool:
    """Whether the wrapper that raised `e` had written an input (an input mutation's
    `copy_`) before the line that raised."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<frametrace-triton wrapper>":
            line = tb.tb_lineno
        tb = tb.tb_next
    writes = write_prefixes(mod)
    if not writes or line is None:
        return bool(writes)
    return any(text.startswith(w) for text in mod.source.splitlines()[:line - 1] for w in writes)


def write_prefixes(mod) -> list:
    """The starts of the wrapper's lines that write an input (a mutating aten call, a
    kernel storing into an input)."""
    known = getattr(mod, "writes", None)      # (a module restored from the result cache)
    if known is not None:
        return known
    writes = [f"    {i.name} = " for i in mod.wrapper.schedule if isinstance(i, Extern)
              and getattr(getattr(i.graph_op, "_schema", None), "is_mutable", True)
              and not _restores_rng(i.graph_op)]
    return writes + [f"    {n}(" for n, k in zip(mod.wrapper.launchers, mod.kernels) if in_place(k)]


def _restores_rng(op) -> bool:
    """A random op run in a given RNG state that changes nothing a second run would read:
    graphsafe_run_with_rng_state advances only its generator (an input, whose state the
    first call restores before running again), run_with_rng_state restores the default
    generator's state after the op."""
    name = op.name() if isinstance(op, torch._ops.HigherOrderOperator) else None
    return name in ("graphsafe_run_with_rng_state", "run_with_rng_state")
