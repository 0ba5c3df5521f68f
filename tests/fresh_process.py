"""A program run as in a fresh process, without paying for `import torch` each time.

The warm-start tests run a program twice, each time in a new process (a cold start that
stores cache entries, a warm one that must trace nothing).  Most of such a process's
life was importing torch and AOTAutograd (half of the warm-cache tests' time).  Here a
server process imports them once, with no FRAMETRACE_*, TRITON_*, TORCH* or PYTHONPATH
variable set; each run is a child forked from it, which then sets the run's
environment, working folder and import path, and runs the program as `__main__`, so
that frametrace is imported and configured in the child, from the run's environment,
as in a new interpreter.  Triton, also imported by the server, reads its variables
(TRITON_INTERPRET) when asked, not at import; no test sets a variable torch reads at
import.  FRAMETRACE_TEST_NO_FORK=1 starts a new interpreter per run.

    proc = run([sys.executable, "prog.py"], env=env, cwd=folder, timeout=300)
    proc.returncode, proc.stdout, proc.stderr
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

_PRELOAD = ("torch", "sympy", "torch.fx.experimental.symbolic_shapes", "torch._functorch.aot_autograd")


class Completed:
    __slots__ = ("returncode", "stdout", "stderr")

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class _Server:
    """The forking server of this test process (one per pytest worker)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=_server_env())
        self.lock = threading.Lock()
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("fresh_process: the server did not start")

    def run(self, argv, env, cwd, timeout):
        with tempfile.TemporaryDirectory(prefix="fresh-process-") as d:
            out, err = os.path.join(d, "out"), os.path.join(d, "err")
            request = {"argv": argv, "env": env, "cwd": cwd, "out": out, "err": err, "timeout": timeout}
            with self.lock:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                reply = self.proc.stdout.readline()
            if not reply:
                raise RuntimeError("fresh_process: the server died")
            rc = json.loads(reply)["rc"]
            if rc == "timeout":
                raise subprocess.TimeoutExpired(argv, timeout)
            with open(out, errors="replace") as f, open(err, errors="replace") as g:
                return Completed(rc, f.read(), g.read())


def _server_env():
    # (the variables of a plain interpreter: none of a run's, which its child sets)
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("FRAMETRACE", "TRITON", "TORCH", "PYTHONPATH"))}


_server = None
_server_lock = threading.Lock()


def run(argv, env, cwd, timeout):
    """`argv` ([sys.executable, program path]) run with `env` and working folder `cwd`;
    returns its exit status and output, or raises subprocess.TimeoutExpired."""
    global _server
    if os.environ.get("FRAMETRACE_TEST_NO_FORK") == "1" or sys.platform == "win32" or \
            len(argv) != 2 or argv[0] != sys.executable:
        p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return Completed(p.returncode, p.stdout, p.stderr)
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        server = _server
    return server.run(argv, env, cwd, timeout)


# --------------------------------------------------------------------------- the server
def _child(request):
    """In the forked child: become the program's process, run it, exit."""
    import runpy
    fd_out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    fd_err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    program = os.path.abspath(request["argv"][1])
    # sys.path as a new interpreter builds it: the program's folder, PYTHONPATH, then
    # the interpreter's own (the server's, less what its own start put first)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(program), *extra, *_BASE_PATH]
    sys.argv = [program]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdout = open(1, "w", closefd=False, buffering=1 if env.get("PYTHONUNBUFFERED") else -1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    code = 0
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    # (a normal exit: atexit handlers and finalizers run, as at a new interpreter's end)
    sys.exit(code)


def _serve():
    import signal
    import time
    for name in _PRELOAD:
        __import__(name)
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline = time.monotonic() + request["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = "timeout"
                break
            time.sleep(0.01)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _BASE_PATH = [p for p in sys.path[1:]]      # (sys.path[0]: this file's folder)
    _serve()
