"""Whole loops over ordinary models stay compiled (issue 30, item 9): a model's constant
float settings under `dynamic=True`, an LSTM over changing batch sizes, Hugging Face's
classification head writing its config, `with lock:`, activation checkpointing with
dropout, `torch.func.functional_call`.  Each test runs several calls with varied inputs
against CPython and counts what was compiled."""
import pytest
import torch
import torch.nn.functional as F

import frametrace
from differential import Call, Then, check


class Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids)).sum(1)


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_embedding_norm_type_stays_constant_under_dynamic_true(backend):
    # nn.Embedding's norm_type (2.0) never changes: it is a constant, not a symbolic
    # input that AOTAutograd would refuse (then every length compiled again).
    torch.manual_seed(0)
    model = Embedder()
    lengths = [3, 5, 7, 9, 12]
    r = check(model, [torch.randint(0, 50, (2, n)) for n in lengths], backend=backend,
              compiled=lambda cnt: frametrace.optimize(model, backend=cnt, dynamic=True))
    assert r.compiles == 1 and r.graphs == 1 and r.breaks == 0, r


def test_module_float_that_changes_becomes_symbolic():
    # A module's float that does change is symbolic from then on (no compile per value).
    lin = torch.nn.Linear(4, 4)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 0.5

        def forward(self, x):
            return lin(x) * self.scale

    m = Scaled()

    def set_scale(v):
        return lambda: setattr(m, "scale", v)

    calls = [torch.randn(3, 4), Then(set_scale(1.5), torch.randn(5, 4)),
             Then(set_scale(2.5), torch.randn(6, 4)), Then(set_scale(3.5), torch.randn(7, 4))]
    r = check(m, calls, backend="aot_eager",
              compiled=lambda cnt: frametrace.optimize(m, backend=cnt, dynamic=True))
    assert r.compiles == 2 and r.breaks == 0, r


def test_unused_float_argument_restart_keeps_sizes_dynamic():
    # A float argument made symbolic (dynamic=True) that the graph never uses is one
    # AOTAutograd asks to specialise: the compile restarts with floats constant, the
    # sizes still symbolic (one compile for every length).
    w = torch.randn(50, 4)

    def f(ids, p):
        return F.embedding(ids, w, norm_type=p) * 2

    r = check(f, [(torch.randint(0, 50, (2, n)), 2.0) for n in (3, 5, 7, 9)],
              backend="aot_eager", dynamic=True)
    assert r.compiles == 1 and r.breaks == 0, r


# --------------------------------------------------------------------------- item 9c
class Recorded:
    """The compiles of a block: records (outcome, reason) and the graphs a counter saw."""

    def __init__(self, inner="eager"):
        from frametrace import convert
        self.convert = convert
        self.records = []
        self.counter = frametrace.testing.CompileCounter(inner=inner)

    def __enter__(self):
        self.errors = self.convert.counters["internal_error"]
        self.convert.record_observers.append(self.records.append)
        return self

    def __exit__(self, *exc):
        self.convert.record_observers.remove(self.records.append)
        assert self.convert.counters["internal_error"] == self.errors, "internal tracer errors"

    @property
    def breaks(self):
        return sum(r.outcome == "break" for r in self.records)

    @property
    def fallbacks(self):
        return sum(r.outcome == "fallback" for r in self.records)

    def __repr__(self):
        return f"graphs={self.counter.frame_count} " + repr([(r.outcome, r.reason) for r in self.records])


def _tiny_bert(**kw):
    import transformers
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=64, num_labels=3, **kw)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg)


def _close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_bert_classification_head_writes_config_without_a_break(backend):
    # forward sets self.config.problem_type (PretrainedConfig's own __setattr__ and
    # __getattribute__, huggingface_hub's strict-dataclass __setattr__ around it) the
    # first time: a write replayed after the graph, the attribute set as in CPython.
    import copy
    eager = _tiny_bert().eval()
    model = copy.deepcopy(eager)
    with Recorded(backend) as rec:
        compiled = frametrace.optimize(model, backend=rec.counter)
        for i in range(5):
            if i == 3:
                eager.config.problem_type = model.config.problem_type = None
            ids = torch.randint(0, 100, (2, 8))
            labels = torch.randint(0, 3, (2,))
            want = eager(input_ids=ids, labels=labels)
            got = compiled(input_ids=ids, labels=labels)
            assert _close(want.loss, got.loss) and _close(want.logits, got.logits)
            assert model.config.problem_type == eager.config.problem_type == "single_label_classification"
    # one entry before the write, one after (the config's problem_type is guarded)
    assert rec.breaks == 0 and rec.fallbacks == 0 and rec.counter.frame_count == 2, rec


class Settings:
    """A config with its own __setattr__ (it validates) and __getattribute__ (aliases),
    as Hugging Face's PretrainedConfig has."""
    attribute_map = {"mode": "problem_type"}

    def __init__(self):
        self.problem_type = None
        self.scale = 2.0

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        if key == "scale" and value <= 0:
            raise ValueError("scale must be positive")
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_config_attribute_stores_are_replayed():
    def f(x, cfg):
        if cfg.mode is None:
            cfg.mode = "regression" if x.shape[-1] == 1 else "classification"
        d = vars(cfg)               # the trace holds the instance dict, then writes again
        cfg.scale = cfg.scale + 1.0
        cfg.extra = d["scale"] * 2
        return x * cfg.scale + len(d)

    fresh = Settings()
    used = Settings()
    used.problem_type = "classification"
    r = check(f, [(torch.randn(3), fresh), (torch.randn(2), Settings()), (torch.randn(3, 1), Settings()),
                  (torch.randn(3), used)])
    assert r.breaks == 0 and r.fallbacks == 0, r


def test_config_attribute_store_that_raises():
    def f(x, cfg, s):
        cfg.scale = s
        return x * cfg.scale

    r = check(f, [(torch.randn(3), Settings(), 3.0), (torch.randn(3), Settings(), -1.0)])
    assert r.fallbacks == 0, r


_lock = __import__("threading").Lock()
_rlock = __import__("threading").RLock()
_state = {"n": 0}


def test_with_lock_keeps_writes_without_a_break():
    def f(x):
        with _lock:
            _state["last"] = "f"
            y = x + 1
        with _rlock:
            with _rlock:
                y = y * 2
        return y

    r = check(f, [torch.randn(3), torch.randn(3), torch.randn(3), torch.randn(3)], globals=("_state",))
    # (the store of "last" is replayed as a store: the dict's keys are not guarded, so
    # the first call adding the key does not make the second compile again)
    assert r.graphs == 1 and r.breaks == 0 and r.fallbacks == 0, r
    assert not _lock.locked()


def test_with_lock_write_replay_holds_the_lock():
    # The block's writes are replayed holding the lock: while another thread holds it,
    # a compiled call waits before writing, as CPython's waits at the `with`.
    import threading
    import time
    lock = threading.Lock()
    state = {"who": None}

    def f(x, who):
        y = x * 2
        with lock:
            state["who"] = who      # (a tensor: any value runs the same entry)
        return y

    with Recorded() as rec:
        g = frametrace.optimize(f, backend=rec.counter)
        a, b, c = torch.zeros(1), torch.zeros(1), torch.zeros(1)
        g(torch.ones(2), a)
        g(torch.ones(2), b)
        assert state["who"] is b and rec.breaks == 0 and rec.fallbacks == 0, rec
        compiled = rec.counter.frame_count
        lock.acquire()
        worker = threading.Thread(target=g, args=(torch.ones(2), c))
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive() and state["who"] is b
        lock.release()
        worker.join(10)
        assert state["who"] is c and not lock.locked()
        # (the worker's call ran the compiled entry: nothing compiled for it)
        assert rec.counter.frame_count == compiled, rec


def test_with_lock_held_while_tracing_is_not_traced_through():
    # This thread already holds an RLock: CPython re-enters it; the trace may not
    # block on a lock, and a Lock held here would deadlock CPython too (never traced).
    import threading
    rlock = threading.RLock()
    out = []

    def f(x):
        with rlock:
            out.append(1)
            return x + 1

    with rlock:
        r = check(f, [torch.randn(2), torch.randn(2)], graphs=None)
    assert not rlock._is_owned()


def test_a_plain_store_under_a_lock_is_compiled():
    # The replay's stores run holding the lock with no handler around them, so a store
    # that could run code and raise there (a class's __setattr__ or data descriptor the
    # trace did not go through) is refused (side_effects._raising_store); a plain
    # attribute store cannot raise and is compiled.
    import threading
    lock = threading.Lock()

    class Plain:
        pass
    obj = Plain()

    def stores(x):
        with lock:
            obj.v = 2
        return x + 1

    r = check(stores, [torch.randn(3), torch.randn(3)])
    assert not lock.locked() and r.graphs == 1 and r.fallbacks == 0, r


# --------------------------------------------------------------------------- item 9d
def _grads_equal(a, b):
    return all((x.grad is None and y.grad is None) or torch.equal(x.grad, y.grad)
               for x, y in zip(a.parameters(), b.parameters()))


class DropoutBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 2)

    def block(self, x):
        return F.dropout(self.lin(x).relu(), 0.5, training=True) * 3

    def forward(self, x, preserve=True):
        h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False,
                                              preserve_rng_state=preserve)
        return self.out(h + F.dropout(x, 0.25, training=True))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_checkpoint_over_dropout_recomputes_the_same_mask(backend):
    # The recompute in the backward must draw the forward's dropout mask again (the
    # random state preserved), and leave the generator where CPython leaves it.
    import copy
    torch.manual_seed(0)
    eager = DropoutBlock()
    model = copy.deepcopy(eager)
    with Recorded(backend) as rec:
        compiled = frametrace.optimize(model, backend=rec.counter)
        for i in range(4):
            x = torch.randn(5, 8, requires_grad=True)
            x2 = x.detach().clone().requires_grad_(True)
            torch.manual_seed(i)
            want = eager(x)
            want.sum().backward()
            after = torch.rand(3)
            torch.manual_seed(i)
            got = compiled(x2)
            got.sum().backward()
            assert torch.equal(want, got) and torch.equal(x.grad, x2.grad)
            assert _grads_equal(eager, model)
            assert torch.equal(after, torch.rand(3))
            eager.zero_grad()
            model.zero_grad()
    assert rec.counter.frame_count == 1 and rec.breaks == 0 and rec.fallbacks == 0, rec


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_bert_with_gradient_checkpointing_trains_like_eager(backend):
    import copy
    eager = _tiny_bert(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.2)
    eager.gradient_checkpointing_enable()
    eager.train()
    model = copy.deepcopy(eager)
    with Recorded(backend) as rec:
        compiled = frametrace.optimize(model, backend=rec.counter)
        for i in range(3):
            ids = torch.randint(0, 100, (2, 8))
            labels = torch.randint(0, 3, (2,))
            torch.manual_seed(i)
            want = eager(input_ids=ids, labels=labels)
            want.loss.backward()
            torch.manual_seed(i)
            got = compiled(input_ids=ids, labels=labels)
            got.loss.backward()
            assert torch.equal(want.loss, got.loss) and torch.equal(want.logits, got.logits)
            assert _grads_equal(eager, model)
            eager.zero_grad()
            model.zero_grad()
    # (the second compile: config.problem_type, set by the first call)
    assert rec.breaks == 0 and rec.fallbacks == 0 and rec.counter.frame_count == 2, rec


# --------------------------------------------------------------------------- item 9b
class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]) + h[-1].sum(-1, keepdim=True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_lstm_over_six_batch_sizes_compiles_at_most_twice(backend, caplog):
    # Dynamic after the second batch size; on a backend that re-traces the graph the
    # fused LSTM op is left to CPython (AOTAutograd's fake kernel for it does not
    # match the real one: every call's graph raised and the frame ran again in
    # CPython), the rest compiled.
    import copy
    import logging
    import time
    frametrace.optimize(lambda x: x + 1, backend=backend)(torch.randn(3))   # (imports)
    torch.manual_seed(0)
    eager = Tagger()
    model = copy.deepcopy(eager)
    caplog.set_level(logging.INFO, logger="frametrace")
    start = time.perf_counter()
    with Recorded(backend) as rec:
        compiled = frametrace.optimize(model, backend=rec.counter)
        for b in (4, 8, 12, 16, 20, 24):
            x = torch.randn(b, 5, 8)
            want = eager(x)
            got = compiled(x)
            assert _close(want, got)
            want.square().sum().backward()
            got.square().sum().backward()
            assert all(torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
                       for p, q in zip(eager.parameters(), model.parameters()))
    elapsed = time.perf_counter() - start
    per_code = {}
    for r in rec.records:
        per_code[r.code] = per_code.get(r.code, 0) + 1
    assert per_code and max(per_code.values()) <= 2 and rec.fallbacks == 0, rec
    assert not [m for m in caplog.messages if "the compiled graph of" in m], caplog.messages
    assert elapsed < 30, elapsed        # (about 1 s on an idle machine)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(6, 6)
        self.dec = torch.nn.Linear(6, 6)
        self.dec.weight = self.enc.weight
        self.norm = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return self.dec(self.norm(self.enc(x)).relu())


class ReadsParameters(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * sum(p.sum() for p in self.parameters())


def test_functional_call_with_other_tensors_compiles_without_a_break():
    # CPython swaps the given tensors into the module for the call: detached ones,
    # computed ones (requires_grad through another graph), other shapes, a tied weight
    # given once, a buffer: the module's code sees them, the graph computes with them.
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    tied = Tied().eval()

    def detached(x):
        params = {k: v.detach() * 2 for k, v in lin.named_parameters()}
        return torch.func.functional_call(lin, params, (x,))

    def computed(x, w, b):
        return torch.func.functional_call(lin, {"weight": w * 0.5, "bias": b}, (x,))

    def tied_and_buffer(x, w, mean):
        return torch.func.functional_call(tied, {"enc.weight": w, "norm.running_mean": mean}, x)

    r = check(detached, [torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)])
    assert r.breaks == 0 and r.graphs == 1, r
    from differential import check_grads
    r = check_grads(computed, [(torch.randn(3, 8), torch.randn(4, 8, requires_grad=True),
                                torch.randn(4, requires_grad=True)) for _ in range(3)])
    assert r.breaks == 0 and r.graphs == 1, r
    r = check(tied_and_buffer, [(torch.randn(5, 6), torch.randn(6, 6), torch.randn(6)) for _ in range(3)])
    assert r.breaks == 0 and r.graphs == 1, r


def test_functional_call_module_reading_its_parameters_otherwise_breaks():
    # Read through self.parameters(), the replaced tensors would be the module's own
    # in the trace: refused (CPython runs the call), the values right.
    m = ReadsParameters()

    def f(x):
        return torch.func.functional_call(m, {k: v + 1 for k, v in m.named_parameters()}, (x,))

    check(f, [torch.randn(2, 4), torch.randn(2, 4)], graphs=None)


class GivesWeightBack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return x @ self.weight.t(), self.weight, self.weight.t()


def test_functional_call_returning_the_given_tensor_and_a_view_of_it():
    m = GivesWeightBack()

    def f(x, w):
        y, same, view = torch.func.functional_call(m, {"weight": w}, (x,))
        view.mul_(2)                    # writes w, as in CPython
        return y, same is w, same, view

    r = check(f, [(torch.randn(2, 4), torch.randn(3, 4)) for _ in range(3)])
    assert r.breaks == 0, r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_checkpointed_attention_with_dropout_has_eagers_gradients(backend):
    from torch.utils.checkpoint import checkpoint

    def f(q, k):
        return (checkpoint(lambda q: F.scaled_dot_product_attention(q, k, q, dropout_p=0.5).sin(),
                           q, use_reentrant=False) * k).sum()

    with Recorded(backend) as rec:
        g = frametrace.optimize(f, backend=rec.counter)
        for i in range(3):
            q = torch.randn(2, 2, 4, 8, requires_grad=True)
            k = torch.randn(2, 2, 4, 8, requires_grad=True)
            q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
            torch.manual_seed(i)
            want = f(q, k)
            want.backward()
            after = torch.rand(2)
            torch.manual_seed(i)
            got = g(q2, k2)
            got.backward()
            assert torch.equal(want, got) and torch.equal(q.grad, q2.grad) and torch.equal(k.grad, k2.grad)
            assert torch.equal(after, torch.rand(2))
    assert rec.counter.frame_count == 1 and rec.breaks == 0 and rec.fallbacks == 0, rec


def test_checkpoint_over_dropout_on_inductor_recomputes_the_forwards_mask():
    # Inductor draws its own numbers (not eager's): the gradients are checked against the
    # mask its output shows, as on the triton backend above
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)

    def f(x):
        return checkpoint(lambda x: F.dropout(lin(x), 0.5, True) * 3, x, use_reentrant=False)
    with Recorded("inductor") as rec:
        g = frametrace.optimize(f, backend=rec.counter)
        for i in range(2):
            x = torch.randn(16, 8, requires_grad=True)
            out = g(x)
            out.backward(torch.ones_like(out))
            mask = (out != 0).float()
            torch.testing.assert_close(x.grad, (6 * mask) @ lin.weight)
            torch.testing.assert_close(lin.bias.grad, 6 * mask.sum(0))
            lin.zero_grad()
            assert 0.2 < mask.mean() < 0.8
    assert rec.counter.frame_count == 1 and rec.breaks == 0 and rec.fallbacks == 0, rec


def test_checkpoint_over_dropout_on_a_backend_that_does_not_say_it_recomputes_breaks():
    # A backend that may re-trace the graph and has not said that it recomputes random
    # ops with the forward's state: the region runs in CPython (gradients still eager's).
    import copy

    def backend(gm, example_inputs):
        return gm.forward

    torch.manual_seed(0)
    eager = DropoutBlock()
    model = copy.deepcopy(eager)
    with Recorded(backend) as rec:
        compiled = frametrace.optimize(model, backend=rec.counter)
        for i in range(2):
            x = torch.randn(5, 8)
            torch.manual_seed(i)
            eager(x).sum().backward()
            torch.manual_seed(i)
            compiled(x).sum().backward()
            assert _grads_equal(eager, model)
    assert rec.breaks >= 1 and all("random" in r.reason for r in rec.records if r.reason), rec


def test_lock_entered_again_inside_its_block_is_not_traced_through():
    # CPython deadlocks there (a Lock is not re-entrant): never compiled to run on.
    import threading
    lock = threading.Lock()

    def f(x, again):
        with lock:
            y = x + 1
            if again:
                if not lock.acquire(timeout=0.05):    # what CPython would block on
                    return y, "would deadlock"
                lock.release()
            return y, "ok"

    def g(x):
        with lock:
            with lock:
                return x + 1

    r = check(f, [(torch.randn(2), False), (torch.randn(2), True)], graphs=None)
    assert not lock.locked()
    with Recorded() as rec:
        compiled = frametrace.optimize(g, backend=rec.counter)
        ended = []

        def run():
            try:
                compiled(torch.randn(2))
            except RuntimeError:          # (the outer exit releases a lock released below)
                ended.append(True)
        worker = __import__("threading").Thread(target=run, daemon=True)
        worker.start()
        worker.join(1.0)
        assert worker.is_alive()          # blocked, as CPython's call is
        assert all(r.outcome != "compiled" for r in rec.records), rec
        # Unblock it: a thread left inside a call of an optimized function keeps the
        # frame hook installed for the whole process (later tests check it is not).
        lock.release()
        worker.join(10)
        assert not worker.is_alive() and ended
