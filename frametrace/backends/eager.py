"""`eager`: run the FX graph as Python, op by op."""
from . import register_backend


@register_backend("eager")
def eager(gm, example_inputs):
    # gm.forward, not gm: skipping nn.Module.__call__ saves a microsecond a call.
    return gm.forward
