"""`default`: the backend of `frametrace.optimize(model)` when none is named.  It chooses
per graph, as torch.compile's default generates kernels where they pay:

- a graph whose tensors are on a CUDA device compiles with the `triton` backend (its
  kernels; a training graph gets its compiled backward too), tuned by `mode=`/`options=`;
- any other graph (CPU) runs with the `eager` backend (view chains, no-op elision): what
  the kernels would buy there Triton's interpreter would cost many times over.
  `mode=`/`options=` tune only the kernels: for such a graph they are a log line, once.

The choice is made twice and the two must agree.  The trace starts from the frame's
arguments: where one of them holds a CUDA tensor the graph is traced for a backend that
may re-trace it over FakeTensors (AOTAutograd's), otherwise for one that runs its ops as
traced (what the trace may keep in a graph differs: see convert._functionalizes).  The
compile then sees the graph: a graph on CUDA that was traced for the eager backend (a
frame whose arguments hold no CUDA tensor makes its tensors there) runs with the eager
backend, with a log line.  Which backend compiled each graph is in
`gm.meta["frametrace_backend"]` (explain() shows it) and in the `graph` log.
"""
from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import types
import warnings

import torch

from .. import config
from . import _BACKENDS, register_backend

graph_log = logging.getLogger("frametrace.graph")
log = logging.getLogger("frametrace")

# Device types whose graphs compile to Triton kernels (tests add "cpu", with
# TRITON_INTERPRET=1, to run the kernel path in Triton's interpreter).
KERNEL_DEVICES = ("cuda",)

# How deep the frame's arguments are searched for a tensor's device (containers,
# modules, an object's attributes: a trainer's `self.model`).
_SEARCH_DEPTH = 3
_SEARCH_WIDTH = 32


class DefaultBackend:
    """The `default` backend with `mode`/`options` (None: the triton backend's own)."""

    __frametrace_backend__ = True
    __frametrace_name__ = "default"

    def __init__(self, mode=None, options=None):
        self.mode = None if mode == "default" else mode
        self.options = dict(options or {})
        self._kernels = None
        if self.mode is not None or self.options:
            # (unknown options raise here, at optimize(), whatever the graphs' devices)
            from .triton import config, configured
            self._kernels = configured({**config.MODES.get(self.mode or "default", {}), **self.options})
        self._noted_settings = False

    def __frametrace_configure__(self, mode, options):
        """optimize(mode=, options=): a default backend choosing the triton backend's
        kernels with those settings."""
        return type(self)(mode, options)

    def __frametrace_runs_ops_as_traced__(self, args) -> bool:
        """For convert._functionalizes, at the start of a trace: a frame whose arguments
        hold no tensor on a kernel device is traced for the eager backend."""
        return not _on_kernel_device(args)

    def kernel_backend(self):
        return self._kernels or _BACKENDS["triton"]

    def choice(self, gm, example_inputs) -> tuple[str, str]:
        """(backend name, why) for this graph: its device, as its trace assumed."""
        name, why = choose(gm, example_inputs)
        if name == "triton" and not gm.meta.get("frametrace_functionalizes", True):
            return "eager", (f"{why}, but traced for the eager backend (the frame's "
                             "arguments hold no CUDA tensor)")
        if name == "triton" and not triton_installed():
            return "eager", f"{why}, but Triton is not installed (pip install triton)"
        return name, why

    def __call__(self, gm, example_inputs):
        name, why = self.choice(gm, example_inputs)
        if name == "eager" and why.endswith("(pip install triton)"):
            _warn_once("frametrace: the default backend runs CUDA graphs with the eager "
                       "backend: Triton is not installed (pip install triton)")
        if name == "eager" and (self.mode is not None or self.options) and not self._noted_settings:
            self._noted_settings = True
            settings = f"mode={self.mode!r}" if self.mode is not None else f"options={self.options!r}"
            log.info("frametrace: %s tunes the default backend's Triton kernels (CUDA graphs); "
                     "%s runs with the eager backend (%s)", settings, type(gm).__name__, why)
        if name == "triton":
            try:
                compiled = self.kernel_backend()(gm, example_inputs)
            except Exception as e:
                # (a graph traced for the kernels runs right with eager too; nothing ran yet)
                if os.environ.get("FRAMETRACE_TRITON_STRICT") == "1" or \
                        any(c.__name__.endswith("RestartAnalysis") for c in type(e).__mro__):
                    raise   # (the tests want it; AOTAutograd's restart is the tracer's to make)
                first = (str(e).strip().splitlines() or [""])[0][:200]
                # a checkpoint traced for a backend that recomputes random ops as the
                # forward drew them: eager's higher-order op would draw others
                name = "aot_eager" if _checkpoints(gm) else "eager"
                why = f"{why}, but the triton backend failed ({type(e).__name__}: {first})"
                log.warning("frametrace: graph %s runs with the %s backend: %s",
                            type(gm).__name__, name, why)
            else:
                _record(gm, name, why)
                return compiled
        _record(gm, name, why)
        return _BACKENDS[name](gm, example_inputs)

    def __repr__(self):
        settings = "".join(f", {k}={v!r}" for k, v in (("mode", self.mode), ("options", self.options)) if v)
        return f"DefaultBackend({settings.lstrip(', ')})"


def _checkpoints(gm) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.higher_order.tag_activation_checkpoint
               for n in gm.graph.nodes)


def _record(gm, name, why):
    gm.meta["frametrace_backend"] = name
    gm.meta["frametrace_backend_reason"] = why
    graph_log.info("graph %s: compiled by %s (the default backend's choice: %s)",
                   type(gm).__name__, name, why)


def choose(gm, example_inputs) -> tuple[str, str]:
    """(backend name, why) for a graph, from its tensors' device alone."""
    if not config.default_backend_kernels:
        return "eager", "frametrace.config.default_backend_kernels is off"
    device = graph_device(gm, example_inputs)
    if device.type in KERNEL_DEVICES:
        return "triton", f"{device.type} tensors"
    return "eager", f"{device.type} tensors"


def graph_device(gm, example_inputs) -> torch.device:
    """The first device other than the CPU among the graph's inputs and values (a graph
    that makes its tensors), else the CPU (as the triton backend places its kernels)."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    for node in gm.graph.nodes:
        val = node.meta.get("val", node.meta.get("example_value"))
        tensors += [v for v in (val if isinstance(val, (list, tuple)) else [val])
                    if isinstance(v, torch.Tensor)]
    return next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))


def _on_kernel_device(args) -> bool:
    if not config.default_backend_kernels:
        return False
    seen = set()
    return any(t.device.type in KERNEL_DEVICES for t in _tensors(args, _SEARCH_DEPTH, seen))


def _tensors(obj, depth, seen):
    """Tensors reachable from `obj`: itself, a container's items, a module's first
    parameter and buffer, an optimizer's first parameter, an object's attributes (read
    from its __dict__: no user code runs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth == 0 or obj is None or isinstance(obj, _OPAQUE) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        for t in (next(obj.parameters(), None), next(obj.buffers(), None)):
            if t is not None:
                yield t
        return
    if isinstance(obj, torch.optim.Optimizer):
        items = [p for g in obj.param_groups[:1] for p in g["params"][:1]]
    elif isinstance(obj, list):
        items = list.__getitem__(obj, slice(0, _SEARCH_WIDTH))
    elif isinstance(obj, tuple):
        items = tuple.__getitem__(obj, slice(0, _SEARCH_WIDTH))
    elif isinstance(obj, dict):
        items = list(itertools.islice(dict.values(obj), _SEARCH_WIDTH))
    else:
        try:
            attrs = object.__getattribute__(obj, "__dict__")
        except Exception:
            return
        items = list(itertools.islice(dict.values(attrs), _SEARCH_WIDTH)) if isinstance(attrs, dict) else ()
    for item in items:
        yield from _tensors(item, depth - 1, seen)


_OPAQUE = (str, bytes, int, float, complex, type, types.ModuleType, types.FunctionType,
           types.BuiltinFunctionType, types.CodeType)


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


_warned: set = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=2)


default = register_backend("default")(DefaultBackend())
