"""`inductor`: torch's own Inductor, as a pass-through for comparisons."""
from . import register_backend


@register_backend("inductor")
def inductor(gm, example_inputs):
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs)
