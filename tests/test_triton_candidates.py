"""How many block-size candidates a kernel gets (`config.autotune_candidates`,
autotune.few): each one a GPU times is a Triton compile in the first call.  "few" keeps a
pointwise or tiled kernel's heuristic default alone (two from autotune.FEW_LARGE
elements), a reduction's default and first alternative (three from FEW_LARGE); "all"
restores every candidate, the lists as they were.  Either way the kernels compute what
eager does (Triton's interpreter on the CPU).  Also: a graph's compile runs with fewer
garbage collections (gc_pause.py) and gives the thresholds back."""
import gc

import pytest
import torch

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, config, gc_pause, tiling  # noqa: E402
from frametrace.backends.triton.autotune import Config  # noqa: E402
from triton_harness import triton_check, triton_check_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _t(configs):
    return [(c.xblock, c.rblock, c.num_warps) if isinstance(c, Config) else (c.yblock, c.xblock, c.num_warps)
            for c in configs]


# The candidate lists before autotune_candidates, for a few shapes of each class.
OLD = {
    ("pointwise", 1 << 20, 1): [(1024, 1, 4), (2048, 1, 8), (4096, 1, 8), (2048, 1, 4), (512, 1, 4)],
    ("pointwise", 1500, 1): [(1024, 1, 4), (2048, 1, 8), (2048, 1, 4), (512, 1, 4)],
    ("persistent", 2048, 1024): [(4, 1024, 8), (4, 1024, 4), (2, 1024, 4)],
    ("persistent", 256, 8192): [(1, 8192, 16), (1, 8192, 8), (1, 8192, 32)],
    ("looped", 32, 1 << 16): [(1, 2048, 8), (1, 1024, 4), (1, 4096, 16)],
    ("outer", 4096, 512): [(16, 32, 4), (64, 8, 4), (32, 16, 4), (128, 8, 4), (64, 32, 8)],
    ("outer", 256, 32): [(64, 32, 8), (64, 32, 4), (32, 32, 4), (128, 32, 8)],
}


def _lists(kind, x, r):
    if kind == "pointwise":
        return autotune.candidates(x, r, False)
    if kind == "outer":
        return autotune.outer_candidates(x, r)
    return autotune.candidates(x, r, True)


@pytest.fixture
def candidates(monkeypatch):
    def set_(value):
        monkeypatch.setattr(config, "autotune_candidates", value)
    monkeypatch.setattr(config, "max_autotune", False)
    return set_


def test_all_restores_the_old_candidate_lists(candidates):
    candidates("all")
    for (kind, x, r), want in OLD.items():
        configs = autotune.few(_lists(kind, x, r), x * r, "pointwise" if kind == "pointwise" else "reduction")
        assert _t(configs) == want, (kind, x, r)
    assert [(c.yblock, c.xblock) for c in tiling.candidates(512, 512, "transpose")] == \
        [(32, 32), (64, 64), (16, 128), (128, 16), (16, 256)]
    assert [(c.yblock, c.xblock) for c in tiling.candidates(64, 4096, "broadcast")] == \
        [(4, 256), (8, 128), (2, 512), (16, 64), (1, 1024)]


def test_few_keeps_the_heuristic_default_and_by_class(candidates):
    candidates("few")
    large = autotune.FEW_LARGE
    for (kind, x, r), want in OLD.items():
        cls = "pointwise" if kind == "pointwise" else "reduction"
        got = _t(autotune.few(_lists(kind, x, r), x * r, cls))
        assert got == want[:1 if cls == "pointwise" else 2], (kind, x, r)
        # a large kernel keeps one more; the choice is a function of the arguments
        assert _t(autotune.few(_lists(kind, x, r), large, cls)) == want[:2 if cls == "pointwise" else 3]
        assert _t(autotune.few(_lists(kind, x, r), x * r, cls)) == got
    for kind in ("transpose", "broadcast"):
        every = tiling._all_candidates(512, 512, kind)
        assert _t(tiling.candidates(512, 512, kind)) == _t(every[:1])
        assert _t(tiling.candidates(4096, 1024, kind)) == _t(tiling._all_candidates(4096, 1024, kind)[:2])


def test_max_autotune_and_bad_values(candidates, monkeypatch):
    candidates("few")
    monkeypatch.setattr(config, "max_autotune", True)
    configs = autotune.candidates(1 << 20, 1, False)
    assert len(configs) > 5 and autotune.few(configs, 1 << 20, "pointwise") == configs
    monkeypatch.setattr(config, "max_autotune", False)
    candidates("some")
    with pytest.raises(ValueError, match="autotune_candidates"):
        autotune.few(configs, 1, "pointwise")


def test_pick_counts_the_compiles_a_gpu_would_make(monkeypatch):
    monkeypatch.setattr(config, "autotune_min_elements", 1 << 16)
    configs = [Config(1024, 1, 4), Config(2048, 1, 8), Config(512, 1, 4)]
    autotune.pick("k_count_big", 1 << 20, 1, configs, None)
    autotune.pick("k_count_small", 1000, 1, configs, None)
    autotune.pick("k_count_one", 1 << 20, 1, configs[:1], None)
    assert autotune.COMPILES[("k_count_big", 1 << 20, 1)] == 3
    assert autotune.COMPILES[("k_count_small", 1000, 1)] == 1
    assert autotune.COMPILES[("k_count_one", 1 << 20, 1)] == 1


def _pointwise(x, y):
    return torch.sigmoid(x) * y + 1.0


def _inner(x):
    return torch.softmax(x, -1)


def _looped(x):
    return x.sum(-1), x.amax(-1)


def _outer(x):
    return x.sum(0)


def _transpose(x):
    return x.t().contiguous() + 1


FUNCTIONS = {
    "pointwise": (_pointwise, lambda: (torch.randn(37, 29), torch.randn(37, 29))),
    "inner": (_inner, lambda: (torch.randn(6, 100),)),
    "looped": (_looped, lambda: (torch.randn(3, 20000),)),
    "outer": (_outer, lambda: (torch.randn(300, 24),)),
    "transpose": (_transpose, lambda: (torch.randn(40, 72),)),
}


@pytest.mark.parametrize("setting", ["few", "few-large", "all"])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_kernels_match_eager_either_way(name, setting, candidates, monkeypatch):
    candidates(setting.split("-")[0])
    if setting == "few-large":  # (these kernels as large ones: one more candidate each)
        monkeypatch.setattr(autotune, "FEW_LARGE", 512)
    torch.manual_seed(0)
    fn, make = FUNCTIONS[name]
    mod = triton_check(fn, *make(), atol=1e-4, rtol=1e-4)
    counts = [len(mod.namespace[n].configs) for n in mod.wrapper.launchers]
    want = {"pointwise": [1, 2, 4], "transpose": [1, 2, 4]}.get(name, [2, 3, 3])
    assert counts == [want[["few", "few-large", "all"].index(setting)]], counts


@pytest.mark.parametrize("setting", ["few", "all"])
def test_gradients_match_eager_either_way(setting, candidates):
    candidates(setting)
    torch.manual_seed(0)
    w = torch.randn(24, requires_grad=True)
    triton_check_grads(lambda x, w: torch.nn.functional.layer_norm(x, (24,), w).relu().sum(0),
                       torch.randn(30, 24, requires_grad=True), w, atol=1e-4, rtol=1e-4)


def test_fewer_collections_raises_the_threshold_and_restores_it(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(config, "compile_gc_threshold", 50_000)
    with gc_pause.fewer_collections():
        assert gc.get_threshold() == (50_000, *before[1:])
        with gc_pause.fewer_collections():
            assert gc.get_threshold()[0] == 50_000
        assert gc.get_threshold()[0] == 50_000     # (the outer one still holds it)
    assert gc.get_threshold() == before
    monkeypatch.setattr(config, "compile_gc_threshold", 0)
    with gc_pause.fewer_collections():
        assert gc.get_threshold() == before
    monkeypatch.setattr(config, "compile_gc_threshold", 50_000)
    gc.disable()
    try:
        with gc_pause.fewer_collections():
            assert gc.get_threshold() == before     # (a program's disabled collector: its own)
    finally:
        gc.enable()


def test_a_compile_runs_with_fewer_collections_and_gives_them_back(monkeypatch):
    monkeypatch.setattr(config, "compile_gc_threshold", 50_000)
    before = gc.get_threshold()
    seen = []
    from frametrace.backends.triton import backend
    real = backend._build

    def build(*args, **kwargs):
        seen.append(gc.get_threshold()[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(backend, "_build", build)
    triton_check(_pointwise, torch.randn(8, 8), torch.randn(8, 8))
    assert seen and all(t == 50_000 for t in seen)
    assert gc.get_threshold() == before
