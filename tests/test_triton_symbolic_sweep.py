"""backend="triton" with symbolic sizes (dynamic shapes), swept against eager: each program
is called with a sequence of sizes that crosses power-of-two buckets (5, 16, 17, 1, 33, 2,
64, 100, back to 5: 1 and multiples of 16 among them), fresh inputs each call, and its
results compared with eager's (values with NaN/inf positions, dtypes, shapes); and what was
compiled is checked: a graph with symbolic sizes ran as kernels (a sweep that would still
pass with everything eager proves nothing), and no graph ran eagerly as a whole.

The block-size mechanisms are attacked too: `config.tuned_buckets` 1 and 2 make later
buckets launch with another bucket's choice, and the candidates picked are varied (on the
CPU, Triton's interpreter always takes the heuristic first one; here every candidate gets
its turn).  PyTorch's OpInfo database serves as a peer suite: its samples resized along
their first dimension.  A sampled part runs by default; FRAMETRACE_SWEEP_FULL=1 runs all of
it (the OpInfo part: every op of the lists below, two samples each, ~2 min on 2 cores)."""
import itertools
import logging
import os

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import frametrace
from triton_harness import eager_and_compiled, sample_program
from frametrace.testing import CompileCounter

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, backend, config  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

FULL = os.environ.get("FRAMETRACE_SWEEP_FULL") == "1"
SIZES = (5, 16, 17, 1, 33, 2, 64, 100, 5)


def sweep(fn, make, sizes=SIZES, atol=1e-4, rtol=1e-4, max_frames=4, symbolic=True, backward=False,
          min_frames=1):
    """fn compiled (triton) against eager on make(n)'s inputs for each n of `sizes`: outputs,
    and inputs after the call; exceptions of the same type.  `backward`: also the gradients
    of a weighted sum of the (single) output on each float input.  Returns the counter."""
    backend.COMPILED.clear()
    before = backend.STATS["eager_graphs"]
    counter = CompileCounter(inner="triton")
    compiled = frametrace.optimize(backend=counter)(fn)
    seen_symbolic = False
    reruns = _Reruns()
    logging.getLogger("frametrace").addHandler(reruns)
    try:
        for n in sizes:
            _call(fn, compiled, make, n, atol, rtol, backward, reruns)
            seen_symbolic = seen_symbolic or any(m.symbolic for m in backend.COMPILED)
    finally:
        logging.getLogger("frametrace").removeHandler(reruns)
    assert backend.STATS["eager_graphs"] == before, "a graph ran eagerly instead of as kernels"
    if symbolic:
        assert seen_symbolic, "no graph with symbolic sizes went through the triton backend"
    assert min_frames <= counter.frame_count <= max_frames, counter.frame_count
    return counter


class _Reruns(logging.Handler):
    """The log lines of graphs that raised and whose frame ran again in CPython."""
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        if "the frame runs in CPython" in record.getMessage():
            self.lines.append(record.getMessage())


def _call(fn, compiled, make, n, atol, rtol, backward, reruns):
    """One call of each at size n, compared (see `sweep`)."""
    torch.manual_seed(n)
    where = f"{getattr(fn, '__name__', fn)} at n={n}"
    if eager_and_compiled(fn, compiled, make(n), where, atol, rtol, backward):
        # (a graph that raised where eager does not: right values from CPython's rerun)
        assert not reruns.lines, f"{where}: {reruns.lines}"
    reruns.lines.clear()


def _cycled_pick(monkeypatch):
    """autotune.pick takes each kernel shape's candidates in turn (the first shape its
    first, the next its second, ...) instead of the interpreter's heuristic first one."""
    turn = itertools.count()

    def pick(name, xnumel, rnumel, configs, run, build=None):
        key = (name, xnumel, rnumel)
        if key not in autotune.TUNED:
            autotune.TUNED[key] = configs[next(turn) % len(configs)]
        return autotune.TUNED[key]
    monkeypatch.setattr(autotune, "pick", pick)
    monkeypatch.setattr(config, "autotune_candidates", "all")
    autotune.TUNED.clear()


def _rows(n, *shape, dtype=torch.float32):
    return torch.randn(n, *shape, dtype=dtype)


# fn, inputs for size n, tolerance: programs whose sizes follow n
PROGRAMS = {
    "pointwise": (lambda x: x.sin() * 2 + 1, lambda n: (_rows(n, 7),)),
    "int_pointwise": (lambda x: (x * 3) // 2 + x % 5, lambda n: (torch.randint(-50, 50, (n, 7)),)),
    "bool_ops": (lambda x, y: (x > 0) & ~y, lambda n: (_rows(n, 3), torch.rand(n, 3) > 0.5)),
    "nan_inf": (lambda x: torch.where(x > 1, float("nan"), x).exp() * 100, lambda n: (_rows(n, 3) * 50,)),
    "softmax_row": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(3, n),)),
    "softmax_col": (lambda x: torch.softmax(x, 0), lambda n: (_rows(n, 5),)),
    "log_softmax_bf16": (lambda x: torch.log_softmax(x, -1), lambda n: (torch.randn(3, n, dtype=torch.bfloat16),)),
    "sum_dim0_outer": (lambda x: x.sum(0), lambda n: (_rows(n, 64),)),
    "sum_dim1": (lambda x: x.sum(1), lambda n: (_rows(n, 6),)),
    "mean_all": (lambda x: x.mean(), lambda n: (_rows(n, 6),)),
    "amax_int": (lambda x: x.amax(-1), lambda n: (torch.randint(-9, 9, (3, n)),)),
    "argmax": (lambda x: x.argmax(-1), lambda n: (torch.randn(3, n),)),
    "argmin_dim0": (lambda x: x.argmin(0), lambda n: (_rows(n, 4),)),
    "var_mean": (lambda x: torch.var_mean(x, 0), lambda n: (_rows(n, 5),)),
    "any_all": (lambda x: ((x > 1.5).any(-1), (x > -3).all(0)), lambda n: (_rows(n, 3),)),
    "cumsum_row": (lambda x: x.cumsum(-1), lambda n: (torch.randn(3, n),)),
    "cumsum_int_col": (lambda x: x.cumsum(0), lambda n: (torch.randint(-5, 5, (n, 3)),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), lambda n: (_rows(n, 8), torch.randn(8), torch.randn(8))),
    "layer_norm_row": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                       lambda n: (torch.randn(3, n), torch.randn(n), torch.randn(n))),
    "transposed_in": (lambda x: (x.t() * 2).sum(-1), lambda n: (_rows(n, 6),)),
    "transposed_out": (lambda x: x.t() + 1, lambda n: (_rows(n, 6),)),
    "expanded": (lambda x, y: x + y, lambda n: (_rows(n, 1).expand(n, 5), torch.randn(5))),
    "channels_last": (lambda x: x.relu() + x.mean((2, 3), keepdim=True),
                      lambda n: (torch.randn(2, 3, n, 4).to(memory_format=torch.channels_last),)),
    "permute3": (lambda x: x.permute(2, 0, 1).sum((1, 2)), lambda n: (torch.randn(n, 3, n + 1),)),
    "two_sizes": (lambda x: (x - x.mean(-1, keepdim=True)).pow(2).mean(0), lambda n: (_rows(n, 2 + (n * 7) % 11),)),
    "size_as_value": (lambda x: x / x.shape[0] + x.shape[1], lambda n: (torch.randn(n, n + 2),)),
    "cat_stack": (lambda x, y: (torch.cat([x, y * 2], 0), torch.stack([x, x], 1)), lambda n: (_rows(n, 3), torch.randn(4, 3))),
    "where_masked_fill": (lambda x, m: torch.where(m, x, -x).masked_fill(x > 1, 0).sum(-1),
                          lambda n: (torch.randn(3, n), torch.rand(3, n) > 0.5)),
    "gather_index": (lambda x, i: (x.gather(1, i), x[:, i[0]]), lambda n: (torch.randn(3, n), torch.randint(0, n, (3, 4)))),
    "embedding": (lambda w, i: F.embedding(i, w).sum(1), lambda n: (torch.randn(11, 4), torch.randint(0, 11, (2, n)))),
    "negative_index": (lambda x, i: x[i], lambda n: (_rows(n, 3), torch.tensor([-1, -n, 0]))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda n: (_rows(n, 7), torch.randint(0, 7, (n,)))),
    "attention_mask": (lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) / 2 + m, -1) @ v,
                       lambda n: (torch.randn(2, n, 8), torch.randn(2, n, 8), torch.randn(2, n, 8),
                                  torch.where(torch.rand(n, n) > 0.3, 0.0, float("-inf")))),
    "in_place_input": (lambda x: x.mul_(2).add_(1), lambda n: (_rows(n, 3),)),
}
# sampled by default (the others with FRAMETRACE_SWEEP_FULL=1): reductions inner and outer,
# scans, int/bool dtypes, non-contiguous inputs, indexing, NaN positions
SAMPLED = ("int_pointwise", "nan_inf", "softmax_row", "log_softmax_bf16", "sum_dim0_outer",
           "argmin_dim0", "any_all", "cumsum_int_col", "layer_norm", "transposed_out",
           "channels_last", "two_sizes", "size_as_value", "cat_stack", "gather_index",
           "negative_index", "in_place_input")
_BF16 = {"log_softmax_bf16"}


@pytest.mark.parametrize("name", [n for n in PROGRAMS if FULL or n in SAMPLED])
def test_sizes_across_buckets(name):
    fn, make = PROGRAMS[name]
    tol = 2e-2 if name in _BF16 else 1e-4
    sweep(fn, make, atol=tol, rtol=tol)


@pytest.mark.parametrize("buckets", [1, 2])
@pytest.mark.parametrize("name", ["softmax_row", "sum_dim0_outer", "cumsum_row"] +
                         (["layer_norm_row", "argmax"] if FULL else []))
def test_reused_buckets_and_every_candidate(monkeypatch, buckets, name):
    """Sizes far from the buckets tuned, launched with another bucket's block sizes (and
    each kernel shape with another candidate): masks and looped symbolic rows make every
    candidate right for every extent."""
    _cycled_pick(monkeypatch)
    monkeypatch.setattr(config, "tuned_buckets", buckets)
    fn, make = PROGRAMS[name]
    sweep(fn, make, sizes=(40, 3, 17, 200, 2, 1000, 33), max_frames=3)


def test_looped_rows_longer_than_persistent_blocks():
    """Rows longer than config.persistent_rblock_max, of symbolic length: looped kernels."""
    sweep(lambda x: (torch.softmax(x, -1), x.sum(-1)), lambda n: (torch.randn(1, n),),
          sizes=(16390, 20000, 16385), max_frames=2)


def test_size_zero_and_one():
    """0 and 1 specialize (the ShapeEnv's rule): static graphs around the symbolic one;
    an empty graph runs eagerly by design, so only the values are checked for it."""
    fn, make = PROGRAMS["softmax_row"]
    sweep(fn, make, sizes=(5, 16, 1, 17), max_frames=3)
    sweep(lambda x: x.sum(0) + 1, lambda n: (_rows(n, 4),), sizes=(5, 16, 0, 17), max_frames=3)


def test_index_out_of_range_raises_as_eager():
    """An index past a symbolic size raises eager's exception from the kernel's check."""
    counter = sweep(lambda x, i: x[i] * 2, lambda n: (_rows(n, 3), torch.tensor([n + 2]) if n == 17 else torch.tensor([1])),
                    sizes=(5, 16, 17, 33), max_frames=2)
    assert counter.frame_count == 2


@pytest.mark.parametrize("op", ["index", "gather"])
def test_index_errors_of_a_symbolic_size_name_no_symbol(op, caplog):
    """The kernel check's message in a graph with symbolic sizes (logged when the frame
    reruns in CPython, which raises eager's own error): the dimension, and no shape symbol
    (`s93`) standing where eager prints the size."""
    import re
    fn = (lambda x, i: x[i] * 2) if op == "index" else (lambda x, i: torch.gather(x, 0, i) * 2)
    compiled = frametrace.optimize(backend="triton")(fn)
    for n in (5, 16, 17):
        x, i = _rows(n, 3), torch.ones(2, 3, dtype=torch.long)
        torch.testing.assert_close(compiled(x, i), fn(x, i))
    assert any(m.symbolic for m in backend.COMPILED)
    x, i = _rows(9, 3), torch.full((2, 3), 40)
    with pytest.raises((IndexError, RuntimeError)) as got:
        fn(x, i)
    want = got.type
    with caplog.at_level(logging.INFO, logger="frametrace"), pytest.raises(want):
        compiled(x, i)
    said = [r.getMessage() for r in caplog.records if "out of bounds" in r.getMessage()]
    assert said and all("dimension 0" in m and not re.search(r"\bs\d+\b", m) for m in said), said


def test_an_aten_calls_index_error_on_the_first_call_leaves_the_graph_compiled(monkeypatch):
    """scatter_add (an aten call in the wrapper) raising eager's error for an index out of
    range on the graph's first call: the error is the program's, and later calls run the
    graph's kernels (it ran eagerly for good: a slow path after one bad input).  Not
    strict: strict mode raises where the backend would give up, which hid it."""
    monkeypatch.delenv("FRAMETRACE_TRITON_STRICT")
    sweep(lambda x, i, s: x.scatter_add(0, i, s) * 2,
          lambda n: (torch.zeros(n, 3), torch.full((2, 3), n if n in (5, 16) else n - 1), torch.randn(2, 3)),
          sizes=(5, 6, 16, 17, 33), max_frames=2)


# -- regressions --------------------------------------------------------------------------------
def test_kernel_taking_an_unbacked_size_runs_after_the_extern_that_binds_it(monkeypatch):
    """x[mask].numel() (u1) added to x[mask].sum(): the add fused into the sum's kernel,
    which the scheduler moved before the second index's aten call that binds u1
    (UnboundLocalError in the wrapper)."""
    monkeypatch.setattr(frametrace.config, "capture_dynamic_output_shape_ops", True)
    sweep(lambda x: x[x > 0].sum() + x[x > 0].numel(), lambda n: (torch.randn(n),),
          sizes=(5, 16, 17, 1, 33), max_frames=3)


def test_variance_of_a_symbolic_count_and_of_one_element():
    """var/std's default correction reaches the lowering as aten.var.correction's float
    1.0: s0 - 1.0 was no index expression (NotImplementedError, and the frame compiled
    with static sizes for good); a variance over one element (static, n=1) scaled by a
    bare `inf` (NameError in the kernel); an alpha of inf likewise."""
    fn = lambda x: (torch.std(x, 0), torch.var_mean(x, 0), torch.var(x, 1, correction=0),  # noqa: E731
                    torch.add(x, x, alpha=float("inf")))
    counter = sweep(fn, lambda n: (_rows(n, 5),), sizes=(5, 16, 1, 17, 33), max_frames=3)
    assert counter.frame_count == 3     # (5; 16 onwards symbolic; 1 specialized)
    sweep(lambda x: torch.var(x, 0, correction=0.5), lambda n: (_rows(n, 5),), sizes=(5, 16, 17),
          symbolic=False)  # (a fractional correction of a symbolic count: aten's var)


@pytest.mark.parametrize("name", ["softmax_row", "layer_norm", "cross_entropy"])
def test_training_graphs_stay_symbolic(name):
    """Forward and backward of a training graph with symbolic sizes: one compile covers
    every later size (the partitioner's byte count guarded on a symbolic numel, which
    specialized the graph: a compile per size, no symbolic kernel)."""
    fn, make = PROGRAMS[name]
    counter = sweep(fn, make, sizes=(5, 16, 17, 33, 64), backward=True, max_frames=2)
    assert counter.frame_count == 2
    assert sum(m.symbolic for m in backend.COMPILED) == 2    # (forward and backward)


# -- PyTorch's OpInfo samples resized along their first dimension -------------------------------
OPINFO = ("abs", "add", "atan2", "clamp", "cos", "cumsum", "cumprod", "div", "exp", "fmod",
          "logaddexp", "logsumexp", "amax", "amin", "argmax", "mean", "prod", "std", "sum", "var",
          "softmax", "log_softmax", "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus",
          "nn.functional.normalize", "nn.functional.mse_loss", "flip", "diff", "tril", "nansum",
          "linalg.vector_norm", "max", "min", "sigmoid", "tanh", "remainder", "lerp", "addcmul",
          "nan_to_num", "cat", "stack", "hstack", "index_select", "gather", "masked_fill",
          "nn.functional.huber_loss", "nn.functional.cosine_similarity", "aminmax", "count_nonzero")
OPINFO_SAMPLED = ("add", "atan2", "cumsum", "logsumexp", "argmax", "var", "softmax",
                  "nn.functional.normalize", "flip", "linalg.vector_norm", "masked_fill")


def _opinfo_cases():
    from torch.testing._internal.common_methods_invocations import op_db
    names = OPINFO if FULL else OPINFO_SAMPLED
    # (max/min.binary: a 0-d operand's `!=` ANDed with a block's fails in Triton 3.9's
    # interpreter, static sizes too: "ufunc 'bitwise_and' not supported", not ours)
    return [op for op in op_db if op.name in names and op.variant_test_name != "binary"]


def _resizable(sample):
    """The sample's tensors, whether each is resized, and the first dimension it has."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [(i, t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    if not tensors or tensors[0][1].dim() < 1 or tensors[0][1].shape[0] < 2:
        return None
    d0 = tensors[0][1].shape[0]
    resize = {i for i, t in tensors if t.dim() >= 1 and t.shape[0] == d0 and (t.is_floating_point() or t.dtype == torch.bool)}
    return leaves, spec, [i for i, _ in tensors], resize


@pytest.mark.parametrize("op", _opinfo_cases(), ids=lambda op: f"{op.name}.{op.variant_test_name}".rstrip("."))
def test_opinfo_samples_resized(op):
    from torch.testing import make_tensor
    samples = [s for s in op.sample_inputs("cpu", torch.float32) if _resizable(s)]
    ran = symbolic = 0
    for k, s in enumerate(samples[:2]):
        leaves, spec, slots, resize = _resizable(s)

        def make(n):
            return tuple(make_tensor((n, *leaves[i].shape[1:]), dtype=leaves[i].dtype, device="cpu",
                                     **({"low": -3, "high": 3} if leaves[i].is_floating_point() else {}))
                         if i in resize else leaves[i].clone() for i in slots)

        program = sample_program(op, leaves, spec, slots)
        # (a code object of its own: the cache limit counts compiles per code object)
        program.__code__ = program.__code__.replace(co_name=f"program_{k}_{op.name.replace('.', '_')}")
        frametrace.reset()
        # (a sample whose program compiles nothing, or keeps no size symbolic, is
        # compared all the same; each op must have a symbolic graph for some sample)
        sweep(program, make, sizes=(3, 6, 17, 2, 33, 16, 5), max_frames=3, symbolic=False, min_frames=0)
        symbolic += any(m.symbolic for m in backend.COMPILED)
        ran += 1
    assert ran, "no sample could be resized"
    assert symbolic, "no sample compiled a graph with symbolic sizes"


def test_strides_of_a_size_specialized_while_traced_read_as_ints():
    """A graph traced with symbolic sizes that a guard specialized has tensors whose strides
    are SymInts of constants: eager's output strides are read as their ints (they reached
    indexing.hint as SymInts: AttributeError, and the frame compiled with static sizes for
    good), and a symbolic stride as none."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from frametrace.backends.triton import layout
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.randn(3, 16), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC]))
    assert layout.static_strides(x) is None
    int(x.shape[1])     # (a guard: the size is 16 from now on)
    assert isinstance(x.stride()[0], torch.SymInt)
    assert layout.static_strides(x) == (16, 1)


def test_launchers_keep_a_bounded_number_of_extents(monkeypatch):
    """Launcher.tuned (grid and block sizes per actual extents) is cleared at
    wrapper.TUNED_LIMIT entries; calls after it still match eager (the bucket's choice,
    kept in `picked`, is reused)."""
    from frametrace.backends.triton import wrapper
    monkeypatch.setattr(wrapper, "TUNED_LIMIT", 3)
    sweep(lambda x: torch.softmax(x * 2, -1) + x.sum(0), lambda n: (_rows(n, 6),),
          sizes=(2, 3, 4, 5, 6, 7, 9, 3, 12))
    launchers = [m.namespace[n] for m in backend.COMPILED if m.symbolic for n in m.wrapper.launchers]
    assert launchers and all(len(L.tuned) <= 3 for L in launchers)
    assert any(L.picked for L in launchers)
