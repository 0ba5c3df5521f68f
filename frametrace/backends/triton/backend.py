"""The backend's driver: AOTAutograd with decompositions, then lowering, scheduling and
code generation of the forward graph; the backward graph runs eagerly."""
from __future__ import annotations

import logging
import os

import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified

from . import config
from .cudagraphs import CudaGraphRunner
from .decompositions import decompositions
from .ir import Extern, Unsupported
from .lowering import GraphLowering
from .scheduler import schedule
from .wrapper import WrapperCodegen

output_code = logging.getLogger("frametrace.output_code")
log = logging.getLogger("frametrace")
COMPILED: list = []   # CompiledModules, newest last (a few kept, for tests and debugging)


class CompiledModule:
    """What the backend made of one forward graph.  `kernels`: one entry per launch
    (`.name`, `.source`); `externs`: aten ops called as they are."""

    def __init__(self, wrapper, source, kernels, externs, fallback_ops, extern_ops=()):
        self.wrapper, self.source, self.namespace = wrapper, source, wrapper.ns
        self.kernels, self.externs, self.fallback_ops = kernels, externs, fallback_ops
        self.extern_ops = extern_ops
        # symbolic sizes: the wrapper reads the shape symbols from its inputs
        self.symbolic = bool(wrapper.lowered.hints)
        self.call = self.namespace["call"]
        self.fast = None    # `fast(args)`, once the first call has compiled every kernel
        self.runner = None  # a CudaGraphRunner, when launches are replayed as a CUDA graph

    @property
    def graphable(self) -> bool:
        """Worth replaying as a CUDA graph, and safe to: no op mutates its inputs."""
        return (config.cudagraphs and not self.symbolic and self.namespace["device"].type == "cuda"
                and len(self.kernels) + len(self.externs) >= config.cudagraph_min_launches
                and not any(op._schema.is_mutable for op in self.extern_ops))

    @property
    def unique_kernels(self) -> list[str]:
        return sorted({k.source for k in self.kernels})

    def make_fast(self, inputs):
        """After a first call with `inputs`: the wrapper that calls each compiled kernel's
        launcher directly (on the GPU), or None."""
        if not config.fast_launch:
            return None
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


def _eager(gm, example_inputs):
    return make_boxed_func(gm.forward)


def _why_not(example_inputs) -> str | None:
    """Why these inputs cannot run as Triton kernels, or None."""
    tensors = []
    for t in example_inputs:
        if isinstance(t, (int, torch.SymInt)) and not isinstance(t, bool):
            if isinstance(t, torch.SymInt) and not config.dynamic_shapes:
                return "symbolic shapes"
            continue
        if not isinstance(t, torch.Tensor):
            return f"a non-tensor input ({type(t).__name__}: dynamic shapes)"
        if not config.dynamic_shapes and any(not isinstance(s, int) for s in t.shape):
            return "symbolic shapes"
        tensors.append(t)
    devices = {t.device.type for t in tensors}
    if len(devices) > 1:
        return f"inputs on several devices ({', '.join(sorted(devices))})"
    if devices == {"cpu"} and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "CPU inputs (TRITON_INTERPRET=1 runs the kernels in Triton's interpreter)"
    if devices - {"cpu", "cuda"}:
        return f"{devices.pop()} inputs"
    return None


def compile_graph(gm, example_inputs):
    try:
        import triton  # noqa: F401  (present, or a clear error now)
    except ImportError:
        raise RuntimeError("backend='triton' needs Triton: pip install triton") from None
    reason = _why_not(example_inputs)
    if reason is not None:
        output_code.info("triton backend: %s; this graph runs with aot_eager", reason)
        log.info("triton backend: %s; this graph runs with aot_eager", reason)
        return aot_module_simplified(gm, example_inputs, fw_compiler=_eager, bw_compiler=_eager,
                                     keep_inference_input_mutations=True)
    from .attention import drop_trivial_masks
    if drop_trivial_masks(gm):
        log.debug("triton backend: dropped attention masks that mask nothing")
    return aot_module_simplified(gm, example_inputs, fw_compiler=compile_forward,
                                 bw_compiler=_eager, decompositions=decompositions(),
                                 keep_inference_input_mutations=True)


def _graph_device(example_inputs):
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def compile_forward(gm, example_inputs):
    reason = _why_not(example_inputs) or (None if config.dynamic_shapes else _symbolic(gm))
    if reason is not None:
        output_code.info("triton backend: %s; this graph runs eagerly", reason)
        return _eager(gm, example_inputs)
    try:
        mod = build(gm, example_inputs)
    except Unsupported as e:
        if _symbolic(gm) is None:
            return _give_up(gm, e)
        # what the lowering cannot express with symbolic sizes runs as before
        output_code.info("triton backend: symbolic shapes (%s); this graph runs with aot_eager", e)
        log.info("triton backend: symbolic shapes (%s); this graph runs with aot_eager", e)
        return _eager(gm, example_inputs)
    except Exception as e:
        return _give_up(gm, e)
    COMPILED.append(mod)
    del COMPILED[:-8]
    if mod.graphable:
        mod.runner = CudaGraphRunner(mod.call, len(mod.kernels) + len(mod.externs))

    def first(args):
        # Triton compiles the kernels on their first launch: a failure there, too, runs
        # the graph eagerly rather than failing the user's call.
        kept = list(args)
        try:
            out = (mod.runner or mod.call)(args)
        except Exception as e:
            run.target = _give_up(gm, e)
            return run.target(kept)
        fast = mod.make_fast(kept)
        if mod.runner is not None:
            run.target = mod.runner
            mod.runner.call = fast or mod.call
        else:
            run.target = fast or mod.call
        return out

    def run(args):
        return run.target(args)
    run.target = first
    run._boxed_call = True
    return run


def _give_up(gm, error):
    """This graph runs eagerly, with a warning; FRAMETRACE_TRITON_STRICT=1 raises instead."""
    if os.environ.get("FRAMETRACE_TRITON_STRICT") == "1":
        raise error
    log.warning("triton backend: %s: %s; this graph runs eagerly", type(error).__name__, error)
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


def build(gm, example_inputs) -> CompiledModule:
    lowered = GraphLowering(gm, example_inputs, _graph_device(example_inputs)).run()
    if any(0 in getattr(o, "shape", (1,)) for o in lowered.items):
        raise Unsupported("empty tensors")
    wrapper = WrapperCodegen(lowered, schedule(lowered))
    source, kernels, externs = wrapper.generate()
    exec(compile(source, "<frametrace-triton wrapper>", "exec"), wrapper.ns)
    if output_code.isEnabledFor(logging.INFO):
        unique = {k.name: k.source for k in kernels}
        output_code.info("triton backend, generated module:\n%s\n%s", source,
                         "\n".join(unique.values()))
    return CompiledModule(wrapper, source, kernels, externs, lowered.fallback_ops,
                          [i.op for i in lowered.items if isinstance(i, Extern)])
