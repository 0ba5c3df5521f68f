"""`aot_eager`: AOTAutograd traces the joint forward/backward graph and splits it; both
halves run eagerly.  Gradients through the compiled function match eager's."""
import operator
import warnings
from torch._decomp import core_aten_decompositions
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.func import functionalize
import torch

from .. import config
from ..shapes import overlaps_itself
from . import register_backend
from .python_floats import python_floats_kept
from .kernel_formats import keep_kernel_formats
from . import aot_cache, write_marks


def _boxed_forward(gm, example_inputs):
    aot_cache.note_compiled_graph(gm)
    return write_marks.boxed(gm)


def _with_artifact(compiled, gm, example_inputs, variant, **how):
    """`compiled` carrying, for the on-disk cache, what AOTAutograd produced and its key:
    `__frametrace_artifact__()` gives (key, bytes), or (None, why not).  The key is taken
    now (grad mode, autocast, the inputs are this compile's); the bytes when the cache
    asks (an entry it cannot store, symbolic sizes, pickles nothing)."""
    record = how.pop("record")
    try:
        aot_cache.check_graph(gm)
        key = aot_cache.key_of(example_inputs, variant, **how)
    except aot_cache.NotCacheable as e:
        why = str(e)        # (`e` is unbound once the except clause ends)
        compiled.__frametrace_artifact__ = lambda: (None, why)
        return compiled
    except Exception as e:      # (our bug: the compile itself is good, only not cached)
        why = f"{type(e).__name__}: {e}"
        compiled.__frametrace_artifact__ = lambda: (None, why)
        return compiled
    made = []

    def artifact():
        if not made:
            try:
                made.append((key, aot_cache.artifact(record)))
            except Exception as e:
                made.append((None, f"{type(e).__name__}: {e}"))
            record.clear()      # (AOTAutograd's fake inputs and graphs: not kept alive)
        return made[0]
    compiled.__frametrace_artifact__ = artifact
    return compiled


def _from_artifact(gm, example_inputs, artifact, variant, **how):
    """The compiled function rebuilt from a cached artifact whose key is this call's, or
    None (with the reason logged) where it is not."""
    stored_key, data = artifact
    try:
        key = aot_cache.key_of(example_inputs, variant, **how)
    except aot_cache.NotCacheable as e:
        aot_cache.log.info("frametrace: cache: AOTAutograd's cached result not used: %s", e)
        return None
    if key != stored_key:
        aot_cache.log.info("frametrace: cache: AOTAutograd's cached result is for other inputs, "
                           "state or settings; AOTAutograd traces the graph again")
        return None
    return aot_cache.rebuild(data, _boxed_forward)


def _caching() -> bool:
    return config.cache and config.cache_aot_results


# (The loaders read no graph: warm_cache passes None.  The cached graphs already hold
# what keep_kernel_formats inserted, which the key's settings name.)
def _load_aot_eager(gm, example_inputs, artifact):
    return _from_artifact(gm, example_inputs, artifact, "aot_eager")


@register_backend("aot_eager")
def aot_eager(gm, example_inputs):
    # Imported on first use: AOTAutograd pulls in torch._dynamo and triton, seconds
    # that `import frametrace` should not pay.
    from torch._functorch.aot_autograd import aot_module_simplified
    if config.keep_kernel_formats:
        keep_kernel_formats(gm)
    try:
        with python_floats_kept(example_inputs, config.aot_eager_keeps_python_floats), \
                aot_cache.capturing(_caching()) as capture:
            compiled = aot_module_simplified(gm, example_inputs, fw_compiler=_boxed_forward,
                                             bw_compiler=_boxed_forward,
                                             keep_inference_input_mutations=True)
        if capture.enabled:
            compiled = _with_artifact(compiled, gm, example_inputs, "aot_eager",
                                      record=capture.record)
        return compiled
    except Exception as e:
        if type(e).__name__ == "TensorifyScalarRestartAnalysis":
            raise       # a float to specialise: frametrace compiles again (convert.py)
        fallback = _functionalized(gm, example_inputs) if config.aot_eager_functionalized_fallback else None
        if fallback is None:
            raise
        warnings.warn(f"frametrace: aot_eager: AOTAutograd could not compile a graph "
                      f"({type(e).__name__}: {str(e).partition(chr(10))[0][:200]}); it runs as eager "
                      "ops, functionalized (frametrace.config.aot_eager_functionalized_fallback)",
                      stacklevel=2)
        return fallback


def _functionalized(gm, example_inputs):
    """`gm` run eagerly under torch.func.functionalize (input writes applied after the
    rest, as AOTAutograd's graphs apply them: the backend's promise below holds), or
    None where that fails too on the example inputs (tried on their FakeTensors)."""
    run = functionalize(gm.forward, remove="mutations")
    # A checkpointed region run as eager ops recomputes without the forward's random
    # state (the higher-order op's eager implementation): no fallback.
    if any(n.target is torch.ops.higher_order.tag_activation_checkpoint
           for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes):
        return None
    # A write into an input whose elements share memory copies back differently from
    # eager's in-place kernel: no fallback (BackendCompilerFailed, never a wrong value).
    # Any overlap, not only a zero stride (an as_strided whose rows overlap).  A graph
    # that writes nothing (an expanded input only read: max_unpool's backward, which
    # AOTAutograd cannot trace over it) has nothing to copy back.
    if _may_write(gm) and any(isinstance(x, torch.Tensor) and x.layout == torch.strided and
                              overlaps_itself(x) for x in example_inputs):
        return None
    try:
        fakes = [x for x in example_inputs if isinstance(x, FakeTensor)]
        # (never the real inputs: the dry run would write them)
        mode = fakes[0].fake_mode if fakes else FakeTensorMode()
        args = [x if isinstance(x, FakeTensor) or not isinstance(x, torch.Tensor)
                else mode.from_tensor(x) for x in example_inputs]
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(*args)
            # An output that is a view of an input comes out of functionalize as a
            # copy (a write through it would miss the input): no fallback.  Seen by
            # running the graph itself on copies of the inputs.
            fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            outs = gm.forward(*fresh)
        if _shares_memory(outs, fresh):
            return None
    except Exception:
        return None
    return write_marks.unboxed(run)


def _shares_memory(outs, inputs) -> bool:
    def storage(t):
        return t.untyped_storage()._cdata
    keys = {storage(a) for a in inputs if isinstance(a, torch.Tensor) and a.layout == torch.strided}
    flat = outs if isinstance(outs, (list, tuple)) else [outs]
    return any(isinstance(o, torch.Tensor) and o.layout == torch.strided and storage(o) in keys
               for o in flat)


_IN_PLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift, operator.imatmul, operator.setitem})


def _may_write(gm) -> bool:
    """Whether a node of `gm` (or of a subgraph) may write a tensor: an in-place method
    or function (a trailing underscore, a mutable schema, `inplace=`/`out=`), an
    augmented assignment, an item store, or a module call.  In doubt, True."""
    for m in gm.modules():
        if not isinstance(m, torch.fx.GraphModule):
            continue
        for n in m.graph.nodes:
            if n.op == "call_module":
                return True
            if n.op == "call_method":
                name = n.target
            elif n.op == "call_function":
                if n.target in _IN_PLACE_OPERATORS or n.kwargs.get("inplace") or "out" in n.kwargs:
                    return True
                schema = getattr(n.target, "_schema", None)
                if schema is not None and schema.is_mutable:
                    return True
                name = getattr(n.target, "__name__", "")
            else:
                continue
            if isinstance(name, str) and (name.endswith("_") and not name.endswith("__")
                                          or name in ("__setitem__", "__delitem__")
                                          or name.startswith("__i") and name.endswith("__")):
                return True
    return False


# Input mutations of a functionalized graph are applied after all of its compute: a
# graph that raises from its compute has written no input, and says so (write_marks);
# codegen's failure path reruns the frame only then.
aot_eager.__frametrace_defers_input_mutations__ = True
# Its partitioners recompute a checkpointed region's random ops with the random state
# the forward saved (functionalize_rng_ops): the backward sees the forward's numbers.
aot_eager.__frametrace_recomputes_random_ops__ = True
# A warm start's compile from what the on-disk cache kept (warm_cache.py).
aot_eager.__frametrace_load_artifact__ = _load_aot_eager


@register_backend("aot_eager_decomp_partition")
def aot_eager_decomp_partition(gm, example_inputs):
    """aot_eager with ATen decompositions and the min-cut partitioner (what inductor's
    AOTAutograd stage does), both halves still run eagerly: tells AOTAutograd problems
    from code generation problems."""
    from functorch.compile import min_cut_rematerialization_partition  # (lazy: start-up time)
    from torch._functorch.aot_autograd import aot_module_simplified  # (lazy: start-up time)
    if config.keep_kernel_formats:
        keep_kernel_formats(gm)
    decompositions = core_aten_decompositions()
    with aot_cache.capturing(_caching()) as capture:
        compiled = aot_module_simplified(gm, example_inputs, fw_compiler=_boxed_forward,
                                         bw_compiler=_boxed_forward,
                                         decompositions=decompositions,
                                         partition_fn=min_cut_rematerialization_partition,
                                         keep_inference_input_mutations=True)
    if capture.enabled:
        compiled = _with_artifact(compiled, gm, example_inputs, "aot_eager_decomp_partition",
                                  record=capture.record, decompositions=decompositions,
                                  partition_fn=min_cut_rematerialization_partition)
    return compiled


def _load_aot_eager_decomp_partition(gm, example_inputs, artifact):
    from functorch.compile import min_cut_rematerialization_partition  # (lazy: start-up time)
    return _from_artifact(gm, example_inputs, artifact, "aot_eager_decomp_partition",
                          decompositions=core_aten_decompositions(),
                          partition_fn=min_cut_rematerialization_partition)


aot_eager_decomp_partition.__frametrace_defers_input_mutations__ = True
aot_eager_decomp_partition.__frametrace_recomputes_random_ops__ = True
aot_eager_decomp_partition.__frametrace_load_artifact__ = _load_aot_eager_decomp_partition
