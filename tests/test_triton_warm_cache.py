"""Warm starts with backend="triton" (warm_cache.py, backends/triton/tune_cache.py): a
warm process runs each cached frame without tracing it (the backend compiles the cached
graph again) and takes the autotuning choices an earlier process timed without timing
them; it computes what the cold process and CPython compute.  Whatever the cold process
compiled for and the warm one differs in (a setting of the triton backend, a dtype, a
layout, a damaged file, the cache switched off) compiles again, never a stale result.

The kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1); each test
runs programs in fresh processes over a cache folder of its own, and every result is
compared with CPython on fresh copies of the inputs."""
import os

import pytest
import torch

pytest.importorskip("triton")

from test_warm_start import _entries, _run as run_program   # (a program in a fresh process, its RESULT)

PROGRAM = r'''
import copy, json, os
import torch, frametrace
from frametrace import convert, warm_cache
from frametrace.backends.triton import autotune, backend, config, result_cache, tune_cache

env = os.environ.get
if env("FAST_ERF") == "0":
    config.fast_erf = False
if env("CACHE_OFF"):
    frametrace.config.cache = False
if env("RESULTS_OFF"):
    frametrace.config.cache_triton_results = False
if env("FINGERPRINT"):
    # (frametrace's own code edited: the generator's among it)
    warm_cache._own_fingerprint = lambda: env("FINGERPRINT")
    result_cache.generator_fingerprint = lambda: env("FINGERPRINT")
if env("RESULT_FORMAT"):
    result_cache._FORMAT = int(env("RESULT_FORMAT"))       # (only the result's key differs)
if env("GARBAGE_RESULT"):
    result_cache.artifact = lambda record: b"\x80garbage"   # (an entry holding a garbage result)
if env("BAD_SOURCE"):
    # (a result whose wrapper source no longer runs: restored, it fails at the first call)
    _describe = result_cache.describe
    def _bad(mod):
        d = _describe(mod)
        d["source"] = d["source"].replace("def call(args):", "def call(args):\n    raise RuntimeError('torn')")
        return d
    result_cache.describe = _bad
if env("OTHER_LAYOUTS"):
    # (a restored module whose first call's tensors differ from the cached layouts)
    _restore = result_cache.restore
    def _other(d):
        mod = _restore(d)
        mod.input_layouts = [None] * len(mod.input_layouts)
        return mod
    result_cache.restore = _other
if env("CACHED_DEVICE"):
    # (the cached layouts name another device for a 0-d input, as CUDA's efficient
    # attention's philox scalars: CPU tensors, CUDA by their FakeTensors; or for a
    # tensor with elements, which must not be served)
    _restore2 = result_cache.restore
    def _elsewhere(d):
        mod = _restore2(d)
        want = () if env("CACHED_DEVICE") == "scalar" else None
        mod.input_layouts = [(l[0], "cuda:0", *l[2:]) if l is not None and
                             (l[2] == () if want == () else l[2] != ()) else l
                             for l in mod.input_layouts]
        return mod
    result_cache.restore = _elsewhere
timed = []
if env("TIMED"):
    # Candidates timed as on a GPU, in the interpreter: the last one timed is the
    # fastest (not the heuristic default, so that a choice taken from disk shows).
    autotune._timed = lambda: True
    autotune._build_all = lambda configs, build: None
    config.autotune_min_elements = 0
    tune_cache.device = lambda: ("Fake GPU", 9, 0, 132)

    def _time(fn):
        fn()
        timed.append(1)
        return -len(timed)
    autotune._time = _time

compiles = []
_compile_graph = backend.compile_graph
def _counting(gm, example_inputs):
    compiles.append(1)
    return _compile_graph(gm, example_inputs)
backend.compile_graph = _counting

records = []
convert.record_observers.append(records.append)
dtype = torch.float64 if env("DTYPE") == "float64" else torch.float32
scenario = env("SCENARIO", "pointwise")
torch.manual_seed(0)


def pointwise(x, w):
    # (an elementwise chain, a softmax's reductions, a full sum)
    y = torch.softmax(x * w + 1.0, -1)
    return y * x.sigmoid(), (x.erf() - y).sum()


def scaled(x, s):
    # (a 0-d tensor beside a tensor with elements)
    return (x * s + s.exp()).tanh()


def tiled(x, y):
    # (a transposed read beside a contiguous one: a 2-D tiled kernel)
    return (x + y.t()).relu() * 2.0


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return torch.nn.functional.layer_norm(self.b(torch.nn.functional.gelu(self.a(x))), (8,))


def make(*shape, seed):
    t = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=dtype)
    if env("STRIDE") and t.dim() == 2:
        t = t.t().contiguous().t()      # (same values, column-major)
    return t


def tolist(v):
    return v.detach().double().tolist() if isinstance(v, torch.Tensor) else [tolist(u) for u in v]


out = {"values": [], "cpython": [], "grads": [], "cpython_grads": []}
if scenario == "training":
    model = MLP().to(dtype)
    reference = copy.deepcopy(model)
    compiled = frametrace.optimize(model, backend="triton", dynamic=False)
    for seed in (1, 2):
        x = make(6, 16, seed=seed)
        xr = x.clone()
        y, r = compiled(x), reference(xr)
        # (not a sum of squares: a layer norm's rows make that a constant, its
        # gradients rounding noise)
        coef = torch.linspace(-1, 2, 8, dtype=dtype)
        (y * coef).sum().backward(); (r * coef).sum().backward()
        out["values"].append(tolist(y)); out["cpython"].append(tolist(r))
    out["grads"] = [tolist(p.grad) for p in model.parameters()]
    out["cpython_grads"] = [tolist(p.grad) for p in reference.parameters()]
elif scenario in ("default_args", "default_global"):
    # The default backend, CPU graphs counted as a kernel device: a frame whose
    # arguments hold a tensor is traced for the kernels (triton); one that reads its
    # tensor from a global is traced for the eager backend, which its graph then runs
    # with, cold or warm.
    from frametrace.backends import default as default_backend
    default_backend.KERNEL_DEVICES = ("cuda", "cpu")
    G = make(8, 64, seed=3)

    def from_args(x):
        return (x * 2).sin().sum(0), x.relu()

    def from_global(n):
        return (G * n).sin().sum(0), G.relu()

    fn, argv = (from_args, lambda: [G.clone()]) if scenario == "default_args" else (from_global, lambda: [3])
    compiled = frametrace.optimize(fn, dynamic=False)
    for _ in range(2):
        out["values"].append(tolist(compiled(*argv())))
        out["cpython"].append(tolist(fn(*argv())))
    out["backends"] = [r.graph_module.meta.get("frametrace_backend") for r in records
                       if r.graph_module is not None]
else:
    fn, shapes = {"pointwise": (pointwise, [(8, 64), (64,)]),
                  "tiled": (tiled, [(32, 48), (48, 32)]),
                  "scaled": (scaled, [(8, 64), ()])}[scenario]
    compiled = frametrace.optimize(fn, backend="triton", dynamic=False)
    for seed in (1, 2):
        args = [make(*s, seed=seed + i) for i, s in enumerate(shapes)]
        copies = [a.clone() for a in args]
        out["values"].append(tolist(compiled(*args)))
        out["cpython"].append(tolist(fn(*copies)))
out["compiled"] = sum(1 for r in records if not r.from_cache and r.transformed_code is not None)
out["from_cache"] = sum(1 for r in records if r.from_cache)
out["backend_compiles"] = len(compiles)
out["kernels"] = sum(len(m.kernels) for m in backend.COMPILED)
out["kernel_names"] = sorted(k.name for m in backend.COMPILED for k in m.kernels)
out["timed"] = len(timed)
out["tuned"] = sorted([k[0], k[1], k[2], tune_cache.describe(c)] for k, c in autotune.TUNED.items())
out["tune_cache"] = dict(tune_cache.STATS)
out["stats"] = dict(warm_cache.stats)
out["pipeline"] = dict(backend.PIPELINE)
out["results"] = dict(result_cache.STATS)
print("RESULT", json.dumps(out))
'''


def _run(tmp_path, **env):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env.setdefault("TRITON_INTERPRET", "1")
    env.setdefault("FRAMETRACE_TRITON_STRICT", "1")
    return run_program(tmp_path, **env)


def _close(a, b, tol=1e-5):
    return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                          rtol=tol, atol=tol)


def _flat(v):
    return [x for u in v for x in _flat(u)] if isinstance(v, list) else [v]


def _same_as_cpython(r):
    assert r["values"] and len(r["values"]) == len(r["cpython"])
    for a, b in zip(r["values"], r["cpython"], strict=True):
        assert _close(_flat(a), _flat(b))
    assert len(r["grads"]) == len(r["cpython_grads"])
    for a, b in zip(r["grads"], r["cpython_grads"], strict=True):
        assert _close(_flat(a), _flat(b))
    assert r["kernels"] >= 1, "nothing ran as Triton kernels"


@pytest.mark.parametrize("scenario", ["pointwise", "training", "tiled"])
def test_warm_start_traces_nothing_same_answers(tmp_path, scenario):
    cold = _run(tmp_path, SCENARIO=scenario)
    _same_as_cpython(cold)
    assert cold["compiled"] >= 1 and cold["stats"]["stores"] >= 1, cold["stderr"][-2000:]
    assert "not cached" not in cold["stderr"], cold["stderr"][-2000:]
    warm = _run(tmp_path, SCENARIO=scenario)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["compiled"] == 0 and warm["from_cache"] == cold["compiled"], warm["stderr"][-2000:]
    assert warm["stats"]["hits"] >= 1 and warm["stats"]["stores"] == 0
    # (the backend's result comes from the cache: no AOTAutograd trace, no lowering,
    # scheduling or code generation; the same kernels as the cold process's)
    assert cold["pipeline"]["builds"] >= (2 if scenario == "training" else 1)
    assert cold["results"]["stored"] == cold["backend_compiles"] >= 1, cold["stderr"][-2000:]
    assert warm["backend_compiles"] == 0 and warm["pipeline"]["builds"] == 0, warm["stderr"][-2000:]
    assert warm["stats"]["backend_hits"] == cold["backend_compiles"]
    assert warm["pipeline"]["restored"] == cold["pipeline"]["builds"]
    assert warm["results"]["recompiled"] == 0
    assert warm["kernels"] == cold["kernels"] and warm["kernel_names"] == cold["kernel_names"]
    if scenario == "tiled":
        assert any(n.startswith("triton_tile_") for n in cold["kernel_names"]), cold["kernel_names"]
    assert "from the cache" in warm["stderr"]
    assert "the backend's result (the triton backend's modules: no lowering) from the cache" in warm["stderr"]


@pytest.mark.parametrize("scenario,backend", [("default_args", "triton"), ("default_global", "eager")])
def test_default_backend_warm_makes_the_cold_choice(tmp_path, scenario, backend):
    """The default backend's choice for a cached graph is the cold one: a graph traced
    for the eager backend (the frame's arguments hold no kernel-device tensor) is not
    handed to the kernels because its pickled GraphModule lost what the trace noted."""
    cold = _run(tmp_path, SCENARIO=scenario)
    assert cold["backends"] == [backend], cold["stderr"][-2000:]
    assert (cold["kernels"] >= 1) == (backend == "triton")
    warm = _run(tmp_path, SCENARIO=scenario)
    assert warm["compiled"] == 0 and warm["from_cache"] >= 1, warm["stderr"][-2000:]
    assert warm["backends"] == [backend] and warm["kernels"] == cold["kernels"]
    for r in (cold, warm):
        for a, b in zip(r["values"], r["cpython"], strict=True):
            assert _close(_flat(a), _flat(b))
    assert warm["values"] == cold["values"]


def test_autotune_choices_from_disk_time_nothing(tmp_path):
    cold = _run(tmp_path, SCENARIO="training", TIMED=1)
    _same_as_cpython(cold)
    assert cold["timed"] >= 2 and cold["tune_cache"]["stores"] >= 1, cold["stderr"][-2000:]
    # (the last candidate timed wins: not every choice is the heuristic default)
    warm = _run(tmp_path, SCENARIO="training", TIMED=1)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["timed"] == 0 and warm["tuned"] == cold["tuned"]
    assert warm["tune_cache"]["hits"] == cold["tune_cache"]["stores"]
    assert warm["compiled"] == 0


def test_damaged_autotune_choice_is_timed_again(tmp_path):
    cold = _run(tmp_path, SCENARIO="pointwise", TIMED=1)
    files = []
    for dirpath, _, names in os.walk(tmp_path / "cache" / "triton-autotune"):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".json")]
    assert files and len(files) == cold["tune_cache"]["stores"]
    with open(files[0], "w") as fh:
        fh.write('{"key": [1, 2')     # (torn)
    warm = _run(tmp_path, SCENARIO="pointwise", TIMED=1)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["tuned"] == cold["tuned"]
    assert warm["timed"] >= 1 and warm["tune_cache"]["errors"] == 1
    assert "cannot be read" in warm["stderr"]


def test_damaged_entry_compiles_again(tmp_path):
    cold = _run(tmp_path)
    for path in _entries(tmp_path):
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])   # (torn)
    warm = _run(tmp_path)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    assert warm["compiled"] == cold["compiled"] and warm["from_cache"] == 0
    assert "is damaged or of another version; a miss" in warm["stderr"]


# What the cold process compiled for and the warm one differs in: the frame is traced
# again (its key: the triton backend's settings, the switch; its guards: dtype, strides).
CHANGES = {
    "a triton setting": dict(FAST_ERF="0"),
    "dtype": dict(DTYPE="float64"),
    "strides": dict(STRIDE=1),
    "cache off": dict(CACHE_OFF=1),
    "generator code": dict(FINGERPRINT="edited"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_situation_compiles_again(tmp_path, change):
    cold = _run(tmp_path)
    _same_as_cpython(cold)
    other = _run(tmp_path, **CHANGES[change])
    _same_as_cpython(other)
    assert other["compiled"] >= 1 and other["from_cache"] == 0, other["stderr"][-2000:]
    assert other["stats"]["hits"] == 0
    if change == "cache off":
        assert other["stats"]["stores"] == 0


def test_key_holds_the_triton_settings_and_devices(monkeypatch):
    from frametrace import warm_cache
    from frametrace.backend_registry import _BACKENDS
    from frametrace.backends.triton import config

    def f(x):
        return x + 1
    triton = _BACKENDS["triton"]
    base = warm_cache.key_of(f.__code__, triton, False, False)
    assert base is not None
    assert warm_cache.key_of(f.__code__, _BACKENDS["eager"], False, False) != base
    monkeypatch.setattr(config, "persistent_rblock_max", 1024)
    assert warm_cache.key_of(f.__code__, triton, False, False) != base
    monkeypatch.undo()
    assert warm_cache.key_of(f.__code__, triton, False, False) == base
    monkeypatch.setattr(warm_cache, "_devices", lambda: (("NVIDIA H200", 9, 0, 132),))
    h200 = warm_cache.key_of(f.__code__, triton, False, False)
    monkeypatch.setattr(warm_cache, "_devices", lambda: (("NVIDIA H100 80GB HBM3", 9, 0, 132),))
    assert warm_cache.key_of(f.__code__, triton, False, False) not in (base, h200)
    monkeypatch.setattr(warm_cache, "_triton_version", lambda: "0.0-other")
    assert warm_cache.key_of(f.__code__, triton, False, False) not in (base, h200)


def test_tune_cache_key_and_unwritable_folder(tmp_path, monkeypatch, caplog):
    from frametrace import config as ft_config
    from frametrace.backends.triton import tune_cache
    from frametrace.backends.triton.autotune import Config
    monkeypatch.setattr(tune_cache, "device", lambda: ("Fake GPU", 9, 0, 132))
    monkeypatch.setattr(ft_config, "cache_dir", str(tmp_path / "c"))
    configs = [Config(1024, 1, 4), Config(2048, 1, 8)]
    tune_cache.store("triton_k_abc", 4096, 1, configs, configs[1])
    assert tune_cache.load("triton_k_abc", 4096, 1, configs) is configs[1]
    assert tune_cache.load("triton_k_abc", 8192, 1, configs) is None            # (extents)
    assert tune_cache.load("triton_k_abd", 4096, 1, configs) is None            # (source)
    assert tune_cache.load("triton_k_abc", 4096, 1, configs[:1] + [Config(2048, 1, 4)]) is None
    monkeypatch.setattr(tune_cache, "device", lambda: ("Other GPU", 8, 0, 108))
    assert tune_cache.load("triton_k_abc", 4096, 1, configs) is None            # (device)
    monkeypatch.setattr(ft_config, "cache", False)
    assert tune_cache.load("triton_k_abc", 4096, 1, configs) is None            # (switched off)
    monkeypatch.setattr(ft_config, "cache", True)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(ft_config, "cache_dir", str(blocker))     # (a file: no folder in it)
    with caplog.at_level("INFO", logger="frametrace.cache"):
        tune_cache.store("triton_k_abc", 4096, 1, configs, configs[0])
        tune_cache.store("triton_k_abc", 4096, 1, configs, configs[0])
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot write an autotune choice" in warnings[0].getMessage()


# What the warm process's entry fits but the backend's cached result must not serve (or
# cannot): the result's own key, a result that cannot be read, the switch, a restored
# module that fails or whose inputs have other layouts: compiled again, the same answers.
RESULT_ATTACKS = {
    "result key": (dict(), dict(RESULT_FORMAT=2), "pointwise"),
    "garbage result": (dict(GARBAGE_RESULT=1), dict(), "pointwise"),
    "switch off": (dict(), dict(RESULTS_OFF=1), "training"),
    "failing module": (dict(BAD_SOURCE=1), dict(), "pointwise"),
    "other layouts": (dict(), dict(OTHER_LAYOUTS=1), "training"),
}


@pytest.mark.parametrize("attack", list(RESULT_ATTACKS))
def test_backend_result_not_served_compiles_again(tmp_path, attack):
    cold_env, warm_env, scenario = RESULT_ATTACKS[attack]
    cold = _run(tmp_path, SCENARIO=scenario, **cold_env)
    _same_as_cpython(cold)
    warm = _run(tmp_path, SCENARIO=scenario, **warm_env)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["compiled"] == 0 and warm["stats"]["hits"] >= 1, warm["stderr"][-2000:]
    if attack in ("failing module", "other layouts"):
        # (restored, then traced again from the cached graph's code at the first call)
        assert warm["stats"]["backend_hits"] >= 1 and warm["results"]["recompiled"] >= 1
        assert warm["pipeline"]["builds"] == warm["results"]["recompiled"]
        assert "a restored triton module does not fit" in warm["stderr"]
    else:
        assert warm["stats"]["backend_hits"] == 0 and warm["pipeline"]["builds"] >= 1
        assert warm["backend_compiles"] == cold["backend_compiles"]
    if attack == "garbage result":
        assert warm["stderr"].count("cannot rebuild the backend's result") == 1
    if attack == "result key":
        assert "cached result is for other inputs" in warm["stderr"]


def test_result_key_holds_inputs_settings_and_generator(monkeypatch):
    from frametrace.backends.triton import config, result_cache

    def key(*inputs):
        return result_cache.result_key(list(inputs))
    x = torch.randn(4, 6)
    base = key(x)
    assert key(x.clone()) == base
    assert key(x.double()) != base                                  # (dtype)
    assert key(x.t().contiguous().t()) != base                      # (strides)
    assert key(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)) != \
        key(torch.randn(2, 3, 4, 5))                                # (channels-last)
    assert key(x.requires_grad_()) != base                          # (requires_grad)
    x.requires_grad_(False)
    assert key(x, x) != key(x, x.clone())                           # (aliasing)
    monkeypatch.setattr(config, "fast_erf", not config.fast_erf)
    assert key(x) != base                                           # (a triton setting)
    monkeypatch.undo()
    assert key(x) == base
    monkeypatch.setenv("TRITON_INTERPRET", "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1")
    assert key(x) != base                                           # (the interpreter)
    monkeypatch.undo()
    monkeypatch.setattr(result_cache, "generator_fingerprint", lambda: "edited")
    assert key(x) != base                                           # (the generator's code)
    monkeypatch.undo()
    # (a GPU no machine has: on the H200 itself its own name would give the same key)
    monkeypatch.setattr(result_cache, "_devices", lambda: (("NVIDIA Imaginary", 1, 2, 3),))
    assert key(x) != base                                           # (the GPU)
    monkeypatch.undo()
    with torch.no_grad():
        assert key(x) != base                                       # (grad mode)
    with pytest.raises(result_cache.NotCacheable):                  # (not strided)
        key(torch.eye(3).to_sparse())


@pytest.mark.parametrize("where", ["scalar", "tensor"])
def test_restored_module_takes_a_scalar_from_another_device(tmp_path, where):
    # A 0-d input whose cached layout names another device fits (the cold module ran on
    # it: the FakeTensors of CUDA's philox scalars say CUDA, the tensors are on the CPU);
    # a tensor with elements on another device does not: compiled again.
    cold = _run(tmp_path, SCENARIO="scaled")
    _same_as_cpython(cold)
    warm = _run(tmp_path, SCENARIO="scaled", CACHED_DEVICE=where)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    assert warm["compiled"] == 0 and warm["stats"]["backend_hits"] == 1
    assert warm["results"]["restored"] == 1
    if where == "scalar":
        assert warm["results"]["recompiled"] == 0 and warm["pipeline"]["builds"] == 0
    else:
        assert warm["results"]["recompiled"] == 1 and warm["pipeline"]["builds"] == 1
        assert "input 0 is ('torch.float32', 'cpu'" in warm["stderr"]


def test_fits_rule():
    from frametrace.backends.triton.result_cache import fits
    t = ("torch.float32", "cuda:0", (4, 6), (6, 1))
    s = ("torch.int64", "cuda:0", (), ())
    s_cpu = ("torch.int64", "cpu", (), ())
    assert fits([t, s, None], [t, s, None])
    assert fits([t, s], [t, s_cpu]) and fits([t, s_cpu], [t, s])     # (0-d: device free)
    assert not fits([t, s], [t, ("torch.int32", "cpu", (), ())])      # (dtype)
    assert not fits([t], [("torch.float32", "cpu", (4, 6), (6, 1))])  # (elements elsewhere)
    assert not fits([t], [("torch.float32", "cuda:0", (4, 6), (1, 4))])   # (strides)
    assert not fits([t, s], [t]) and not fits([s], [None]) and not fits([None], [s])
