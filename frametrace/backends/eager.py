"""`eager`: run the FX graph as Python, op by op (chains of view ops as one
`as_strided` each, see view_chains.py)."""
from . import register_backend, view_chains


@register_backend("eager")
def eager(gm, example_inputs):
    gm = view_chains.collapse(gm) or gm
    # gm.forward, not gm: skipping nn.Module.__call__ saves a microsecond a call.
    return gm.forward


# The graph's ops run as traced, by the kernels: what a tensor's layout decides (whether
# reshape views or copies) the kernels decide, not a re-trace over FakeTensors.
eager.__frametrace_runs_ops_as_traced__ = True
