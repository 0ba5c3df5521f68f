"""One measurement in a process of its own (a CUDA fault, or one compiler's caches and
allocator, costs that row only): the child prints `RESULT <json>` as its last such line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(script, argv, timeout, stderr_tail=0, env=None, echo=False) -> dict:
    """`python script *argv` with this checkout first on the path: its RESULT dict, or
    {"error": ...} (the end of its output, or "timed out").  `stderr_tail`: print that
    much of the child's stderr (its profiles) to ours; `env`: variables to set in the
    child; `echo`: print the child's other output lines to ours."""
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(script), *argv], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    if stderr_tail:
        print(proc.stderr[-stderr_tail:], file=sys.stderr)
    if echo:
        print("\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("RESULT ")))
    got = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(got[-1][7:]) if got else {"error": (proc.stderr or proc.stdout)[-3000:]}
