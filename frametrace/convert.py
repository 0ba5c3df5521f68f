"""The hook's Python callback: decide whether to trace a frame, trace it, compile its
graph, and hand the C hook a (guard, transformed code) cache entry."""
from __future__ import annotations

import gc
import importlib.util
import itertools
import logging
import os
import site
import sys
import sysconfig
import threading
import time
import warnings
import weakref
from collections import Counter

import torch
from bytecode import CellVar
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from . import _C, cache_limit, config, interop, recompiles, resume, stance, warm_cache
from . import distributed, progress
from .bytecode_diff import plain_diff
from .codegen import CodeGen, GraphSlot, RerunState, fill_graph_slot
from .exc import BackendCompilerFailed, Unsupported, format_user_stack, frame_summary
from .backends import backend_name
from .global_state import GlobalState
from .graph import OutputGraph, written_arg
from .guards import GuardSet
from .interpreter import InstructionTranslator
from .shapes import (ShapePolicy, compile_started, forget_real_tensors, forget_sizes,
                     release_shape_env_caches)
from .variables import (DictVar, IteratorVar, ListVar, MethodVar, NULL, TensorVar, TupleVar, Var,
                        tensor_facts)
from .variables.lazy import Lazy
from .variables.functions import BoundMethodVar, Cell, NestedFunctionVar, PartialVar
from .variables.optimizers import TRACED_TORCH_PACKAGES
from .variables.subclasses import is_user_container
from .variables.symbolic import FormattedVar, SymNodeVar
from .variables.modules import NNModuleVar
from .variables.user_objects import DataclassVar, NewObjectVar, UserObjectVar
from .variables.contexts import enclosing_with_starts

log = logging.getLogger("frametrace")
graph_log = logging.getLogger("frametrace.graph")
recompile_log = logging.getLogger("frametrace.recompiles")
break_log = logging.getLogger("frametrace.graph_breaks")
guard_log = logging.getLogger("frametrace.guards")
bytecode_log = logging.getLogger("frametrace.bytecode")
output_code_log = logging.getLogger("frametrace.output_code")

_fn_ids = itertools.count()
# Codes with cache state, for reset(); by id, since code objects compare by content.
_seen_codes: dict[int, weakref.ref] = {}
_installed_globals: list[tuple[dict, str]] = []           # __compiled_fn_N we placed
_warned_cache_limit: set[int] = set()


class CompileRecord:
    """What one compile of one frame produced (read by explain(), show() and tests).
    `outcome` is "compiled" (the frame runs transformed code to its end), "break"
    (compiled up to a graph break, then a resume function) or "fallback" (the frame
    runs in CPython); `reason`, `hint` and `user_stack` say why for the last two.
    `from_cache`: the entry came from the on-disk cache (warm_cache.py): nothing was
    traced, the backend compiled the cached graph."""
    __slots__ = ("code", "_graph_module", "op_count", "guards", "reason", "hint", "user_stack",
                 "compile_seconds", "backend_seconds", "transformed_code", "outcome", "check",
                 "from_cache")

    def __init__(self, code):
        self.code = code
        self._graph_module = None
        self.op_count = 0
        self.guards: list[str] = []
        self.reason = None
        self.hint = None
        self.user_stack = []
        self.compile_seconds = 0.0
        self.backend_seconds = 0.0
        self.transformed_code = None
        self.outcome = "compiled"
        self.check = None
        self.from_cache = False


    @property
    def graph_module(self):
        """The FX graph (an entry from the cache: unpickled at the first read)."""
        gm = self._graph_module = _resolved(self._graph_module)
        return gm

    @graph_module.setter
    def graph_module(self, gm):
        self._graph_module = gm


def _resolved(gm):
    """`gm`, or the GraphModule of a cached entry's graph not unpickled yet
    (warm_cache._GraphBytes, config.cache_lazy_graph): unpickled now, None (one log
    line) where it cannot be."""
    if type(gm) is not warm_cache._GraphBytes:
        return gm
    try:
        return gm.load()
    except Exception as e:
        warm_cache.log.warning("frametrace: cache: cannot unpickle a cached entry's graph (%s: %s)",
                               type(e).__name__, e)
        return None


class _GraphModules(dict):
    """__compiled_fn_N -> its GraphModule (an entry's from the cache: unpickled when read)."""

    def __getitem__(self, name):
        return _resolved(super().__getitem__(name))

    def get(self, name, default=None):
        return _resolved(super().get(name, default))

    def values(self):
        return [_resolved(v) for v in super().values()]

    def items(self):
        return [(k, _resolved(v)) for k, v in super().items()]


graph_modules = _GraphModules()                # __compiled_fn_N -> its GraphModule

# Observers get every CompileRecord (explain() and tests register one).
record_observers: list = []

# Events worth asserting on in tests: "internal_error" counts tracer bugs that were
# caught (the frame ran in CPython), so a test can require zero.
counters: Counter = Counter()


# --------------------------------------------------------------------------- skipping
def _package_dirs(names):
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        for loc in (spec.submodule_search_locations or [spec.origin]):
            if loc:
                dirs.append(os.path.realpath(loc if os.path.isdir(loc) else loc))
    return tuple(dirs)


_skip_cache: dict[str, bool] = {}
_layout = None


def _paths():
    global _layout
    if _layout is None:
        paths = sysconfig.get_paths()
        stdlib = tuple({os.path.realpath(paths["stdlib"]), os.path.realpath(paths["platstdlib"])})
        sites = tuple({os.path.realpath(p) for p in
                       [paths["purelib"], paths["platlib"], *site.getsitepackages()]})
        _layout = (stdlib, sites, _package_dirs(config.skip_packages),
                   _package_dirs(TRACED_TORCH_PACKAGES))
    return _layout


def is_skipped_file(filename: str) -> bool:
    """Code in the standard library, torch, frametrace and the packages of
    `config.skip_packages` is never traced on its own."""
    hit = _skip_cache.get(filename)
    if hit is not None:
        return hit
    if filename.startswith("<"):
        hit = filename.startswith(("<frozen", "<eval_with_key", "<frametrace"))
    else:
        path = os.path.realpath(filename)
        stdlib, sites, packages, traced = _paths()
        if any(path.startswith(p + os.sep) for p in traced):
            hit = False
        elif any(path.startswith(p + os.sep) or path == p for p in packages):
            hit = True
        elif any(path.startswith(p + os.sep) for p in stdlib):
            hit = not any(path.startswith(s + os.sep) for s in sites)
        else:
            hit = False
    _skip_cache[filename] = hit
    return hit


def _generated_in_skipped_package(code, func) -> bool:
    """Code made by exec in a skipped package's module (a dataclass's __init__, named
    "<string>"), which a skipped call reaches (torch.cond running in CPython at a graph
    break compiles with torch's own machinery)."""
    if not code.co_filename.startswith("<"):
        return False
    name = (getattr(func, "__globals__", None) or {}).get("__name__")
    # (collections.namedtuple's __new__ is made in a namespace of its own.)
    return isinstance(name, str) and (name.split(".")[0] in config.skip_packages or
                                      name.startswith("namedtuple_"))


# 3.11 runs comprehensions as frames of their own, over a hidden iterator argument
# ('.0') that is new on every call: traced alone they could never be reused.  (3.12
# inlines them into the enclosing frame.)
_COMPREHENSIONS = frozenset({"<listcomp>", "<setcomp>", "<dictcomp>"})


# Codes traced even where their file is skipped: the forward of a torch.nn module that
# the user passed to optimize() directly (nn.Sequential, nn.TransformerEncoder ...).
_forced: dict[int, object] = {}


def force_trace(code):
    """Trace `code` even in a skipped file, until reset()."""
    _forced[id(code)] = code
    if _C.code_flags(code)[0]:
        _C.clear_code(code)       # forget an earlier "skip" decision


# --------------------------------------------------------------------------- callback
_callbacks: dict[tuple, object] = {}


def make_callback(backend, fullgraph: bool, dynamic=None):
    """The callback the C hook calls on a cache miss:
    ``callback(code, func, arg_slots, n_entries)``.  One per (backend, fullgraph,
    dynamic): cache entries belong to their callback, so optimize() calls with the same
    settings share compiled code and calls with different ones do not."""
    key = (id(backend), bool(fullgraph), dynamic)
    known = _callbacks.get(key)
    if known is not None and known.backend is backend:
        return known
    callback = _make_callback(backend, fullgraph, dynamic)
    _callbacks[key] = callback
    return callback


def _make_callback(backend, fullgraph: bool, dynamic):

    def callback(code, func, args, n_entries):
        decided = interop.frame_decision(code, func, is_skipped_file)
        if decided is not False:
            return decided
        if (is_skipped_file(code.co_filename) and id(code) not in _forced) or \
                code.co_name in _COMPREHENSIONS or _generated_in_skipped_package(code, func):
            return _C.SKIP
        if _called_by_import_system() or _inside_torch_tracing() or _in_functorch_transform() or \
                any(func is cb for cb in gc.callbacks):
            # (a gc callback runs wherever a collection happens to start: not the
            # program's code, and compiling it would count against whatever it interrupted)
            return None           # this call runs in CPython; nothing is cached
        if id(code) not in _seen_codes:
            _seen_codes[id(code)] = weakref.ref(code, lambda _, k=id(code): _seen_codes.pop(k, None))
        in_stance = stance.current()
        if in_stance != "default":
            _stance_miss(in_stance, code, func, args, callback)
            return None           # this call runs in CPython; nothing is cached
        if cache_limit.exceeded(code, args, n_entries):
            if id(code) not in _warned_cache_limit:
                _warned_cache_limit.add(id(code))
                cache_limit.warn(code, n_entries, recompiles.entry_reasons(code, func, args, callback))
            return _C.RUN_DEFAULT_ON_MISS
        wait = config.compile_lock_timeout
        if not _compile_lock.acquire(timeout=-1 if wait is None else wait):
            log.warning("frametrace: %s waited %ss for another thread's compile; this call "
                        "runs in CPython", log_name(code), config.compile_lock_timeout)
            return None           # this call runs in CPython; the next one tries again
        try:
            if _compiled_meanwhile(code, func, args, n_entries):
                return None       # another thread's entry fits: the next call runs it
            key = warm_cache.key_of(code, backend, fullgraph, dynamic) if config.cache else None
            decision = warm_cache.lookup(code, func, args, key, backend, _install_cached) \
                if key else None
            if decision is None:
                if n_entries and recompile_log.isEnabledFor(logging.INFO):
                    _log_recompile(code, func, args, callback)
                with _warning_filters_kept():
                    decision = compile_frame(code, func, args, backend, fullgraph, dynamic)
                if key is not None and type(decision) is tuple:
                    _store(code, func, key, decision, backend)
            if type(decision) is tuple:
                decision[0].instances = cache_limit.instances_of(code, args)
                decision[0].callback = callback     # (whose entry: recompile reasons)
            return decision
        except (Unsupported, BackendCompilerFailed):
            raise
        except Exception as e:
            # A failure outside the tracer's own handlers: still ours, never the user's.
            counters["internal_error"] += 1
            if fullgraph:
                raise Unsupported(f"internal error while compiling: {type(e).__name__}: {e}",
                                  []) from e
            _log_internal_error(code, [], e)
            return None         # this call runs in CPython; the next one tries again
        finally:
            _compile_lock.release()

    callback.backend = backend
    callback.fullgraph = fullgraph
    callback.dynamic = dynamic
    return callback


def _install_cached(code, func, check, new_code, slot, compiled, gm, outcome, guard_texts,
                    seconds, op_count):
    """A cached entry (warm_cache.lookup), its graph compiled by the backend: installed
    and recorded as a compile's entry is; returns the C hook's decision.  `gm`: the
    entry's graph (warm_cache._GraphBytes: unpickled when first read)."""
    record = CompileRecord(code)
    record.from_cache = True
    if gm is not None:
        new_code = _install_graph_fn(func, new_code, slot, f"__compiled_fn_{next(_fn_ids)}", compiled, gm)
        record.graph_module = gm
        record.op_count = op_count
    record.outcome = outcome
    record.guards = guard_texts
    record.transformed_code = new_code
    record.check = check
    record.backend_seconds = record.compile_seconds = seconds
    for observer in record_observers:
        observer(record)
    return check, new_code


def _store(code, func, key, decision, backend):
    """Write the entry just compiled to the on-disk cache, where it can be described
    soundly (warm_cache.describe); one log line where it cannot."""
    check, new_code = decision
    if new_code is None:
        return          # (a frame left to CPython: compiling it again costs a trace only)
    graph_fn = next((c for c in new_code.co_consts if type(c) is _C.Unhooked and
                     getattr(c, "__name__", None) in graph_modules), None)
    gm = graph_modules.get(graph_fn.__name__) if graph_fn is not None else None
    gs = getattr(check, "guard_set", None)
    if gs is None:
        return
    outcome = "break" if any(getattr(c, "co_name", "").startswith("<resume") or
                             getattr(getattr(c, "__code__", None), "co_name", "").startswith("<resume")
                             for c in new_code.co_consts) else "compiled"
    try:
        entry = warm_cache.describe(code, func, check, new_code, gm, graph_fn, gs.inlined, outcome,
                                    backend)
    except warm_cache.NotCacheable as e:
        warm_cache.stats["not_cacheable"] += 1
        warm_cache.log.info("frametrace: cache: %s (%s:%d) is not cached: %s", log_name(code),
                            code.co_filename, code.co_firstlineno, e)
        return
    except Exception as e:
        # Our bug, but the entry just compiled is good: it is installed, not cached.
        counters["cache_describe_error"] += 1
        warm_cache.log.warning("frametrace: cache: cannot describe an entry of %s (%s: %s); "
                               "not cached", log_name(code), type(e).__name__, e,
                               exc_info=warm_cache.log.isEnabledFor(logging.DEBUG))
        return
    warm_cache.store(code, key, entry)


# One compile at a time in the process.  Tracing and AOTAutograd keep state in module
# globals (torch.fx's CURRENT_PATCHER, the fake mode's caches, our generation and
# graph counters): two threads compiling at once broke each other's compiles, and the
# failure reached the user as BackendCompilerFailed.  Re-entrant, because a compile
# may run code that compiles another frame (a backend calling compiled code).  The
# wait releases the GIL; it is bounded (config.compile_lock_timeout), so a compile
# that waits on a thread that waits on this lock ends with that call run in CPython,
# not a hang.
_compile_lock = threading.RLock()


class _warning_filters_kept:
    """While this thread compiles, changes to the warning filters that it undoes
    (catch_warnings in AOTAutograd, in torch's lazily imported modules) do not count
    as changes.  Each one bumped the filters' version, which empties every module's
    __warningregistry__: a `warnings.warn` the program had already made, under the
    once-per-location rule, fired a second time after the first compile.  A net change
    (an imported module's filterwarnings) still counts, once, at the end."""
    _depth = 0

    def __enter__(self):
        cls = type(self)
        cls._depth += 1
        if cls._depth > 1 or not hasattr(warnings, "_filters_mutated"):
            return self
        cls._filters = list(warnings.filters)
        cls._real = real = warnings._filters_mutated
        me = threading.get_ident()

        def filters_mutated():
            if threading.get_ident() != me:
                real()          # another thread's change counts as usual
        warnings._filters_mutated = filters_mutated
        return self

    def __exit__(self, *exc):
        cls = type(self)
        cls._depth -= 1
        if cls._depth or not hasattr(cls, "_real"):
            return False
        warnings._filters_mutated = cls._real
        del cls._real
        if list(warnings.filters) != cls._filters:
            warnings._filters_mutated()
        return False


def _compiled_meanwhile(code, func, args, n_entries) -> bool:
    """Whether an entry added while this thread waited for the compile lock (another
    thread compiled the same frame) passes its guards for this call: compiling again
    would add a duplicate entry, counted against the cache limit."""
    try:
        entries = _C.entries(code)
    except Exception:
        return False
    for entry in entries[:max(0, len(entries) - n_entries)]:
        try:
            if entry.check(*args, func) is True:
                return True
        except Exception:
            continue
    return False


def _called_by_import_system() -> bool:
    """Whether the frame being decided on was called by importlib: finders, loaders and
    import hooks (setuptools' _distutils_hack, say) run for an `import` the user's frame
    makes; they are the import system's business, not code to compile.  (The hook
    calls us before that frame starts, so our caller's frame is its caller.)"""
    caller = sys._getframe(2)
    return caller is not None and caller.f_code.co_filename.startswith("<frozen importlib")


_TRACER_MODULES = ("torch.fx", "torch._subclasses", "torch._functorch", "torch._export",
                   "torch._higher_order_ops", "torch._dynamo", "torch._inductor")


def _inside_torch_tracing() -> bool:
    """Whether torch is tracing the code that calls this frame: make_fx (torch.func's
    linearize, AOTAutograd, export) or fake-tensor propagation.  Such code is the
    tracer's input, not a program to compile: a compiled frame there would hand its
    transformed code (grad-mode calls, a graph of FakeTensors) to the tracer, which
    torch.compile avoids by disabling itself in those regions."""
    return any(type(m).__module__.startswith(_TRACER_MODULES)
               for m in (*_get_current_function_mode_stack(), *_get_current_dispatch_mode_stack()))


def _in_functorch_transform() -> bool:
    """Whether a torch.func transform run by CPython (vmap, grad ... after a graph break)
    is calling this frame: its tensors are the transform's wrappers, which FakeTensors
    cannot stand for, so the frame is the transform's to run."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _log_recompile(code, func, args, callback):
    """Every entry's failed guard, most recent first.  Entries of other optimize()
    settings (explain()'s own compile of an optimized function) do not make this a
    recompile."""
    reasons = recompiles.entry_reasons(code, func, args, callback)
    if reasons:
        recompile_log.info("recompiling %s", recompiles.describe(log_name(code), code, reasons))


def _stance_miss(in_stance, code, func, args, callback):
    """A miss under a stance other than "default": "fail_on_recompile" raises, naming
    every entry's failed guard; the others run the call in CPython."""
    if in_stance != "fail_on_recompile":
        return
    reasons = recompiles.entry_reasons(code, func, args, callback)
    what = recompiles.describe(log_name(code), code, reasons) if reasons else \
        f"{log_name(code)} ({code.co_filename}:{code.co_firstlineno}): not compiled yet"
    raise stance.RecompileError(
        f"frametrace: a call would compile under the stance 'fail_on_recompile': {what}",
        reasons)


def compile_frame(code, func, args, backend, fullgraph: bool, dynamic=None):
    """Trace and compile one frame; returns the C hook's decision.  Tracing switches
    grad mode and autocast for real (so FakeTensors come out right); whatever happens,
    the program's state is put back as it was at the frame's entry."""
    entry_grad = torch.is_grad_enabled()
    state = GlobalState()
    # The user's saved-tensor hooks (pack/unpack) are for the program's tensors, not for
    # FakeTensors of the trace: they run when the compiled code runs.
    hooks_were_tracing = _set_saved_tensors_hooks_tracing(True)
    modes_start = compile_started()
    span = progress.begin("frame", code)
    try:
        return _drive(code, func, args, backend, fullgraph, dynamic, entry_grad)
    finally:
        # Also after an interrupt (KeyboardInterrupt mid-trace, in a backend...): modes,
        # autocast, grad mode and defaults as they were; the interrupt goes on to the user.
        state.restore()
        _set_saved_tensors_hooks_tracing(hooks_were_tracing)
        release_shape_env_caches()
        forget_real_tensors(modes_start)
        progress.end(span)


def _drive(code, func, args, backend, fullgraph, dynamic, entry_grad):
    """The attempts at one frame; returns the C hook's decision.  An attempt that failed
    while something was symbolic asks for another (see `_retry_static`): after
    AOTAutograd's restart for a float it cannot keep symbolic, one with the floats
    constant and the sizes as asked; after any other failure, or a second, one with
    static sizes, which makes nothing symbolic and so cannot ask again."""
    outcome = _attempt(code, func, args, backend, fullgraph, dynamic, entry_grad)
    if outcome.kind == "retry" and outcome.floats_only:
        torch._C._set_grad_enabled(entry_grad)
        # Expected: the floats are constants from now on, the sizes as asked.
        log.info("frametrace: %s (%s:%d): a float could not stay symbolic; floats "
                 "are constants there from now on", code.co_name, code.co_filename,
                 code.co_firstlineno)
        outcome = _attempt(code, func, args, backend, fullgraph, dynamic, entry_grad)
    if outcome.kind == "retry":
        torch._C._set_grad_enabled(entry_grad)
        quiet = outcome.reason.startswith("TensorifyScalarRestartAnalysis")
        (log.info if quiet else log.warning)("frametrace: %s (%s:%d) failed with symbolic sizes (%s); it is "
                    "compiled with static sizes from now on", code.co_name,
                    code.co_filename, code.co_firstlineno, outcome.reason)
        progress.phase("tracing again, with static sizes")
        outcome = _attempt(code, func, args, backend, fullgraph, False, entry_grad)
        if outcome.kind == "retry":
            raise RuntimeError(f"frametrace: the static compile of {code.co_name} asked "
                               f"for another ({outcome.reason})")
    return outcome.entry


def _set_saved_tensors_hooks_tracing(on: bool) -> bool:
    setter = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    return setter(on) if setter is not None else False


class _Outcome:
    """What one compile attempt came to.  `kind` is "compiled", "break" or "fallback"
    (as CompileRecord.outcome; `new_code` the transformed code, None for a fallback),
    or "retry": the attempt failed with something symbolic and was undone, and
    `_drive` makes another (`floats_only`: with the floats constant, else with static
    sizes; `reason`: what failed).  `entry` is the C hook's decision once the attempt
    is installed: (check, code), or None where this call runs in CPython unrecorded."""
    __slots__ = ("kind", "new_code", "reason", "floats_only", "entry")

    def __init__(self, kind, new_code=None, reason=None, floats_only=False):
        self.kind = kind
        self.new_code = new_code
        self.reason = reason
        self.floats_only = floats_only
        self.entry = None


class _Attempt:
    """One attempt at compiling a frame: the tracer, graph and guards of its latest
    trace (a graph break traces the frame again, up to the break, with new ones), the
    record it fills, and what to undo if it is given up (the graphs it installed)."""
    __slots__ = ("code", "func", "args", "backend", "fullgraph", "entry_grad", "generation",
                 "record", "t0", "policy", "guards", "output", "tracer", "installed")

    def __init__(self, code, func, args, backend, fullgraph, dynamic, entry_grad):
        self.code, self.func, self.args = code, func, args
        self.backend, self.fullgraph, self.entry_grad = backend, fullgraph, entry_grad
        self.generation = _generation
        self.record = CompileRecord(code)
        self.t0 = time.perf_counter()
        self.policy = ShapePolicy(code, dynamic)
        self.new_trace()
        self.installed = len(_installed_globals)

    def new_trace(self):
        """A fresh tracer, graph and guards (the shape policy is the attempt's)."""
        self.guards = GuardSet(self.code, self.func)
        self.output = OutputGraph(self.guards, self.policy)
        self.output.functionalizes = _functionalizes(self.backend, self.args)
        self.output.recomputes_random = getattr(self.backend, "__frametrace_recomputes_random_ops__", False)
        self.tracer = InstructionTranslator(self.code, self.func, self.args, self.output, self.guards)
        _count_ops(self.output, self.tracer)


# Bumped by reset(): a compile that started before a reset (in another thread) hands
# back nothing, so no entry outlives the reset that should have dropped it.
_generation = 0


def generation() -> int:
    """How many times reset() ran."""
    return _generation


def _attempt(code, func, args, backend, fullgraph, dynamic, entry_grad) -> _Outcome:
    """Trace and compile the frame once, then install what came of it."""
    # Under DDP, graphs cut at gradient buckets: the frame's decisions (may a graph that
    # raised run again?) are made for the pieces, not for the backend's single graph.
    backend = distributed.split_backend(backend)
    a = _Attempt(code, func, args, backend, fullgraph, dynamic, entry_grad)
    outcome = _trace(a)
    return outcome if outcome.kind == "retry" else _install(a, outcome)


def _retry_static(a, reason) -> _Outcome | None:
    """Whatever failed may have failed because a size was symbolic: a static compile
    first, before giving up on the frame; the attempt is undone (its contexts closed,
    the graphs it handed out uninstalled).  AOTAutograd's restart for a float it cannot
    keep symbolic costs only the floats (the sizes stay symbolic).  None where nothing
    was symbolic: the failure is the frame's."""
    if not a.policy.used:
        return None
    a.output.close_contexts()
    floats_only = reason.startswith("TensorifyScalarRestartAnalysis") and a.policy.floats_static()
    if not floats_only:
        a.policy.stay_static()
    _uninstall(a.installed)         # graphs this attempt already handed out
    return _Outcome("retry", reason=reason, floats_only=floats_only)


def _trace(a) -> _Outcome:
    """Trace the frame to its end and compile it; where the trace cannot go on, see
    `_unsupported`.  The user's backend failing is theirs (`_backend_failed`); any
    other exception is our bug, and the frame runs correctly in CPython."""
    try:
        result = a.tracer.run()
        return _Outcome("compiled", _finish(a.code, a.func, a.tracer, a.output, a.guards, result,
                                            a.backend, a.record, entry_grad=a.entry_grad))
    except Unsupported as e:
        return _unsupported(a, e)
    except BackendCompilerFailed as e:
        return _backend_failed(e, a, [a.tracer.user_location()])
    except Exception as e:
        return _internal_error(a, e)


def _unsupported(a, e) -> _Outcome:
    """The trace met what it cannot trace: under fullgraph the user's error; else a
    graph break there (or at a `with` around it), or else the frame runs in CPython."""
    code, record = a.code, a.record
    if not e.user_stack:
        e.user_stack = [a.tracer.user_location()]
    if a.fullgraph:
        retry = _retry_static(a, e.reason)
        if retry is not None:
            return retry
        raise Unsupported(e.reason, e.user_stack, e.hint) from None
    record.reason = e.reason
    record.hint = e.hint
    record.user_stack = e.user_stack
    outcome = None
    for break_index in _break_candidates(a, e):
        if not resume.can_break(code, a.tracer.instructions[break_index]):
            continue
        outcome = _compile_break(a, e, break_index)
        if outcome is not None:
            break
    if outcome is not None and outcome.kind != "fallback":
        return outcome
    retry = _retry_static(a, e.reason)
    if retry is not None:
        return retry
    record.outcome = "fallback"
    log.info("frametrace: running %s in CPython: %s%s", log_name(code), e.reason,
             format_user_stack(e.user_stack))
    _log_break("running in CPython:", code, e.reason, e.hint, e.user_stack)
    return _Outcome("fallback")


def _break_candidates(a, e) -> list:
    """Where the break for `e` may go: the instruction that failed, then the `with`
    blocks around it (innermost first).  Inside `with` blocks whose context cannot be
    handed over to CPython, the break goes to their `with` instead: CPython runs the
    whole block."""
    if e.break_index is None:
        return []
    offset = a.tracer.instructions[e.break_index].offset
    return [e.break_index] + [a.tracer.index_of[o] for o in enclosing_with_starts(a.code, offset)]


def _compile_break(a, e, break_index) -> _Outcome | None:
    """Trace again up to the instruction that failed, compile that much, and go on in
    CPython from there (then in a resume function).  None where the break cannot be
    there (the next candidate is tried); a fallback where building it failed."""
    a.output.close_contexts()
    torch._C._set_grad_enabled(a.entry_grad)
    a.new_trace()
    tracer = a.tracer
    tracer.stop_at = break_index
    try:
        if tracer.run() is not None or tracer.ip != break_index:
            # (a `with` a resume function starts inside: never reached)
            raise Unsupported(f"the trace does not reach instruction {break_index}")
        new_code = _finish(a.code, a.func, tracer, a.output, a.guards, None, a.backend, a.record,
                           break_at=tracer.instructions[break_index],
                           entry_grad=a.entry_grad)
        a.record.outcome = "break"
        _log_break("graph break in", a.code, e.reason, e.hint, e.user_stack)
        return _Outcome("break", new_code)
    except Unsupported as e2:
        log.info("frametrace: cannot break the graph there (%s)", e2.reason)
        return None
    except BackendCompilerFailed as e2:
        return _backend_failed(e2, a, [tracer.user_location()])
    except Exception as e2:
        # Building the break (its code, a resume function) failed: our bug, and
        # the frame still runs correctly in CPython.  (Unless it failed for a
        # symbolic number, as AOTAutograd's restart for a float it cannot keep
        # symbolic: then the static compile first.)
        retry = _retry_static(a, f"{type(e2).__name__}: {e2}")
        if retry is not None:
            return retry
        counters["internal_error"] += 1
        _log_internal_error(a.code, [tracer.user_location()], e2)
        _uninstall(a.installed)
        return _Outcome("fallback")


def _internal_error(a, e) -> _Outcome:
    """Tracing raised what it should not have: our bug (counted, logged in one line), and
    the frame runs correctly in CPython; under fullgraph the user hears of it."""
    where = [a.tracer.user_location()]
    retry = _retry_static(a, f"{type(e).__name__}: {e}")
    if retry is not None:
        return retry
    counters["internal_error"] += 1
    if a.fullgraph:
        raise Unsupported(f"internal error while tracing: {type(e).__name__}: {e}", where) from e
    _log_internal_error(a.code, where, e)
    _uninstall(a.installed)
    record = a.record
    record.reason = f"internal error in frametrace: {type(e).__name__}: {e}"
    record.user_stack = where
    record.outcome = "fallback"
    return _Outcome("fallback")


def _install(a, outcome) -> _Outcome:
    """Guard what the attempt compiled (a fallback too: the frame runs in CPython while
    its guards hold), record it, and set `outcome.entry`; no entry where the state
    changed while compiling or reset() ran meanwhile (this call runs in CPython)."""
    code, func, args, guards, record = a.code, a.func, a.args, a.guards, a.record
    new_code, installed, entry_grad = outcome.new_code, a.installed, a.entry_grad
    a.output.close_contexts()
    torch._C._set_grad_enabled(entry_grad)
    # Every graph depends on grad mode, and on the default dtype (factories, promotion
    # of Python floats), whether or not the trace read them.
    guards.grad_mode(entry_grad)
    guards.autocast_state()
    guards.function_modes()
    if new_code is not None and record.graph_module is not None:
        guards.global_state("get_default_dtype", torch.get_default_dtype, torch.get_default_dtype(),
                            text=f"default dtype: {torch.get_default_dtype()}")
    try:
        guards.shape_guards(a.output.shape_env)
        check = guards.compile()
    except Exception as e:
        counters["internal_error"] += 1
        retry = _retry_static(a, f"guards: {type(e).__name__}: {e}")
        if retry is not None:
            return retry
        _log_internal_error(code, [], e)
        return outcome
    check.guard_set = guards
    if guards.stale:
        # A fact of the trace changed while it compiled (an ABC registration made by a
        # module the backend imported): its code is wrong for this very call.
        log.info("frametrace: %s changed while compiling; this call runs in CPython",
                 log_name(code))
        _uninstall(installed)
        return outcome
    if new_code is not None:
        _check_own_guards(code, func, args, check, guards)
    record.guards = guards.texts()
    record.compile_seconds = time.perf_counter() - a.t0
    record.transformed_code = new_code
    record.check = check
    if guard_log.isEnabledFor(logging.INFO):
        guard_log.info("guards of %s (%s:%d):\n  %s", log_name(code), code.co_filename,
                       code.co_firstlineno, "\n  ".join(record.guards))
    if new_code is not None and bytecode_log.isEnabledFor(logging.INFO):
        bytecode_log.info("bytecode of %s:\n%s", log_name(code), plain_diff(code, new_code))
    if a.generation != _generation:
        _uninstall(installed)
        return outcome              # reset() ran meanwhile: this call runs in CPython
    for observer in record_observers:
        observer(record)
    outcome.entry = (check, new_code)
    return outcome


def _check_own_guards(code, func, args, check, guards):
    """The entry's check must pass for the call it was compiled for: where it fails,
    something the compile itself changed (global state, a registry) invalidated it, and
    the same call would compile again.  Counted ("failed_own_guard": tests require
    none) and logged with the guard."""
    try:
        ok = check(*args, func) is True
    except Exception:
        ok = False
    if not ok:
        counters["failed_own_guard"] += 1
        if recompile_log.isEnabledFor(logging.INFO):
            recompile_log.info("%s (%s:%d) fails its own guard just after compiling (the "
                               "next identical call will recompile): %s", log_name(code),
                               code.co_filename, code.co_firstlineno,
                               guards.first_failure(args, func))


def log_name(code) -> str:
    """A frame's name in the logs: its function's, or a resume function's full name
    (``f.<resume at line 12 #1>``, as the viewer shows it)."""
    return code.co_qualname if "<resume at line" in code.co_qualname else code.co_name


# (file, line, reason) of the breaks logged: a break is logged once, not at every
# recompile of its frame.
_logged_breaks: set = set()


def _log_break(what, code, reason, hint, user_stack):
    """A graph break, or a frame left to CPython, on the graph_breaks log: once per
    user location and reason."""
    if not break_log.isEnabledFor(logging.INFO):
        return
    user_stack = user_stack or [frame_summary(code, code.co_firstlineno)]
    key = (user_stack[-1].filename, user_stack[-1].lineno, reason)
    if key in _logged_breaks:
        return
    _logged_breaks.add(key)
    break_log.info("%s %s: %s%s%s", what, log_name(code), reason,
                   f"\n  Hint: {hint}" if hint else "", format_user_stack(user_stack))


def _backend_failed(e, a, where) -> _Outcome:
    """The user's backend raised: theirs to see (raised on), unless they asked for the
    fall-back.  It may have failed on symbolic sizes: a static compile is tried first."""
    retry = _retry_static(a, f"{type(e.error).__name__}: {e.error}")
    if retry is not None:
        return retry
    _uninstall(a.installed)
    code, record = a.code, a.record
    e.frame = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
    if not config.suppress_errors:
        raise e
    counters["backend_error"] += 1
    log.warning("frametrace: %s; running %s in CPython", str(e).split("\n")[0], code.co_name)
    record.reason = f"backend {e.backend_name!r} failed: {type(e.error).__name__}: {e.error}"
    record.user_stack = where
    record.outcome = "fallback"
    _log_break("running in CPython:", code, record.reason,
               "frametrace.config.suppress_errors = False raises the backend's error",
               where)
    return _Outcome("fallback")


def _log_internal_error(code, where, e):
    """One line per internal error (the traceback at DEBUG level); the graph_breaks
    log lists the frame with the frames that fell back."""
    _log_break("running in CPython:", code, f"internal error in frametrace ({type(e).__name__}: {e})",
               "please report it; the frame runs correctly in CPython", where)
    log.warning("frametrace: internal error while tracing %s (%s: %s); running it in "
                "CPython%s", log_name(code), type(e).__name__, e, format_user_stack(where),
                exc_info=log.isEnabledFor(logging.DEBUG))


def _finish(code, func, tracer, output, guards, result, backend, record, break_at=None,
            entry_grad=True):
    """Compile the graph and build the transformed code: it returns `result`, or at a
    graph break runs `break_at` in CPython and continues in a resume function."""
    ops_traced = tracer.side_effects.clock() if tracer.side_effects.clock else None
    # At a return, the frame's cells are stored too: a returned closure reads them.
    cells = resume.cells_to_store(tracer) if break_at is None else []
    out_nodes = _graph_outputs(tracer, output, guards, result, cells, break_at)
    _check_picked(output, out_nodes)
    _check_fresh_cache_keys(output, out_nodes)
    side_effects = tracer.side_effects
    cg = CodeGen(code, lineno=tracer.lineno)
    slot = None
    if output.computes():
        slot = _emit_graph_call(cg, output, backend, side_effects, out_nodes, ops_traced,
                                entry_grad)
    cg.set_deterministic(output.deterministic)
    # What the frame returns, or hands over at a break, is computed before the side
    # effects are replayed: CPython computed it before them too.
    if break_at is None:
        _keep_return_value(cg, tracer, result, cells)
    else:
        plan = resume.prepare_break(cg, tracer, break_at)
    side_effects.reconstruct(cg, set(code.co_freevars))
    if break_at is None:
        _emit_return(cg, cells, entry_grad)
    else:
        resume.emit_break(cg, tracer, break_at, func, plan, entry_grad)
    new_code = cg.assemble()
    # Only now, when the frame can be rebuilt, is the graph handed to the backend.
    if slot is not None:
        new_code = _compile_graph(code, func, output, backend, record, out_nodes, slot,
                                  new_code, entry_grad)
    return new_code


def _graph_outputs(tracer, output, guards, result, cells, break_at) -> list:
    """The graph's outputs: the nodes of every tensor that outlives the trace (what the
    frame returns and the cells it stores, or all that is live at the break, and what
    the replayed side effects write); the rest of the graph is pruned."""
    out_nodes = []
    live = [result, *(tracer.cells[n].value for n in cells)] if break_at is None \
        else _live_at_break(tracer)
    for v in live:
        _collect_outputs(v, out_nodes)
    side_effects = tracer.side_effects
    for v in side_effects.values():
        _collect_outputs(v, out_nodes)
    output.prune_unused(keep=out_nodes)
    _guard_aliasing(output, guards, tracer.side_effects)
    return out_nodes


def _emit_graph_call(cg, output, backend, side_effects, out_nodes, ops_traced,
                     entry_grad) -> GraphSlot:
    """The graph's call, its outputs stored in locals (`cg.tensor_locals`).  The graph is
    a slot until the backend compiled it: the code is built first.  Whether the call
    may run the graph again after an exception, and which grad mode it then puts back,
    is decided here."""
    name = f"__compiled_fn_{next(_fn_ids)}"
    slot = GraphSlot(name)
    rerun_state = None
    # A backend that writes inputs after the rest: the frame runs again only after a
    # failure its graph marked as coming before those writes.
    deferred = getattr(backend, "__frametrace_defers_input_mutations__", False) and \
        any(_storage_key(i.node) in output.fake_mode.written_storages for i in output.inputs)
    if _can_run_again(output, backend):
        rerun = entry_grad
    else:
        rerun_state = _rerun_state(output, backend, side_effects, ops_traced)
        rerun = entry_grad if rerun_state is not None else None
    # A graph that switches grad mode inside `with` blocks and raises midway leaves
    # the mode switched; CPython's blocks put it back as the exception leaves them.
    outside = entry_grad if output.outer_grad is None else output.outer_grad
    restore = outside if rerun is None and not output.unscoped_grad and any(
        n.target is torch._C._set_grad_enabled for n in output.graph.nodes) else None
    names = cg.call_graph(slot, [i.source for i in output.inputs], len(out_nodes), rerun,
                          restore, rerun_state, bool(deferred))
    cg.tensor_locals = dict(zip(out_nodes, names))
    return slot


def _keep_return_value(cg, tracer, result, cells):
    """What the frame returns, and its cells' values, into temporaries before the side
    effects are replayed (they may change what those values are built from)."""
    result.reconstruct(cg)
    cg.emit("STORE_FAST", "___return_value")
    for n in cells:
        tracer.cells[n].value.reconstruct(cg)
        cg.emit("STORE_FAST", f"___cell_{n}")


def _emit_return(cg, cells, entry_grad):
    """After the side effects: the cells, the grad mode the frame leaves, the return."""
    # The cells change only now: a replayed value read through one (an int argument
    # that a closure captured) is the value the trace saw, not the final one.
    for n in cells:
        cg.emit("LOAD_FAST", f"___cell_{n}")
        cg.emit("STORE_DEREF", CellVar(n))
    if torch.is_grad_enabled() != entry_grad:
        # set_grad_enabled(mode) called as a function: the mode outlives the frame,
        # whatever the backend did with the graph's grad-mode nodes.
        cg.set_grad_mode(torch.is_grad_enabled())
    cg.emit("LOAD_FAST", "___return_value")
    cg.emit("RETURN_VALUE")


def _compile_graph(code, func, output, backend, record, out_nodes, slot, new_code,
                   entry_grad):
    """The backend compiles the graph (logged, recorded), and the transformed code's
    slot gets the compiled function; returns that code."""
    name = slot.name
    # The backend sees the grad mode the graph starts in at run time (AOTAutograd
    # decides between training and inference graphs by it).
    progress.phase(f"backend compile ({backend_name(backend)})")
    with torch.set_grad_enabled(entry_grad):
        gm, compiled, seconds = output.compile(backend, out_nodes, name)
    record.graph_module = gm
    record.op_count = output.op_count()
    record.backend_seconds = seconds
    if graph_log.isEnabledFor(logging.INFO):
        graph_log.info("graph %s of %s (%s:%d), %d ops:\n%s", name, log_name(code),
                       code.co_filename, code.co_firstlineno, record.op_count,
                       readable_graph(gm))
    if output_code_log.isEnabledFor(logging.INFO):
        _log_output_code(name, gm, compiled)
    return _install_graph_fn(func, new_code, slot, name, compiled, gm)


def _install_graph_fn(func, new_code, slot, name, compiled, gm):
    """`new_code` with the compiled graph `name` in its slot; returns that code."""
    graph_fn = _C.Unhooked(compiled)
    graph_fn.__name__ = name
    new_code = fill_graph_slot(new_code, slot, graph_fn)
    # Also a global of that name, for people and tools reading the module (the
    # code does not load it from there).
    func.__globals__[name] = graph_fn
    _installed_globals.append((func.__globals__, name))
    graph_modules[name] = gm
    return new_code


def readable_graph(gm) -> str:
    """A graph's code with each value's dtype and shape and, above each group of
    nodes, the user's line it came from (as torch.compile's graph_code log)."""
    try:
        return gm.print_readable(print_output=False).strip()
    except Exception:       # (an FX version without it, or a node it cannot print)
        return gm.code.strip()


def _log_output_code(name, gm, compiled):
    """What the backend made of graph `name`: its own code (Triton kernels, a traced
    AOT graph); a backend that runs the FX code as it is gets a line, not the graph log
    again."""
    source = getattr(compiled, "source_code", None)
    owner = getattr(compiled, "__self__", None)
    if source is None and owner is not gm:
        source = getattr(owner, "code", None)
    if source is None or str(source).strip() == gm.code.strip():
        output_code_log.info("output code of %s: the backend runs the FX graph as it is "
                             "(the graph log shows it)", name)
    else:
        output_code_log.info("output code of %s:\n%s", name, str(source).strip())


def _functionalizes(backend, args=()) -> bool:
    # Any backend but those that run the graph's ops as traced (the eager backend) may
    # re-trace it over FakeTensors (AOTAutograd: aot_eager, triton, inductor, most
    # users' backends).  A backend that chooses per graph (the default) answers from
    # the frame's arguments, and keeps to that answer when it compiles the graph.
    runs_as_traced = getattr(backend, "__frametrace_runs_ops_as_traced__", False)
    if callable(runs_as_traced):
        runs_as_traced = runs_as_traced(args)
    return not runs_as_traced


def _can_run_again(output, backend) -> bool:
    """Whether a graph that raised has changed nothing outside itself, so the frame can
    run again in CPython from its start: it drew no random numbers, entered no
    autocast, and wrote to no input (or the backend writes inputs only once the rest
    succeeded, as AOTAutograd's functionalized graphs do)."""
    mode = output.fake_mode
    if mode.used_rng:
        return False
    if any(n.op == "call_function" and getattr(n.target, "__name__", "") == "_enter_autocast"
           for n in output.graph.nodes):
        return False
    if output.deterministic is not None:
        return False        # its switch may have run: the rerun would start in it
    if getattr(backend, "__frametrace_defers_input_mutations__", False):
        return True         # (if what it raised says so: _emit_graph_call)
    return not any(_storage_key(i.node) in mode.written_storages for i in output.inputs)


def _enters_autocast(output) -> bool:
    return any(n.op == "call_function" and getattr(n.target, "__name__", "") == "_enter_autocast"
               for n in output.graph.nodes)


def _count_ops(output, tracer):
    """Gives the tracer's side effects a clock: the graph ops created so far (created,
    not present: an op removed later still counted when it was made)."""
    graph = output.graph
    created = [0]
    make = graph.create_node

    def create_node(*args, **kwargs):
        node = make(*args, **kwargs)
        if node.op not in ("placeholder", "output"):
            created[0] += 1
        return node
    graph.create_node = create_node
    tracer.side_effects.clock = lambda: created[0]


def _rerun_state(output, backend, side_effects, ops_traced=None):
    """For a graph that cannot simply run again (see _can_run_again): what to save
    before each call so that a failure can put it back and the frame run again in
    CPython (a codegen.RerunState), or None where raising as it is is already right
    or nothing can be saved.

    Raising as it is leaves what the graph did before the failing op, which is what
    CPython did when the backend runs the ops in order; the Python effects the trace
    replays after the graph are lost, though, and so are input writes a backend
    defers to the end of its graph (AOTAutograd's).  Those cases save and rerun: the
    random generators, autocast, and the inputs the graph writes (copies, so only
    where effects would be lost; an input that needs grad keeps the autograd history
    the failed graph gave it, so it is not put back)."""
    if not config.rerun_failed_graphs_from_saved_state or output.deterministic is not None:
        return None
    mode = output.fake_mode
    defers = getattr(backend, "__frametrace_defers_input_mutations__", False)
    written = [i for i in output.inputs if _storage_key(i.node) in mode.written_storages]
    autocast = _enters_autocast(output)
    # (Python effects made after every op of the graph, in program order, are not
    # lost: a failure comes before them in CPython too.)
    effects_lost = bool(side_effects) and not (
        ops_traced is not None and config.rerun_skips_effects_after_every_op and
        side_effects.all_after(ops_traced))
    if not effects_lost and not autocast and not (defers and written):
        return None
    cuda = set()
    for node in output.graph.nodes:
        if any(isinstance(a, torch.Generator) for a in (*node.args, *node.kwargs.values())):
            return None             # the program's own generator: not ours to save
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            if value.device.type == "cuda":
                cuda.add(value.device.index or 0)
            elif value.device.type not in ("cpu", "meta") and mode.used_rng:
                return None         # (a generator we do not know how to save)
    copies = []
    if written and not defers:
        for i in written:
            if not isinstance(i.value, torch.Tensor) or i.value.requires_grad:
                return None
            copies.append(i.source)
    return RerunState(bool(mode.used_rng), tuple(sorted(cuda)), autocast, copies)


_MAX_ALIAS_GUARDS = 32


def _guard_aliasing(output, guards, side_effects):
    """A trace assumes its inputs are the distinct objects it saw.  For tensors that
    matters when the graph writes to one: guard each written input's sharing of
    memory with the other tensor inputs (and, where shared, the exact geometry)."""
    written = _written_storages(output.graph)
    if written:
        tensors = [(i, _storage_key(i.node)) for i in output.inputs
                   if isinstance(i.node.meta.get("example_value"), torch.Tensor)]
        users = Counter(key for _, key in tensors)
        alone = [a for a, key in tensors if key in written and users[key] == 1]
        if alone:  # the common case, checked in one pass
            ids = {id(a) for a in alone}
            guards.unshared([a.source for a in alone],
                            [b.source for b, _ in tensors if id(b) not in ids])
        else:
            ids = ()
        pairs = 0
        for a, key_a in tensors:
            if key_a not in written or id(a) in ids:
                continue
            for b, key_b in tensors:
                if b is not a and pairs < _MAX_ALIAS_GUARDS ** 2:
                    first, second = sorted((a, b), key=lambda i: i.source.name())
                    guards.tensor_aliasing(first.source, second.source, key_a == key_b,
                                           first.value, second.value)
                    pairs += 1
    if output.tensor_keyed_reads or tensor_facts.any_hashed(output._input_fakes.values()):
        # A lookup in a dict keyed by tensors (an optimizer's state, a set made in the
        # frame) found a key, or did not, by identity: the tensor inputs are as many
        # distinct objects as traced.
        sources = output.tensor_input_sources
        if len(sources) > 1:
            guards.distinct(sources)
    # Mutable objects guarded by type (lists, dicts, user objects): the trace took
    # two paths to different objects as different objects (a mutation through one
    # is not seen through the other; `a is b` folded to False).  Paths to the same
    # object are guarded by `same_object` where the second path was wrapped.
    objects = [var.source for _, var in output.object_vars.values()
               if var.source is not None and (isinstance(var, (ListVar, DictVar, UserObjectVar)) or
                                              isinstance(var, NNModuleVar) and output.unspecialized(var.source))]
    if len(objects) > 1:
        guards.distinct(objects)
    # Closure cells from outside: one the trace wrote is another Cell than those it
    # read through other closures only while they are other cells at run time too.
    written_cells = side_effects.written_cells()
    if written_cells:
        cells = [c.cell_source for _, c in output.object_vars.values()
                 if isinstance(c, Cell) and c.cell_source is not None][:_MAX_ALIAS_GUARDS]
        for w in written_cells[:_MAX_ALIAS_GUARDS]:
            for other in cells:
                if other != w.cell_source:
                    guards.distinct_objects(w.cell_source, other)


def _check_picked(output, out_nodes):
    """min()/max() of tensors made a new tensor where CPython returns one of the items
    (variables/builtins.py): refused where that shows, when it is written into, or when
    it outlives the frame along with an item the caller can reach (an input, or a
    tensor that also outlives it)."""
    if not output.picked_storages:
        return
    if set(output.picked_storages) & output.fake_mode.written_storages:
        raise Unsupported("writing into the result of min()/max() of tensors (in CPython, "
                          "into the item it returned)")
    reachable = {_storage_key(n) for n in out_nodes} | \
        {_storage_key(i.node) for i in output.inputs}
    for made, items in output.picked_storages.items():
        if made in reachable and reachable & set(items):
            raise Unsupported("the result of min()/max() of tensors outlives the frame with "
                              "its items (CPython returns one of them, the same object)")


def _check_fresh_cache_keys(output, out_nodes):
    """A tensor made in the frame and used as an lru_cache key (variables/functions.py)
    must not outlive it: CPython's cache holds an entry for it that ours does not."""
    if output.fresh_cache_keys and any(id(n.meta.get("example_value")) in output.fresh_cache_keys
                                       for n in out_nodes):
        raise Unsupported("a tensor made in the frame and passed to an lru_cache function "
                          "outlives the frame (CPython's cache keeps an entry for it)")


def _storage_key(node):
    value = node.meta.get("example_value")
    try:
        return value.untyped_storage()._cdata
    except Exception:
        return None


def _written_storages(graph) -> set:
    """The (fake) storages that in-place ops of the graph write to: an input among
    them is mutated, directly or through a view."""
    written = set()
    for node in graph.nodes:
        if node.op not in ("call_method", "call_function"):
            continue
        target = written_arg(node.op, node.target, node.args, node.kwargs)
        for t in (target if isinstance(target, (list, tuple)) else [target]):
            if isinstance(t, torch.fx.Node):
                written.add(_storage_key(t))
    written.discard(None)
    return written


def _live_at_break(tracer):
    """The Vars a graph break hands to CPython: the stack, locals and cells."""
    # The loops the break is inside go on in the resume function, over what their
    # iterators have left (pulled now, so its tensors are graph outputs).
    for v in tracer.stack:
        if isinstance(v, IteratorVar):
            v.remaining(tracer)
    live = [v for v in tracer.stack if v is not NULL]
    live += [v for v in tracer.locals.values() if type(v) is not Lazy and v is not NULL]
    live += [c.value for c in tracer.cells.values() if c.value is not None and type(c.value) is not Lazy]
    return live


def _collect_outputs(v, out, seen=None):
    seen = set() if seen is None else seen
    if isinstance(v, (TensorVar, SymNodeVar)):
        if v.node.op != "placeholder" and v.node not in out:
            out.append(v.node)
        return
    if isinstance(v, FormattedVar):   # (formatted at run time from its numbers)
        for piece in v.pieces:
            if not isinstance(piece, str):
                _collect_outputs(piece[0], out, seen)
        return
    if id(v) in seen:         # containers can hold themselves (d = locals(); d['d'] = d)
        return
    seen.add(id(v))
    if is_user_container(v):          # its attributes are rebuilt with it
        for item in v.attrs.values():
            _collect_outputs(item, out, seen)
    if isinstance(v, (TupleVar, ListVar)):
        # (a lazy list or dict from outside: only what the trace added is written back)
        appended = v.appended_items() if isinstance(v, ListVar) else None
        for item in v.items if appended is None else appended:
            _collect_outputs(item, out, seen)
    elif isinstance(v, DictVar):
        stored = v.stored_items()
        for item in (v.items if stored is None else stored).values():
            _collect_outputs(item, out, seen)
    elif isinstance(v, DataclassVar):
        for item in v.fields.values():
            _collect_outputs(item, out, seen)
    elif isinstance(v, (MethodVar, BoundMethodVar)):
        _collect_outputs(v.obj, out, seen)
    elif getattr(v, "base", None) is not None and isinstance(v.base, Var):
        _collect_outputs(v.base, out, seen)
    elif isinstance(getattr(v, "dict", None), DictVar):      # a dict view
        _collect_outputs(v.dict, out, seen)
    elif getattr(v, "remade", False):        # a generator made again by its call
        fn, args, kwargs = v.maker
        for item in [fn, *args, *kwargs.values()]:
            _collect_outputs(item, out, seen)
    elif isinstance(v, IteratorVar) and v.handover() is not None:
        _collect_outputs(v.handover()[1], out, seen)
    elif isinstance(v, IteratorVar):
        for item in v.items[v.index:]:
            _collect_outputs(item, out, seen)
    elif isinstance(v, NestedFunctionVar):
        # A function made while tracing, rebuilt: over its defaults, cells, attributes.
        cells = [c.value for c in v.cells if isinstance(c.value, Var)]
        for item in [*v.defaults, *v.kwdefaults.values(), *cells, *v.attrs.values()]:
            _collect_outputs(item, out, seen)
    elif isinstance(v, PartialVar):
        for item in [*v.args, *v.kwargs.values()]:
            _collect_outputs(item, out, seen)
    elif isinstance(v, NewObjectVar):
        for item in v.attrs.values():
            _collect_outputs(item, out, seen)


def _uninstall(keep: int):
    """Take back the __compiled_fn_N globals installed after the first `keep`."""
    while len(_installed_globals) > keep:
        g, name = _installed_globals.pop()
        g.pop(name, None)
        graph_modules.pop(name, None)


def reset():
    """Forget every compiled entry and the globals frametrace installed.  Frames
    running compiled code meanwhile (other threads) finish with it: their code holds
    its graphs itself."""
    global _generation
    _generation += 1
    for ref in list(_seen_codes.values()):
        code = ref()
        if code is not None:
            _C.clear_code(code)
    _seen_codes.clear()
    _warned_cache_limit.clear()
    _logged_breaks.clear()
    while _installed_globals:
        g, name = _installed_globals.pop()
        g.pop(name, None)
    graph_modules.clear()
    resume.clear()
    forget_sizes()
    _forced.clear()           # (an optimized module forces its forward again when called)


