"""What AOTAutograd made of a graph, as bytes for the on-disk cache (warm starts), and
the compiled function rebuilt from them without tracing again.

AOTAutograd's work for aot_eager is the joint trace, functionalization, the metadata
analysis and the partition; its products are the forward and backward graphs (run as
they are) and the metadata its runtime wrappers are built from (`ViewAndMutationMeta`,
the dispatch wrappers of deduplicated and aliased inputs, how many outputs the backward
saves).  torch.compile's bundled AOTAutogradCache keeps the same (autograd_cache.py,
aot_autograd_result.py); this module rebuilds the wrappers with the same calls as
AOTAutograd's own compile path (graph_compile.py), from torch._functorch only.

The artifact is produced under a key of everything the result depends on beyond the
graph it is stored with: each input's metadata (type, dtype, device, layout, sizes,
strides, offset, requires_grad, leaf or view, aliasing between inputs), grad mode,
autocast, inference mode, deterministic algorithms, the default dtype, torch's
functorch config, frametrace's settings the backend reads, the decompositions and the
partitioner, the torch and Python versions; the graph by being stored in the cache
entry of the graph it was made from.  A load computes the key again from the live
inputs and state; any difference (or anything the key cannot say: a symbolic size, a tensor subclass, a
custom op whose Python implementation could have changed) is a miss and AOTAutograd
traces the graph as before.

Not cached (AOTAutograd runs as before): graphs with symbolic sizes or numbers, tensor
subclasses, effect tokens, functionalized random ops, a backward-state input, graphs
with parameters, buffers or constants of their own, custom (non-torch) ops, and the
functionalized fallback.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import logging
import marshal
import os
import pickle
import sys
import threading
import types

import torch

from .. import config

log = logging.getLogger("frametrace.cache")

_FORMAT = 2         # (the artifact's layout: a change makes old artifacts misses)


class NotCacheable(Exception):
    """AOTAutograd's result for this graph cannot be described soundly."""


# --------------------------------------------------------------------------- the key
_OP_NAMESPACES = frozenset({"aten", "prims", "higher_order", "_c10d_functional", "c10d_functional",
                            "_dtensor", "rngprims", "profiler"})
_TORCH_ROOT = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _torch_defined(fn) -> bool:
    """A callable whose Python code (if any) is torch's: its behaviour is pinned by the
    torch version in the key."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        return os.path.abspath(code.co_filename).startswith(_TORCH_ROOT)
    module = getattr(fn, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "_operator", "operator", "math", "builtins", "_functools")


def _target_text(target) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ns = target.namespace if hasattr(target, "namespace") else str(target).split(".")[0]
        if ns not in _OP_NAMESPACES:
            # (its fake and autograd implementations are the user's Python code)
            raise NotCacheable(f"a custom op {target}")
        return f"op:{target}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"hop:{target.name()}"
    if not _torch_defined(target):
        raise NotCacheable(f"a call of {target!r:.80}, not torch's own")
    return f"fn:{getattr(target, '__module__', None)}.{getattr(target, '__qualname__', repr(target))}"


def check_graph(gm):
    """NotCacheable where a call of the graph (or an argument of one) is code that is not
    torch's: a custom op's fake and autograd implementations, a checkpoint's context_fn
    are the user's Python code, which AOTAutograd baked into its graphs and which could
    change while the graph does not."""
    # (AOTAutograd would take those as leading inputs, which the rebuilt function lacks)
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        raise NotCacheable("the graph holds parameters or buffers of its own")
    for name, m in gm.named_modules():
        if not isinstance(m, torch.fx.GraphModule):
            if name == "" or type(m) is torch.nn.Module:
                continue
            raise NotCacheable(f"a submodule {name} of type {type(m).__name__}")
        for n in m.graph.nodes:
            if n.op == "call_function":
                _target_text(n.target)
            for a in torch.fx.node.map_aggregate((n.args, n.kwargs), lambda a: a):
                if callable(a) and not isinstance(a, (torch.fx.Node, type)):
                    _target_text(a)


def _input_text(example_inputs) -> list:
    out = []
    storages = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            t = type(x)
            if t not in (torch.Tensor, torch.nn.Parameter) and \
                    type(x).__name__ != "FakeTensor":
                raise NotCacheable(f"input {i} is a {t.__name__}")
            if x.layout != torch.strided or any(not isinstance(s, int) for s in
                                                (*x.shape, *x.stride(), x.storage_offset())):
                raise NotCacheable(f"input {i}: a symbolic or non-strided layout")
            key = x.untyped_storage()._cdata if type(x).__name__ != "FakeTensor" else \
                id(x.untyped_storage())
            alias = storages.setdefault(key, i)
            out.append(("T", str(x.dtype), str(x.device), tuple(x.shape), tuple(x.stride()),
                        x.storage_offset(), x.untyped_storage().nbytes(), alias,
                        x.requires_grad, x.is_leaf, x._is_view(), x.is_conj(), x.is_neg(),
                        x.is_inference(), t is torch.nn.Parameter))
        elif type(x) in (int, float, bool, type(None)):
            out.append(("V", type(x).__name__, repr(x)))
        else:
            raise NotCacheable(f"input {i} is a {type(x).__name__}")
    return out


def _plain_config(value):
    if isinstance(value, (int, float, str, bool, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return repr(sorted(map(_plain_config, value)) if isinstance(value, (set, frozenset))
                    else [_plain_config(v) for v in value])
    if isinstance(value, dict):
        return repr(sorted((repr(k), _plain_config(v)) for k, v in value.items()))
    if callable(value):
        return f"callable:{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', None)}"
    return f"{type(value).__qualname__}:{value!r}"


def _state() -> tuple:
    """The process state AOTAutograd's result depends on."""
    autocast = []
    for device in torch._C._autocast_supported_devices():
        on = torch.is_autocast_enabled(device)
        autocast.append((device, on, str(torch.get_autocast_dtype(device)) if on else None))
    from torch._functorch import config as functorch_config  # (lazy: start-up time)
    functorch = functorch_config.get_config_copy()
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), tuple(autocast),
            torch.is_autocast_cache_enabled(), torch.are_deterministic_algorithms_enabled(),
            str(torch.get_default_dtype()),
            tuple((k, _plain_config(v)) for k, v in sorted(functorch.items())),
            config.aot_eager_keeps_python_floats, config.keep_kernel_formats)


def _callable_text(fn):
    """A decomposition by its code (NotCacheable where that code is not torch's)."""
    if isinstance(fn, functools.partial):
        return (_callable_text(fn.func), tuple(map(str, fn.args)),
                tuple(sorted((k, str(v)) for k, v in fn.keywords.items())))
    if not _torch_defined(fn):
        raise NotCacheable(f"a decomposition {fn!r:.80} that is not torch's")
    code = getattr(fn, "__code__", None)
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
            hashlib.sha256(code.co_code).hexdigest()[:16] if code is not None else None)


def _decompositions_text(decompositions) -> tuple:
    if not decompositions:
        return ()
    return tuple(sorted((str(op), _callable_text(fn)) for op, fn in decompositions.items()))


def key_of(example_inputs, variant: str, decompositions=None, partition_fn=None) -> str:
    """The artifact's key (NotCacheable where one cannot be made soundly).  The graph is
    not in it: the artifact is stored in the cache entry of the graph it was made from
    (warm_cache.py), under that entry's key (the frame's code and every function it
    inlined, versions, settings) and guards, in one checksummed file.  (Its FX code is
    not comparable either: the entry's graph, pickled, comes back with its constant
    tensors as attributes where the traced one made them with calls.)"""
    h = hashlib.sha256()
    for part in (_FORMAT, sys.version, torch.__version__, variant, _state(),
                 _decompositions_text(decompositions),
                 None if partition_fn is None else _target_text(partition_fn),
                 _input_text(example_inputs)):
        h.update(repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()


# --------------------------------------------------------------------------- capture
class _Capture(threading.local):
    current = None


_capture = _Capture()


def note_compiled_graph(gm):
    """Called by aot_eager's forward/inference compiler: the graph AOTAutograd compiled."""
    c = _capture.current
    if c is not None:
        c.setdefault("fw_graphs", []).append(gm)


def note_product(compiled):
    """Called by a backend's compilers with what they made of each graph (the triton
    backend's modules, forward then backward): kept with the record; returns it."""
    c = _capture.current
    if c is not None:
        c.setdefault("products", []).append(compiled)
    return compiled


class capturing:
    """While AOTAutograd compiles one graph in this thread: what it produced, recorded
    where its own compile path hands it to the AOTAutogradCache (which frametrace leaves
    off): `record` then holds the artifact's parts, or `record["refused"]` why not."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.record = {}
        self.installed = []

    def __enter__(self):
        if not self.enabled:
            return self
        try:
            # (lazy: a private module of torch's, which some versions lack)
            from torch._functorch._aot_autograd import graph_compile
        except ImportError:
            self.record["refused"] = "this torch has no graph_compile module"
            return self
        thread = threading.get_ident()
        for name, kind in (("_cache_autograd_info", "autograd"), ("_cache_inference_info", "inference")):
            original = getattr(graph_compile, name, None)
            if original is None:
                self.record["refused"] = f"this torch has no {name}"
                continue
            patched = self._recorder(original, kind, thread)
            setattr(graph_compile, name, patched)
            self.installed.append((graph_compile, name, original, patched))
        self.record["fw_graphs"] = []
        _capture.current = self.record
        return self

    def _recorder(self, original, kind, thread):
        signature = inspect.signature(original)
        record = self.record

        def recorder(*args, **kwargs):
            out = original(*args, **kwargs)     # (makes the metadata runtime-safe, picklable)
            if threading.get_ident() == thread:
                try:
                    record.setdefault("calls", []).append(
                        (kind, dict(signature.bind(*args, **kwargs).arguments)))
                except TypeError as e:
                    record["refused"] = f"{original.__name__} has another signature ({e})"
            return out
        return recorder

    def __exit__(self, *exc):
        _capture.current = None
        for module, name, original, patched in self.installed:
            if getattr(module, name) is patched:
                setattr(module, name, original)
        return False


_GRAPH_FILENAME = "<frametrace: cached AOT graph>"


def _reduced_graph(gm):
    """`gm` as pickle bytes: its code, without its meta (fake values, sources), and that
    code compiled (marshal's bytes, this Python's: sys.version is in the key), which a
    warm start runs instead of compiling the source (config.cache_graph_bytecode)."""
    fn, (body, import_block) = gm.__reduce__()
    body = dict(body)
    body["meta"] = {}
    bytecode = marshal.dumps(compile(import_block + (body.get("_code") or body["code"]),
                                     _GRAPH_FILENAME, "exec"))
    return pickle.dumps((fn, body, import_block, bytecode), protocol=pickle.HIGHEST_PROTOCOL)


class _CodeOnly(torch.nn.Module):
    """A graph's attributes and its generated `forward`, without the FX graph: what a
    boxed compiler runs.  (GraphModule's unpickling traces the code again to rebuild
    the graph, a third of a warm start's cost for GPT-2.)"""

    def __init__(self, body, forward):
        super().__init__()
        self.__dict__ = body
        self.forward = types.MethodType(forward, self)


def _graph_from(data):
    _, body, import_block, bytecode = pickle.loads(data)
    code = None
    if config.cache_graph_bytecode:
        try:
            code = marshal.loads(bytecode)
        except Exception:       # (damaged: the file's checksum makes it unlikely)
            code = None
        if type(code) is not types.CodeType or code.co_filename != _GRAPH_FILENAME:
            code = None
    if code is None:
        code = compile(import_block + (body.get("_code") or body["code"]), _GRAPH_FILENAME, "exec")
    namespace: dict = {}
    exec(code, namespace)
    return _CodeOnly(body, namespace["forward"])


def _cacheable(cfg):
    """AOTAutograd's config without its compilers, partitioner and decompositions (what
    the runtime wrappers read of it is plain data).  torch 2.13 has a method for this;
    on earlier ones, a copy with those fields emptied."""
    if hasattr(cfg, "to_cacheable"):
        return cfg.to_cacheable()
    return dataclasses.replace(cfg, **{f.name: ({} if f.name == "decompositions" else None)
                                       for f in dataclasses.fields(cfg)
                                       if f.name in ("decompositions", "cache_info") or callable(getattr(cfg, f.name))})


def artifact(record) -> bytes:
    """The bytes of what AOTAutograd produced (NotCacheable where it cannot be)."""
    if "refused" in record:
        raise NotCacheable(record["refused"])
    calls = record.get("calls") or []
    graphs = record.get("fw_graphs") or []
    if len(calls) != 1 or len(graphs) != 1:
        raise NotCacheable(f"{len(calls)} results and {len(graphs)} compiled graphs recorded")
    kind, a = calls[0]
    meta = a["fw_metadata"]
    if a.get("maybe_subclass_meta") is not None:
        raise NotCacheable("tensor subclasses")
    if meta.tokens:
        raise NotCacheable("effect tokens")
    if meta.is_rng_op_functionalized or meta.num_graphsafe_rng_states:
        raise NotCacheable("functionalized random ops")
    from torch._functorch import config as functorch_config  # (lazy: start-up time)
    if functorch_config.debug_assert:
        raise NotCacheable("functorch's debug_assert wrapper")
    tc = torch._guards.TracingContext.try_get()
    if tc is not None and (tc.fakify_first_call or any(p is None for p in tc.params_flat or ())):
        raise NotCacheable("a tracing context that fakifies outputs or freezes parameters")
    parts = {"kind": kind, "fw": _reduced_graph(graphs[0]), "fw_metadata": meta,
             "wrappers": a["wrappers"], "aot_config": _cacheable(a["aot_config"]),
             "disable_amp": torch._C._is_any_autocast_enabled()}
    if kind == "autograd":
        if [x for x in a["flat_args"] if type(x).__name__ == "BackwardState"]:
            raise NotCacheable("a backward-state input")
        if a["bw_module"] is None:
            raise NotCacheable("no backward graph")
        parts.update(bw=_reduced_graph(a["bw_module"]),
                     num_fw_outs_saved_for_bw=a["num_fw_outs_saved_for_bw"],
                     indices_of_inps_to_detach=list(a["_indices_of_inps_to_detach"]),
                     num_symints_saved_for_bw=a["num_symints_saved_for_bw"])
    try:
        return pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise NotCacheable(f"cannot pickle AOTAutograd's result ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------- loading
def _autograd_function(runtime_wrappers, **fields):
    """AOTDispatchAutograd.post_compile over the compiled forward and backward: from torch
    2.13 it takes one AOTDispatchAutogradCompileSpec (which also names the backward's
    compiler); torch 2.11 takes the same fields as arguments, in this order."""
    spec = getattr(runtime_wrappers, "AOTDispatchAutogradCompileSpec", None)
    post = runtime_wrappers.AOTDispatchAutograd.post_compile
    if spec is not None:
        return post(spec(**fields, bw_compiler=None, try_save_cache_entry=None))
    order = ("compiled_fw_func", "compiled_bw_func", "maybe_subclass_meta", "num_symints_saved_for_bw",
             "backward_state_indices", "disable_amp", "indices_of_inps_to_detach", "lazy_backward_info",
             "aot_config")
    return post(*(fields[k] for k in order), fw_metadata=fields["fw_metadata"], try_save_cache_entry=None)


# (what the rebuilt functions skipped: tests read it)
STATS = {"alias_checks_skipped": 0}


def _skip_first_call_alias_check(fn, rw) -> int:
    """AOTAutograd's runtime wrapper runs a compiled function's first call under a
    dispatch mode (`_AnalyzeCustomOpInputOutputMode`, while
    `torch._functorch.config.check_custom_op_aliasing`) that checks each custom op's
    outputs against its inputs for aliasing; builtin ops are passed through, each still
    paying a Python dispatch (GPT-2, 6 layers: ~0.02 s).  A cached graph calls torch's
    own ops only (`check_graph`: a custom op makes it not cacheable), so the rebuilt
    wrapper's first-call context is marked used.  The context is found in the wrapper's
    closures; where torch keeps it elsewhere, none is found and the check runs (0)."""
    context = getattr(rw, "_FirstInvocationContext", None)     # (torch 2.13; older: none)
    found, seen, stack = 0, set(), [(fn, 0)] if context is not None else []
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > 8:
            continue
        seen.add(id(obj))
        if isinstance(obj, context):
            obj._is_first = False
            found += 1
            continue
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                stack.append((cell.cell_contents, depth + 1))
            except ValueError:      # (an empty cell)
                pass
        inner = getattr(obj, "__wrapped__", None)
        if inner is not None:
            stack.append((inner, depth + 1))
    return found


def rebuild(data: bytes, boxed_compiler):
    """The compiled function of an artifact, its runtime wrappers made by the same calls
    as AOTAutograd's compile path (graph_compile.py: _aot_stage2b_compile_forward_or_
    inference, _aot_stage2c_make_*_function; aot_autograd.py: aot_module_simplified's
    `forward`)."""
    # (lazy: start-up time.  AOTAutograd's entry module first: importing its runtime
    # wrappers on their own is an import cycle in torch)
    from torch._functorch import aot_autograd  # noqa: F401
    from torch._functorch._aot_autograd import runtime_wrappers as rw  # (lazy: as above)
    parts = pickle.loads(data)
    meta, cfg = parts["fw_metadata"], parts["aot_config"]
    autograd = parts["kind"] == "autograd"
    fw = _graph_from(parts["fw"])
    compiled_fw = boxed_compiler(fw, None)
    compiled_fw = rw.EffectTokensWrapper().post_compile(compiled_fw, cfg, runtime_metadata=meta)
    compiled_fw = rw.AOTDispatchSubclassWrapper(
        fw_only=None, trace_joint=False, maybe_subclass_meta=None,
        num_fw_outs_saved_for_bw=parts.get("num_fw_outs_saved_for_bw"),
    ).post_compile(compiled_fw, cfg, runtime_metadata=meta)
    compiled_fw = rw.FunctionalizedRngRuntimeWrapper(return_new_outs=not autograd).post_compile(
        compiled_fw, cfg, runtime_metadata=meta)
    if autograd:
        bw = _graph_from(parts["bw"])
        compiled_fn = _autograd_function(
            rw, compiled_fw_func=compiled_fw, compiled_bw_func=boxed_compiler(bw, None),
            maybe_subclass_meta=None, num_symints_saved_for_bw=parts["num_symints_saved_for_bw"],
            backward_state_indices=[], disable_amp=parts["disable_amp"],
            indices_of_inps_to_detach=parts["indices_of_inps_to_detach"],
            lazy_backward_info=None, aot_config=cfg, fw_metadata=meta)
    else:
        compiled_fn = rw.RuntimeWrapper(indices_of_inps_to_detach=[], trace_joint=False,
                                        disable_amp=parts["disable_amp"]).post_compile(
            compiled_fw, cfg, runtime_metadata=meta)
    compiled_fn, _ = rw.post_compile(parts["wrappers"], compiled_fn, cfg, runtime_metadata=meta)
    if config.cache_skip_alias_check:
        STATS["alias_checks_skipped"] += _skip_first_call_alias_check(compiled_fn, rw)

    def forward(*runtime_args):
        return compiled_fn(list(runtime_args))
    forward.__frametrace_from_aot_cache__ = True
    return forward
