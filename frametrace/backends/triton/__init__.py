"""`triton`: frametrace's own code generator.  AOTAutograd gives a core-aten graph; its
pointwise, reduction and view ops are lowered, fused and written as Triton kernels that a
generated Python wrapper launches, while matrix products, convolutions, attention and
ops without a lowering stay aten calls in the same wrapper.

>>> f = frametrace.optimize(backend="triton")(lambda x, w: torch.softmax(x * w, -1))
>>> f(torch.randn(8, 4096, device="cuda"), torch.randn(4096, device="cuda"))
>>> frametrace.backends.triton.last_compiled().kernels   # one fused kernel

On CPU tensors the kernels run in Triton's interpreter when TRITON_INTERPRET=1 (tests);
otherwise CPU graphs run with aot_eager.  `FRAMETRACE_LOGS=output_code` logs the wrapper
and the kernels; `last_compiled().fallbacks` (and `FRAMETRACE_LOGS=perf_hints`) name the
ops that ran as aten calls though a kernel could have run them, and why.  In training the
backward graph is compiled too (partition.py splits the joint graph).  Importing this
module does not import Triton.
"""
from .. import register_backend


@register_backend("triton")
def triton_backend(gm, example_inputs):
    from .backend import compile_graph  # (lazy: the pipeline loads at the first compile)
    return compile_graph(gm, example_inputs)


def _configure(mode, options):
    """optimize(backend="triton", mode=, options=): a mode's settings, then `options`."""
    from . import config  # (lazy: `import frametrace` loads no module of the backend)
    return configured({**config.MODES.get(mode or "default", {}), **(options or {})})


triton_backend.__frametrace_configure__ = _configure


def _load_artifact(gm, example_inputs, artifact):
    """A warm start's compiled function from the result the cold one stored
    (result_cache.py), or None where its key is not this call's."""
    from .backend import load_artifact  # (lazy: the pipeline loads at the first compile)
    return load_artifact(gm, example_inputs, artifact)


triton_backend.__frametrace_load_artifact__ = _load_artifact
triton_backend.__frametrace_artifact_switch__ = "cache_triton_results"
triton_backend.__frametrace_artifact_what__ = "the triton backend's modules: no lowering"


def _recomputes_random(devices) -> bool:
    """A checkpointed region's random draw is recomputed in the backward from the
    forward's numbers: the decompositions draw one Philox key per call (philox_seed,
    tagged nondeterministic_seeded), which AOTAutograd's min-cut wraps in
    run_and_save_rng_state / run_with_rng_state, and each element's number is a function
    of that key and its counter.  Checked on CPU tensors (Triton's interpreter runs the
    kernels) and on CUDA (the CUDA generator's state saved and restored);
    `config.checkpoint_random_on_cuda` turns the CUDA path off, and such a region then
    runs in CPython there."""
    from . import config  # (lazy: as above)
    return all(d.type != "cuda" for d in devices) or config.checkpoint_random_on_cuda


triton_backend.__frametrace_recomputes_random_ops__ = _recomputes_random


def configured(overrides: dict):
    """The triton backend with `overrides` of `config` (from `optimize(mode=, options=)`)
    for its compiles and for the modules they make, whatever `config` says later."""
    from . import config  # (lazy: as above)
    unknown = sorted(set(overrides) - set(config.settings()))
    if unknown:
        raise ValueError(f"unknown triton option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(config.settings()))}")

    def triton_with_settings(gm, example_inputs):
        from .backend import COMPILED, compile_graph  # (lazy: at the first compile)
        saved = {k: getattr(config, k) for k in overrides}
        before = {id(m) for m in COMPILED}
        for k, v in overrides.items():
            setattr(config, k, v)
        try:
            compiled = compile_graph(gm, example_inputs)
            for module in COMPILED:
                if id(module) not in before:
                    module.settings = dict(overrides)
            return compiled
        finally:
            for k, v in saved.items():
                setattr(config, k, v)

    triton_with_settings.__frametrace_backend__ = True
    triton_with_settings.__frametrace_name__ = "triton"
    triton_with_settings.__frametrace_recomputes_random_ops__ = _recomputes_random
    return triton_with_settings


def last_compiled():
    """The CompiledModule of the most recently compiled graph (`.kind`: "inference", or
    a training graph's "forward" or "backward"), or None."""
    from .backend import COMPILED  # (lazy: nothing compiled, nothing to load)
    return COMPILED[-1] if COMPILED else None
