"""benchmarks/training.py runs: its --smoke mode (tiny LLaMA on the CPU, frametrace with
the eager backend there) prints a row whose frametrace run matches eager after the
checked steps, in one graph without breaks."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_training_benchmark_smoke(tmp_path):
    pytest.importorskip("transformers")
    table = tmp_path / "table.md"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "training.py"), "--smoke",
                        "--models", "llama4", "--no-inductor", "--steps", "1", "--warmup", "0",
                        "--md", str(table)], capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = [line for line in table.read_text().splitlines() if line.startswith("| llama4 |")]
    assert len(rows) == 1, table.read_text()
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    head = [c.strip() for c in table.read_text().splitlines()[0].strip("|").split("|")]
    row = dict(zip(head, cells))
    assert float(row["eager ms"]) > 0 and float(row["frametrace ms"]) > 0, row
    assert row["inductor ms"] == "-", row
    abs_diff, rel_diff = (float(x) for x in row["ft loss+params max abs / rel diff"].split(" / "))
    # (exact on the CPU's eager backend; on a GPU the triton backend's fused kernels keep
    # autocast's bf16 intermediates unrounded, as Inductor's do)
    tol = (5e-3, 5e-2) if torch.cuda.is_available() else (1e-4, 1e-3)
    assert abs_diff < tol[0] and rel_diff < tol[1], row
    # the model's forward, and opt.step: its first step (which creates the state) and the rest
    assert row["ft graphs / breaks / eager graphs"] == "3 / 0 / 0", row


def test_training_benchmark_cnn_separate_processes(tmp_path):
    # the CNN row (a small bottleneck ResNet on the CPU, SGD with momentum, BatchNorm),
    # each variant in its own process, compared with the eager process's numbers
    table = tmp_path / "table.md"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "training.py"), "--smoke",
                        "--models", "resnet50", "--separate", "--no-inductor", "--steps", "1",
                        "--warmup", "0", "--md", str(table)],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    text = table.read_text()
    head = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    rows = [line for line in text.splitlines() if line.startswith("| resnet50 |")]
    assert len(rows) == 1, text
    row = dict(zip(head, [c.strip() for c in rows[0].strip("|").split("|")]))
    assert float(row["eager ms"]) > 0 and float(row["frametrace ms"]) > 0, row
    abs_diff, rel_diff = (float(x) for x in row["ft loss+params max abs / rel diff"].split(" / "))
    tol = (5e-3, 5e-2) if torch.cuda.is_available() else (1e-4, 1e-3)
    assert abs_diff < tol[0] and rel_diff < tol[1], row
    assert "frametrace/eager: time" in text, text
