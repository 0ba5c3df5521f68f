"""AOTAutograd's results in the on-disk cache (backends/aot_cache.py): a warm process
runs the cached forward/backward graphs without AOTAutograd tracing anything, and gives
what the cold process and CPython give; whatever the cached result was made for and
the warm call differs in (input layout, dtype, requires_grad, grad mode, autocast,
functorch's config, decompositions) makes AOTAutograd trace again, never a stale result.
Each test runs programs in fresh processes over a cache folder of its own."""
import hashlib
import os
import pickle

import pytest
import torch

from test_warm_start import _entries, _run as run_program   # (a program in a fresh process, its RESULT)

PROGRAM = r'''
import copy, json, os, sys
import torch, frametrace
import torch._functorch.aot_autograd as aot_autograd
from frametrace import convert, warm_cache

traced = []
_original = aot_autograd.aot_module_simplified
def _counting(*args, **kwargs):
    traced.append(1)
    return _original(*args, **kwargs)
aot_autograd.aot_module_simplified = _counting   # (aot_eager imports it at each compile)

env = os.environ.get
unpickled = []      # (entries' FX graphs unpickled: a lazy one only when read)
_deserialize = torch.fx.graph_module._deserialize_graph_module
def _counting_deserialize(*args, **kwargs):
    unpickled.append(1)
    return _deserialize(*args, **kwargs)
torch.fx.graph_module._deserialize_graph_module = _counting_deserialize
if env("LAZY") == "0":
    frametrace.config.cache_lazy_graph = False
if env("GRAPH_BYTECODE") == "0":
    frametrace.config.cache_graph_bytecode = False
if env("NO_TO_CACHEABLE"):       # (AOTConfig before torch 2.13: no to_cacheable())
    from torch._functorch._aot_autograd import schemas
    if hasattr(schemas.AOTConfig, "to_cacheable"):
        del schemas.AOTConfig.to_cacheable
if env("AOT_OFF"):
    frametrace.config.cache_aot_results = False
if env("ALIAS_CHECK") == "1":
    frametrace.config.cache_skip_alias_check = False
from torch._functorch._aot_autograd import runtime_wrappers as _rw
alias_checked = []      # (ops dispatched through the first call's custom-op aliasing check)
if hasattr(_rw, "_AnalyzeCustomOpInputOutputMode"):
    _alias_dispatch = _rw._AnalyzeCustomOpInputOutputMode.__torch_dispatch__
    def _counting_alias_dispatch(self, *args, **kwargs):
        alias_checked.append(1)
        return _alias_dispatch(self, *args, **kwargs)
    _rw._AnalyzeCustomOpInputOutputMode.__torch_dispatch__ = _counting_alias_dispatch
if env("FUNCTORCH"):
    torch._functorch.config.view_replay_for_aliased_outputs = \
        not torch._functorch.config.view_replay_for_aliased_outputs
if env("DECOMP"):
    from frametrace.backends import aot_eager as _aot_eager_module
    _table = _aot_eager_module.core_aten_decompositions
    def _fewer():
        table = dict(_table())
        table.pop(torch.ops.aten.gelu.default, None)
        table.pop(torch.ops.aten.gelu_backward.default, None)
        return table
    _aot_eager_module.core_aten_decompositions = _fewer

records = []
convert.record_observers.append(records.append)
dtype = torch.float64 if env("DTYPE") == "float64" else torch.float32
scenario = env("SCENARIO", "mlp")
torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))).tanh()


def mutate(x, buf):
    buf.mul_(2)
    return (x * buf).sin() + buf.sum()


if scenario == "custom_op":
    # (its fake and backward implementations are this file's code: an edit of them would
    # leave the graph as it is)
    factor = float(env("FACTOR", "3"))

    @torch.library.custom_op("ftwarm::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * factor

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    def _backward(ctx, g):
        return g * factor
    scale.register_autograd(_backward)

    def with_custom_op(x):
        return torch.ops.ftwarm.scale(x).sin()


def make_input(n):
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(n), dtype=dtype)
    if env("STRIDE"):
        x = x.t().contiguous().t()      # (same values, column-major)
    return x.requires_grad_(env("REQ_GRAD", "1") == "1")


out = {"values": [], "cpython": [], "grads": [], "cpython_grads": []}
sizes = [int(s) for s in env("SIZES", "4,4").split(",")]
if scenario == "custom_op":
    fn = frametrace.optimize(with_custom_op, backend=env("BACKEND", "aot_eager"), dynamic=False)
    for n in sizes:
        x = make_input(n)
        xr = x.detach().clone().requires_grad_(True)
        y = fn(x)
        r = (xr * factor).sin()
        y.sum().backward(); r.sum().backward()
        out["values"].append(y.tolist())
        out["cpython"].append(r.tolist())
        out["grads"].append(x.grad.tolist())
        out["cpython_grads"].append(xr.grad.tolist())
elif scenario == "mutation":
    fn = frametrace.optimize(mutate, backend=env("BACKEND", "aot_eager"), dynamic=False)
    for n in sizes:
        x, xr = make_input(n), None
        xr = x.detach().clone().requires_grad_(x.requires_grad)
        buf, bufr = torch.ones(n, 6, dtype=dtype), torch.ones(n, 6, dtype=dtype)
        y, r = fn(x, buf), mutate(xr, bufr)
        y.sum().backward(); r.sum().backward()
        out["values"].append([y.tolist(), buf.tolist()])
        out["cpython"].append([r.tolist(), bufr.tolist()])
        out["grads"].append(x.grad.tolist())
        out["cpython_grads"].append(xr.grad.tolist())
else:
    model = MLP().to(dtype)
    reference = copy.deepcopy(model)
    compiled = frametrace.optimize(model, backend=env("BACKEND", "aot_eager"),
                                   dynamic=None if env("DYNAMIC") else False)
    for n in sizes:
        x = make_input(n)
        xr = x.detach().clone().requires_grad_(x.requires_grad)
        if env("GRAD") == "0":
            with torch.no_grad():
                y, r = compiled(x), reference(xr)
        elif env("AUTOCAST"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y, r = compiled(x), reference(xr)
            y.float().sum().backward(); r.float().sum().backward()
        else:
            y, r = compiled(x), reference(xr)
            y.sum().backward(); r.sum().backward()
        out["values"].append(y.float().tolist())
        out["cpython"].append(r.float().tolist())
    out["grads"] = [p.grad.tolist() for p in model.parameters() if p.grad is not None]
    out["cpython_grads"] = [p.grad.tolist() for p in reference.parameters() if p.grad is not None]
out["traced"] = len(traced)
out["unpickled_before_read"] = len(unpickled)
if env("READ_GRAPHS"):      # (explain()'s view: each entry's graph, op count, code)
    out["graphs"] = [[r.op_count, r.graph_module.code.strip()] for r in records
                     if r.graph_module is not None]
    out["graph_modules"] = len([g for g in convert.graph_modules.values() if g is not None])
out["compiled"] = sum(1 for r in records if not r.from_cache and r.transformed_code is not None)
out["from_cache"] = sum(1 for r in records if r.from_cache)
out["stats"] = dict(warm_cache.stats)
out["alias_checked"] = len(alias_checked)
out["has_alias_check"] = hasattr(_rw, "_FirstInvocationContext")
from frametrace.backends import aot_cache
out["alias_checks_skipped"] = aot_cache.STATS["alias_checks_skipped"]
print("RESULT", json.dumps(out))
'''


def _run(tmp_path, **env):
    (tmp_path / "prog.py").write_text(PROGRAM)
    return run_program(tmp_path, **env)


def _close(a, b, tol=1e-5):
    return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                          rtol=tol, atol=tol)


def _same_as_cpython(r, tol=1e-5):
    assert r["values"] and len(r["values"]) == len(r["cpython"])
    for a, b in zip(r["values"], r["cpython"], strict=True):
        assert _close(a, b, tol)
    for a, b in zip(r["grads"], r["cpython_grads"], strict=True):
        assert _close(a, b, tol)


SCENARIOS = {
    "training": dict(),
    "input mutation": dict(SCENARIO="mutation"),
    "inference (no_grad)": dict(GRAD=0),
    "no input requires grad": dict(REQ_GRAD=0),
    "autocast bf16": dict(AUTOCAST=1),
    "column-major input": dict(STRIDE=1),
    "float64": dict(DTYPE="float64"),
    "decomp_partition": dict(BACKEND="aot_eager_decomp_partition"),
    "AOTConfig without to_cacheable (torch 2.11)": dict(NO_TO_CACHEABLE=1),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_warm_start_traces_nothing_same_answers(tmp_path, scenario):
    env = SCENARIOS[scenario]
    tol = 2e-2 if "AUTOCAST" in env else 1e-5
    cold = _run(tmp_path, **env)
    _same_as_cpython(cold, tol)
    assert cold["traced"] >= 1 and cold["stats"]["stores"] >= 1, cold["stderr"][-2000:]
    assert "not cached" not in cold["stderr"], cold["stderr"][-2000:]
    warm = _run(tmp_path, **env)
    _same_as_cpython(warm, tol)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["compiled"] == 0 and warm["traced"] == 0, warm["stderr"][-2000:]
    assert warm["stats"]["backend_hits"] == cold["stats"]["stores"]
    assert "AOTAutograd's graphs) from the cache" in warm["stderr"]


# What the cold process compiled for and the warm one differs in.  Some are misses of
# the frame's entry (its guards: layout, dtype, requires_grad, grad mode, autocast),
# the others of AOTAutograd's result only (its key: functorch's config, the
# decompositions): either way AOTAutograd traces again.
CHANGES = {
    "strides": (dict(), dict(STRIDE=1)),
    "dtype": (dict(), dict(DTYPE="float64")),
    "requires_grad": (dict(), dict(REQ_GRAD=0)),
    "grad mode off": (dict(), dict(GRAD=0)),
    "autocast": (dict(), dict(AUTOCAST=1)),
    "functorch config": (dict(), dict(FUNCTORCH=1)),
    "decompositions": (dict(BACKEND="aot_eager_decomp_partition"),
                       dict(BACKEND="aot_eager_decomp_partition", DECOMP=1)),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_situation_traces_again(tmp_path, change):
    first, second = CHANGES[change]
    cold = _run(tmp_path, **first)
    _same_as_cpython(cold)
    other = _run(tmp_path, **second)
    _same_as_cpython(other, 2e-2 if "AUTOCAST" in second else 1e-5)
    assert other["traced"] >= 1, other["stderr"][-2000:]
    assert other["stats"]["backend_hits"] == 0
    if change in ("functorch config", "decompositions"):
        # The frame's entry fits (no trace of the frame); AOTAutograd's result does not.
        assert other["compiled"] == 0 and other["from_cache"] >= 1
        assert other["stats"]["backend_misses"] >= 1
        assert "is for other inputs, state or settings" in other["stderr"]


def test_custom_op_result_not_cached(tmp_path):
    """A custom op's Python implementations are baked into AOTAutograd's graphs and
    pinned by nothing: its graphs are not cached, the warm process traces them (an
    edited backward formula is then used, never a stale one)."""
    cold = _run(tmp_path, SCENARIO="custom_op")
    _same_as_cpython(cold)
    # (the frame's entry is refused already, for the op packet its guards compare;
    # aot_cache.check_graph refuses such a graph's AOTAutograd result in any case)
    assert "is not cached" in cold["stderr"] and "ftwarm.scale" in cold["stderr"]
    warm = _run(tmp_path, SCENARIO="custom_op", FACTOR="5")
    _same_as_cpython(warm)
    assert warm["traced"] >= 1 and warm["stats"]["backend_hits"] == 0


def test_switch_off_traces_with_aot_autograd(tmp_path):
    cold = _run(tmp_path)
    warm = _run(tmp_path, AOT_OFF=1)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    assert warm["compiled"] == 0 and warm["from_cache"] >= 1      # (the entry still serves)
    assert warm["traced"] == cold["traced"] and warm["stats"]["backend_hits"] == 0


def test_dynamic_sizes_not_cached_still_right(tmp_path):
    env = dict(DYNAMIC=1, SIZES="4,4,5,6")
    cold = _run(tmp_path, **env)
    _same_as_cpython(cold)
    warm = _run(tmp_path, **env)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    # The static entry comes from the cache; the symbolic one is traced again.
    assert warm["stats"]["backend_hits"] >= 1
    assert warm["traced"] == cold["traced"] - warm["stats"]["backend_hits"]


def _rewrite_entries(tmp_path, old, new, count=1):
    """Replace `old` by `new` in each entry's body, the file's checksum made right again
    (a writer's bug, not a torn file)."""
    head = 8 + 32
    for path in _entries(tmp_path):
        data = open(path, "rb").read()
        outer = pickle.loads(data[head:])
        body = outer["body"]
        assert old in body
        outer["body"] = body.replace(old, new, count)
        payload = pickle.dumps(outer)
        open(path, "wb").write(data[:8] + hashlib.sha256(payload).digest() + payload)


@pytest.mark.parametrize("bytecode", ["off", "damaged too"])
def test_damaged_artifact_with_valid_checksum_compiles_again(tmp_path, bytecode):
    """An artifact that cannot be rebuilt (here its forward's code renamed, and its
    bytecode either not used or not this graph's) is a miss of AOTAutograd's result with
    one log line; the graph is compiled from the entry."""
    cold = _run(tmp_path)
    # (the artifact comes first in the entry's body: its forward graph's code)
    _rewrite_entries(tmp_path, b"def forward(self", b"def forwarX(self")
    if bytecode == "damaged too":       # (then the source is compiled: the renamed one)
        _rewrite_entries(tmp_path, b"<frametrace: cached AOT graph>",
                         b"<frametrace: cached AOT graph!", count=-1)
    warm = _run(tmp_path, GRAPH_BYTECODE="0" if bytecode == "off" else "1")
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["compiled"] == 0 and warm["from_cache"] >= 1
    assert warm["traced"] >= 1 and warm["stats"]["backend_hits"] == 0
    assert "cannot rebuild the backend's result" in warm["stderr"]


def test_key_covers_inputs_state_and_versions(monkeypatch):
    """The artifact's key, in this process: each thing AOTAutograd's result depends on
    changes it."""
    from frametrace.backends import aot_cache
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 3)
    base = aot_cache.key_of([x, w], "aot_eager")
    assert aot_cache.key_of([x, w], "aot_eager") == base
    variants = {
        "stride": [x.detach().t().contiguous().t().requires_grad_(), w],
        "dtype": [x.detach().double().requires_grad_(), w],
        "requires_grad": [x.detach(), w],
        "a view of another size": [x, w[:, :2]],
        "aliasing": [x, x],
        "a python number": [x, w, 3],
    }
    for name, inputs in variants.items():
        assert aot_cache.key_of(inputs, "aot_eager") != base, name
    assert aot_cache.key_of([x, w], "aot_eager_decomp_partition") != base
    with torch.no_grad():
        assert aot_cache.key_of([x, w], "aot_eager") != base
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert aot_cache.key_of([x, w], "aot_eager") != base
    with torch.autocast("cpu", dtype=torch.float16):
        fp16 = aot_cache.key_of([x, w], "aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert aot_cache.key_of([x, w], "aot_eager") != fp16
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    with_table = aot_cache.key_of([x, w], "aot_eager", decompositions=table)
    smaller = dict(table)
    smaller.pop(next(iter(smaller)))
    assert aot_cache.key_of([x, w], "aot_eager", decompositions=smaller) != with_table
    from torch._functorch import config as functorch_config
    before = functorch_config.view_replay_for_aliased_outputs
    functorch_config.view_replay_for_aliased_outputs = not before
    try:
        assert aot_cache.key_of([x, w], "aot_eager") != base
    finally:
        functorch_config.view_replay_for_aliased_outputs = before
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert aot_cache.key_of([x, w], "aot_eager") != base
    monkeypatch.undo()
    assert aot_cache.key_of([x, w], "aot_eager") == base
    with pytest.raises(aot_cache.NotCacheable):
        aot_cache.key_of([x, object()], "aot_eager")


def test_graphs_calling_code_not_torch_s_are_refused():
    """check_graph: a custom op's or a user function's code is not pinned by the key."""
    import torch.fx as fx
    from frametrace.backends import aot_cache

    @torch.library.custom_op("ftwarmunit::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def user(x):
        return x

    def graph_of(target):
        g = fx.Graph()
        g.output(g.call_function(target, (g.placeholder("x"),)))
        return fx.GraphModule(torch.nn.Module(), g)

    for target in (torch.ops.ftwarmunit.double.default, user):
        with pytest.raises(aot_cache.NotCacheable):
            aot_cache.check_graph(graph_of(target))
    aot_cache.check_graph(graph_of(torch.sin))
    aot_cache.check_graph(graph_of(torch.ops.aten.sin.default))


@pytest.mark.parametrize("lazy", ["1", "0"])
def test_lazy_graph_unpickled_only_when_read(tmp_path, lazy):
    """config.cache_lazy_graph: a warm entry whose AOTAutograd result comes from the
    cache does not unpickle its FX graph to run; explain()'s records and graph_modules
    give the same graph as the cold process when read.  Off: unpickled at the load."""
    cold = _run(tmp_path, READ_GRAPHS=1, SIZES="4,4,5")
    _same_as_cpython(cold)
    warm = _run(tmp_path, READ_GRAPHS=1, SIZES="4,4,5", LAZY=lazy)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
    assert warm["compiled"] == 0 and warm["traced"] == 0
    assert warm["stats"]["backend_hits"] == cold["stats"]["stores"] == 2
    if lazy == "1":
        assert warm["unpickled_before_read"] == 0
    else:
        assert warm["unpickled_before_read"] >= 2
    assert warm["graphs"] == cold["graphs"] and len(warm["graphs"]) == 2
    assert warm["graph_modules"] == 2


def test_graph_bytecode_damaged_compiles_its_source(tmp_path):
    """Cached bytecode that is not the graph's (marshal gives another file's code: it is
    checked) is left aside for the graph's source, compiled as before: still from the
    cache, nothing traced, same answers."""
    cold = _run(tmp_path)
    _rewrite_entries(tmp_path, b"<frametrace: cached AOT graph>",
                     b"<frametrace: cached AOT graph!", count=-1)
    for bytecode in ("1", "0"):
        warm = _run(tmp_path, GRAPH_BYTECODE=bytecode)
        _same_as_cpython(warm)
        assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
        assert warm["compiled"] == 0 and warm["traced"] == 0
        assert warm["stats"]["backend_hits"] == cold["stats"]["stores"]


@pytest.mark.parametrize("scenario", ["training", "inference (no_grad)", "input mutation"])
def test_warm_start_skips_first_call_alias_check(tmp_path, scenario):
    """config.cache_skip_alias_check: a function rebuilt from the cache runs its first
    call without AOTAutograd's custom-op aliasing check (every op of the graph dispatched
    through a Python mode; the graph has torch's ops only); off, the check runs as in
    the cold process.  Same answers as CPython and the cold process either way, nothing
    traced warm."""
    env = SCENARIOS[scenario]
    cold = _run(tmp_path, **env)
    _same_as_cpython(cold)
    if not cold["has_alias_check"]:
        pytest.skip("this torch's runtime wrapper has no first-call aliasing check")
    assert cold["alias_checked"] > 0 and cold["alias_checks_skipped"] == 0   # (the count works)
    for switch in ("0", "1"):
        warm = _run(tmp_path, ALIAS_CHECK=switch, **env)
        _same_as_cpython(warm)
        assert warm["values"] == cold["values"] and warm["grads"] == cold["grads"]
        assert warm["compiled"] == 0 and warm["traced"] == 0, warm["stderr"][-2000:]
        assert warm["stats"]["backend_hits"] == cold["stats"]["stores"] >= 1
        if switch == "0":
            assert warm["alias_checked"] == 0
            assert warm["alias_checks_skipped"] == warm["stats"]["backend_hits"]
        else:
            assert warm["alias_checked"] > 0 and warm["alias_checks_skipped"] == 0
