"""One measurement in a process of its own (a CUDA fault, or one compiler's caches and
allocator, costs that row only): the child prints `RESULT <json>` (or another marker) as
its last such line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(script, argv, timeout, stderr_tail=0, marker="RESULT", echo_stdout=False,
              failed_stderr=0, on_stderr=None, env=None) -> dict:
    """`python script *argv` with this checkout first on the path: the dict of its last
    `marker` line, or {"error": ..., "stderr": ...} (the end of its output, or "timed out";
    its whole stderr, "" when timed out).
    `stderr_tail`: print that much of the child's stderr (its profiles) to ours;
    `failed_stderr`: that much, only when the child exits non-zero or prints no marker line;
    `echo_stdout`: print the child's other stdout lines before the marker line to ours;
    `on_stderr`: called with the child's whole stderr (to keep it); `env`: variables to
    set in the child."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([ROOT, *kept]))
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(script), *argv], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "stderr": ""}
    if on_stderr is not None:
        on_stderr(proc.stderr)
    if stderr_tail:
        print(proc.stderr[-stderr_tail:], file=sys.stderr)
    tag = marker + " "
    got = None
    for ln in proc.stdout.splitlines():
        if ln.startswith(tag):
            got = ln
        elif echo_stdout and got is None:
            print(ln, flush=True)
    if failed_stderr and (proc.returncode or got is None):
        sys.stderr.write(proc.stderr[-failed_stderr:])
    if got is None:
        return {"error": (proc.stderr or proc.stdout)[-3000:], "stderr": proc.stderr}
    return json.loads(got[len(tag):])


def last_line(stderr) -> str:
    """A failed child's last non-empty line of stderr (else "no output")."""
    return ([x for x in stderr.strip().splitlines() if x.strip()][-1:] or ["no output"])[0]


def print_table(text, md=None):
    """Print a result table, and write it to the markdown file `md` where one is given."""
    print(text)
    if md:
        with open(md, "w") as f:
            f.write(text + "\n")
