"""Kernels launched on CUDA through torch's ahead-of-time launcher instead of the C
launcher Triton builds with gcc per kernel signature (backends/triton/static_launch.py,
`config.static_launch`).

The generated fast wrapper is checked here on any machine (its launch lines, with a
stand-in for the loaded kernel); on a GPU, whole programs run with the launcher on and
off against eager, with no Triton launcher built while it is on, and every case where
it must step aside (launch hooks) falls back to Triton's.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, compiled_module, config, static_launch, wrapper  # noqa: E402
from triton_harness import triton_check  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.usefixtures("triton_interpreter")
def test_fast_wrapper_passes_only_what_the_compiled_kernel_takes(monkeypatch):
    from types import SimpleNamespace

    from triton.runtime import driver

    x, w = torch.randn(8, 16), torch.randn(16)
    frametrace.reset()
    mod = triton_check(lambda x, w: torch.softmax(x * w, -1), x, w, kernels=1, rtol=1e-4)
    W = mod.wrapper
    name = W.launchers[0]
    launcher = W.ns[name]
    launcher.compiled = SimpleNamespace()
    nargs = len(re.search(rf"{name}\(([^)]*)\)", mod.source).group(1).split(","))
    # A kernel that takes its pointers and sizes but not argument 1 (specialized by
    # Triton), and one scratch pointer.
    passed = tuple(i for i in range(nargs) if i != 1)
    stand_in = static_launch.StaticKernel(1234, 8, 96, "O" * (len(passed) + 1), passed, (None,))
    monkeypatch.setattr(wrapper, "static_kernel", lambda k, device=None: stand_in)
    monkeypatch.setattr(static_launch, "_LAUNCHER", SimpleNamespace(_launch_kernel=None))
    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    monkeypatch.setattr(W.lowered, "device", torch.device("cuda", 0))
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=None))
    src = W.fast_source([x, w])
    line = next(l for l in src.splitlines() if "static_launch(" in l)
    args = re.search(r", (\(.*\)), stream\)", line).group(1)
    call_args = [a.strip() for a in re.search(rf"{name}\(([^)]*)\)", mod.source).group(1).split(",")]
    call_args += [repr(v) for v in launcher.constexprs()]
    want = [call_args[i] for i in passed] + ["None"]
    assert args == "(" + "".join(f"{a}, " for a in want) + ")", line
    assert f"static_launch(fn_{name}, {launcher.grid[0]}, 1, 1, 8, 96, " in line, line
    assert "run_" not in src


def test_declines_what_is_not_a_compiled_kernel():
    from types import SimpleNamespace
    assert static_launch.static_kernel(SimpleNamespace(run=None), 0) is None


class _LauncherCount:
    """Counts the C launchers Triton makes (one per kernel signature: a gcc run)."""

    def __init__(self, monkeypatch):
        from triton.runtime import driver
        active = driver.active
        made = self.made = []
        original = active.launcher_cls

        def counting(*args, **kwargs):
            made.append(args)
            return original(*args, **kwargs)
        monkeypatch.setattr(active, "launcher_cls", counting)


def _program(x, w, idx, y):
    h = F.layer_norm(x @ w, (w.shape[1],)).relu()
    g = h[idx]                                     # a gather: a checked kernel
    return torch.softmax(g, -1).sum(0), (y.t() * 2 + 1).contiguous(), h.mean()


def _inputs(n=64, device="cuda"):
    return (torch.randn(n, 32, device=device), torch.randn(32, 48, device=device),
            torch.randint(0, n, (17,), device=device), torch.randn(40, 24, device=device))


@cuda
@pytest.mark.parametrize("static", [True, False])
def test_programs_match_eager_with_and_without_the_launcher(monkeypatch, static):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    monkeypatch.setattr(config, "static_launch", static)
    count = _LauncherCount(monkeypatch)
    before = dict(static_launch.STATS)
    cf = frametrace.optimize(backend="triton")(_program)
    for i in range(4):                  # the first call, then the fast wrapper
        args = _inputs()
        torch.testing.assert_close(cf(*args), _program(*args), rtol=1e-4, atol=1e-4)
    loaded = static_launch.STATS["loaded"] - before["loaded"]
    if static:
        assert loaded > 0 and not count.made, (loaded, len(count.made))
    else:
        assert loaded == 0 and count.made


@cuda
def test_dynamic_sizes_launch_through_the_slow_wrapper(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    count = _LauncherCount(monkeypatch)
    f = lambda x: torch.softmax(x * 2, -1) + x.sum(-1, keepdim=True)  # noqa: E731
    cf = frametrace.optimize(backend="triton", dynamic=True)(f)
    for n in (5, 9, 33, 70, 9):
        x = torch.randn(n, 100, device="cuda")
        torch.testing.assert_close(cf(x), f(x), rtol=1e-4, atol=1e-4)
    assert not count.made


@cuda
def test_launch_hooks_run_through_triton(monkeypatch):
    from triton import knobs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    seen = []
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    cf = frametrace.optimize(backend="triton")(_program)
    args = _inputs()
    torch.testing.assert_close(cf(*args), _program(*args), rtol=1e-4, atol=1e-4)
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    try:
        args = _inputs()
        torch.testing.assert_close(cf(*args), _program(*args), rtol=1e-4, atol=1e-4)
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
    assert seen, "the launch hook was never called"


def _fake_compiled(signature, constants=None, **metadata):
    """A stand-in for Triton's CompiledKernel, as the launcher reads it."""
    from types import SimpleNamespace
    md = dict(hash="abc", shared=0, num_warps=4, num_ctas=1, global_scratch_size=0,
              profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
    md.update(metadata)
    fn = SimpleNamespace(arg_names=list(signature), __name__="k")
    src = SimpleNamespace(fn=fn, signature=signature, constants=constants or {})
    return SimpleNamespace(asm={"cubin": b"\0"}, metadata=SimpleNamespace(**md), src=src)


def test_launch_types_from_the_signature(monkeypatch):
    from types import SimpleNamespace
    loads = []
    monkeypatch.setattr(static_launch, "_LAUNCHER", SimpleNamespace(
        _load_kernel=lambda path, name, shared, device: loads.append(name) or (7, 16, 0)))
    sig = {"x": "*fp32", "y": "*bf16", "n": "i32", "one": "constexpr", "eps": "fp32",
           "m": "i64", "XBLOCK": "constexpr"}
    k = static_launch.static_kernel(_fake_compiled(sig, {(3,): 1, (6,): 128}), 0)
    # pointers, i32, fp32, i64, then the two unused scratch pointers (null)
    assert (k.types, k.passed, k.extra) == ("OOifl" + "OO", (0, 1, 2, 4, 5), (None, None))
    assert k.args_of(["X", "Y", 5, 1, 0.5, 9, 128]) == ("X", "Y", 5, 0.5, 9, None, None)
    assert k.function == 7 and loads == ["k"]
    # torch 2.13's loader also returns the module first
    monkeypatch.setattr(static_launch, "_LAUNCHER", SimpleNamespace(
        _load_kernel=lambda *a: (3, 8, 16, 0)))
    assert static_launch.static_kernel(_fake_compiled({"x": "*fp32"}), 0).function == 8
    # no scratch attributes (an older Triton): no extra pointers
    old = _fake_compiled({"x": "*fp32"})
    del old.metadata.global_scratch_size, old.metadata.profile_scratch_size
    assert static_launch.static_kernel(old, 0).types == "O"


@pytest.mark.parametrize("why", ["fp16 scalar", "scratch", "ctas", "pdl", "switch"])
def test_declines_what_torchs_launcher_cannot_run_as_triton(monkeypatch, why):
    from types import SimpleNamespace
    monkeypatch.setattr(static_launch, "_LAUNCHER", SimpleNamespace(_load_kernel=lambda *a: (7, 16, 0)))
    sig, md = {"x": "*fp32", "s": "i32"}, {}
    if why == "fp16 scalar":
        sig["s"] = "fp16"
    elif why == "scratch":
        md["global_scratch_size"] = 64
    elif why == "ctas":
        md["num_ctas"] = 2
    elif why == "pdl":
        md["launch_pdl"] = True
    else:
        monkeypatch.setattr(config, "static_launch", False)
    assert static_launch.static_kernel(_fake_compiled(sig, **md), 0) is None
    assert static_launch.static_kernel(_fake_compiled({"x": "*fp32", "s": "i32"}), 0) is not None \
        or why == "switch"


# -- launches remembered per specialization (config.memo_launches) -------------------------

def _cuda_everywhere(monkeypatch, cxx=False):
    """launch_key on CPU tensors as if they were CUDA ones (the key reads only dtype,
    pointer and is_cuda); `cxx`: its C++ reads too (which read the device in C++)."""
    from types import SimpleNamespace
    monkeypatch.setattr(static_launch, "_LAUNCHER", SimpleNamespace(_launch_kernel=None))
    monkeypatch.setattr(static_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(static_launch, "_hooked", lambda: False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(config, "launch_keys_in_cxx", cxx)
    if cxx and static_launch._KEYS is not None:
        real = static_launch._KEYS
        monkeypatch.setattr(static_launch, "_KEYS", SimpleNamespace(codes=lambda args: real.codes(args, True)))


def _key_arguments():
    """Argument tuples that Triton specializes differently, or alike: tensors of several
    dtypes, aligned and 4 bytes off, views (transposed, expanded, channels-last, empty),
    and ints, bools, floats and None that are equal but different (1, True, 1.0), at the
    edges of int32 and int64, negative, multiples of 16 or not."""
    x = torch.randn(65)
    tensors = [x[:64], x[1:], x[:64].double(), x[:64].to(torch.int64), x[:64] > 0,
               x[:64].bfloat16(), x[:0], x[:64].view(8, 8).t(), x[:1].expand(64),
               torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last), x[16:32]]
    values = [0, 1, -1, 15, 16, 17, 32, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1,
              -2 ** 31 - 16, 2 ** 63 - 16, 2 ** 63, 2 ** 64, 2 ** 64 + 1, -2 ** 63, -2 ** 63 - 1,
              -2 ** 70, True, False, 1.0, 0.0, float("nan"), None]
    return [(t, v) for t in tensors for v in values] + [(v, t) for t in tensors[:2] for v in values] + \
        [(tensors[0], tensors[1], 16, None), (tensors[1], tensors[0], 16, None)]


@pytest.mark.skipif(static_launch._KEYS is None, reason="frametrace._launch_keys not built")
def test_cxx_launch_keys_tell_apart_what_the_python_key_does(monkeypatch):
    """`config.launch_keys_in_cxx`: over arguments that Triton specializes differently
    or alike, two launches get equal C++ keys exactly when their Python keys are equal
    (a collision would launch a kernel compiled for another specialization)."""
    args = _key_arguments()
    _cuda_everywhere(monkeypatch, cxx=False)
    py = [static_launch.launch_key((64, 1), a) for a in args]
    _cuda_everywhere(monkeypatch, cxx=True)
    cxx = [static_launch.launch_key((64, 1), a) for a in args]
    assert all(type(k) is tuple and type(k[2]) is bytes for k in cxx), cxx[:3]
    assert len(set(py)) > 40
    for i in range(len(args)):
        for j in range(len(args)):
            assert (py[i] == py[j]) == (cxx[i] == cxx[j]), (args[i], args[j])
    assert static_launch.launch_key((65, 1), args[0]) != cxx[0]     # the block sizes
    monkeypatch.setattr(static_launch, "_current_device", lambda: 1)
    assert static_launch.launch_key((64, 1), args[0]) != cxx[0]     # the device


@pytest.mark.skipif(static_launch._KEYS is None, reason="frametrace._launch_keys not built")
def test_cxx_launch_keys_leave_to_python_what_may_run_python(monkeypatch):
    """A tensor subclass (its reads may run Python code) is keyed in Python, with the
    Python key's entries; CPU tensors and other kinds decline as the Python key does;
    with the switch off every key is Python's."""
    from types import SimpleNamespace

    class Sub(torch.Tensor):
        pass
    keys = static_launch._KEYS
    x = torch.randn(8)
    assert keys.codes((x, 8)) is None                           # a CPU tensor
    assert keys.codes((x.as_subclass(Sub), 8)) is NotImplemented
    assert keys.codes((x, SimpleNamespace()), True) is None
    assert keys.codes((8, 2.0), True) is None                   # no tensor
    with pytest.raises(TypeError):
        keys.codes(x)
    _cuda_everywhere(monkeypatch, cxx=True)
    sub = static_launch.launch_key(None, (x.as_subclass(Sub), 8))
    plain = static_launch.launch_key(None, (x, 8))
    assert type(sub[2]) is tuple and type(plain[2]) is bytes and sub != plain
    monkeypatch.setattr(static_launch, "_hooked", lambda: True)
    assert static_launch.launch_key(None, (x, 8)) is None
    monkeypatch.setattr(static_launch, "_hooked", lambda: False)
    monkeypatch.setattr(config, "launch_keys_in_cxx", False)
    assert type(static_launch.launch_key(None, (x, 8))[2]) is tuple


def test_launch_key_separates_what_triton_specializes_on(monkeypatch):
    _cuda_everywhere(monkeypatch)
    key = static_launch.launch_key
    x = torch.randn(64)
    base = key((64, 1), (x, 64))
    assert base is not None and key((64, 1), (x.clone(), 80)) == base   # same specialization
    # equal-but-different values: 1 (a constexpr for Triton), True, 1.0 and 17 all differ
    ones = {key((64, 1), (x, v)) for v in (1, True, 1.0, 17)}
    assert len(ones) == 4
    assert key((64, 1), (x, 17)) == key((64, 1), (x, 33))               # neither 1 nor a multiple of 16
    assert key((64, 1), (x, 16)) != key((64, 1), (x, 17))
    # widths: int32, int64, uint64
    widths = {key((64, 1), (x, v)) for v in (2 ** 31 - 16, 2 ** 31, 2 ** 63)}
    assert len(widths) == 3
    assert key((64, 1), (x, -2 ** 31)) != key((64, 1), (x, -2 ** 31 - 16))
    # pointer alignment (a view 4 bytes in), dtype, the block sizes, the device
    assert key((64, 1), (x[1:], 64)) != base
    assert key((64, 1), (x.double(), 64)) != base
    assert key((65, 1), (x, 64)) != base
    monkeypatch.setattr(static_launch, "_current_device", lambda: 1)
    assert key((64, 1), (x, 64)) != base


def test_launch_key_declines_what_torchs_launcher_would_not_run(monkeypatch):
    from types import SimpleNamespace
    x = torch.randn(8)
    assert static_launch.launch_key(None, (x, 8)) is None         # no CUDA here, or CPU tensors
    _cuda_everywhere(monkeypatch)
    assert static_launch.launch_key(None, (x, 8)) is not None
    assert static_launch.launch_key(None, (x, torch.Generator())) is None
    assert static_launch.launch_key(None, (x, SimpleNamespace())) is None
    assert static_launch.launch_key(None, (8, 2.0)) is None        # no tensor: nothing to launch on
    monkeypatch.setattr(config, "static_launch", False)
    assert static_launch.launch_key(None, (x, 8)) is None
    monkeypatch.setattr(config, "static_launch", True)
    monkeypatch.setattr(static_launch, "_hooked", lambda: True)     # a profiler's hooks
    assert static_launch.launch_key(None, (x, 8)) is None


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("memo,cxx", [(True, False), (True, True), (False, False)])
def test_launcher_runs_the_remembered_kernel_only_for_its_key(monkeypatch, memo, cxx):
    from types import SimpleNamespace
    _cuda_everywhere(monkeypatch, cxx)
    monkeypatch.setattr(config, "memo_launches", memo)
    x = torch.randn(4, 40)
    frametrace.reset()
    mod = triton_check(lambda x, n: torch.softmax(x * 2, -1) + n, x, 3, kernels=1, rtol=1e-4)
    launcher = mod.wrapper.ns[mod.wrapper.launchers[0]]
    launcher.memo.clear()
    via_jit, replayed = [], []

    class Stand:
        def launch(self, grid, args, stream):
            replayed.append((grid, args[0].data_ptr(), stream))

    def jit(fn, grid, args, kwargs):
        via_jit.append(args[0].data_ptr())
        return SimpleNamespace(tag=len(via_jit)), Stand()
    monkeypatch.setattr(wrapper, "launch_static", jit)
    monkeypatch.setattr(wrapper, "current_raw_stream", lambda device: 777)
    a, b = torch.randn(64), torch.randn(65)
    launcher(a, torch.empty(64))
    launcher(a, torch.empty(64))
    launcher(b[1:], torch.empty(64))        # another alignment: Triton compiles for it
    launcher(b[1:], torch.empty(64))
    if memo:
        assert len(via_jit) == 2 and len(replayed) == 2
        assert replayed[0][2] == 777 and launcher.compiled.tag == 2
    else:
        assert len(via_jit) == 4 and not replayed and not launcher.memo


@cuda
@pytest.mark.parametrize("memo,cxx", [(True, True), (True, False), (False, True)])
def test_remembered_launches_match_eager_over_sizes_and_alignments(monkeypatch, memo, cxx):
    """Symbolic sizes (the slow wrapper launches every kernel through its Launcher): sizes
    that are multiples of 16 and others, inputs 4 bytes off alignment, then the same
    sizes and alignments again: Triton's JIT is asked only the first time (keys read in
    C++ or in Python)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    monkeypatch.setattr(config, "memo_launches", memo)
    monkeypatch.setattr(config, "launch_keys_in_cxx", cxx)
    monkeypatch.setattr(config, "sized_fast_after", 0)     # (every call through the Launchers)
    jit = []
    real = wrapper.launch_static
    monkeypatch.setattr(wrapper, "launch_static", lambda *a: jit.append(1) or real(*a))

    def f(x, y):
        h = x * 2 + y
        return torch.softmax(h, -1) + h.sum(-1, keepdim=True), h.amax(0)
    cf = frametrace.optimize(backend="triton", dynamic=True)(f)
    sizes = (5, 16, 17, 32, 7)
    counts = []
    for round_ in range(2):
        before = len(jit)
        for i, n in enumerate(sizes):
            base = torch.randn(n * 100 + 1, device="cuda")
            x = (base[1:] if i % 2 else base[:-1]).view(n, 100)     # 4 bytes off, or aligned
            y = torch.randn(n, 100, device="cuda")
            for got, want in zip(cf(x, y), f(x, y)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        counts.append(len(jit) - before)
    assert counts[0] > 0
    assert counts[1] == (0 if memo else counts[0]), counts


@cuda
@pytest.mark.parametrize("after", [2, 1, 0])
def test_recurring_sizes_run_a_fast_wrapper_of_their_own(monkeypatch, after):
    """Symbolic sizes (compiled_module.Sized): sizes called `sized_fast_after` times get
    a fast wrapper with their grids and kernels as literals; later calls with those sizes
    launch no Launcher, other sizes still run the general wrapper, and inputs off the
    alignment a wrapper was made for run the general wrapper.  Every call against eager;
    `sized_fast_after = 0` never makes one."""
    from frametrace.backends.triton import backend
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "cudagraphs", False)
    monkeypatch.setattr(config, "sized_fast_after", after)
    general = []
    real = wrapper.Launcher._go
    monkeypatch.setattr(wrapper.Launcher, "_go", lambda self, args: general.append(1) or real(self, args))

    def f(x, y):
        h = x * 2 + y
        return torch.softmax(h, -1) + h.sum(-1, keepdim=True), h.amax(0), h[:, :7].float().mean()
    frametrace.reset()
    cf = frametrace.optimize(backend="triton", dynamic=True)(f)
    launched = []
    for i, n in enumerate((5, 16, 5, 16, 5, 16, 33, 5, 17, 17, 17, 16)):
        base = torch.randn(n * 100 + 1, device="cuda")
        x = (base[1:] if i == 11 else base[:-1]).view(n, 100)     # the last: 4 bytes off
        y = torch.randn(n, 100, device="cuda")
        before = len(general)
        for got, want in zip(cf(x, y), f(x, y)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        launched.append(len(general) > before)
    mod = backend.COMPILED[-1]
    assert mod.symbolic
    if after == 0:
        assert all(launched) and mod.fast is None
        return
    assert isinstance(mod.fast, compiled_module.Sized)
    # after 2: 5 and 16 general twice each, then fast; 33 once; 17 twice, then fast;
    # after 1: each size general once.  The last call's input is off the alignment 16's
    # wrapper was made for: general
    assert launched == ([True, True, True, True, False, False, True, False, True, True, False, True] if after == 2
                        else [True, True, False, False, False, False, True, False, True, False, False, True]), launched
    sizes = (5, 16, 17) if after == 2 else (5, 16, 17, 33)
    assert len(mod.fast.fast) == len(sizes) and all(any(n in k for k in mod.fast.fast) for n in sizes), \
        mod.fast.fast.keys()
    # one function for every set of sizes, each set a table of kernels and grids
    assert len(mod.fast.shared) == 1
    assert all("static_launch(*T[" in s for s in mod.fast.sources.values())


@pytest.mark.usefixtures("triton_interpreter")
def test_no_sized_dispatch_where_no_fast_wrapper_runs():
    """On the CPU (Triton's interpreter) a symbolic graph keeps its general wrapper, and
    its fast template exists (the symbolic kind, for a GPU)."""
    from frametrace.backends.triton import backend
    frametrace.reset()
    cf = frametrace.optimize(backend="triton", dynamic=True)(lambda x: torch.softmax(x * 2, -1))
    for n in (5, 9, 5, 9, 5):
        x = torch.randn(n, 12)
        torch.testing.assert_close(cf(x), torch.softmax(x * 2, -1))
    mod = backend.COMPILED[-1]
    assert mod.symbolic and mod.fast is None and mod.wrapper.fast_template is not None
    assert compiled_module.Sized.make(mod, [5, torch.randn(5, 12)]) is None


def _launch_bound(rounds, device="cuda"):
    """Rows of 64 through `rounds` small softmaxes: many short launches (launch-bound,
    worth a CUDA graph), returning the rows and their column maxima.  Most of each round's
    input carries over, so the outputs depend on `x` and `w` (repeated softmaxes alone
    converge to the same rows whatever the input: a replay reading stale inputs passed)."""
    w = torch.randn(64, device=device)

    def f(x):
        h = x * w + 1
        for _ in range(rounds):
            h = torch.softmax(h, -1) * 2 + h * 0.9
        return h, h.amax(0)
    return f


@pytest.mark.parametrize("rounds", [6, 8, 24])
def test_launch_bound_outputs_depend_on_the_input(rounds):
    """The CUDA-graph tests compare replays with eager on fresh inputs: that proves
    something only if `_launch_bound`'s outputs move with the input (and its weight)."""
    torch.manual_seed(0)
    f = _launch_bound(rounds, device="cpu")
    x = torch.randn(5, 64)
    h, m = f(x)
    h2, m2 = f(x + torch.randn(5, 64))
    assert (h - h2).abs().min() > 0 and (h - h2).abs().max() > 1e-3 and (m - m2).abs().max() > 1e-3


@cuda
def test_recurring_sizes_replay_a_cuda_graph_each(monkeypatch):
    """An inference graph with symbolic sizes: each recurring set of sizes gets its own
    CUDA-graph runner (sizes passed as ints are part of what a replay must match), the
    graphs sharing one memory pool; two sizes called in turn with fresh values every
    call, against eager, through capture and replays."""
    from frametrace.backends.triton import backend, cudagraphs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "sized_fast_after", 2)
    f = _launch_bound(6)
    frametrace.reset()
    cf = frametrace.optimize(backend="triton", dynamic=True)(f)
    with torch.no_grad():
        for i in range(-2, 16):     # (3 and 5 first: the static graph, then the symbolic one)
            n = (3, 5)[i] if i < 0 else (7, 40, 7, 40, 33)[i % 5]
            x = torch.randn(n, 64, device="cuda")
            for got, want in zip(cf(x), f(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    mod = next(m for m in reversed(backend.COMPILED) if m.symbolic)
    runners = [r for r in mod.fast.fast.values() if isinstance(r, cudagraphs.CudaGraphRunner)]
    assert len(runners) == 3, mod.fast.fast
    assert all(r.decision != "not yet measured" for r in runners[:2]), [r.decision for r in runners]
    assert all(r.capture_at == max(4, config.sized_capture_at) for r in runners)
    if any(r.graph is not None for r in runners):
        assert mod.fast.pool is not None


def _stand_in_module(monkeypatch, tables=True, source=True):
    """A CompiledModule-like object for `Sized` on any machine: its general wrapper
    records each call; `sized_table` gives one signature for all sizes (or None), and
    the shared fast source returns what it was called with."""
    from types import SimpleNamespace
    calls = []
    lowered = SimpleNamespace(late_symbols={}, symbol_sources={"s0": "x.shape[0]"}, inputs=["x"],
                              device=torch.device("cuda", 0))
    made = []

    def fast_source(inputs, ns=None, table=False):
        made.append(table)
        if not source:
            return None
        return "def fast(args, T):\n    return ('fast', T, list(args))\n" if table else \
            "def fast(args):\n    return ('own', list(args))\n"
    wrapper_ = SimpleNamespace(fast_template="t", lowered=lowered, fast_source=fast_source,
                               sized_table=lambda inputs: (("sig",), (inputs[0].shape[0],)) if tables else None)
    mod = SimpleNamespace(wrapper=wrapper_, settings={}, namespace={}, kind="training", kernels=[], externs=[],
                          call=lambda args: calls.append(args[0].shape[0]) or ("call", list(args)))
    return mod, calls, made


@pytest.mark.parametrize("tables", [True, False])
def test_sized_dispatch_counts_builds_and_bounds(monkeypatch, tables):
    """compiled_module.Sized without a GPU: sizes run the general wrapper until their
    `sized_fast_after`-th call, then their fast wrapper (one shared function with a
    table each, or a source of their own where no table can be had); at most
    `sized_fast_limit` sets are kept (the oldest made goes), and the count of sizes seen
    once is bounded."""
    monkeypatch.setattr(config, "sized_fast_limit", 2)
    monkeypatch.setattr(config, "sized_fast_after", 2)
    mod, calls, made = _stand_in_module(monkeypatch, tables=tables)
    t = lambda n: torch.zeros(n)  # noqa: E731
    run = compiled_module.Sized.make(mod, [t(3)])
    assert run is not None and run.seen == {(3,): 1}
    out = run([t(3)])                    # second call of 3: the general wrapper, then made
    assert out[0] == "call" and calls == [3] and set(run.fast) == {(3,)}
    got = run([t(3)])
    assert got[0] == ("fast" if tables else "own") and calls == [3]
    if tables:
        assert got[1] == (3,)            # its own table
    run([t(5)])
    run([t(5)])
    assert set(run.fast) == {(3,), (5,)} and calls == [3, 5, 5]
    run([t(7)])
    run([t(7)])                          # a third set: the oldest (3) goes
    assert set(run.fast) == {(5,), (7,)}
    assert run([t(3)])[0] == "call"      # 3 counts from the start again
    assert made == ([True] if tables else [False, False, False])   # (shared: made once)
    for n in range(100, 100 + 16 * 2 + 1):   # sizes seen once: the count is bounded
        run([t(n)])
    assert len(run.seen) <= 16 * 2


def test_sized_dispatch_from_the_first_call(monkeypatch):
    """`sized_fast_after = 1` (the default): the call that makes the dispatcher, and each
    new set's first call, run the general wrapper and make the set's fast wrapper; every
    later call of the set runs it; nothing stays counted as seen."""
    monkeypatch.setattr(config, "sized_fast_after", 1)
    mod, calls, _ = _stand_in_module(monkeypatch)
    t = lambda n: torch.zeros(n)  # noqa: E731
    run = compiled_module.Sized.make(mod, [t(3)])
    assert set(run.fast) == {(3,)} and not run.seen
    assert run([t(3)])[0] == "fast" and calls == []
    assert run([t(5)])[0] == "call" and calls == [5] and set(run.fast) == {(3,), (5,)}
    assert run([t(5)])[0] == "fast" and calls == [5] and not run.seen


def test_sized_dispatch_from_the_first_call_compiles_own_sources_at_the_second(monkeypatch):
    """Where no table can be had (a source of its own per set, a compile), `sized_fast_after
    = 1` still makes a set's fast wrapper at its second call only: a set seen once costs no
    compile; the count of such sets stays bounded."""
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_fast_limit", 2)
    mod, calls, made = _stand_in_module(monkeypatch, tables=False)
    t = lambda n: torch.zeros(n)  # noqa: E731
    run = compiled_module.Sized.make(mod, [t(3)])
    assert not run.fast and run.seen == {(3,): 1} and made == []     # (no source compiled)
    assert run([t(3)])[0] == "call" and set(run.fast) == {(3,)} and made == [False]
    assert run([t(3)])[0] == "own" and calls == [3]
    for n in range(100, 100 + 16 * 2 + 1):
        run([t(n)])
    assert len(run.seen) <= 16 * 2 and made.count(False) == 1


def test_sized_dispatch_without_a_fast_source_runs_the_general_wrapper(monkeypatch):
    mod, calls, _ = _stand_in_module(monkeypatch, tables=False, source=False)
    run = compiled_module.Sized.make(mod, [torch.zeros(4)])
    for _ in range(3):
        assert run([torch.zeros(4)])[0] == "call"
    assert calls == [4, 4, 4] and run.fast == {(4,): mod.call}


def test_no_sized_dispatch_for_sizes_the_data_decides(monkeypatch):
    mod, _, _ = _stand_in_module(monkeypatch)
    mod.wrapper.lowered.late_symbols = {"u0": ("buf1", (), 0)}
    assert compiled_module.Sized.make(mod, [torch.zeros(4)]) is None
    mod.wrapper.lowered.late_symbols = {}
    monkeypatch.setattr(config, "sized_fast_after", 0)
    assert compiled_module.Sized.make(mod, [torch.zeros(4)]) is None


@cuda
@pytest.mark.parametrize("shared", [True, False])
def test_sibling_sizes_trust_a_kept_replay(monkeypatch, shared):
    """`config.sized_shared_verdict`: once one set of sizes measured its replay faster and
    kept it, a sibling set captures at its third call without timing again (and not
    before: its second call is timed, for the GPU-bound check); with the switch off the
    sibling waits for `sized_capture_at`.  Values against eager on every call, fresh
    inputs each time, through the general wrapper, direct calls, capture and replays."""
    from frametrace.backends.triton import backend, cudagraphs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_capture_at", 5)
    monkeypatch.setattr(config, "sized_shared_verdict", shared)
    monkeypatch.setattr(config, "sized_early_verdict", False)   # (its own test below)
    monkeypatch.setattr(config, "sized_capture_first", False)   # (its own test below)
    monkeypatch.setattr(config, "graph_trust_saturated", False)  # (its own test below)
    f = _launch_bound(8)
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)

    def check(n):
        x = torch.randn(n, 64, device="cuda")
        for got, want in zip(cf(x), f(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        for n in (3, 5):        # the static graph, then the symbolic one (n alone)
            check(n)
        mod = next(m for m in reversed(backend.COMPILED) if m.symbolic)

        def runner_at(n, calls):    # (a set whose table needs a source of its own is made a call later)
            for _ in range(calls + 2):
                r = mod.fast.fast.get((n,))
                if isinstance(r, cudagraphs.CudaGraphRunner) and (r.calls == calls or r.calls < 0):
                    return r
                check(n)
            raise AssertionError(mod.fast.fast)
        first = runner_at(7, 5)
        if first.graph is None:
            pytest.skip(f"this GPU kept launching: {first.decision}")
        assert (mod.fast.verdict is not None and mod.fast.verdict.kept) is shared
        sibling = runner_at(40, 2)
        assert sibling.graph is None and sibling.gpu_us is not None   # (2nd call: timed)
        check(40)
        if shared:
            assert sibling.graph is not None and sibling.decision.startswith(
                ("a sibling's", "the host is most")), sibling.decision
        else:
            assert sibling.graph is None
            check(40)
            check(40)
            assert sibling.decision != "not yet measured"
        for n in (40, 7, 40, 33, 7):
            check(n)


def _sized_cuda_graphs(monkeypatch, first, **more):
    """Settings of the CUDA-graph tests of symbolic sizes: real launches, a fast wrapper
    from each set's first call, one verdict shared by the sets, no untimed trust of a
    saturated host (its own tests), `config.sized_capture_first` as given."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    settings = dict(sized_fast_after=1, sized_shared_verdict=True, sized_capture_first=first,
                    graph_trust_saturated=False, **more)
    for name, value in settings.items():
        monkeypatch.setattr(config, name, value)


@cuda
@pytest.mark.parametrize("early", [True, False])
def test_sizes_called_in_rounds_capture_in_the_third(monkeypatch, early):
    """`config.sized_early_verdict`: sizes called once a round each, in turn (decoding's
    lengths, one call per `generate()`).  On: the first size at its third call measures
    its replay there, and the others, at their third calls in the same round, trust it,
    so every size replays from the fourth round.  Off: the first measurement waits for
    `sized_capture_at` (5).  Values against eager on every call, fresh inputs."""
    from frametrace.backends.triton import backend, cudagraphs
    _sized_cuda_graphs(monkeypatch, first=False, sized_capture_at=5, sized_early_verdict=early)
    f = _launch_bound(8)
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)
    sizes = (7, 40, 33, 12)
    captured = {}     # size -> (round, its runner's calls) when its graph was first there
    with torch.no_grad():
        for rnd, ns in enumerate([(3,), (5,)] + [sizes] * 7):
            for n in ns:
                x = torch.randn(n, 64, device="cuda")
                for got, want in zip(cf(x), f(x)):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                mod = next((m for m in reversed(backend.COMPILED) if m.symbolic), None)
                r = mod and mod.fast.fast.get((n,))
                if isinstance(r, cudagraphs.CudaGraphRunner) and r.graph is not None:
                    captured.setdefault(n, (rnd - 1, r.calls))
    runners = {n: mod.fast.fast.get((n,)) for n in sizes}
    assert all(isinstance(r, cudagraphs.CudaGraphRunner) for r in runners.values()), mod.fast.fast
    first = runners[7]
    if first.decision.startswith("GPU-bound") or first.calls < 0:
        pytest.skip(f"this GPU kept launching: {first.decision}")
    assert set(captured) == set(sizes), (captured, {n: r.decision for n, r in runners.items()})
    want = 3 if early else 5
    assert captured[7][1] == want and "vs replay" in first.decision, (captured, first.decision)
    for n in sizes[1:]:
        assert captured[n][1] == (3 if early else 5), captured
        assert runners[n].decision.startswith("a sibling's"), runners[n].decision
    assert mod.fast.verdict.tried and mod.fast.verdict.kept


@cuda
@pytest.mark.parametrize("trust", [True, False])
def test_saturated_host_captures_untimed(monkeypatch, trust):
    """`config.graph_trust_saturated`: a static graph of many tiny launches (its host time
    is nearly all of its wall time) is captured and kept without timed runs around the
    capture; with the switch off it is timed (the decision names the replay's time).  A
    graph of few launches and many outputs is timed either way (its replay's own copies
    may cost the host more than its launches).  Values against eager on every call, with
    fresh inputs (copied into the graph) and replays after."""
    from frametrace.backends.triton import backend
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "graph_trust_saturated", trust)
    w = torch.randn(64, device="cuda")

    def many(x):
        h = x * w + 1
        for _ in range(24):
            h = torch.softmax(h, -1) * 2 + h.sum(-1, keepdim=True) * 1e-3
        return h

    def few(x):
        y = torch.softmax(x, -1)
        return y, y * 2, y + 1, y.sum(-1), y.amax(-1)
    for f, untimed in ((many, trust), (few, False)):
        frametrace.reset()
        cf = frametrace.optimize(backend="triton")(f)
        with torch.no_grad():
            for _ in range(8):
                x = torch.randn(16, 64, device="cuda")
                for got, want in zip(*(pytree_leaves(cf(x)), pytree_leaves(f(x)))):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        runner = backend.COMPILED[-1].runner
        if runner is None:
            continue    # (too few launches for a graph at all)
        assert runner.decision != "not yet measured"
        if runner.decision.startswith("GPU-bound"):
            continue    # (this machine's GPU is slower than its host here)
        assert runner.decision.startswith("the host is most") is untimed, (f.__name__, runner.decision)
        if untimed:
            assert runner.graph is not None


@cuda
@pytest.mark.parametrize("direct", [True, False])
def test_capture_keeps_the_allocator_cache(monkeypatch, direct):
    """`config.graph_capture_direct`: a capture runs on our side stream without
    `torch.cuda.graph`'s device synchronize and `empty_cache` (counted here); with the
    switch off it goes through `torch.cuda.graph`, which empties the cache.  Each call's
    input is made by a long matmul still running on the current stream when the call
    starts, and outputs of calls before the capture are checked after the replays (the
    graph's pool must not reuse their memory); values against eager on every call."""
    from frametrace.backends.triton import backend
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "graph_capture_direct", direct)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    emptied = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1) or real())
    f = _launch_bound(24)
    a = torch.randn(2048, 2048, device="cuda")
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)
    kept = []
    with torch.no_grad():
        for i in range(8):
            x = (a @ a)[:16, :64] * 1e-2 + i     # (pending on the stream as the call starts)
            got, want = cf(x), f(x)
            kept.append((got, [t.clone() for t in want]))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        torch.cuda.synchronize()
    for got, want in kept:
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    runner = backend.COMPILED[-1].runner
    assert runner is not None and runner.decision != "not yet measured"
    if runner.decision.startswith("GPU-bound"):
        return      # (never captured on this machine)
    assert bool(emptied) is not direct, (runner.decision, len(emptied))


@cuda
@pytest.mark.parametrize("trust", [True, False])
def test_saturated_sizes_capture_at_their_third_call(monkeypatch, trust):
    """A set of sizes whose one timed direct call (its second) was nearly all host time
    captures untimed at its third call, before `sized_capture_at`; with
    `config.graph_trust_saturated` off it waits for `sized_capture_at` and is timed.
    Values against eager on every call, fresh inputs, two sizes in turn."""
    from frametrace.backends.triton import backend, cudagraphs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_capture_at", 6)
    monkeypatch.setattr(config, "sized_shared_verdict", False)
    monkeypatch.setattr(config, "graph_trust_saturated", trust)
    w = torch.randn(64, device="cuda")

    def f(x):   # (each column maximum ends a kernel: ~50 launches, whatever the rows)
        h = x * w
        for _ in range(24):
            h = torch.softmax(h, -1) + h.amax(0) * 1e-3
        return h
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)
    seen = {}
    with torch.no_grad():
        for i in range(16):
            n = (3, 5, 7, 40)[min(i, 2 + i % 2)]
            x = torch.randn(n, 64, device="cuda")
            torch.testing.assert_close(cf(x), f(x), rtol=1e-4, atol=1e-4)
            mod = next((m for m in reversed(backend.COMPILED) if m.symbolic), None)
            r = mod and mod.fast.fast.get((n,))
            if isinstance(r, cudagraphs.CudaGraphRunner) and r.graph is not None:
                seen.setdefault(n, r.calls)
    runners = [mod.fast.fast.get((n,)) for n in (7, 40)]     # (5's was called once)
    assert all(isinstance(r, cudagraphs.CudaGraphRunner) for r in runners), mod.fast.fast
    if any(r.decision.startswith("GPU-bound") for r in runners):
        pytest.skip("this GPU is slower than its host here")
    assert set(seen) == {7, 40}, (seen, [r.decision for r in runners])
    for n, calls in seen.items():
        assert calls == (3 if trust else 6), (n, calls, [(r.launches, r.outs, r.host_us, r.gpu_us, r.decision) for r in runners])
    assert all(r.decision.startswith("the host is most") is trust for r in runners), \
        [r.decision for r in runners]


def _tiny_runner(call, pool=None):
    """A CudaGraphRunner over `call` that captures untimed at its third call (a sibling's
    verdict), as a `Sized` runner does once a sibling kept its replay."""
    from frametrace.backends.triton import cudagraphs
    verdict = cudagraphs.Verdict()
    verdict.kept = True
    return cudagraphs.CudaGraphRunner(call, launches=100, pool=pool, verdict=verdict)


@cuda
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_failed_capture_leaves_random_ops_working(monkeypatch, direct, shared):
    """A call that syncs inside the capture (`.item()`) invalidates it: the runner must
    fall back to launching, with right values, and leave the CUDA generator usable (a
    failed `capture_end` left it marked as capturing, and every later random op of the
    process raised), through either capture path and pool."""
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(config, "graph_capture_direct", direct)
    w = torch.randn(64, device="cuda")

    def call(args):
        (x,) = args
        if torch.cuda.is_current_stream_capturing():
            x.sum().item()
        return [x * w + 1]
    runner = _tiny_runner(call, cudagraphs.SharedPool() if shared else None)
    for _ in range(6):
        x = torch.randn(16, 64, device="cuda")      # (raised here once the generator stuck)
        torch.testing.assert_close(runner([x])[0], x * w + 1)
    assert runner.graph is None and runner.calls < 0
    torch.testing.assert_close(torch.rand(3, device="cuda").shape, torch.Size([3]))


@cuda
@pytest.mark.parametrize("direct", [True, False])
def test_shared_pool_outlives_its_graphs(monkeypatch, direct):
    """Graphs of one SharedPool: after every graph captured into it died (a replay
    dropped, sizes evicted), another still captures into it (without the pool's own
    graph, the allocator kept the dead pool until its cache was emptied and the capture
    failed inside torch), and replays right values; random ops work throughout."""
    import gc
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(config, "graph_capture_direct", direct)
    w = torch.randn(64, device="cuda")
    pool = cudagraphs.SharedPool()

    def call(args):
        return [torch.softmax(args[0] * w, -1) + 1]
    for _ in range(3):
        runner = _tiny_runner(call, pool)
        for _ in range(5):
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(runner([x])[0], call([x])[0])
        if runner.decision.startswith("GPU-bound"):
            pytest.skip("this GPU is slower than its host here")
        assert runner.graph is not None, runner.decision
        del runner
        gc.collect()


def pytree_leaves(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _graphs_without_a_gpu(monkeypatch, replay_us=50.0, direct=(100.0, 90.0)):
    """CudaGraphRunner's timing and capture stood in for on any machine: a direct call
    takes `direct` (wall, host) us, a replay `replay_us`; the capture runs the call; CUDA
    streams and graphs are stand-ins."""
    import contextlib
    from types import SimpleNamespace
    from frametrace.backends.triton import cudagraphs
    stream = SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=lambda: None))
    monkeypatch.setattr(cudagraphs, "_capturing", lambda: False)
    monkeypatch.setattr(cudagraphs, "_capture", lambda graph, pool, fn, args, direct=True: fn(args))
    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_timed", lambda self, fn, args: (
        (fn(args), replay_us, 5.0) if fn is self else (fn(args), *direct)))


def _sized_over_ints(monkeypatch):
    """A `Sized` dispatcher (inference, graphable) over a stand-in module whose one input
    is its size, an int: what a replay matches on, with no tensor to move."""
    mod, calls, _ = _stand_in_module(monkeypatch)
    mod.wrapper.lowered.symbol_sources = {"s0": "x"}
    mod.wrapper.sized_table = lambda inputs: (("sig",), (inputs[0],))
    mod.kind, mod.graphable_per_size = "inference", True
    mod.call = lambda args: ("call", list(args))
    return compiled_module.Sized.make(mod, [3])


@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("outcome", ["kept", "lost", "gpu_bound_first"])
def test_sizes_in_rounds_capture_in_their_third_without_a_gpu(monkeypatch, early, outcome):
    """`config.sized_early_verdict`, its decisions without a GPU: sizes called once a
    round each (decoding's lengths).  On: the first size at its third call measures its
    replay; kept, the others capture at their third calls in the same round, trusting
    it; lost, each other measures its own at `sized_capture_at`.  A first size found
    GPU-bound measures nothing, and the next size at its third call measures instead.
    Off: the first measurement waits for `sized_capture_at`."""
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_capture_at", 5)
    monkeypatch.setattr(config, "sized_shared_verdict", True)
    monkeypatch.setattr(config, "sized_early_verdict", early)
    monkeypatch.setattr(config, "sized_capture_first", False)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    _graphs_without_a_gpu(monkeypatch, replay_us=150.0 if outcome == "lost" else 50.0)
    run = _sized_over_ints(monkeypatch)
    sizes = (7, 40, 33, 12)
    if outcome == "gpu_bound_first":   # (7's direct calls: the host a tenth of their time)
        timed = cudagraphs.CudaGraphRunner._timed
        monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_timed", lambda self, fn, args: (
            (fn(args), 100.0, 10.0) if fn is not self and args[0] == 7 else timed(self, fn, args)))
    captured = {}
    for rnd in range(1, 9):
        for n in sizes:
            assert run([n])[-1] == [n]      # (the general wrapper, the fast one or its replay)
            r = run.fast[(n,)]
            if r.graph is not None:
                captured.setdefault(n, r.calls)
    decisions = {n: run.fast[(n,)].decision for n in sizes}
    if outcome == "kept":
        want = 3 if early else 5
        assert captured == {n: want for n in sizes}, (captured, decisions)
        assert "vs replay" in decisions[7]
        assert all(decisions[n].startswith("a sibling's") for n in sizes[1:]), decisions
    elif outcome == "lost":
        assert captured == {}, decisions
        assert all("vs replay 150" in d for d in decisions.values()), decisions
        assert [run.fast[(n,)].calls < 0 for n in sizes] == [True] * 4
    else:
        assert decisions[7].startswith("GPU-bound"), decisions
        want = 3 if early else 5
        assert captured == {n: want for n in sizes[1:]}, (captured, decisions)
        assert "vs replay" in decisions[40]
        assert all(decisions[n].startswith("a sibling's") for n in sizes[2:]), decisions
    assert run.verdict.tried
    assert run.verdict.kept is (outcome != "lost")


def test_sized_eviction_keeps_the_sets_near_a_replay(monkeypatch):
    """More sets of sizes than `sized_fast_limit`: the one dropped is, of the oldest
    quarter made, the one called least towards its CUDA-graph capture, so that a hot size
    made first survives a stream of sizes seen once (oldest-first dropped it at the
    limit's first new set, and it would have warmed up and captured again).  Without a
    GPU: the runners' timing and capture are stood in for."""
    monkeypatch.setattr(config, "sized_fast_limit", 8)
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_capture_at", 100)    # (no capture)
    _graphs_without_a_gpu(monkeypatch)
    mod, calls, _ = _stand_in_module(monkeypatch)
    mod.kind, mod.graphable_per_size = "inference", True
    t = lambda n: torch.zeros(n)  # noqa: E731
    run = compiled_module.Sized.make(mod, [t(1)])
    for n in range(2, 9):
        run([t(n)])
    assert list(run.fast) == [(n,) for n in range(1, 9)]
    for _ in range(5):
        assert run([t(1)])[0] == "fast"
    assert run.fast[(1,)].calls == 6
    for n in range(9, 20):          # eleven sizes seen once
        run([t(n)])
        assert (1,) in run.fast and len(run.fast) == 8
    assert run([t(1)])[0] == "fast" and 1 not in calls    # (never through `call`: its first call made it)
    monkeypatch.setattr(config, "sized_fast_limit", 4)      # (a window of one: oldest first)
    run = compiled_module.Sized.make(mod, [t(1)])
    for n in range(2, 5):
        run([t(n)])
    for _ in range(5):
        run([t(1)])
    run([t(5)])
    assert (1,) not in run.fast


@pytest.mark.parametrize("outcome", ["kept", "lost", "gpu_bound_first"])
def test_sizes_capture_at_their_first_call_once_a_replay_was_kept_without_a_gpu(monkeypatch, outcome):
    """`config.sized_capture_first`, its decisions without a GPU: the first set of sizes
    measures a replay right after its first call (direct calls timed, a graph captured,
    timed and dropped).  Kept: that set captures at its second call, every later new set
    right after its first (a bet) and replays from its second.  Lost: none captures, and
    each other set measures its own at `sized_capture_at`.  A first set found GPU-bound
    measures nothing; the next new set measures instead."""
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_capture_at", 5)
    monkeypatch.setattr(config, "sized_shared_verdict", True)
    monkeypatch.setattr(config, "sized_capture_first", True)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    _graphs_without_a_gpu(monkeypatch, replay_us=150.0 if outcome == "lost" else 50.0)
    if outcome == "gpu_bound_first":   # (3's direct calls: the host a tenth of their time)
        timed = cudagraphs.CudaGraphRunner._timed
        monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_timed", lambda self, fn, args: (
            (fn(args), 100.0, 10.0) if fn is not self and args[0] == 3 else timed(self, fn, args)))
    run = _sized_over_ints(monkeypatch)     # (size 3's first call)
    first = run.fast[(3,)]
    sizes = (3, 7, 40, 33, 12)
    captured, replays = {}, {}
    for rnd in range(1, 8):
        for n in sizes:
            if (n,) in run.fast and run.fast[(n,)].graph is not None:
                replays[n] = replays.get(n, 0) + 1
            assert run([n])[-1] == [n]      # (the general wrapper, the fast one or its replay)
            r = run.fast[(n,)]
            if r.graph is not None:
                captured.setdefault(n, r.calls)
    decisions = {n: run.fast[(n,)].decision for n in sizes}
    assert run.verdict.tried
    assert run.verdict.kept is (outcome != "lost")
    if outcome == "kept":
        assert captured == {3: 2, 7: 1, 40: 1, 33: 1, 12: 1}, (captured, decisions)
        assert "vs replay 50 us, at its first call; captured at call 2" in first.decision
        assert all(decisions[n] == "a sibling's replay was faster; captured at its first call"
                   for n in sizes[1:]), decisions
        assert (run.verdict.unpaid, run.verdict.recurred) == (0, 5)    # (3's 2nd call, 4 bets)
        assert replays == {n: 6 for n in sizes}, replays
    elif outcome == "lost":
        assert captured == {} and run.verdict.unpaid == 0, decisions
        assert "vs replay 150 us, at its first call" in first.decision and first.calls < 0
        assert all("vs replay 150 us, at call 5" in decisions[n] for n in sizes[1:]), decisions
    else:
        assert decisions[3].startswith("GPU-bound") and first.calls < 0, decisions
        assert captured == {7: 2, 40: 1, 33: 1, 12: 1}, (captured, decisions)
        assert "at its first call; captured at call 2" in decisions[7], decisions


def test_bets_on_sizes_seen_once_stop_at_the_limit_without_a_gpu(monkeypatch):
    """`config.sized_capture_first_limit`: sizes that never recur (a long prompt's decoding
    steps in one `generate()`) stop the bets once that many were never replayed; a set
    that recurs makes room for more (a bet replayed, or a set not bet on, which captures
    at its second call, untimed: the verdict was kept).  Without a GPU: timing and
    capture stood in for."""
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_fast_limit", 64)
    monkeypatch.setattr(config, "sized_shared_verdict", True)
    monkeypatch.setattr(config, "sized_capture_first", True)
    monkeypatch.setattr(config, "sized_capture_first_limit", 3)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    _graphs_without_a_gpu(monkeypatch)
    run = _sized_over_ints(monkeypatch)     # (3 measures: kept)
    bet = lambda: sorted(n for (n,), r in run.fast.items() if r.bet)  # noqa: E731
    for n in range(10, 20):
        run([n])
    assert bet() == [10, 11, 12], bet()
    assert all(run.fast[(n,)].graph is None for n in range(13, 20))
    run([11])                               # (a bet replays)
    assert bet() == [10, 12] and run.verdict.recurred == 1
    for n in range(20, 24):
        run([n])
    assert bet() == [10, 12, 20, 21], bet()     # (unpaid < limit + recurred)
    run([15])                               # (not bet on: captures at its second call)
    r = run.fast[(15,)]
    assert r.graph is not None and r.decision == "a sibling's replay was faster, at call 2", r.decision
    assert not r.bet and run.verdict.recurred == 2
    run([24])
    assert bet() == [10, 12, 20, 21, 24], bet()


def test_a_graph_gpu_bound_at_first_calls_stops_measuring_there_without_a_gpu(monkeypatch):
    """A graph whose first sets are GPU-bound: the first two sets' first calls measure
    (and keep launching), later sets' first calls run nothing more (their second call is
    timed and decides, as without `config.sized_capture_first`); values every call.
    Without a GPU: timing and capture stood in for."""
    from frametrace.backends.triton import cudagraphs
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_shared_verdict", True)
    monkeypatch.setattr(config, "sized_capture_first", True)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    _graphs_without_a_gpu(monkeypatch, direct=(100.0, 10.0))
    timed = []
    inner = cudagraphs.CudaGraphRunner._timed
    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_timed",
                        lambda self, fn, args: timed.append(args[0]) or inner(self, fn, args))
    run = _sized_over_ints(monkeypatch)     # (3: GPU-bound at its first call)
    for n in (7, 40, 33, 12):
        assert run([n])[-1] == [n]
    assert timed == [3, 3, 7, 7], timed
    assert run.verdict.gpu_bound == 2 and not run.verdict.tried
    assert all(run.fast[(n,)].gpu_us is None for n in (40, 33, 12))
    for n in (40, 40, 40):
        assert run([n])[-1] == [n]
    r = run.fast[(40,)]
    assert r.decision.startswith("GPU-bound") and r.calls < 0 and timed[4:] == [40], (r.decision, timed)


def test_eviction_keeps_a_bet_that_replays_without_a_gpu(monkeypatch):
    """A set captured at its first call stays at one call however often it replays: its
    replays count towards keeping it, so a stream of sizes seen once evicts those, not
    a hot bet.  Without a GPU: timing and capture stood in for."""
    monkeypatch.setattr(config, "sized_fast_after", 1)
    monkeypatch.setattr(config, "sized_fast_limit", 8)
    monkeypatch.setattr(config, "sized_shared_verdict", True)
    monkeypatch.setattr(config, "sized_capture_first", True)
    monkeypatch.setattr(config, "graph_trust_saturated", False)
    _graphs_without_a_gpu(monkeypatch)
    run = _sized_over_ints(monkeypatch)     # (3 measures: kept)
    run([5])
    assert run.fast[(5,)].bet
    for _ in range(10):
        run([5])
    assert run.fast[(5,)].replays == 10 and run.fast[(5,)].calls == 1
    for n in range(100, 120):               # (sizes seen once)
        run([n])
        assert (5,) in run.fast and len(run.fast) <= 8


@cuda
def test_sizes_called_in_rounds_capture_at_their_first_call(monkeypatch):
    """`config.sized_capture_first`: sizes called once a round each (a server's lengths),
    fresh inputs every call.  The symbolic graph's first set measures its replay right
    after its first call; kept, it captures at its second call, and every new size right
    after its first, replaying from its second.  Values against eager on every call, each
    call's outputs its own; a weight the graphs read in place, replaced by another tensor
    between calls, is read anew (the replay's pointer check misses and the call launches)."""
    from frametrace.backends.triton import backend, cudagraphs
    _sized_cuda_graphs(monkeypatch, first=True)
    lin = torch.nn.Linear(64, 64, device="cuda")
    soft = _launch_bound(8)

    def f(x):
        h, m = soft(lin(x))
        return h, m
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)
    sizes = (7, 40, 33, 12)
    captured, outs = {}, []

    def check(n):
        x = torch.randn(n, 64, device="cuda")
        got = cf(x)
        for g, w in zip(got, f(x)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        outs.append(got[0])
    with torch.no_grad():
        for rnd, ns in enumerate([(3,), (5,)] + [sizes] * 4):
            for n in ns:
                check(n)
                mod = next((m for m in reversed(backend.COMPILED) if m.symbolic), None)
                r = mod and mod.fast.fast.get((n,))
                if isinstance(r, cudagraphs.CudaGraphRunner) and r.graph is not None:
                    captured.setdefault(n, r.calls)
        first = mod.fast.fast[(5,)]
        if first.decision.startswith("GPU-bound") or first.calls < 0:
            pytest.skip(f"this GPU kept launching: {first.decision}")
        assert "at its first call" in first.decision, first.decision
        assert captured == {n: 1 for n in sizes}, (captured, {n: mod.fast.fast[(n,)].decision for n in sizes})
        assert mod.fast.verdict.unpaid == 0 and mod.fast.verdict.recurred >= 4
        assert len({o.data_ptr() for o in outs[-8:]}) == 8
        compiled = len(backend.COMPILED)
        lin.weight.data = torch.randn(64, 64, device="cuda")    # (another tensor, same sizes)
        for n in sizes + (5,) + sizes:
            check(n)
        if len(backend.COMPILED) == compiled:   # (no recompile: the same graphs missed)
            state = {n: (r.misses, r.calls, r.graph is None, r.stable, r.decision)
                     for n, r in ((n, mod.fast.fast[(n,)]) for n in sizes)}
            assert all(r[0] >= 1 for r in state.values()), state


def test_verdict_copies_an_input_once_seen_moving():
    """`Verdict.stable`: an input at the address a sibling call had is read in place
    unless some earlier pair of calls saw it move (the caching allocator gives a fresh
    input of one size the block another size freed); sizes are matched by value."""
    from frametrace.backends.triton import cudagraphs
    v = cudagraphs.Verdict(first=True)
    assert v.saw([100, 200, None]) is None
    assert v.saw([100, 300, None]) == [100, 200, None]
    assert v.moved == {1}
    assert v.stable([100, 300, None], [100, 300, None]) == [True, False, None]
    assert v.stable([100, 300, None], [101, 300, None]) == [False, False, None]


@cuda
def test_a_replay_whose_input_moved_captures_again_copying_it(monkeypatch):
    """A set captured at its first call while its input sat where the sibling call's had
    (one buffer's views, as the caching allocator may hand out): the graph reads it in
    place, and the first call with the input elsewhere captures again with it copied in
    (`cudagraphs.REPAIR_INPUTS`), then replays.  Values against eager on every call."""
    from frametrace.backends.triton import backend, cudagraphs
    _sized_cuda_graphs(monkeypatch, first=True)
    f = _launch_bound(8)
    frametrace.reset()
    cf = frametrace.optimize(backend="triton")(f)
    buf = torch.empty(64, 64, device="cuda")

    def check(x):
        for g, w in zip(cf(x), f(x)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        for n in (3, 5, 5, 7, 7, 40, 40):    # (the static graph; the symbolic one's first set)
            check(buf[:n].normal_())
        mod = next(m for m in reversed(backend.COMPILED) if m.symbolic)
        r = mod.fast.fast[(40,)]
        if r.graph is None:
            pytest.skip(f"this GPU kept launching: {r.decision}")
        x_at = [i for i, keep in enumerate(r.stable) if keep is not None and r.static[i].shape[0] == 40]
        assert len(x_at) == 1 and r.stable[x_at[0]], r.stable     # (read in place)
        for _ in range(3):
            check(torch.randn(40, 64, device="cuda"))
        assert r.graph is not None and r.stable[x_at[0]] is False and r.misses == 1
        assert x_at[0] in mod.fast.verdict.moved
        check(buf[:40].normal_())


@pytest.mark.parametrize("shared", [False, True])
def test_a_parameter_given_other_memory_misses_the_replay_without_a_gpu(monkeypatch, shared):
    """A graph reads an in-place input at the address it was captured with.  A parameter
    given other memory after the capture (`p.data = ...`: the same Python object, which
    frametrace passes to the graph each call) must make the call miss the replay and
    launch, never replay over the old memory; with a sibling verdict (`Sized`) the graph
    is captured again reading it at its new address (copying it in each call would cost
    a weight's bytes per call).  Without a GPU: timing and capture stood in for; the
    stand-in replay returns what the capture computed, so a replay after the swap would
    return the old weight's product."""
    from frametrace.backends.triton import cudagraphs
    _graphs_without_a_gpu(monkeypatch)
    monkeypatch.setattr(cudagraphs, "_graphable", lambda args: True)
    p = torch.nn.Parameter(torch.randn(8))

    def call(args):
        x, w = args
        return [x * w]
    verdict = cudagraphs.Verdict(first=True) if shared else None
    runner = cudagraphs.CudaGraphRunner(call, launches=100, verdict=verdict)
    x = torch.randn(8)      # (the same tensor each call: read in place too)
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(runner([x, p])[0], x * p)
        assert runner.graph is not None and runner.stable == [True, True], runner.decision
        p.data = torch.randn(8)
        for _ in range(2):
            torch.testing.assert_close(runner([x, p])[0], x * p)
    assert runner.misses == (1 if shared else 2)    # (shared: captured again after one)
    assert runner.stable == [True, True]        # (the same object: read at its new address)
    assert runner.ptrs[1] == p.data_ptr() if shared else runner.ptrs[1] != p.data_ptr()
    assert not (verdict and verdict.moved)


def test_an_input_copied_in_keeps_its_strides():
    """An input a graph copies into a buffer of its own at each call keeps its sizes and
    strides there (a kernel may have them as literals; `clone()` made a sliced row
    contiguous, and the kernel read the buffer with the slice's row stride).  An expanded
    input, whose elements overlap, refuses: the capture fails and the set launches."""
    from frametrace.backends.triton import cudagraphs
    base = torch.randn(4, 8)
    for a in (base[:, :5], base.t(), base[1:, 2:][::2], torch.randn(2, 3, 4).permute(2, 0, 1),
              base[:, 3], base[2:3], torch.randn(0, 5)[:, 1:]):
        b = cudagraphs._buffer_like(a)
        assert b.shape == a.shape and b.stride() == a.stride() and torch.equal(b, a)
        assert b.numel() == 0 or b.data_ptr() != a.data_ptr()
    for a in (torch.randn(4, 1).expand(4, 5), torch.randn(5).as_strided((3, 3), (1, 1))):
        with pytest.raises(ValueError):
            cudagraphs._buffer_like(a)
