"""Settings read while tracing and compiling.  Change them as module attributes.

>>> import frametrace
>>> frametrace.config.cache_size_limit = 16
"""
import os as _os

# Compiled entries kept per code object; past it the frame runs in CPython on a miss.
# Entries for other instances of an nn.Module or optimizer that the frame's guards name
# by identity (one forward's code, many modules) count apart, up to
# accumulated_cache_size_limit entries in all (torch.compile's two recompile limits).
cache_size_limit = 8
accumulated_cache_size_limit = 256

# Packages whose frames are never traced (unless reached by inlining): torch itself,
# frametrace, and libraries with no torch program to capture.  The standard library
# is always skipped.
skip_packages = ("torch", "functorch", "frametrace", "sympy", "bytecode", "rich", "numpy",
                 "triton", "_pytest", "pluggy", "typing_extensions", "filelock")

# `t.item()`, `t.tolist()`, `int(t)`, `float(t)` and `bool(t)` stay in the graph as numbers
# the trace does not know ("unbacked" symbols, checked at run time by `torch._check`
# facts); off, they are graph breaks whose results feed the resumed graph.  As
# torch.compile's `capture_scalar_outputs`.
capture_scalar_outputs = False

# Ops whose output sizes depend on the data (`nonzero`, `masked_select`, `x[mask]`,
# `unique`, `repeat_interleave` with tensor repeats) stay in the graph, their sizes
# unbacked symbols; off, they are graph breaks.  As torch.compile's
# `capture_dynamic_output_shape_ops`.
capture_dynamic_output_shape_ops = False

# A program written for torch.compile that turned on torch._dynamo.config's
# capture_scalar_outputs / capture_dynamic_output_shape_ops gets them here too, once it
# has imported torch._dynamo itself (interop.capture_scalar_outputs reads them; either
# setting on is on).  False: only the two settings above count.
honour_torch_compile_config = True

# A backend that raises while compiling a graph is the user's error: the call raises
# frametrace.BackendCompilerFailed (the backend's exception as its cause), as with
# torch.compile.  True: the frame runs in CPython instead, with one log line.
suppress_errors = False

# Compiles are serialised by one process-wide lock (convert._compile_lock): tracing and
# AOTAutograd keep global state that two concurrent compiles corrupt.  A thread that
# waits longer than this many seconds for another thread's compile runs that call in
# CPython instead (no deadlock, whatever the other compile waits on).  None: no bound.
compile_lock_timeout = 300.0

# The eager backend runs a chain of view ops as one `as_strided` where that is provably
# the same view (backends/view_chains.py).  False: every view op of the graph runs, to
# tell a wrong answer of the shortcut's from another.
view_chain_shortcut = True

# An output that views a graph input through a dtype view (`x.view(torch.float64)
# .flatten()`) is made after the compiled graph by its view ops on the real input
# (replayed_views.py): AOTAutograd regenerates it with `as_strided` in the input's
# elements once sizes are symbolic, which is wrong.  False: the backend returns it.
replay_dtype_views = True

# An nn.Module computed in CPython at a graph break (`copy.deepcopy(model)`, a factory
# the trace could not follow) is traced in the resume frame like any module, guarded by
# its type and by what the trace reads of it, not by its identity: it is often a new
# object on every call, which an identity guard would recompile for each time.
# False: such a module stays opaque data there (calling it breaks again).
trace_modules_from_breaks = True

# An int an nn.Module holds is a constant of the model (guarded by value, as under
# torch.compile) until it has changed twice between calls: a counter (`self.step += 1`
# in forward) is then a symbolic input instead of one compile per step up to the cache
# limit.  False: module ints stay constants (each new value recompiles).
dynamic_module_counters = True

# The tracer keeps the sources of the nn.Modules and optimizers it has met up to date as
# it meets them (variables/builder.py ObjectVars), to tell whether a number it wraps is
# held by a module; False: collected from every traced object at each number.
incremental_module_sources = True

# Guards load attributes (a class's, an instance's) from a memo while the version tags
# of the class, its metatype and the instance dict are unchanged (_C/guards.c,
# cached_attr).  False: every load is a getattr, to tell a wrong answer of the memo's
# from another.  Read when an entry is compiled (it applies to every check from then on).
memoize_attr_guards = True

# The tensor guard of an input with symbolic sizes (dynamic=True) is a check of the C
# program, as a static one is (_C/guards.c, TENSOR): its static sizes and strides are
# compared there, and each symbol's range where no other shape guard names the symbol;
# the Python shape guards check the rest, reading the sizes they need.  False: the
# whole guard and every range run as Python (___z0[0] >= 2), to tell a wrong answer of
# the C form's from another.  Read while tracing.
symbolic_tensor_guards_in_c = True

# A dict from outside read only by key (`d[k]`, `d.get(k)`, `k in d`) is guarded on
# those keys alone (present with their values, or absent) until the trace uses it
# whole, when all its keys are guarded by type and value (variables/containers.py,
# DictVar.lazy).  False: every such dict is guarded whole (its keys, in order) as soon
# as it is read, to tell a wrong answer of the lazy guards from another.
lazy_dict_guards = True

# A plain list from outside the frame is read (and its length guarded) only when the
# trace uses what it holds; appends alone (`history.append(loss)`) are replayed as
# appends (variables/containers.py, ListVar.lazy), so a list that grows every step does
# not recompile every step.  False: every such list is read whole, its length guarded.
lazy_list_appends = True

# An op that gives its argument back and writes nothing (contiguous() of a contiguous
# tensor, to() its own dtype, dropout in eval) records no graph node (graph.py); where
# that rests on the tensor's layout, only a layout known for sure counts
# (variables/tensor_layout.py).  False: every such op stays in the graph, to tell a
# wrong answer of the elision's from another.
eliminate_noop_ops = True

# A graph that raises at run time and cannot simply run again from its start (it drew
# random numbers, entered autocast, or wrote an input) saves, before each call, what
# it changes (the generators' states, autocast, copies of the inputs it writes), where
# raising as it is would lose the program's effects before the failing op (Python
# effects replayed after the graph, input writes AOTAutograd defers): a failure puts
# it back and runs the frame again in CPython.  Off: such a failure raises at once,
# without those effects (no copies and no generator reads per call).
rerun_failed_graphs_from_saved_state = True

# A graph that raises saves nothing per call (rerun_failed_graphs_from_saved_state) when
# the program's Python effects all came after every op of the graph: a failure comes
# before them in CPython too.  False: such graphs save too, to tell a wrong answer of
# this shortcut from another.
rerun_skips_effects_after_every_op = True

# A graph AOTAutograd cannot compile although eager runs it (an in-place op it cannot
# functionalize, a backward it traces with data-dependent sizes where eager's autograd
# needs none) runs on aot_eager as eager ops under torch.func.functionalize, which
# applies input writes at the end as AOTAutograd's graphs do, with one warning.  False:
# aot_eager raises BackendCompilerFailed for it, as torch.compile's does.
aot_eager_functionalized_fallback = True

# An entry that relies on an ABC's isinstance/issubclass answer used to guard CPython's
# ABC token, which any register() bumps: a backend compile (torch's lazily imported
# modules register classes with ABCs), another frame's compile or a library's first use
# failed the guard of every entry so made.  The guard keeps the answers instead and asks
# them again when the token moved (guards.py, _AbcAnswers); where they still hold it
# holds.  False: the token read while tracing is guarded, to tell a wrong answer of the
# revalidation from another.
refresh_abc_token = True

# The default backend (optimize() without backend=) compiles graphs on CUDA tensors with
# the triton backend's kernels, and graphs it could not compile there with eager
# (backends/default.py).  False: it runs every graph with the eager backend, as before
# issue 30, to tell a wrong answer of the kernels from another.
default_backend_kernels = True

# On a terminal (stderr a tty), a compile that runs longer than `compile_status_after`
# seconds shows a transient status line: the frame, the phase (tracing, backend compile,
# autotuning kernel N), the time so far; erased when it ends, never in a pipe or a log
# (compile_status.py).  A long first call was silent.  False: never shown.
compile_status = True
compile_status_after = 2.0

# aot_eager hands AOTAutograd a graph with symbolic float inputs (an lr or a beta that
# changed between calls) with AOTAutograd's float-to-tensor rewrite off, so that the
# floats reach the ops as Python floats, as in eager: where that rewrite cannot handle
# an op (SGD's `add_(g, alpha=-lr)`, Adam's `lerp_` with `1 - beta1`) it would ask for
# the float as a constant, a recompile at every new value (backends/aot_eager.py).
# False: the rewrite runs, as under torch.compile.
aot_eager_keeps_python_floats = True

# The same for backend="triton": a graph with a symbolic float input runs its aten ops
# as they are (the floats as Python floats, no kernels for that graph: an optimizer
# step under a scheduler) instead of compiling again for every new value, as
# torch.compile's Inductor does (on the H200, a GPT-2 training step whose lr a scheduler
# moved compiled 7 times after warm-up, then hit the cache limit).  False: the rewrite
# runs and the floats become constants.
triton_keeps_python_floats = True

# Behind AOTAutograd (aot_eager, triton) the ops whose aten kernel keeps a channels-last
# input's memory format where torch's decompositions do not (upsampling on every device:
# a CUDA image of few channels came back contiguous; channel_shuffle and max_unpool on
# the CPU) ask for that format explicitly (backends/kernel_formats.py).  False: the
# decomposition's layout.
keep_kernel_formats = True

# Logging calls (`log.info(...)`, `logging.warning(...)`) and `warnings.warn` in traced
# code are made after the graph, in order with the other replayed effects, instead of
# breaking it; a call on a logger disabled at trace time is dropped, guarded on
# isEnabledFor (variables/log_calls.py).  They broke every graph in model code that
# logs.  False: each such call is a graph break, CPython makes it.
trace_logging_calls = True

# `warnings.simplefilter("ignore")` (or filterwarnings, any action but "error") inside a
# `with warnings.catch_warnings()` the trace holds is dropped: the block's exit puts the
# filters back, and a warnings.warn traced in the block is a break anyway.  What it
# drops is only which warnings the graph's kernels print inside the block.  False:
# each such call is a graph break (and the block runs in CPython).
trace_warning_filters_in_catch_warnings = True

# `assert t, "msg"` on a tensor is a check op in the graph (frametrace::assert_true,
# variables/asserts.py) instead of a data-dependent break.  False: the break.
asserts_in_graph = True

# At a graph break on a call (``t.item()``), the rest of the statement that only formats
# and calls print/round/str/format/... on what it returned runs in CPython with it
# (resume.statement_rest): `print(round(t.mean().item(), 3))` was three breaks (item,
# round, print), each resume function breaking again at once on data.  False: the break
# runs its call only and the resume function starts right after it.
break_runs_statement_rest = True

# A graph compiled while DistributedDataParallel runs its wrapped module is cut at the
# boundaries of DDP's gradient buckets (parameters counted in the order of their
# gradients, up to DDP's bucket_cap_mb), each piece compiled on its own, so that with a
# backend compiling the backward whole (aot_eager, triton) each bucket's all-reduce
# starts while the earlier layers' backward still runs, as in eager DDP
# (frametrace/distributed.py; torch.compile's DDPOptimizer).  False: one graph, and every
# all-reduce waits for the end of its backward.
ddp_split_graphs = True

# Compiled entries are also written to an on-disk cache, and a process's first call of a
# frame whose cached entry's guards hold runs it without tracing (warm_cache.py): the
# folder is `cache_dir`, else $FRAMETRACE_CACHE_DIR, else $XDG_CACHE_HOME/frametrace
# (~/.cache/frametrace); FRAMETRACE_CACHE_DIR= (empty) writes no folder (the entries are
# still kept for frametrace.save_cache), `cache = False` turns it all off (nothing is
# described, written or read).  Least recently used entries go past `cache_max_bytes`.
cache = True
cache_dir = None
cache_max_bytes = 1 << 30


def cache_folder() -> str | None:
    """The on-disk cache's folder (compiled entries, the triton backend's autotuning
    choices), or None where the cache is off (see `cache` above)."""
    if not cache:
        return None
    if cache_dir is not None:
        return cache_dir or None
    env = _os.environ.get("FRAMETRACE_CACHE_DIR")
    if env is not None:
        return env or None
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "frametrace")

# An entry compiled by aot_eager (or aot_eager_decomp_partition) also keeps what
# AOTAutograd made of its graph (forward and backward graphs, the runtime wrappers'
# metadata; backends/aot_cache.py), under a key of the inputs' metadata, grad mode,
# autocast, configs, decompositions and versions: a warm start whose key matches runs
# them without AOTAutograd tracing the graph again.  False: nothing of AOTAutograd's is
# stored or used, a warm start traces the cached graph with AOTAutograd, as before.
cache_aot_results = True
# The triton backend's compiled result kept with each cached entry as well
# (backends/triton/result_cache.py): AOTAutograd's graphs and metadata and, for each
# graph, the generated wrapper, kernel sources and launch descriptions, under a key of
# the inputs' metadata, the triton settings, Triton's version, the GPUs and frametrace's
# own code.  A warm start whose key matches runs no AOTAutograd trace, lowering,
# scheduling or code generation.  False: a warm start compiles the cached graph again.
cache_triton_results = True
# Warm starts' shortcuts (each False: the work is done in full, as before).
# cache_fingerprint_by_stat: frametrace's own source fingerprint (part of every key) is
# taken from a note in the cache folder when every file of frametrace has the same
# inode, size, modification and change times (ns) as when the note was written; any
# write to a file changes its change time, so an edited tracer is hashed again.
cache_fingerprint_by_stat = True
# cache_lazy_graph: a warm entry whose backend's result comes from the cache (aot_eager,
# triton) unpickles its FX graph only when asked (explain(), the viewer) or where the
# backend's result cannot be used; the guards are checked on the live call as always.
# (An entry whose graph names functions by their code unpickles it at once.)
cache_lazy_graph = True
# cache_graph_bytecode: AOTAutograd's cached forward and backward graphs carry their
# compiled bytecode (marshal, this Python's), run instead of compiling their source.
cache_graph_bytecode = True
# cache_skip_alias_check: a function rebuilt from AOTAutograd's cached result skips the
# check AOTAutograd's runtime wrapper runs at a compiled function's first call (each op
# dispatched through a Python mode that looks for custom ops whose outputs alias their
# inputs; torch._functorch.config.check_custom_op_aliasing): a cached graph calls only
# torch's own ops (a custom op makes it not cacheable).
cache_skip_alias_check = True
