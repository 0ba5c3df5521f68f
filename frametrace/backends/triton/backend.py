"""The backend's driver: AOTAutograd with decompositions, then lowering, scheduling and
code generation of each graph it gives: an inference graph, or a training graph's forward
and backward, split by partition.py (the backward recomputes cheap forward values).

A kernel that cannot be generated, or fails on its first launch, costs only the FX nodes
it fuses: they become aten calls in the same wrapper and the graph is built again.  The
whole graph runs eagerly (with a warning) only when that does not help."""
from __future__ import annotations

import logging
import os
import time
import warnings

import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode

from ... import config as frametrace_config
from .. import aot_cache
from ..python_floats import python_floats_kept
from ..kernel_formats import keep_kernel_formats
from . import config, layout
from .attention import drop_trivial_masks
from .compiled_module import CompiledModule, boxed, layouts, mutated_before, rehearsal, settle
from .context import CompileContext
from .kernel_source import KernelCodegen
from .cudagraphs import CudaGraphRunner
from .decompositions import decompositions
from .fallback import kernel_nodes
from .gc_pause import during
from .ir import Extern, Unsupported
from .lowering import GraphLowering
from .partition import partition
from .precompile import precompile
from . import result_cache
from .rng import hoist_seeds
from .scheduler import schedule
from .wrapper import Launcher, WrapperCodegen

output_code = logging.getLogger("frametrace.output_code")
perf_hints = logging.getLogger("frametrace.perf_hints")
log = logging.getLogger("frametrace")
COMPILED: list = []   # CompiledModules, newest last (a few kept, for tests and debugging)
# Over the process: graphs run eagerly or with aot_eager as a whole, and FX nodes run as
# aten calls that kernels could have run (a benchmark asserts both are 0)
STATS = {"eager_graphs": 0, "fallback_nodes": 0}
# Lowerings (each `build`: lowering, scheduling, kernel and wrapper source) and modules
# restored from the result cache (result_cache.py) instead: a warm start's builds are 0
PIPELINE = {"builds": 0, "build_seconds": 0.0, "restored": 0, "restore_seconds": 0.0}
# Builds of one graph after the first, each with more nodes as aten calls, before it runs
# eagerly as a whole
REBUILDS = 8


def _eager(gm, example_inputs):
    return make_boxed_func(gm.forward)


def _why_not(example_inputs, device, generators=False) -> str | None:
    """Why these inputs cannot run as Triton kernels on `device`, or None.  Tensors on
    other devices (a CPU scalar tensor beside CUDA ones) are the lowering's to handle.
    `generators`: torch.Generators may be among them (AOTAutograd's graph-safe RNG
    states, in the graphs it compiles; `config.generator_inputs`)."""
    for t in example_inputs:
        if isinstance(t, torch.Generator):
            if generators and config.generator_inputs:
                continue
            return "a torch.Generator input" + (" (graph-safe RNG: backends.triton.config."
                                                 "generator_inputs is off)" if generators else "")
        if isinstance(t, (int, torch.SymInt)) and not isinstance(t, bool):
            if isinstance(t, torch.SymInt) and not config.dynamic_shapes:
                return "symbolic shapes"
            continue
        if isinstance(t, torch.SymBool):
            continue   # (a backward's copy of a forward's runtime assert on sizes)
        if isinstance(t, torch.SymFloat):
            return "a float input that changes between calls (kept a Python float: " \
                   "frametrace.config.triton_keeps_python_floats)"
        if not isinstance(t, torch.Tensor):
            return f"a non-tensor input ({type(t).__name__}: dynamic shapes)"
        if not config.dynamic_shapes and any(not isinstance(s, int) for s in t.shape):
            return "symbolic shapes"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "CPU inputs (TRITON_INTERPRET=1 runs the kernels in Triton's interpreter)"
    if device.type not in ("cpu", "cuda"):
        return f"{device.type} inputs"
    return None


def _eager_whole(reason, device, how="with aot_eager", expected=False):
    """Log a graph that runs without kernels: a warning for a GPU graph (a CPU graph runs
    without them unless Triton's interpreter is asked for), unless `expected`."""
    STATS["eager_graphs"] += 1
    output_code.info("triton backend: %s; this graph runs %s", reason, how)
    level = logging.WARNING if device.type == "cuda" and not expected else logging.INFO
    perf_hints.log(level, "triton backend: %s; this graph runs %s", reason, how)
    log.log(level, "triton backend: %s; this graph runs %s", reason, how)


_warned_cpu = False


def _cpu_graph():
    """backend="triton" named for a graph of CPU tensors: it runs with aot_eager, which
    the user is told once (the default backend sends such graphs to eager instead);
    FRAMETRACE_TRITON_STRICT=1 refuses it."""
    global _warned_cpu
    message = ("frametrace: backend='triton' got a graph of CPU tensors: it runs with aot_eager, "
               "not as Triton kernels (TRITON_INTERPRET=1 runs them in Triton's interpreter; "
               "the default backend runs CPU graphs with eager)")
    if _strict():
        raise RuntimeError(f"{message}; FRAMETRACE_TRITON_STRICT=1 refuses that fallback")
    if not _warned_cpu:
        _warned_cpu = True
        warnings.warn(message, stacklevel=2)


@during
def compile_graph(gm, example_inputs):
    try:
        import triton  # noqa: F401  (present, or a clear error now)
    except ImportError:
        raise RuntimeError("backend='triton' needs Triton: pip install triton") from None
    device = _graph_device(gm, example_inputs)
    reason = _why_not(example_inputs, device)
    if reason is not None and device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        _cpu_graph()
    floats = python_floats_kept(example_inputs, frametrace_config.triton_keeps_python_floats)
    if frametrace_config.keep_kernel_formats:
        keep_kernel_formats(gm)
    if reason is not None:
        _eager_whole(reason, device, expected=floats.active)
        with floats:
            return aot_module_simplified(gm, example_inputs, fw_compiler=_eager, bw_compiler=_eager,
                                         keep_inference_input_mutations=True)
    if drop_trivial_masks(gm):
        log.debug("triton backend: dropped attention masks that mask nothing")
    caching = frametrace_config.cache and frametrace_config.cache_triton_results
    # (cached: the backward is compiled now, not at its first call, so that the entry
    # stored after this compile holds its kernels too)
    # (only where the capture is installed: it is what reaches the metadata to mend)
    with floats, aot_cache.capturing(caching) as capture, \
            result_cache.backward_now(caching and bool(capture.installed)):
        compiled = aot_module_simplified(gm, example_inputs, fw_compiler=compile_training_forward,
                                         bw_compiler=compile_backward, inference_compiler=compile_forward,
                                         partition_fn=partition, decompositions=decompositions(),
                                         keep_inference_input_mutations=True)
    if capture.installed:
        result_cache.no_donated_buffers(capture.record)
    if capture.enabled:
        compiled = result_cache.with_artifact(compiled, gm, example_inputs, capture.record)
    return compiled


def load_artifact(gm, example_inputs, artifact):
    """A warm start's compiled function from the result a cold one stored
    (result_cache.load), or None: restored modules are recorded as this pipeline's
    (COMPILED, PIPELINE), and a graph whose restored module does not fit is compiled
    again by it."""
    return result_cache.load(gm, example_inputs, artifact, restored=_restored, recompile=_compile)


def _restored(mod, seconds):
    """A module restored from the result cache, kept as a build's is."""
    COMPILED.append(mod)
    del COMPILED[:-8]
    PIPELINE["restored"] += 1
    PIPELINE["restore_seconds"] += seconds


def _graph_device(gm, example_inputs):
    """Where the kernels run: the first accelerator among the inputs, else among the
    graph's values (a graph that makes its tensors), else the CPU."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        tensors += [v for v in (val if isinstance(val, (list, tuple)) else [val])
                    if isinstance(v, torch.Tensor)]
    return next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))


def _strict() -> bool:
    return os.environ.get("FRAMETRACE_TRITON_STRICT") == "1"


def compile_forward(gm, example_inputs):
    """An inference graph (no autograd), or a whole graph handed over alone."""
    aot_cache.note_compiled_graph(gm)
    return aot_cache.note_product(_compile(gm, example_inputs, "inference"))


def compile_training_forward(gm, example_inputs):
    """The forward of a training graph: it also returns what the backward is saved."""
    aot_cache.note_compiled_graph(gm)
    return aot_cache.note_product(_compile(gm, example_inputs, "forward"))


def compile_backward(gm, example_inputs):
    """The backward of a training graph: saved values and tangents in, gradients out."""
    return aot_cache.note_product(_compile(gm, example_inputs, "backward"))


@during
def _compile(gm, example_inputs, kind):
    device = _graph_device(gm, example_inputs)
    if kind == "backward":   # (built for the layouts its forward stored the saved values in)
        example_inputs = layout.backward_examples(gm, example_inputs)
    reason = _why_not(example_inputs, device, generators=True) or \
        (None if config.dynamic_shapes else _symbolic(gm))
    if reason is not None:
        # (a float kept a Python float is the switch's promise, not a surprise to warn of)
        _eager_whole(reason, device, "eagerly",
                     expected=any(isinstance(t, torch.SymFloat) for t in example_inputs))
        return _eager(gm, example_inputs)
    aten_nodes: dict = {}   # FX node -> why it runs as aten, from failed builds and launches
    hinted: set = set()     # the fallbacks logged
    try:
        mod = _build(gm, example_inputs, device, aten_nodes, hinted, kind)
    except Unsupported as e:
        if _symbolic(gm) is None:
            return _give_up(gm, e)
        # what the lowering cannot express with symbolic sizes runs as before
        _eager_whole(f"symbolic shapes ({e})", device)
        return _eager(gm, example_inputs)
    except Exception as e:
        return _give_up(gm, e)

    @during
    def first(args):
        # Triton compiles the kernels on their first launch: a kernel that fails there
        # runs its nodes as aten in a graph built again; the graph runs eagerly only when
        # that does not help.
        nonlocal mod
        kept = list(args)
        examples = example_inputs
        # the generators' states (graph-safe RNG): a graph built again, or run eagerly,
        # after a failed launch draws what this call would have drawn
        generators = [(g, g.get_state()) for g in kept if isinstance(g, torch.Generator)]

        def again(target):
            for g, state in generators:
                g.set_state(state)
            return target(kept)
        if kind == "backward" and not mod.symbolic and _restrided(example_inputs, args):
            # the forward stored a saved value in other strides than AOTAutograd traced:
            # the kernels are built for the strides they will read
            log.info("triton backend: a backward's inputs have other strides than traced; built again")
            examples = _stand_ins(example_inputs, args)
            if mod in COMPILED:
                COMPILED.remove(mod)
            try:
                mod = _build(gm, examples, device, aten_nodes, hinted, kind)
            except Exception as e:
                run.target = _give_up(gm, e)
                return run.target(kept)
        for _ in range(REBUILDS + 1):
            precompile(mod, kept)
            trial = rehearsal(mod, kept)
            try:
                if trial is not None:
                    mod.call(trial)     # (compiles every kernel; writes only the copies)
                    trial = None
                out = (mod.runner or mod.call)(args)
                break
            except Exception as e:
                if getattr(e, "frametrace_check", False):
                    raise  # the program's error (an index out of range): the kernels are fine
                if trial is None and mutated_before(mod, e):
                    raise  # running the graph again would read the input it wrote
                trial = None
                blamed = _blame_launch(mod, e, aten_nodes)
                if blamed is None and _frame_self(e, Launcher) is None:
                    # raised by an aten call or the wrapper, not a kernel: where the graph
                    # run eagerly raises too, the program's error (scatter_add's index out
                    # of range): raised, and the next call runs the kernels again instead
                    # of the graph running eagerly for good
                    out = again(make_boxed_func(gm.forward))
                    run.target = _give_up(gm, e)
                    return out
                if blamed is None:
                    run.target = _give_up(gm, e)
                    return again(run.target)
                aten_nodes.update(blamed)
                if mod in COMPILED:
                    COMPILED.remove(mod)  # (one entry per graph)
                try:
                    mod = _build(gm, examples, device, aten_nodes, hinted, kind)
                except Exception as e2:
                    run.target = _give_up(gm, e2)
                    return again(run.target)
                for g, state in generators:
                    g.set_state(state)
                args = list(kept)
        else:
            run.target = _give_up(gm, RuntimeError("kernels kept failing on their first launch"))
            return again(run.target)
        settle(run, mod, kept)
        return out

    run = boxed(first, lambda: mod)
    return run


def _stand_ins(example_inputs, args) -> list:
    """Examples to build a graph again for `args`' strides: fake tensors of their sizes,
    strides, dtypes and devices, not the tensors.  The module keeps its examples (its
    lowering's `example_inputs`) for as long as the graph lives: a backward built from
    the first step's own saved activations held all of them (a ResNet-50's, GiBs) past
    that step, for good.  Where no fake mode is at hand, the arguments as they are."""
    try:
        mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        return [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    except Exception as e:  # (a tensor subclass the fake mode cannot take, say)
        log.info("triton backend: no fake stand-ins (%s); the graph keeps its first inputs", e)
        return list(args)


def _restrided(example_inputs, args) -> bool:
    """Whether a tensor argument's strides differ from its example's (where both are known
    numbers; size-1 dimensions' strides do not matter)."""
    for ex, a in zip(example_inputs, args):
        if isinstance(ex, torch.Tensor) and isinstance(a, torch.Tensor):
            try:
                if any(n != 1 and s != t for n, s, t in zip(a.shape, ex.stride(), a.stride())):
                    return True
            except Exception:  # symbolic strides
                return False
    return False


def _build(gm, example_inputs, device, aten_nodes, hinted, kind="inference") -> CompiledModule:
    """`build`, again with the FX nodes of a kernel that could not be generated as aten
    calls, a few times at most; then the last error is raised."""
    for attempt in range(REBUILDS + 1):
        try:
            mod = build(gm, example_inputs, device, aten_nodes)
            break
        except Exception as e:
            blamed = _blame_build(e, aten_nodes)
            if blamed is None or attempt == REBUILDS:
                raise
            aten_nodes.update(blamed)
    mod.kind = kind
    COMPILED.append(mod)
    del COMPILED[:-8]
    # a training graph's outputs are activations held until the backward, and its
    # backward's inputs are those: a replay would copy each out (or in), and its static
    # buffers would hold a second set of them for the life of the graph
    if mod.graphable and kind == "inference":
        mod.runner = CudaGraphRunner(mod.call, len(mod.kernels) + len(mod.externs),
                                     settings=mod.settings)
    for f in mod.fallbacks:
        if f not in hinted:
            hinted.add(f)
            STATS["fallback_nodes"] += 1
            perf_hints.info("triton backend: %s (%s) runs as an aten call: %s", f.node, f.op, f.reason)
    return mod


def _reason(e) -> str:
    """The error in a line: its first and last (Triton puts the source between)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = " ... ".join(dict.fromkeys(lines[:1] + lines[-1:]))
    return f"{type(e).__name__}: {text}"[:300]


def _blame_build(e, aten_nodes) -> dict | None:
    """{FX node: why} for the nodes whose kernel could not be generated (the node whose
    code raised, else all those of the kernel being generated), or None."""
    if _strict() and not isinstance(e, Unsupported):
        return None  # an internal error: the tests want to see it
    node = getattr(e, "frametrace_node", None)
    if node is not None:
        why = str(e) if isinstance(e, Unsupported) else f"kernel code generation failed: {_reason(e)}"
        nodes = {node: why}
    else:
        if isinstance(e, ForeignPointer):  # (generated: only its launch would fail)
            nodes = kernel_nodes(e.kernel.group, e.kernel.stores)
        else:
            cg = _frame_self(e, KernelCodegen)
            if cg is None:
                return None
            nodes = kernel_nodes(cg.group, cg.stores, failed=e)
        why = f"kernel code generation failed: {_reason(e)}"
        nodes = dict.fromkeys(nodes, why)
    nodes = {n: w for n, w in nodes.items() if n not in aten_nodes}
    return nodes or None


def _blame_launch(mod, e, aten_nodes) -> dict | None:
    """{FX node: why} for the nodes a kernel that failed on its first launch fuses, or None."""
    if _strict():
        return None
    launcher = _frame_self(e, Launcher)
    if launcher is None:
        return None
    why = f"kernel failed to compile or launch: {_reason(e)}"
    nodes = {}
    for item in mod.kernels:
        if item.name == launcher.name:  # (the same source: the same failure)
            nodes.update(dict.fromkeys(kernel_nodes(item.group, item.stores), why))
    nodes = {n: w for n, w in nodes.items() if n not in aten_nodes}
    return nodes or None


def _frame_self(e, cls):
    """The innermost `self` of class `cls` among the frames `e` went through."""
    found, tb = None, e.__traceback__
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if isinstance(obj, cls):
            found = obj
        tb = tb.tb_next
    return found


def _give_up(gm, error):
    """This graph runs eagerly, with a warning; FRAMETRACE_TRITON_STRICT=1 raises instead."""
    if _strict():
        raise error
    STATS["eager_graphs"] += 1
    log.warning("triton backend: %s: %s; this graph runs eagerly", type(error).__name__, error)
    perf_hints.warning("triton backend: %s: %s; this graph runs eagerly", type(error).__name__, error)
    return make_boxed_func(gm.forward)


def _symbolic(gm) -> str | None:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
                    not isinstance(s, int) for s in v.shape)):
                return "symbolic shapes"
    return None


def build(gm, example_inputs, device=None, aten_nodes=None) -> CompiledModule:
    """`aten_nodes`: {FX node: why} that run as aten calls whatever their lowering."""
    device = _graph_device(gm, example_inputs) if device is None else device
    t0 = time.perf_counter()
    PIPELINE["builds"] += 1
    hoist_seeds(gm)
    ctx = CompileContext()  # this compile's alone: a later build, or another thread's, has its own
    with ctx.active():
        lowered = GraphLowering(gm, example_inputs, device, aten_nodes, ctx).run()
        if any(0 in getattr(o, "shape", (1,)) for o in lowered.items):
            raise Unsupported("empty tensors")
        wrapper = WrapperCodegen(lowered, schedule(lowered))
        source, kernels, externs = wrapper.generate()
    ctx.memo.clear()    # (the index helpers' results: the kernels keep the context alive)
    _check_devices(lowered, kernels)
    exec(compile(source, "<frametrace-triton wrapper>", "exec"), wrapper.ns)
    if output_code.isEnabledFor(logging.INFO):
        unique = {k.name: k.source for k in kernels}
        fell = "".join(f"# {f.node} ({f.op}) runs as an aten call: {f.reason}\n"
                       for f in lowered.fallbacks)
        output_code.info("triton backend, generated module:\n%s%s\n%s", fell, source,
                         "\n".join(unique.values()))
    mod = CompiledModule(wrapper, source, kernels, externs, lowered.fallback_ops,
                         [i.graph_op for i in lowered.items if isinstance(i, Extern)], lowered.fallbacks)
    mod.input_layouts = layouts(example_inputs)
    PIPELINE["build_seconds"] += time.perf_counter() - t0
    return mod


class ForeignPointer(Exception):
    """A kernel would take a pointer to memory on another device than its own."""
    def __init__(self, message, kernel):
        super().__init__(message)
        self.kernel = kernel


def _check_devices(lowered, kernels):
    """Before any launch: every tensor a kernel takes lives on the kernels' device (a
    pointer to host memory faults the GPU and loses the process's CUDA context)."""
    for k in kernels:
        for name in k.args:
            device = lowered.devices.get(name)
            if device is not None and device != lowered.device:
                raise ForeignPointer(f"kernel {k.name} would read {name} on {device} "
                                     f"from {lowered.device}", k)
