"""`aot_eager`: AOTAutograd traces the joint forward/backward graph and splits it; both
halves run eagerly.  Gradients through the compiled function match eager's."""
from torch._functorch.aot_autograd import aot_module_simplified
from functorch.compile import make_boxed_func

from . import register_backend


def _boxed_forward(gm, example_inputs):
    return make_boxed_func(gm.forward)


@register_backend("aot_eager")
def aot_eager(gm, example_inputs):
    return aot_module_simplified(gm, example_inputs, fw_compiler=_boxed_forward,
                                 bw_compiler=_boxed_forward,
                                 keep_inference_input_mutations=True)
