"""`inductor`: torch's own Inductor, as a pass-through for comparisons.  `mode=` and
`options=` of `frametrace.optimize` reach it as they do with torch.compile."""
from . import register_backend


@register_backend("inductor")
def inductor(gm, example_inputs, mode=None, options=None):
    from torch._inductor import list_mode_options  # (lazy: start-up time)
    from torch._inductor.compile_fx import compile_fx  # (lazy: start-up time)
    patches = {**(list_mode_options(mode) if mode not in (None, "default") else {}), **(options or {})}
    return compile_fx(gm, example_inputs, config_patches=patches or None)


# A checkpointed region's random ops: Inductor lowers AOTAutograd's run_and_save_rng_state
# / run_with_rng_state, so its backward recomputes the forward's numbers (as under
# torch.compile, which traces such a region without a break).
inductor.__frametrace_recomputes_random_ops__ = True
