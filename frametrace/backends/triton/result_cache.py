"""The triton backend's compiled result kept with a cached entry (warm_cache.py), and
the runnable function rebuilt from it in a warm process without AOTAutograd's trace,
lowering, scheduling or code generation.

What is kept (`with_artifact`): AOTAutograd's graphs and metadata, as aot_eager keeps
them (aot_cache.py: the same capture, the same rebuild of its runtime wrappers), and
for each graph the backend compiled (an inference graph, or a training graph's forward
and backward: the backward is compiled with the forward, not at its first call, while
the cache is on) a description of its `CompiledModule`: the wrapper's source and the
template of its fast wrapper, each launcher's kernel source, extents, block-size
candidates and arguments, the wrapper's constants (tensors, dtypes, devices, plain
values: anything else is not cached) and the aten ops it calls (by name), which ops
write inputs.  The kernels themselves are compiled by Triton at their first launch as
always, from its own disk cache (TRITON_CACHE_DIR); the block sizes come from
tune_cache.py.

The key (`result_key`) covers what the result depends on beyond the graph it is stored
with (the entry's key already holds the frame's code and frametrace's own source): every
input's dtype, device, sizes, strides, offset, requires_grad and aliasing, grad mode,
autocast and functorch's config (aot_cache.key_of), the triton backend's settings,
Triton's version, TRITON_INTERPRET, the GPUs' names, capabilities and SM counts, the
python-floats switch and frametrace's own code.  A load computes it again from the live
inputs; a difference is a miss and the cached graph is compiled as before.  Graphs with
symbolic sizes are not cached (nor anything aot_cache refuses: custom ops, tensor
subclasses...); neither is a graph that runs eagerly as a whole.

The first call of a restored module checks that its tensors have the layouts the
kernels were made for (a backward's saved values); where they do not, or a kernel fails
to compile, the graph is traced again from its cached code and compiled by the
pipeline, as a cold start would (`_recompile`): a miss, never a wrong answer.
`frametrace.config.cache_triton_results = False` turns all of it off.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import logging
import os
import pickle
import time
import types

import torch
from functorch.compile import make_boxed_func
from torch._functorch import config as functorch_config
from torch.fx.experimental.proxy_tensor import make_fx

from ... import config as frametrace_config
from .. import aot_cache
from . import config, tune_cache
from .compiled_module import (CompiledModule, boxed, layouts, mutated_before, rehearsal, settle,
                              write_prefixes)
from .cudagraphs import CudaGraphRunner
from .foreach import in_place
from .wrapper import Launcher, WrapperCodegen, base_namespace

log = logging.getLogger("frametrace.cache")

_FORMAT = 1         # (the description's layout: a change makes old ones misses)
_OP_NAMESPACES = ("aten", "prims", "frametrace")
# (what every wrapper's namespace holds: never a module's own constant)
_BASE_NAMES = frozenset(base_namespace(torch.device("cpu")))
STATS = {"stored": 0, "not_cached": 0, "restored": 0, "recompiled": 0}


class NotCacheable(Exception):
    """What the backend made of a graph cannot be described soundly."""


# --------------------------------------------------------------------------- the key
def result_key(example_inputs) -> str:
    """The result's key for these inputs in this process (NotCacheable where none can
    be made)."""
    variant = repr(("triton", _FORMAT, sorted((k, repr(v)) for k, v in config.settings().items()),
                    _triton_version(), os.environ.get("TRITON_INTERPRET", "0") == "1", _devices(),
                    generator_fingerprint(), frametrace_config.triton_keeps_python_floats))
    try:
        return aot_cache.key_of(example_inputs, variant)
    except aot_cache.NotCacheable as e:
        raise NotCacheable(str(e)) from None


@functools.lru_cache(maxsize=1)
def generator_fingerprint() -> str:
    """The backends' source (this generator's, AOTAutograd's capture and rebuild): an
    edited generator makes new keys.  (The entry's key holds all of frametrace's.)"""
    h = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _triton_version():
    try:
        return importlib.metadata.version("triton")
    except Exception:
        return None


def _devices() -> tuple:
    if not torch.cuda.is_available():
        return ()
    return tuple(tune_cache._device_of(i) for i in range(torch.cuda.device_count()))


@contextlib.contextmanager
def backward_now(enabled):
    """While the cache is on: AOTAutograd compiles a training graph's backward with its
    forward (its kernels then go with the entry) instead of at the first backward.
    Without donated buffers: a backward compiled up front with them refuses
    `retain_graph=True` and double backward (which the lazy one allows), and the
    triton backend's backward does not reuse them anyway; `no_donated_buffers` then
    says so in the metadata AOTAutograd's runtime checks."""
    if not enabled:
        yield
        return
    with functorch_config.patch(force_non_lazy_backward_lowering=True, donated_buffer=False):
        yield


def no_donated_buffers(record):
    """After a compile under `backward_now`: each training graph's runtime metadata says
    it has no donated buffers ([]); compiled without them it says None, which
    AOTAutograd's backward takes for some and refuses under retain_graph=True (the lazy
    backward resets it to [] when it compiles; this one compiled before)."""
    for kind, args in record.get("calls") or ():
        meta = args.get("fw_metadata")
        if kind == "autograd" and meta is not None and getattr(meta, "bw_donated_idxs", []) is None:
            meta.bw_donated_idxs = []


# --------------------------------------------------------------------------- storing
def _plain(value, depth=0) -> bool:
    if depth > 4:
        return False
    if type(value) in (int, float, bool, str, complex, type(None), torch.dtype, torch.device,
                       torch.layout, torch.memory_format):
        return True
    if type(value) in (tuple, list):
        return all(_plain(v, depth + 1) for v in value)
    return type(value) is torch.Tensor and value.layout == torch.strided


def _op_name(op) -> tuple:
    if not isinstance(op, torch._ops.OpOverload) or op.namespace not in _OP_NAMESPACES:
        raise NotCacheable(f"a call of {op!r:.60}")
    return op.namespace, op._schema.name.split("::")[1], op._overloadname


def _op_of(name):
    namespace, packet, overload = name
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def describe(mod) -> dict:
    """A CompiledModule as plain values (NotCacheable where it cannot be)."""
    w = mod.wrapper
    if mod.symbolic or getattr(w, "fast_template", None) is None or mod.input_layouts is None:
        raise NotCacheable("symbolic sizes")
    if getattr(w.lowered, "generators", ()):
        # (AOTAutograd's graph-safe RNG: its runtime makes the generators; aot_cache does
        # not rebuild that runtime either)
        raise NotCacheable("torch.Generator inputs (graph-safe RNG states)")
    launchers = set(w.launchers)
    consts, ops = {}, {}
    for name in w.generated_names:
        if name in _BASE_NAMES or name in launchers:
            continue
        if name in w.ops:
            ops[name] = _op_name(w.ops[name])
            continue
        value = w.ns[name]
        if not _plain(value):
            raise NotCacheable(f"a constant of type {type(value).__name__}")
        consts[name] = value
    kernels = []
    for name, k in zip(w.launchers, mod.kernels, strict=True):
        try:
            description = w.ns[name].description()
        except ValueError as e:
            raise NotCacheable(str(e)) from None
        kernels.append((name, description, k.source, list(k.args), in_place(k)))
    return {"kind": mod.kind, "device": w.ns["device"], "source": mod.source,
            "fast_template": w.fast_template, "inputs": list(w.lowered.inputs),
            "off_device": w.lowered.off_device, "consts": consts, "ops": ops, "kernels": kernels,
            "externs": list(mod.externs), "extern_ops": [_op_name(op) for op in mod.extern_ops],
            "fallback_ops": list(mod.fallback_ops), "writes": write_prefixes(mod),
            "layouts": mod.input_layouts, "settings": dict(mod.settings)}


def artifact(record) -> bytes:
    """The bytes of what AOTAutograd and the backend made of a graph."""
    products = record.get("products") or []
    modules = []
    for p in products:
        current = getattr(p, "current_module", None)
        if current is None:
            raise NotCacheable("a graph runs eagerly")
        modules.append(describe(current()))
    calls = record.get("calls") or []
    expected = 2 if calls and calls[0][0] == "autograd" else 1
    if len(modules) != expected:
        raise NotCacheable(f"{len(modules)} graphs compiled, {expected} expected")
    try:
        aot = aot_cache.artifact(record)
    except aot_cache.NotCacheable as e:
        raise NotCacheable(str(e)) from None
    try:
        return pickle.dumps({"format": _FORMAT, "aot": aot, "modules": modules},
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise NotCacheable(f"cannot pickle the result ({type(e).__name__}: {e})") from None


def with_artifact(compiled, gm, example_inputs, record):
    """`compiled` carrying, for the on-disk cache, the backend's result and its key:
    `__frametrace_artifact__()` gives (key, bytes), or (None, why not).  The key is taken
    now; the bytes when the cache asks (after this compile, before the first call)."""
    try:
        aot_cache.check_graph(gm)
        key = result_key(example_inputs)
    except (aot_cache.NotCacheable, NotCacheable) as e:
        why = str(e)
        compiled.__frametrace_artifact__ = lambda: (None, why)
        return compiled
    except Exception as e:      # (our bug: the compile is good, only not cached)
        why = f"{type(e).__name__}: {e}"
        compiled.__frametrace_artifact__ = lambda: (None, why)
        return compiled
    made = []

    def artifact_now():
        if not made:
            try:
                made.append((key, artifact(record)))
                STATS["stored"] += 1
            except Exception as e:
                STATS["not_cached"] += 1
                made.append((None, f"{type(e).__name__}: {e}"))
            record.clear()
        return made[0]
    compiled.__frametrace_artifact__ = artifact_now
    return compiled


# --------------------------------------------------------------------------- loading
class _Kernel:
    """A restored kernel: what the driver reads of one (no IR: its FX nodes are gone)."""
    __slots__ = ("name", "source", "args", "writes_inputs", "symbols", "tile")

    def __init__(self, name, source, args, writes_inputs, tile):
        self.name, self.source, self.args, self.writes_inputs = name, source, args, writes_inputs
        self.symbols, self.tile = [], tile

    def __repr__(self):
        return f"Kernel({self.name}, restored)"


class _Wrapper:
    """A restored wrapper: its namespace, launchers and the fast wrapper's template."""

    def __init__(self, d, ns):
        self.ns, self.launchers = ns, [k[0] for k in d["kernels"]]
        self.launch_args = {k[0]: k[3] for k in d["kernels"]}
        self.fast_template = d["fast_template"]
        self.lowered = types.SimpleNamespace(device=d["device"], hints={}, inputs=d["inputs"],
                                             off_device=d["off_device"])
        self.schedule = []

    fast_source = WrapperCodegen.fast_source    # (the same fast wrapper as a build's)


def restore(d):
    """The CompiledModule a description was made from."""
    ns = base_namespace(d["device"])
    ns.update(d["consts"])
    ns.update((name, getattr(op, "_op", op)) for name, op in
              ((n, _op_of(o)) for n, o in d["ops"].items()))
    kernels = []
    for name, description, source, args, writes in d["kernels"]:
        ns[name] = Launcher.restore(description, source)
        kernels.append(_Kernel(description[1], source, args, writes, description[6]))
    wrapper = _Wrapper(d, ns)
    exec(compile(d["source"], "<frametrace-triton wrapper>", "exec"), ns)
    mod = CompiledModule(wrapper, d["source"], kernels, d["externs"], d["fallback_ops"],
                         [_op_of(o) for o in d["extern_ops"]])
    mod.kind, mod.settings, mod.writes = d["kind"], d["settings"], d["writes"]
    mod.input_layouts, mod.restored = d["layouts"], True
    return mod


def runner(d, graph, restored, recompile):
    """The boxed function of a restored module; `graph`: the graph's cached code (an
    aot_cache._CodeOnly), traced again where the restored module does not fit;
    `restored(mod, seconds)` and `recompile(gm, example_inputs, kind)`: as `load`'s."""
    t0 = time.perf_counter()
    mod = restore(d)
    restored(mod, time.perf_counter() - t0)
    STATS["restored"] += 1
    if mod.graphable and mod.kind == "inference":
        mod.runner = CudaGraphRunner(mod.call, len(mod.kernels) + len(mod.externs),
                                     settings=mod.settings)

    def first(args):
        kept = list(args)
        now = layouts(kept)
        if not fits(mod.input_layouts, now):
            return _recompile(run, graph, d["kind"], kept, _layout_difference(mod.input_layouts, now),
                              recompile)
        trial = rehearsal(mod, kept)
        try:
            if trial is not None:
                mod.call(trial)     # (compiles every kernel; writes only the copies)
                trial = None
            out = (mod.runner or mod.call)(args)
        except Exception as e:
            if getattr(e, "frametrace_check", False):
                raise  # the program's error (an index out of range): the kernels are fine
            if trial is None and mutated_before(mod, e):
                raise
            return _recompile(run, graph, d["kind"], kept, f"{type(e).__name__}: {e}"[:300],
                              recompile)
        settle(run, mod, kept)
        return out

    run = boxed(first, lambda: mod)
    return run


def fits(cached, now) -> bool:
    """Whether a restored module, built for the `cached` layouts, takes inputs of the `now`
    layouts as the cold process's module took its first call's.  The cached ones are the
    FakeTensor examples', which can name another device than the call's for a 0-d tensor
    (the philox seed and offset that CUDA's efficient attention saves for its backward:
    CPU tensors, CUDA by their meta function): the cold module ran on those too (the
    kernels never read such a scalar through a pointer: Triton refuses a CPU pointer at
    the first launch, which then compiles the graph again)."""
    if len(cached) != len(now):
        return False
    for c, n in zip(cached, now):
        if c != n and not (c is not None and n is not None and c[2] == () == n[2]
                           and c[0] == n[0] and c[1] != n[1]):
            return False
    return True


def _layout_difference(cached, now) -> str:
    """Which input of a restored module differs from its cached layout (for the log line)."""
    if len(cached) != len(now):
        return f"{len(now)} inputs where {len(cached)} were cached"
    i = next(i for i, (a, b) in enumerate(zip(cached, now)) if a != b)
    return f"input {i} is {now[i]} where {cached[i]} was cached"


def _recompile(run, graph, kind, args, why, recompile):
    """The graph traced again from its cached code (FakeTensors of `args`) and compiled
    by the pipeline (`recompile`), as a cold start compiles it; eagerly where that fails."""
    STATS["recompiled"] += 1
    log.warning("frametrace: cache: a restored triton module does not fit (%s); its graph is "
                "compiled again", why)
    try:
        traced = make_fx(lambda *a: graph.forward(*a), tracing_mode="fake")(*args)
        examples = [n.meta.get("val") for n in traced.graph.nodes if n.op == "placeholder"]
        run.target = recompile(traced, examples, kind)
    except Exception as e:
        log.warning("frametrace: cache: cannot compile the cached graph again (%s: %s); it runs "
                    "eagerly", type(e).__name__, e)
        run.target = make_boxed_func(graph.forward)
    return run.target(args)


def load(gm, example_inputs, data, restored, recompile):
    """warm_cache's `__frametrace_load_artifact__` (through backend.load_artifact): the
    compiled function rebuilt from a stored (key, bytes), or None (the reason logged)
    where the key is not this call's.  The pipeline above gives `restored(mod, seconds)`,
    which records each restored module as its own, and `recompile(gm, example_inputs,
    kind)`, which compiles a graph whose restored module does not fit: this module
    imports nothing of it."""
    stored_key, blob = data
    try:
        key = result_key(example_inputs)
    except NotCacheable as e:
        log.info("frametrace: cache: the triton backend's cached result not used: %s", e)
        return None
    if key != stored_key:
        log.info("frametrace: cache: the triton backend's cached result is for other inputs, "
                 "state or settings; the cached graph is compiled again")
        return None
    parts = pickle.loads(blob)
    if parts.get("format") != _FORMAT:
        return None
    if os.environ.get("TRITON_INTERPRET", "0") != "1" and \
            any(m["device"].type == "cpu" for m in parts["modules"]):
        return None
    modules = iter(parts["modules"])

    def boxed(graph, _):
        return runner(next(modules), graph, restored, recompile)
    return aot_cache.rebuild(parts["aot"], boxed)
