"""`aot_eager`: AOTAutograd traces the joint forward/backward graph and splits it; both
halves run eagerly.  Gradients through the compiled function match eager's."""
from . import register_backend


def _boxed_forward(gm, example_inputs):
    from functorch.compile import make_boxed_func
    return make_boxed_func(gm.forward)


@register_backend("aot_eager")
def aot_eager(gm, example_inputs):
    # Imported on first use: AOTAutograd pulls in torch._dynamo and triton, seconds
    # that `import frametrace` should not pay.
    from torch._functorch.aot_autograd import aot_module_simplified
    return aot_module_simplified(gm, example_inputs, fw_compiler=_boxed_forward,
                                 bw_compiler=_boxed_forward,
                                 keep_inference_input_mutations=True)


# Input mutations of a functionalized graph are applied after all of its compute: a
# graph that raises has written no input (codegen's failure path relies on it).
aot_eager.__frametrace_defers_input_mutations__ = True


@register_backend("aot_eager_decomp_partition")
def aot_eager_decomp_partition(gm, example_inputs):
    """aot_eager with ATen decompositions and the min-cut partitioner (what inductor's
    AOTAutograd stage does), both halves still run eagerly: tells AOTAutograd problems
    from code generation problems."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    return aot_module_simplified(gm, example_inputs, fw_compiler=_boxed_forward,
                                 bw_compiler=_boxed_forward,
                                 decompositions=core_aten_decompositions(),
                                 partition_fn=min_cut_rematerialization_partition,
                                 keep_inference_input_mutations=True)


aot_eager_decomp_partition.__frametrace_defers_input_mutations__ = True
