"""The triton backend's autotuning does less where it cannot matter: a kernel of at most
`config.autotune_min_elements` elements takes the heuristic default untimed (launch-bound:
its candidates' compiles were most of a first call's time), and the candidates of a kernel
that is timed compile at once in threads (`config.compile_threads`) before they are timed.
Neither changes what a kernel computes: the CUDA test compares with eager."""
import contextlib
import threading

import pytest
import torch

pytest.importorskip("triton")
from frametrace.backends.triton import autotune, config, wrapper  # noqa: E402
from frametrace.backends.triton.autotune import Config  # noqa: E402


def test_small_kernels_are_not_timed(monkeypatch):
    monkeypatch.setattr(config, "autotune_min_elements", 1 << 16)
    assert autotune._too_small(256, 256)
    assert not autotune._too_small(1 << 16, 2)
    monkeypatch.setattr(config, "max_autotune", True)
    assert not autotune._too_small(4, 4)
    monkeypatch.setattr(config, "max_autotune", False)
    monkeypatch.setattr(config, "autotune_min_elements", 0)
    assert not autotune._too_small(1, 1)


def test_pick_takes_the_default_untimed_where_it_cannot_matter(monkeypatch):
    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config, "autotune_min_elements", 1 << 16)
    runs = []
    configs = [Config(1024, 1, 4), Config(2048, 1, 8)]
    best = autotune.pick("k_small_test", 1000, 1, configs, runs.append, runs.append)
    assert best is configs[0] and runs == []


@pytest.fixture
def fake_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())


def test_candidates_build_in_threads_first_alone(monkeypatch, fake_cuda_device):
    monkeypatch.setattr(config, "compile_threads", 4)
    configs = [Config(x, 1, 4) for x in (128, 256, 512, 1024, 2048)]
    seen, lock = [], threading.Lock()
    first_done = threading.Event()

    def build(c):
        with lock:
            seen.append((c, threading.current_thread().name, first_done.is_set()))
        if c is configs[0]:
            first_done.set()
        if c is configs[2]:
            raise RuntimeError("out of shared memory")   # timed as failing later, not raised here
    autotune._build_all(configs, build)
    assert sorted(c.xblock for c, _, _ in seen) == [c.xblock for c in configs]
    first = next(s for s in seen if s[0] is configs[0])
    assert not first[1].startswith("frametrace-triton-compile")
    assert all(done for c, _, done in seen if c is not configs[0])
    assert all(name.startswith("frametrace-triton-compile") for c, name, _ in seen if c is not configs[0])


def test_one_thread_builds_nothing_ahead(monkeypatch, fake_cuda_device):
    monkeypatch.setattr(config, "compile_threads", 1)
    built = []
    autotune._build_all([Config(128, 1, 4), Config(256, 1, 4)], built.append)
    assert built == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("threads", [1, 8])
def test_timed_kernels_built_in_threads_match_eager(monkeypatch, threads):
    from differential import check
    monkeypatch.setattr(config, "compile_threads", threads)
    before = autotune.STATS["built_in_threads"]

    def f(x, y):
        return torch.softmax(x * 2 + y, -1).sum(0) + x.mean()
    shape = (1024 + threads, 512)
    check(f, [(torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")) for _ in range(2)],
          backend="triton", rtol=1e-4, atol=1e-5)
    assert (autotune.STATS["built_in_threads"] > before) == (threads > 1)


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.parametrize("each,limit", [(False, 0), (True, 0), (True, 4), (False, 2)])
def test_symbolic_extents_tune_per_power_of_two_bucket(monkeypatch, each, limit):
    """A graph with a symbolic length tunes block sizes per power-of-two bucket of each
    kernel's extents (a length first met inside its bucket takes that bucket's choice),
    or per distinct extent with `tune_each_size`; with `tuned_buckets`, at most that
    many are tuned and later ones take the nearest's choice.  Every call against eager."""
    import frametrace
    from frametrace.backends.triton import backend
    monkeypatch.setattr(config, "tune_each_size", each)
    monkeypatch.setattr(config, "tuned_buckets", limit)
    asked = []
    real = autotune.pick
    monkeypatch.setattr(autotune, "pick", lambda name, x, r, *a: asked.append((name, x, r)) or real(name, x, r, *a))
    frametrace.reset()
    f = lambda x: torch.softmax(x * 2, -1) + x.sum(-1, keepdim=True)  # noqa: E731
    cf = frametrace.optimize(backend="triton", dynamic=True)(f)
    for n in (3, 5, 6, 7, 9, 12, 6, 40, 2000):
        x = torch.randn(n, 10)
        torch.testing.assert_close(cf(x), f(x), rtol=1e-5, atol=1e-5)
    keys = [(x, r) for _, x, r in asked]
    want = {(True, 0): [(3, 10), (5, 10), (6, 10), (7, 10), (9, 10), (12, 10), (40, 10), (2000, 10)],
            (True, 4): [(3, 10), (5, 10), (6, 10), (7, 10)],
            (False, 0): [(4, 16), (8, 16), (16, 16), (64, 16), (2048, 16)],
            (False, 2): [(4, 16), (8, 16)]}[each, limit]
    assert keys == want, keys
    launcher = next(v for v in backend.COMPILED[-1].namespace.values() if isinstance(v, wrapper.Launcher))
    if limit:   # 2000 rows: the nearest tuned bucket's choice (8 or 7 rows' one)
        assert set(launcher.picked) == set(want)
        assert launcher.tuned[(2000, 10)][1] == launcher.picked[want[-1]].kwargs(launcher.reduction)
