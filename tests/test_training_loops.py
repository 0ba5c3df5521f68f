"""Training loops around a compiled forward (+ backward): gradient accumulation over
several compiled calls, autocast around and inside the compiled function, zero_grad with
and without set_to_none, a no_sync-style flag that the forward reads, no_grad /
inference_mode evaluation between steps, train()/eval() with dropout and BatchNorm,
backward twice, and loss.backward() inside the compiled function; with the aot_eager
backend and the triton backend (its kernels in Triton's interpreter on the CPU).

Every loop is differential: `differential.check` runs it in CPython and with the step
function compiled, on deep copies of the same model and batches, and compares what the
loop returns (losses), the model afterwards (state_dict: parameters and BatchNorm's
running statistics, and every parameter's .grad) and exceptions; then the graph and
compile counts are asserted.  The optimizer step itself runs in CPython here (its
tracing is tested with the optimizer work)."""
import contextlib
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import frametrace
from differential import check

STEPS = 3


@pytest.fixture
def backend(training_backend):
    return training_backend


class Net(nn.Module):
    """Linear-GELU-Linear whose forward reads a flag (`sync`) that a context manager
    toggles, as DDP's no_sync toggles require_backward_grad_sync."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.sync = True

    def forward(self, x):
        out = self.l2(F.gelu(self.l1(x)))
        return out if self.sync else out * 0.5


class BNNet(nn.Module):
    """Linear (no bias: BatchNorm removes it, and Adam would amplify its rounding
    noise) - BatchNorm - ReLU - Linear."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.l1, self.bn, self.l2 = nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.Linear(16, 4)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.l2(self.drop(F.relu(self.bn(self.l1(x)))))


@contextlib.contextmanager
def no_sync(model):
    old, model.sync = model.sync, False
    try:
        yield
    finally:
        model.sync = old


def mse(model, x, y):
    return F.mse_loss(model(x), y)


def batches(n=2 * STEPS):
    return [(torch.randn(6, 8), torch.randn(6, 4)) for _ in range(n)]


def train_check(loop, step, model, backend, data=None, **kw):
    """check() of `loop(step, model, data)` in CPython against the same loop with `step`
    compiled (the loop itself runs in CPython on both sides)."""
    data = batches() if data is None else data
    return check(lambda m, d: loop(step, m, d), [(model, data)], backend=backend,
                 compiled=lambda counter: lambda m, d: loop(frametrace.optimize(backend=counter)(step), m, d),
                 **kw)


# -- gradient accumulation and zero_grad ----------------------------------------------------
def accumulate(step, model, data, micro=2, set_to_none=True):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    losses = []
    for s in range(STEPS):
        for m in range(micro):
            loss = step(model, *data[s * micro + m]) / micro
            loss.backward()
            losses.append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return losses


def test_gradient_accumulation_over_compiled_calls(backend):
    r = train_check(accumulate, mse, Net(), backend)
    assert (r.graphs, r.compiles, r.breaks) == (1, 1, 0)


def test_gradient_accumulation_with_batchnorm(backend):
    r = train_check(functools.partial(accumulate, micro=3), mse, BNNet(), backend,
                    data=batches(3 * STEPS))
    assert (r.graphs, r.breaks) == (1, 0)


def test_zero_grad_keeping_the_grad_tensors(backend):
    def loop(step, model, data):
        out = accumulate(step, model, data, set_to_none=False)
        # zero_grad(set_to_none=False) zeroes the same tensors, which later backward
        # passes accumulate into
        grads = [p.grad for p in model.parameters()]
        step(model, *data[0]).backward()
        return out, [p.grad is g for p, g in zip(model.parameters(), grads)]

    r = train_check(loop, mse, Net(), backend)
    assert (r.graphs, r.compiles) == (1, 1)


# -- autocast -------------------------------------------------------------------------------
def sgd_loop(step, model, data, context=lambda s: contextlib.nullcontext()):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for s in range(STEPS + 1):
        with context(s):
            loss = step(model, *data[s])
        losses.append((loss.dtype, loss.detach()))
        loss.float().backward()
        opt.step()
        opt.zero_grad()
    return losses


def raw_mse(model, x, y):
    return (model(x) - y).pow(2).mean()     # (no float32 autocast policy on the loss)


def test_autocast_around_the_compiled_call_switched_per_step(backend):
    # bf16 on even steps, fp32 on odd ones: a graph each, both reused
    def autocast(s):
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=s % 2 == 0)

    r = train_check(functools.partial(sgd_loop, context=autocast), raw_mse, Net(), backend,
                    atol=1e-2, rtol=1e-2)
    assert (r.graphs, r.compiles, r.breaks) == (2, 2, 0)


def test_autocast_inside_the_compiled_function(backend):
    def step(model, x, y):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = model(x)
            with torch.autocast(device_type="cpu", enabled=False):
                return F.mse_loss(out.float(), y)

    r = train_check(sgd_loop, step, Net(), backend, atol=1e-2, rtol=1e-2)
    assert (r.graphs, r.compiles, r.breaks) == (1, 1, 0)


# -- a no_sync-style flag -------------------------------------------------------------------
def test_no_sync_flag_set_by_a_context_manager_around_the_call(backend):
    def loop(step, model, data):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for s in range(STEPS):
            for m in range(2):     # the first micro-batch without sync, as with DDP
                with no_sync(model) if m == 0 else contextlib.nullcontext():
                    loss = step(model, *data[2 * s + m])
                    loss.backward()
                losses.append(loss.detach())
            opt.step()
            opt.zero_grad()
        return losses

    r = train_check(loop, mse, Net(), backend)
    assert (r.graphs, r.compiles) == (2, 2)      # the guard on model.sync saw both values


def test_no_sync_flag_read_by_a_forward_pre_hook(backend):
    def loop(step, model, data):
        handle = model.register_forward_pre_hook(lambda m, args: None if m.sync else (args[0] * 2,))
        out = []
        for s in range(2 * STEPS):
            with no_sync(model) if s % 2 else contextlib.nullcontext():
                loss = step(model, *data[s])
            loss.backward()
            out.append(loss.detach())
        handle.remove()
        return out

    r = train_check(loop, mse, Net(), backend)
    assert (r.graphs, r.compiles) == (2, 2)


def test_no_sync_context_inside_the_compiled_function(backend):
    def step(model, x, y):
        with no_sync(model):
            a = mse(model, x, y)
        return a + mse(model, x, y)

    r = train_check(sgd_loop, step, Net(), backend)
    assert (r.graphs, r.breaks) == (1, 0)


# -- evaluation between training steps ------------------------------------------------------
def train_and_evaluate(step, model, data, evaluation=torch.no_grad, eval_mode=True, eval_first=False):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    out = []
    for s in range(STEPS):
        if eval_first:
            out.append(evaluate(step, model, data, evaluation, eval_mode))
        loss = step(model, *data[s])
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.detach())
        if not eval_first:
            out.append(evaluate(step, model, data, evaluation, eval_mode))
    return out


def evaluate(step, model, data, evaluation, eval_mode):
    if eval_mode:
        model.eval()
    with evaluation():
        loss = step(model, *data[-1])
    model.train()
    return loss.clone(), loss.requires_grad


@pytest.mark.parametrize("eval_first", [False, True], ids=["train_first", "eval_first"])
def test_no_grad_evaluation_in_eval_mode_between_steps(backend, eval_first):
    # BatchNorm: batch statistics and running-stat updates in training, the running
    # statistics in eval; a graph for each, reused at every step
    r = train_check(functools.partial(train_and_evaluate, eval_first=eval_first), mse, BNNet(), backend)
    assert (r.graphs, r.compiles, r.breaks) == (2, 2, 0)


def test_no_grad_evaluation_in_train_mode_updates_running_stats(backend):
    r = train_check(functools.partial(train_and_evaluate, eval_mode=False), mse, BNNet(), backend)
    assert (r.graphs, r.compiles) == (2, 2)


def test_eval_mode_with_grad_enabled(backend):
    r = train_check(functools.partial(train_and_evaluate, evaluation=contextlib.nullcontext),
                    mse, BNNet(), backend)
    assert (r.graphs, r.compiles) == (2, 2)


def test_inference_mode_evaluation_between_steps(backend):
    r = train_check(functools.partial(train_and_evaluate, evaluation=torch.inference_mode),
                    mse, BNNet(), backend)
    assert (r.graphs, r.compiles) == (2, 2)


def test_dropout_switched_by_train_and_eval():
    # (aot_eager: dropout draws from torch's generator as eager does, so the masks and
    # hence the parameters match; the triton backend's dropout is checked below)
    r = train_check(train_and_evaluate, mse, BNNet(dropout=0.3), "aot_eager")
    assert (r.graphs, r.compiles) == (2, 2)


@pytest.mark.usefixtures("triton_interpreter")
def test_dropout_switched_by_train_and_eval_triton():
    # Whatever random numbers the kernels draw: in training each output is 0 or the
    # undropped value / (1 - p), in eval the value itself, and the switch back to
    # training drops again (the guard on `training` both ways).
    pytest.importorskip("triton")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5))
    compiled = frametrace.optimize(backend="triton")(model)
    x = torch.randn(32, 16)
    plain = model[1](model[0](x)).detach()
    for training in (True, False, True):
        model.train(training)
        got = compiled(x)
        if not training:
            torch.testing.assert_close(got, plain)
            continue
        kept = got != 0
        torch.testing.assert_close(got[kept], plain[kept] * 2)
        assert 0.3 < 1 - kept[plain != 0].float().mean().item() < 0.7
        got.sum().backward()        # the gradient flows through the kept elements only
        w = model[0].weight.grad
        assert w is not None and w.abs().sum() > 0
        model.zero_grad()


# -- backward twice, double backward --------------------------------------------------------
def test_backward_twice_raises_as_eager(backend):
    def loop(step, model, data):
        loss = step(model, *data[0])
        loss.backward()
        loss.backward()

    train_check(loop, mse, Net(), backend)


def test_backward_twice_with_retain_graph(backend):
    def loop(step, model, data):
        loss = step(model, *data[0])
        loss.backward(retain_graph=True)
        loss.backward()
        return loss

    r = train_check(loop, mse, Net(), backend)
    assert r.graphs == 1


def test_double_backward_through_a_compiled_graph_raises(backend):
    # As with torch.compile: AOTAutograd's backward is not itself differentiable, and
    # it says so instead of giving a wrong second derivative.
    model = Net()
    x, y = batches(1)[0]
    x.requires_grad_()
    loss = frametrace.optimize(backend=backend)(mse)(model, x, y)
    g, = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


# -- backward inside the compiled function --------------------------------------------------
def test_backward_inside_the_compiled_function(backend):
    def step(model, xs, ys):
        for x, y in zip(xs, ys):
            (mse(model, x, y) / len(xs)).backward()
        return torch.stack([p.grad.norm() for p in model.parameters()])

    def loop(step, model, data):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for s in range(STEPS):
            pair = data[2 * s:2 * s + 2]
            out.append(step(model, [x for x, _ in pair], [y for _, y in pair]))
            opt.step()
            opt.zero_grad(set_to_none=False)
        return out

    r = train_check(loop, step, Net(), backend)
    assert r.breaks == 2 and r.graphs == 3       # a graph break at each backward()
    assert all("backward" in why for why in r.reasons())


def test_backward_with_retain_graph_inside_then_again_outside(backend):
    def step(model, x, y):
        loss = mse(model, x, y)
        loss.backward(retain_graph=True)
        return loss

    def loop(step, model, data):
        loss = step(model, *data[0])
        loss.backward()
        return loss.detach()

    r = train_check(loop, step, Net(), backend)
    assert r.breaks == 1


# -- what the step trains -------------------------------------------------------------------
def test_frozen_parameters_switched_between_steps(backend):
    def loop(step, model, data):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for s in range(2 * STEPS):
            model.l1.weight.requires_grad_(s % 2 == 0)
            loss = step(model, *data[s])
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.detach())
        return out

    r = train_check(loop, mse, Net(), backend)
    assert (r.graphs, r.compiles) == (2, 2)


def adamw_loop(model, data, forward=None):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    out = []
    for s in range(STEPS):
        loss = F.mse_loss((forward or model)(data[s][0]), data[s][1])
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.detach())
    return out


def test_compiled_module_trained_with_adamw(backend):
    r = check(adamw_loop, [(BNNet(), batches())], backend=backend,
              compiled=lambda counter: lambda m, d: adamw_loop(m, d, frametrace.optimize(backend=counter)(m)))
    assert (r.graphs, r.compiles, r.breaks) == (1, 1, 0)


# -- what models compute their training loss with -------------------------------------------
def test_cross_entropy_loss_module_made_in_the_frame():
    # BERT's and many HF heads' `loss_fct = CrossEntropyLoss(); loss_fct(logits, labels)`:
    # its __init__ registers a buffer (the class weights, None or a tensor)
    def f(logits, labels, w):
        plain = nn.CrossEntropyLoss()(logits.view(-1, 5), labels.view(-1))
        weighted = nn.CrossEntropyLoss(weight=w * 2, ignore_index=0)(logits.view(-1, 5), labels.view(-1))
        return plain + weighted

    inputs = [(torch.randn(2, 3, 5, requires_grad=True), torch.randint(0, 5, (2, 3)), torch.rand(5))
              for _ in range(2)]
    r = check(f, inputs, fullgraph=True)
    assert (r.graphs, r.breaks) == (1, 0)


class Scaled(nn.Module):
    def __init__(self, scale, name="scale", persistent=True):
        super().__init__()
        self.register_buffer(name, scale, persistent=persistent)
        self.name = name

    def forward(self, x):
        return x * getattr(self, self.name)


def test_register_buffer_on_a_module_made_in_the_frame():
    def f(x):
        a = Scaled(x.new_full((3,), 2.0))(x)
        b = Scaled(None, persistent=False)
        b.scale = torch.ones(3) * 3      # a tensor may replace a buffer
        return a + b(x)

    r = check(f, [torch.randn(3), torch.randn(3)], fullgraph=True)
    assert (r.graphs, r.breaks) == (1, 0)


def test_register_buffer_errors_on_a_module_made_in_the_frame():
    def taken(x):
        return Scaled(x, name="forward")(x)          # KeyError: attribute exists

    def dotted(x):
        return Scaled(x, name="a.b")(x)              # KeyError: can't contain "."

    def not_a_tensor(x):
        return Scaled([1.0])(x)                      # TypeError

    for f in (taken, dotted, not_a_tensor):
        check(f, [torch.randn(3)], graphs=None)


class Log:
    def __init__(self):
        self.lines = []

    def warning(self, msg):
        self.lines.append(msg)


@functools.lru_cache(None)
def warn_once(log, msg):
    log.warning(msg)


def test_lru_cache_call_on_an_object_argument():
    # HF's `logger.warning_once(msg)`: a cache keyed by the logger object, whose identity
    # is guarded; the guard calls again (a hit, or after cache_clear() the miss CPython
    # would have had, which warns).  The same calls in CPython, on other loggers, warn
    # the same.
    def f(x, log):
        warn_once(log, "loss_type=None")
        return x + 1

    cnt = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=cnt, fullgraph=True)(f)
    logs = {"ours": (Log(), Log()), "cpython": (Log(), Log())}
    for run, fn in (("ours", compiled), ("cpython", f)):
        a, b = logs[run]
        for log in (a, a, b, a, b, None, a, b):
            if log is None:
                warn_once.cache_clear()
                continue
            torch.testing.assert_close(fn(torch.ones(2), log), torch.full((2,), 2.0))
    assert [log.lines for log in logs["ours"]] == [log.lines for log in logs["cpython"]] == \
        [["loss_type=None"] * 2] * 2
    assert cnt.frame_count == 2       # one entry per logger


def hf_loop(step, model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    losses = []
    for ids, labels in data:
        loss = step(model, ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def hf_loss(model, ids, labels):
    return model(input_ids=ids, labels=labels).loss


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_hf_training_step_with_the_models_own_loss_is_one_graph(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(vocab_size=128)
    if name == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **small))
    elif name == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=2, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0, **small))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=32, use_cache=False, **small))
    ids = [torch.randint(0, 128, (2, 8)) for _ in range(STEPS)]
    data = [(i, torch.where(torch.rand(i.shape) < 0.5, i, -100)) for i in ids]
    r = check(lambda m, d: hf_loop(hf_loss, m, d), [(model, data)], backend="aot_eager",
              compiled=lambda counter: lambda m, d: hf_loop(
                  frametrace.optimize(backend=counter, fullgraph=True)(hf_loss), m, d), atol=1e-5, rtol=1e-4)
    assert (r.graphs, r.compiles, r.breaks) == (1, 1, 0)


# -- activation checkpointing ---------------------------------------------------------------
class Stop(Exception):
    pass


def test_saved_tensor_hook_raising_inside_a_compiled_graph(backend):
    # A pack hook is user code that runs inside the graph: its exception goes on as
    # raised, instead of the frame running again in CPython (which would run the hooks
    # again); non-reentrant checkpointing stops its recomputation this way.
    def layer(x, w):
        return (x.sin() * w).cos().relu()

    def run(fn, x, w):
        packed = []

        def pack(t):
            packed.append(tuple(t.shape))
            if len(packed) == 2:
                raise Stop("enough")
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            try:
                fn(x, w)
            except Stop as e:
                return str(e), len(packed)
        return "ran", len(packed)

    x, w = torch.randn(3, 4), torch.randn(4, requires_grad=True)
    r = check(lambda x, w: run(layer, x, w), [(x, w)], backend=backend,
              compiled=lambda counter: lambda x, w: run(frametrace.optimize(backend=counter)(layer), x, w))
    assert r.graphs == 1


def checkpointed_loop(step, model, data):
    from torch.utils.checkpoint import checkpoint
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for s in range(STEPS):
        loss = checkpoint(step, model, *data[s], use_reentrant=False)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.detach())
    return out


def test_compiled_function_checkpointed_in_cpython(backend):
    r = train_check(checkpointed_loop, mse, Net(), backend)
    assert (r.graphs, r.compiles) == (1, 1)


def test_checkpointed_attention_without_dropout_is_in_the_graph():
    # scaled_dot_product_attention is tagged as random whatever its dropout_p; with 0 it
    # draws nothing, so the region is recomputable in the backward
    from torch.utils.checkpoint import checkpoint

    def f(q, p):
        return checkpoint(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=p).sin(), q,
                          use_reentrant=False).sum()

    q = torch.randn(2, 2, 4, 8, requires_grad=True)
    r = check(f, [(q, 0.0)], backend="aot_eager", fullgraph=True)
    assert (r.graphs, r.breaks) == (1, 0)
    # with dropout too, since its recompute draws the same numbers again (gradients
    # compared exactly: tests/test_model_loops.py)
    r = check(lambda q: f(q, 0.5) * 0, [q], backend="aot_eager", graphs=None)
    assert r.breaks + r.fallbacks == 0, r


def test_hf_llama_with_gradient_checkpointing_is_one_graph():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, use_cache=False, vocab_size=128))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = [torch.randint(0, 128, (2, 8)) for _ in range(STEPS)]
    r = check(lambda m, d: hf_loop(hf_loss, m, d), [(model, [(i, i) for i in ids])], backend="aot_eager",
              compiled=lambda counter: lambda m, d: hf_loop(
                  frametrace.optimize(backend=counter, fullgraph=True)(hf_loss), m, d), atol=1e-5, rtol=1e-4)
    assert (r.graphs, r.compiles, r.breaks) == (1, 1, 0)


class DropoutBlock(nn.Module):
    """A block whose checkpointed region draws random numbers (dropout), called as HF
    layers call it: a functools.partial of checkpoint on a partial of forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.ckpt = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)

    def body(self, x, scale=1.0):
        return F.dropout(self.lin(x).relu(), 0.3) * scale

    def forward(self, x):
        return self.ckpt(functools.partial(self.body, scale=2.0), x)


def test_checkpoint_over_random_ops_is_one_graph(backend):
    # AOTAutograd's partitioner has the backward recompute the region with the forward's
    # random state (run_with_rng_state): one graph, and the losses and parameters are
    # CPython's.  The triton backend draws other numbers than eager (Philox in its
    # kernels): test_triton_rng checks its gradients against the numbers its forward drew.
    def step(model, x, y):
        return F.mse_loss(model(x * 2).sum(-1, keepdim=True).expand(-1, 4), y)

    model = nn.Sequential(DropoutBlock(), DropoutBlock())
    if backend == "triton":
        counter = frametrace.testing.CompileCounter(inner="triton")
        losses = sgd_loop(frametrace.optimize(step, backend=counter, fullgraph=True), model,
                          [(torch.randn(6, 8), torch.randn(6, 4))] * 4)
        assert counter.frame_count == 1 and all(torch.isfinite(v) for _, v in losses), losses
        return
    r = train_check(sgd_loop, step, model, backend, data=[(torch.randn(6, 8), torch.randn(6, 4))] * 4)
    assert r.breaks == 0 and r.graphs == 1, r
