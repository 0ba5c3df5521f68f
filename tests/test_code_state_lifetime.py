"""Memory safety of the hook's per-code state (frametrace/_C/evalframe.c).

Dropping a code's cache entries runs Python: guard functions die, and the weakref
callbacks of weakly guarded objects (GuardSet._on_death) call remove_entry on the same
code.  reset() (clear_code) must not let those callbacks see a state, or an entry list,
that is in the middle of being freed: on main they did, removed an entry from the list
being deallocated, and the list then released that entry a second time (heap
corruption, a segfault later in an unrelated allocation).  Each case runs in a
subprocess, so a corrupted heap fails the test instead of the test run.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(src):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(src)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_reset_survives_a_guard_death_that_removes_another_entry():
    r = _run("""
        import gc, weakref
        from frametrace import _C

        def f(x):
            return x

        class Held:
            pass

        state = {}

        def on_death(_ref):
            # What GuardSet._on_death does: drop the (newer) entry whose guard this is.
            newer = state["newer"]()
            if newer is not None:
                state["removed"] = _C.remove_entry(f.__code__, newer)

        def callback(code, func, args, n_entries):
            if n_entries == 0:
                held = Held()       # alive only through the oldest entry's guard
                state["held"] = weakref.ref(held, on_death)
                return (lambda *a, _held=held: False), None
            newer = lambda *a: False
            state["newer"] = weakref.ref(newer)
            return newer, None

        hooked = _C.Hooked(f, callback)
        hooked(1)
        hooked(2)
        assert len(_C.entries(f.__code__)) == 2
        _C.clear_code(f.__code__)
        assert _C.entries(f.__code__) == [] and state["removed"] is False
        assert state["newer"]() is None
        junk = [object.__new__(Held) for _ in range(100000)] + ["%015d" % i for i in range(100000)]
        gc.collect()
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])
