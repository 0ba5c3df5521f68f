"""AOTAutograd with Python-float graph inputs kept as Python floats (the backends that
can run them so: aot_eager, triton's aten path)."""
import threading

import torch


class python_floats_kept:
    """While AOTAutograd compiles (for aot_eager, and for triton, whose lowering then runs
    such a graph as aten ops) a graph with a symbolic float input (a
    learning rate or a beta that changed between calls): its pass that rewrites
    Python-float arithmetic as float64 tensor ops is off, in this thread.  The pass is
    for code generators that cannot take a float argument; where it cannot rewrite an
    op (`add_(g, alpha=-lr)`, `lerp_(g, 1 - beta1)`, `beta1 ** step`) it asks for the
    float as a constant, and every new value recompiles (SGD under any schedule, Adam
    under OneCycleLR).  aot_eager's graphs run their ATen ops as they are: the float
    reaches each op as the Python float eager passes.  torch offers no switch (torch
    2.13 reads a predicate cached for the process, 2.11 the environment), so the pass
    as AOTAutograd's graph compiler calls it is replaced, in this thread, for the call
    (`enabled`: `config.aot_eager_keeps_python_floats`, `config.triton_keeps_python_floats`)."""

    def __init__(self, example_inputs, enabled: bool):
        self.active = enabled and any(isinstance(x, torch.SymFloat) for x in example_inputs)
        self.installed = None

    def __enter__(self):
        if not self.active:
            return
        try:
            # (lazy: a private module of torch's, which some versions lack)
            from torch._functorch._aot_autograd import graph_compile as caller
            original = caller.tensorify_python_scalars
        except (ImportError, AttributeError):
            return          # (another torch: its own behaviour, a restart per value at worst)
        thread = threading.get_ident()

        def tensorify(gm, *args, **kwargs):
            return None if threading.get_ident() == thread else original(gm, *args, **kwargs)
        caller.tensorify_python_scalars = tensorify
        self.installed = (caller, original, tensorify)

    def __exit__(self, *exc):
        if self.installed is not None:
            caller, original, tensorify = self.installed
            if caller.tensorify_python_scalars is tensorify:
                caller.tensorify_python_scalars = original
        return False
