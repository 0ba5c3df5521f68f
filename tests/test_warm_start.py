"""The on-disk cache (warm starts): each test runs programs in fresh processes over a
cache folder of its own, and compares what a warm process computes, writes and
compiles with the cold process and with CPython."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import fresh_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pythonpath(*first):
    # The caller's own PYTHONPATH stays behind ours: where dependencies are installed
    # with --target (the GPU machine's bytecode), the child could not import them.
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*first, *kept])

HELPERS = '''
def scale(x):
    return x * 2.0
'''

# The program: a module whose forward inlines a helper from another file (helpers.py),
# writes a global list and a module attribute, and breaks its graph once (a print of a
# number read from data) so that a resume function runs after the break.
PROGRAM = '''
import copy, json, os, sys
import torch, frametrace
from frametrace import convert, warm_cache
import helpers

log = []

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        width = int(os.environ.get("WIDTH", 8))
        self.a = torch.nn.Linear(6, width)
        self.b = torch.nn.Linear(width, 3)
        self.calls = 0
        self.scale = float(os.environ.get("SCALE", 1.0))

    def forward(self, x):
        h = helpers.scale(self.a(x)).relu()
        log.append(h.shape[0])
        self.calls += 1
        if BREAK:
            print("mean", round(h.mean().item(), 3))
        return self.b(h).tanh().sum(0) * self.calls * self.scale

BREAK = os.environ.get("BREAK") == "1"
records = []
convert.record_observers.append(records.append)
torch.manual_seed(0)
model = Block()
reference = copy.deepcopy(model)
# (aot_eager: entries with symbolic sizes are not cached, so sizes stay static)
if os.environ.get("FRAMETRACE_SWITCH"):       # (a warm-start shortcut turned off)
    setattr(frametrace.config, os.environ["FRAMETRACE_SWITCH"], False)
compiled = frametrace.optimize(model, backend=os.environ.get("BACKEND", "eager"),
                               dynamic=False if os.environ.get("BACKEND") == "aot_eager" else None)
if os.environ.get("LOAD"):
    print("loaded", frametrace.load_cache(os.environ["LOAD"]))
out = {"values": [], "cpython": [], "grads": [], "cpython_grads": []}
for n in (4, 4, 5):
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(n))
    y = compiled(x)
    y.sum().backward()
    out["values"].append(y.tolist())
    log_before = list(log)
    r = reference(x)
    r.sum().backward()
    out["cpython"].append(r.tolist())
out["grads"] = [p.grad.tolist() for p in model.parameters()]
out["cpython_grads"] = [p.grad.tolist() for p in reference.parameters()]
out["log"] = log
out["calls"] = [model.calls, reference.calls]
out["compiled"] = sum(1 for r in records if not r.from_cache and r.transformed_code is not None)
out["from_cache"] = sum(1 for r in records if r.from_cache)
out["graphs"] = sum(1 for r in records if r.graph_module is not None)
out["stats"] = dict(warm_cache.stats)
if os.environ.get("SAVE"):
    out["saved"] = frametrace.save_cache(os.environ["SAVE"])
print("RESULT", json.dumps(out))
'''


def _setup(tmp_path, helpers=HELPERS):
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "prog.py").write_text(PROGRAM)


def _run(tmp_path, cache=None, **env):
    full = dict(os.environ)
    full.pop("FRAMETRACE_LOGS", None)
    full["PYTHONPATH"] = _pythonpath(ROOT, str(tmp_path))
    full["FRAMETRACE_CACHE_DIR"] = str(tmp_path / "cache") if cache is None else cache
    full["PYTHONDONTWRITEBYTECODE"] = "1"
    full["FRAMETRACE_LOGS"] = "cache"
    full.update({k: str(v) for k, v in env.items()})
    # (forked from a server that has imported torch: a new interpreter's state, less its
    # seconds of imports; see fresh_process.py)
    proc = fresh_process.run([sys.executable, str(tmp_path / "prog.py")], env=full, cwd=str(tmp_path),
                             timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr[-3000:]
    result = json.loads(line[0][len("RESULT "):])
    result["stderr"] = proc.stderr
    result["stdout"] = proc.stdout
    return result


def _close(a, b):
    import torch
    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


def _same_as_cpython(r):
    for a, b in zip(r["values"], r["cpython"], strict=True):
        assert _close(a, b)
    for a, b in zip(r["grads"], r["cpython_grads"], strict=True):
        assert _close(a, b)
    assert r["calls"][0] == r["calls"][1] == 3
    assert r["log"] == [4, 4, 4, 4, 5, 5]     # (compiled, then CPython, each step)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("graph_break", [False, True])
def test_warm_start_same_values_and_effects_compiles_nothing(tmp_path, backend, graph_break):
    _setup(tmp_path)
    env = dict(BACKEND=backend, BREAK=int(graph_break))
    cold = _run(tmp_path, **env)
    _same_as_cpython(cold)
    assert cold["compiled"] >= 1 and cold["from_cache"] == 0
    assert cold["stats"]["stores"] >= 1 and cold["stats"]["not_cacheable"] == 0
    warm = _run(tmp_path, **env)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    assert warm["compiled"] == 0, warm["stderr"][-2000:]
    if backend == "aot_eager":      # (static sizes: one entry for each cold compile)
        assert warm["from_cache"] == cold["compiled"] and warm["graphs"] == cold["graphs"]
    else:
        # The cold process's last entry has the batch size and the module's call counter
        # symbolic (each changed): it serves every call of the warm process.
        assert 1 <= warm["from_cache"] <= cold["compiled"] and 1 <= warm["graphs"] <= cold["graphs"]
    if graph_break:
        # The resume function's entry came from the cache too (its own key).
        assert warm["from_cache"] >= 2
        assert warm["stdout"].count("mean") == cold["stdout"].count("mean") == 6   # (and CPython's)
    assert "from the cache" in warm["stderr"]


def test_edited_inlined_helper_compiles_again(tmp_path):
    _setup(tmp_path)
    cold = _run(tmp_path)
    _same_as_cpython(cold)
    # Same length, same lines: only the helper's constant differs.
    (tmp_path / "helpers.py").write_text(HELPERS.replace("2.0", "3.0"))
    edited = _run(tmp_path)
    _same_as_cpython(edited)
    assert edited["values"] != cold["values"]
    assert edited["from_cache"] == 0 and edited["compiled"] == cold["compiled"]
    assert "scale has changed" in edited["stderr"]
    # And the edited program's entries serve its next run.
    again = _run(tmp_path)
    assert again["compiled"] == 0 and again["values"] == edited["values"]


def test_edited_frame_compiles_again(tmp_path):
    _setup(tmp_path)
    cold = _run(tmp_path)
    (tmp_path / "prog.py").write_text(PROGRAM.replace(".tanh()", ".sigmoid()"))
    edited = _run(tmp_path)
    _same_as_cpython(edited)
    assert edited["from_cache"] == 0 and edited["compiled"] >= 1
    assert edited["values"] != cold["values"]


@pytest.mark.parametrize("change", [dict(WIDTH=9), dict(SCALE=0.5)])
def test_other_module_state_compiles_again(tmp_path, change):
    """The module of the warm process is another object, bound by its source: what the
    entry relies on of it (its parameters' sizes, a float attribute) is still guarded."""
    _setup(tmp_path)
    cold = _run(tmp_path)
    other = _run(tmp_path, **change)
    _same_as_cpython(other)
    assert other["values"] != cold["values"]
    assert other["from_cache"] == 0 and other["compiled"] >= 1


def test_cache_command(tmp_path):
    _setup(tmp_path)
    _run(tmp_path)
    env = dict(os.environ, PYTHONPATH=_pythonpath(ROOT), FRAMETRACE_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "frametrace", "cache"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "cache") in out.stdout
    assert f"entries: {len(_entries(tmp_path))}" in out.stdout
    cleared = subprocess.run([sys.executable, "-m", "frametrace", "cache", "--clear"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert "entries: 0" in cleared.stdout


def _entries(tmp_path):
    out = []
    for dirpath, _, files in os.walk(tmp_path / "cache"):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".entry")]
    assert out
    return out


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_files_are_misses(tmp_path, damage):
    _setup(tmp_path)
    cold = _run(tmp_path)
    for path in _entries(tmp_path):
        data = open(path, "rb").read()
        new = {"truncated": data[:len(data) // 2], "garbage": os.urandom(len(data)),
               "empty": b""}[damage]
        open(path, "wb").write(new)
    warm = _run(tmp_path)
    _same_as_cpython(warm)
    assert warm["values"] == cold["values"]
    assert warm["from_cache"] == 0 and warm["compiled"] == cold["compiled"]
    assert warm["stderr"].count("is damaged or of another version") == len(_entries(tmp_path)) - \
        warm["stats"]["stores"]


def test_entry_of_another_version_is_a_miss(tmp_path):
    _setup(tmp_path)
    cold = _run(tmp_path)
    sys.path.insert(0, ROOT)
    import hashlib
    for path in _entries(tmp_path):
        data = open(path, "rb").read()
        head = 8 + 32
        outer = pickle.loads(data[head:])
        outer["versions"] = ("another",) + tuple(outer["versions"][1:])
        payload = pickle.dumps(outer)
        open(path, "wb").write(data[:8] + hashlib.sha256(payload).digest() + payload)
    warm = _run(tmp_path)
    _same_as_cpython(warm)
    assert warm["from_cache"] == 0 and warm["compiled"] == cold["compiled"]
    assert "written by another version" in warm["stderr"]


def test_unwritable_folder_is_a_miss_with_one_line(tmp_path):
    _setup(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    r = _run(tmp_path, cache=str(tmp_path / "afile" / "cache"))
    _same_as_cpython(r)
    assert r["compiled"] >= 1 and r["stats"]["errors"] >= 1
    assert r["stderr"].count("cannot write an entry") == r["compiled"]


def test_cache_off_when_folder_empty(tmp_path):
    _setup(tmp_path)
    r = _run(tmp_path, cache="")
    _same_as_cpython(r)
    assert not os.path.exists(tmp_path / "cache")
    r2 = _run(tmp_path, cache="")
    assert r2["from_cache"] == 0 and r2["compiled"] == r["compiled"]


def test_concurrent_writers(tmp_path):
    _setup(tmp_path)
    full = dict(os.environ, PYTHONPATH=_pythonpath(ROOT, str(tmp_path)),
                FRAMETRACE_CACHE_DIR=str(tmp_path / "cache"), BREAK="1")
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "prog.py")], env=full, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    assert not [f for f in os.listdir(tmp_path / "cache") if f.startswith(".tmp")]
    warm = _run(tmp_path, BREAK=1)
    _same_as_cpython(warm)
    assert warm["compiled"] == 0 and warm["from_cache"] >= 2


def test_save_and_load_one_file(tmp_path):
    _setup(tmp_path)
    path = tmp_path / "shipped.ftcache"
    cold = _run(tmp_path, cache="", SAVE=path, BREAK=1)
    assert cold["saved"] >= 2
    warm = _run(tmp_path, cache="", LOAD=path, BREAK=1)
    _same_as_cpython(warm)
    assert "loaded " + str(cold["saved"]) in warm["stdout"]
    assert warm["compiled"] == 0 and warm["from_cache"] == cold["compiled"]
    # A damaged file: nothing loaded, one line, the program compiles as usual.
    path.write_bytes(path.read_bytes()[:100])
    broken = _run(tmp_path, cache="", LOAD=path, BREAK=1)
    _same_as_cpython(broken)
    assert "loaded 0" in broken["stdout"] and broken["compiled"] == cold["compiled"]
    assert broken["stderr"].count("cannot load") == 1


def test_size_bound_evicts_least_recently_used(tmp_path):
    script = tmp_path / "many.py"
    script.write_text(textwrap.dedent('''
        import torch, frametrace
        frametrace.config.cache_max_bytes = 60_000
        fns = []
        for i in range(12):
            exec(f"def f{i}(x):\\n    return (x + {i}).sin() * {i}", globals())
        for i in range(12):
            frametrace.optimize(globals()[f"f{i}"])(torch.ones(3))
        info = frametrace.cache_info()
        print("INFO", info["entries"], info["bytes"], info["stores"])
    '''))
    env = dict(os.environ, PYTHONPATH=_pythonpath(ROOT), FRAMETRACE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries, size, stores = map(int, proc.stdout.split("INFO")[1].split())
    assert stores == 12 and 0 < entries < 12 and size <= 60_000


def test_save_with_a_folder_and_load_elsewhere(tmp_path):
    """save_cache() also ships what a process with a cache folder wrote there."""
    _setup(tmp_path)
    path = tmp_path / "shipped.ftcache"
    cold = _run(tmp_path, SAVE=path)
    assert cold["saved"] == cold["compiled"]
    warm = _run(tmp_path, cache=str(tmp_path / "other-cache"), LOAD=path)
    _same_as_cpython(warm)
    assert warm["compiled"] == 0 and warm["from_cache"] == cold["compiled"]


ENUM_PROGRAM = '''
import enum, json, os
import torch, frametrace
from frametrace import convert

class Mode(enum.Enum):
    A = 1
    B = int(os.environ.get("B", 2))

records = []
convert.record_observers.append(records.append)

def f(x):
    return x * Mode.B.value + len(Mode.B.name)

x = torch.ones(3)
got = frametrace.optimize(f, backend="eager")(x)
print("RESULT", json.dumps({"got": got.tolist(), "want": f(x).tolist(),
                            "from_cache": sum(r.from_cache for r in records)}))
'''


def test_an_enum_member_of_another_value_is_a_miss(tmp_path):
    # The trace reads a member's value as a constant (one object per member in a
    # process: an identity guard holds it); another process may give the member another
    # value, so the entry binds it by class, name and value.
    (tmp_path / "prog.py").write_text(ENUM_PROGRAM)
    runs = {}
    for name, b in (("cold", 2), ("warm", 2), ("other", 7), ("other_warm", 7)):
        runs[name] = r = _run(tmp_path, B=b)
        assert r["got"] == r["want"], (name, r)
    assert runs["cold"]["from_cache"] == 0 and runs["warm"]["from_cache"] == 1
    assert runs["other"]["from_cache"] == 0 and runs["other"]["got"] != runs["cold"]["got"]
    assert runs["other_warm"]["from_cache"] == 1


def _tree(root):
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "sub" / "b.py").write_text("B = 2\n")
    (root / "pkg" / "ext.cpython-399-x86_64-linux-gnu.so").write_bytes(b"another Python's")
    return str(root / "pkg")


def test_fingerprint_note_follows_every_write(tmp_path, monkeypatch):
    """config.cache_fingerprint_by_stat: frametrace's source hash is taken from the
    cache folder's note while every file has the inode, size and times the note was
    written for; any write makes it hash again, even one that keeps the size and puts the
    modification time back (the change time moves).  A damaged note is hashed again."""
    sys.path.insert(0, ROOT)
    from frametrace import warm_cache
    root, folder = _tree(tmp_path), str(tmp_path / "cache")
    hashed = []
    real = warm_cache._hash_files
    monkeypatch.setattr(warm_cache, "_hash_files", lambda files: hashed.append(1) or real(files))
    first = warm_cache._fingerprint(root, folder)
    assert first == real(warm_cache._own_files(root)) and len(hashed) == 1
    # (another Python's extension is not this process's code)
    assert [rel for rel, _ in warm_cache._own_files(root)] == ["a.py", os.path.join("sub", "b.py")]
    assert warm_cache._fingerprint(root, folder) == first and len(hashed) == 1
    assert warm_cache._fingerprint(root, None) == first and len(hashed) == 2
    path = tmp_path / "pkg" / "sub" / "b.py"
    st = os.stat(path)
    path.write_text("B = 3\n")                               # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))      # same modification time
    edited = warm_cache._fingerprint(root, folder)
    assert edited != first and len(hashed) == 3
    assert warm_cache._fingerprint(root, folder) == edited and len(hashed) == 3
    notes = os.listdir(tmp_path / "cache" / "own-fingerprint")
    assert len(notes) == 1          # (the older note of this tree removed)
    (tmp_path / "cache" / "own-fingerprint" / notes[0]).write_bytes(b"garbage")
    assert warm_cache._fingerprint(root, folder) == edited and len(hashed) == 4
    (tmp_path / "pkg" / "c.py").write_text("")              # a new file
    assert warm_cache._fingerprint(root, folder) != edited and len(hashed) == 5
    # An unwritable folder: hashed each time, nothing raised.
    (tmp_path / "afile").write_text("")
    assert warm_cache._fingerprint(root, str(tmp_path / "afile" / "c")) == \
        warm_cache._fingerprint(root, None)


def test_fingerprint_switch_off_writes_no_note(tmp_path):
    _setup(tmp_path)
    warm = None
    for _ in range(2):
        warm = _run(tmp_path, FRAMETRACE_SWITCH="cache_fingerprint_by_stat")
    assert warm["compiled"] == 0 and warm["from_cache"] >= 1
    assert not os.path.exists(tmp_path / "cache" / "own-fingerprint")
    on = _run(tmp_path)          # (the same key with the note: the entries serve)
    assert on["compiled"] == 0 and os.listdir(tmp_path / "cache" / "own-fingerprint")


ALLOWED = '''
import torch

@torch.compiler.allow_in_graph
def scale(x):
    return x * 2.0
'''


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_edited_function_the_graph_calls_compiles_again(tmp_path, backend):
    """A function kept in the graph (allow_in_graph): the graph's code imports it by
    name, and the entry's guards pin its code, so that an edit of the function is a
    miss whether or not the graph is unpickled at the load (config.cache_lazy_graph;
    its AOTAutograd result is not cached: a call of code not torch's)."""
    _setup(tmp_path, helpers=ALLOWED)
    cold = _run(tmp_path, BACKEND=backend)
    _same_as_cpython(cold)
    warm = _run(tmp_path, BACKEND=backend)
    assert warm["compiled"] == 0 and warm["values"] == cold["values"]
    (tmp_path / "helpers.py").write_text(ALLOWED.replace("2.0", "3.0"))
    edited = _run(tmp_path, BACKEND=backend)
    _same_as_cpython(edited)
    assert edited["values"] != cold["values"]
    assert edited["from_cache"] == 0 and edited["compiled"] == cold["compiled"]
    assert "scale has changed" in edited["stderr"]
