"""NumPy post-processing inside a compiled function: a small classifier's logits go
through softmax, top-k, a confidence threshold and an entropy score written in NumPy,
and the whole function compiles into ONE graph (fullgraph=True): the NumPy calls run on
the graph's tensors through torch._numpy, and the results come back as NumPy arrays.

    python examples/numpy_postprocess.py
"""
import numpy as np
import torch

import frametrace

K = 3
THRESHOLD = 0.2


def postprocess(x, weight, bias):
    logits = torch.nn.functional.linear(x, weight, bias)      # the model, in torch
    z = logits.numpy()                                         # the same memory, as NumPy
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :K]  # top-k classes, best first
    top = np.take_along_axis(probs, order, axis=-1)
    labels = np.where(top[:, 0] > THRESHOLD, order[:, 0], -1)   # -1: not confident
    entropy = -(probs * np.log(np.clip(probs, 1e-12, 1.0))).sum(axis=-1)
    eps = np.finfo(probs.dtype).eps
    margin = (top[:, 0] - top[:, 1]) / (top[:, 0] + eps)
    return {"labels": labels, "top_k": order, "top_p": top.astype(np.float32),
            "entropy": entropy, "margin": margin, "confident": int(K), "mean_p": probs.mean()}


def make_inputs(seed, batch=8, features=16, classes=10):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, features, generator=g),
            torch.randn(classes, features, generator=g), torch.randn(classes, generator=g))


def same(a, b):
    return all(type(a[k]) is type(b[k]) and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
               and np.allclose(a[k], b[k]) for k in a)


if __name__ == "__main__":
    counter = frametrace.testing.CompileCounter()
    compiled = frametrace.optimize(backend=counter, fullgraph=True)(postprocess)
    for seed in range(3):
        args = make_inputs(seed)
        want, got = postprocess(*args), compiled(*args)
        assert same(want, got), (want, got)
    print("labels:", got["labels"], "top_p dtype:", got["top_p"].dtype, type(got["mean_p"]).__name__)
    print(f"matches CPython over 3 calls; {counter.frame_count} graph, {counter.op_count} ops")
    print(counter.graphs[0].code.strip())
