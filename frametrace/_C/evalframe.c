/* frametrace's PEP 523 frame-evaluation hook, for CPython 3.11, 3.12 and 3.13.
 *
 * The hook is installed interpreter-wide only while at least one thread has a
 * callback set (installing it makes CPython stop inlining Python-to-Python
 * calls, so we keep that cost to optimized regions).  For each frame it:
 *
 *   1. runs it unchanged when this thread has no callback, when it is thrown
 *      into, when a generator owns it, or when its code is marked to skip;
 *   2. otherwise walks the code object's cache entries, calling each entry's
 *      guard with the frame's argument slots (no allocation: the slots are
 *      passed straight from the frame as a vectorcall array; a GuardCheck runs
 *      in C, see guards.c, after a cheap dispatch key rules most entries out);
 *   3. on a hit, calls a function built from the entry's transformed code
 *      with those same slots (transformed code takes every argument slot as
 *      a plain positional parameter), and drops the original frame unrun;
 *   4. on a miss, asks the Python callback, which returns a new entry, or
 *      says to run the frame in CPython this time / always / on every miss.
 *
 * The callback, guards and compiled graphs run with this thread's callback
 * cleared, so the hook never re-enters the tracer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#if defined(__linux__)
#include <pthread.h>
#endif

/* 3.14 stores _PyStackRef (tagged pointers) in localsplus, so passing the slots
 * straight to a vectorcall is wrong there; refuse until the hook is ported and tested
 * (frametrace/interpreter.py lists the rest of what 3.14 changes). */
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "frametrace's frame hook supports CPython 3.11, 3.12 and 3.13 (3.14 frames hold _PyStackRef slots: not ported yet)"
#endif

#include "guards.h"

#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

/* ---- version-specific frame access: the only place that differs ---- */
#if PY_VERSION_HEX >= 0x030C0000
#define FRAME_FUNC(f) ((PyFunctionObject *)(f)->f_funcobj)
#else
#define FRAME_FUNC(f) ((f)->f_func)
#endif
/* 3.13 keeps the code object as f_executable (a strong reference). */
#if PY_VERSION_HEX >= 0x030D0000
#define FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#define FRAME_CODE_FIELD f_executable
#else
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_CODE_FIELD f_code
#endif

/* 3.12 renamed the code-extra API (the old names still work, deprecated). */
#if PY_VERSION_HEX >= 0x030C0000
#define CODE_GET_EXTRA PyUnstable_Code_GetExtra
#define CODE_SET_EXTRA PyUnstable_Code_SetExtra
#define REQUEST_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#else
#define CODE_GET_EXTRA _PyCode_GetExtra
#define CODE_SET_EXTRA _PyCode_SetExtra
#define REQUEST_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#endif

#if PY_VERSION_HEX >= 0x030C0000
/* From 3.12 the eval function owns the frame it is given: _PyEval_Vector no
 * longer clears it (3.13: the same, clear_thread_frame).  A frame we answer without evaluating must be cleared and
 * popped here.  This mirrors CPython's clear_thread_frame for the one case we
 * take: a thread-owned frame that never started and has no frame object. */
static void
pop_datastack_frame(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    PyObject **base = (PyObject **)frame;
    _PyStackChunk *chunk = tstate->datastack_chunk;
    if (base == &chunk->data[0]) {
        _PyStackChunk *previous = chunk->previous;
        tstate->datastack_top = &previous->data[previous->top];
        tstate->datastack_chunk = previous;
        tstate->datastack_limit = (PyObject **)(((char *)previous) + previous->size);
        PyObjectArenaAllocator arena;
        PyObject_GetArenaAllocator(&arena);
        arena.free(arena.ctx, chunk, chunk->size);
    }
    else {
        tstate->datastack_top = base;
    }
}

static void
drop_unrun_frame(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_funcobj);
    Py_DECREF(frame->FRAME_CODE_FIELD);
    pop_datastack_frame(tstate, frame);
}
#else
/* In 3.11 _PyEval_Vector clears and pops the frame after we return. */
static void
drop_unrun_frame(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    (void)tstate;
    (void)frame;
}
#endif

/* ---- thread-local callback and hook installation ---- */
static _Thread_local PyObject *tls_callback = NULL;   /* strong reference */
/* Depth of regions where this thread's frames run unhooked even with a callback set:
 * the callback and guards, compiled graphs, frametrace.disable()d functions.  (The
 * callback itself only changes through swap_callback, which keeps the count of threads
 * with a callback right.) */
static _Thread_local int tls_suspended = 0;
static Py_ssize_t threads_with_callback = 0;          /* under the GIL */
static Py_ssize_t extra_index = -1;

/* Values the Python callback may return besides a (guard, code) pair. */
enum { DECIDE_SKIP = 0, DECIDE_RUN_DEFAULT_ON_MISS = 1, DECIDE_RUN_UNHOOKED = 2 };

static PyObject *frametrace_eval(PyThreadState *, _PyInterpreterFrame *, int);

/* Frames being evaluated with the hook removed because their thread ran deep (below). */
static Py_ssize_t deep_regions = 0;                   /* under the GIL */

static void
update_install(void)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    /* (This replaces another hook installed over ours, torch.compile's: an optimize()d
     * call has switched torch.compile off for its thread first, and torch.compile
     * installs its hook again when it is switched back on; a hook it left installed
     * after an error must not shut ours out.) */
    _PyInterpreterState_SetEvalFrameFunc(
        interp, threads_with_callback > 0 && deep_regions == 0 ? frametrace_eval
                                                            : _PyEval_EvalFrameDefault);
}

/* ---- deep recursion ----
 * With any PEP 523 hook installed CPython stops inlining Python-to-Python calls: each
 * call recurses in C, costing C stack (and, on 3.12, a unit of the fixed C recursion
 * limit).  CPython without a hook runs 20,000 nested calls in no C stack at all; with
 * one it segfaults (3.11) or raises RecursionError after ~1,000 levels (3.12).  So when
 * a thread runs low on either, the frame at that depth is evaluated with the hook
 * removed: its callees are inlined again, as in plain CPython, and run uncompiled
 * (always a correct answer) until it returns.  The hook is interpreter-wide, so other
 * threads run uncompiled for that time too. */
#if PY_VERSION_HEX >= 0x030C0000
#  if defined(Py_C_RECURSION_LIMIT)
#    define C_LIMIT Py_C_RECURSION_LIMIT
#  elif defined(C_RECURSION_LIMIT)
#    define C_LIMIT C_RECURSION_LIMIT
#  else
#    define C_LIMIT 1500
#  endif
#endif

/* Lowest address this thread's C stack may grow to before its frames run unhooked
 * (stacks grow down on every platform we build for); 1 when unknown. */
static _Thread_local uintptr_t tls_stack_floor = 0;

static uintptr_t
stack_floor(void)
{
    uintptr_t floor = 1;
#if defined(__linux__)
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *base;
        size_t size;
        if (pthread_attr_getstack(&attr, &base, &size) == 0 && size > 0) {
            /* A quarter of the stack, at least 256 KiB, stays for the unhooked
             * subtree's own C recursion (CPython's C calls, extensions). */
            size_t reserve = size / 4 > (256u << 10) ? size / 4 : (256u << 10);
            floor = (uintptr_t)base + (reserve < size ? reserve : size / 2);
        }
        pthread_attr_destroy(&attr);
    }
#endif
    return floor;
}

static inline int
running_deep(PyThreadState *tstate)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (tstate->c_recursion_remaining < C_LIMIT / 3) {
        return 1;
    }
#else
    (void)tstate;
#endif
    char here;
    if (tls_stack_floor == 0) {
        tls_stack_floor = stack_floor();
    }
    return (uintptr_t)&here < tls_stack_floor;
}

static PyObject *
eval_unhooked(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    deep_regions++;
    update_install();
    PyObject *r = _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    deep_regions--;
    update_install();
    return r;
}

/* ---- another PEP 523 hook on top of ours: torch.compile's ----
 * torch.compile installs its hook over whatever is installed and runs the frames it
 * does not take (its own compiled code, frames it skips, its compiler's) through the
 * function it replaced, ours when a frametrace region is running.  While torch.compile
 * is active on this thread such frames are its business, never traced here.  frametrace
 * registers torch's getter and setter of its per-thread callback (None: inactive). */
static PyObject *foreign_get = NULL;
static PyObject *foreign_set = NULL;

/* 1 when the other hook is active on this thread, 0 when not, -1 on an error. */
static int
foreign_active(void)
{
    PyObject *cb = PyObject_CallNoArgs(foreign_get);
    if (cb == NULL) {
        return -1;
    }
    int active = cb != Py_None;
    Py_DECREF(cb);
    return active;
}

/* Swap this thread's callback; returns the previous one (new reference,
 * Py_None for none). */
static PyObject *
swap_callback(PyObject *cb)
{
    PyObject *prev = tls_callback;
    if (cb == Py_None) {
        cb = NULL;
    }
    Py_XINCREF(cb);
    tls_callback = cb;
    if ((prev == NULL) != (cb == NULL)) {
        threads_with_callback += cb != NULL ? 1 : -1;
        update_install();
    }
    return prev != NULL ? prev : Py_NewRef(Py_None);
}

/* ---- per-code state (stored as code extra) ---- */
typedef struct {
    PyObject *entries;  /* list of CacheEntry, most recent first */
    int skip;           /* never trace or look up this code */
    int miss_default;   /* on a miss, run in CPython without asking */
} CodeState;

/* Dropping the entries runs arbitrary Python (guard functions die, weakref callbacks
 * such as a guard's _on_death call remove_entry).  CPython calls this while the state is
 * still the code's extra (_PyCode_SetExtra frees the old value before storing the new
 * one; code_dealloc frees it in place), so the list is detached first: nothing reached
 * from here may see a list that is being deallocated. */
static void
free_code_state(void *p)
{
    CodeState *st = (CodeState *)p;
    if (st == NULL) {
        return;
    }
    PyObject *entries = st->entries;
    st->entries = NULL;
    PyMem_Free(st);
    Py_XDECREF(entries);
}

static CodeState *
get_code_state(PyObject *code, int create)
{
    void *extra = NULL;
    if (CODE_GET_EXTRA(code, extra_index, &extra) < 0) {
        return NULL;
    }
    if (extra == NULL && create) {
        CodeState *st = PyMem_Calloc(1, sizeof(CodeState));
        if (st == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        st->entries = PyList_New(0);
        if (st->entries == NULL || CODE_SET_EXTRA(code, extra_index, st) < 0) {
            free_code_state(st);
            return NULL;
        }
        extra = st;
    }
    return (CodeState *)extra;
}

/* ---- cache entries ---- */
typedef struct {
    PyObject_HEAD
    PyObject *check;    /* guard: check(*arg_slots, func) -> bool */
    PyObject *code;     /* transformed code, or None: run the original */
    PyObject *fn;       /* function over `code` for `closure`, built lazily */
    PyObject *closure;  /* the closure `fn` was built with */
    PyObject *globals;
    PyObject *callback; /* the callback (backend, fullgraph) that made this entry */
} CacheEntry;

static void
CacheEntry_dealloc(CacheEntry *self)
{
    Py_XDECREF(self->check);
    Py_XDECREF(self->code);
    Py_XDECREF(self->fn);
    Py_XDECREF(self->closure);
    Py_XDECREF(self->globals);
    Py_XDECREF(self->callback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
CacheEntry_get_check(CacheEntry *self, void *c)
{
    return Py_NewRef(self->check);
}

static PyObject *
CacheEntry_get_code(CacheEntry *self, void *c)
{
    return Py_NewRef(self->code);
}

static PyGetSetDef CacheEntry_getset[] = {
    {"check", (getter)CacheEntry_get_check, NULL, "guard function", NULL},
    {"code", (getter)CacheEntry_get_code, NULL, "transformed code or None", NULL},
    {NULL},
};

static PyTypeObject CacheEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "frametrace._C.CacheEntry",
    .tp_basicsize = sizeof(CacheEntry),
    .tp_dealloc = (destructor)CacheEntry_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_getset = CacheEntry_getset,
};

/* The function that runs an entry's transformed code for this frame.  Its
 * closure must be the calling function's, so it is rebuilt when that
 * changes (one slot: the usual case is one closure per code object). */
static PyObject *
entry_function(CacheEntry *e, PyFunctionObject *func)
{
    PyObject *closure = func->func_closure;
    if (e->fn != NULL && e->closure == closure && e->globals == func->func_globals) {
        return e->fn;
    }
    PyObject *fn = PyFunction_NewWithQualName(e->code, func->func_globals, func->func_qualname);
    if (fn == NULL) {
        return NULL;
    }
    if (closure != NULL && PyFunction_SetClosure(fn, closure) < 0) {
        Py_DECREF(fn);
        return NULL;
    }
    Py_XSETREF(e->fn, fn);
    Py_XINCREF(closure);
    Py_XSETREF(e->closure, closure);
    Py_INCREF(func->func_globals);
    Py_XSETREF(e->globals, func->func_globals);
    return fn;
}

static int
mark_skip(PyObject *code)
{
    CodeState *st = get_code_state(code, 1);
    if (st == NULL) {
        return -1;
    }
    st->skip = 1;
    return 0;
}

static CacheEntry *
new_entry(PyObject *check, PyObject *code, PyObject *callback)
{
    if (!PyCallable_Check(check) || (code != Py_None && !PyCode_Check(code))) {
        PyErr_SetString(PyExc_TypeError, "cache entry needs (callable guard, code or None)");
        return NULL;
    }
    CacheEntry *e = PyObject_New(CacheEntry, &CacheEntryType);
    if (e == NULL) {
        return NULL;
    }
    e->check = Py_NewRef(check);
    e->code = Py_NewRef(code);
    e->fn = e->closure = e->globals = NULL;
    e->callback = Py_NewRef(callback);
    /* Transformed code runs as its own frame under the hook: never trace it. */
    if (code != Py_None && mark_skip(code) < 0) {
        Py_DECREF(e);
        return NULL;
    }
    return e;
}

/* ---- the hook ---- */
#define MAX_STACK_ARGS 32

/* What lookup_and_run returns for "evaluate the frame in CPython": the caller does,
 * as a tail call, so a frame we let run costs no C stack of ours (with the hook
 * installed CPython already recurses in C once per Python call; deep recursion
 * through frames we skip must not need more than that). */
static char run_default_marker;
#define RUN_DEFAULT ((PyObject *)&run_default_marker)
/* The callback's answer for one call (torch.compiler.disable's wrapper of a user
 * function): this frame and all it calls run unhooked. */
static char run_unhooked_marker;
#define RUN_UNHOOKED ((PyObject *)&run_unhooked_marker)

static PyObject *lookup_and_run(PyThreadState *, _PyInterpreterFrame *, PyObject *,
                                PyCodeObject *, CodeState *) __attribute__((noinline));

static PyObject *
eval_suspended(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    tls_suspended++;
    PyObject *r = _PyEval_EvalFrameDefault(tstate, frame, 0);
    tls_suspended--;
    return r;
}

static PyObject *
frametrace_eval(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    if (running_deep(tstate)) {
        return eval_unhooked(tstate, frame, throwflag);
    }
    PyObject *cb = tls_callback;
    if (cb == NULL && threads_with_callback == 0 && deep_regions == 0) {
        update_install();   /* put back by another hook that had replaced ours */
    }
    if (cb == NULL || tls_suspended || throwflag || frame->owner != FRAME_OWNED_BY_THREAD ||
        frame->frame_obj != NULL) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    PyCodeObject *code = FRAME_CODE(frame);
    if (!(code->co_flags & CO_OPTIMIZED) ||
        (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR))) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    CodeState *st = get_code_state((PyObject *)code, 0);
    if (st != NULL && st->skip) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    if (st == NULL && PyErr_Occurred()) {
        drop_unrun_frame(tstate, frame);
        return NULL;
    }
    if (foreign_get != NULL && _PyInterpreterState_GetEvalFrameFunc(tstate->interp) != frametrace_eval) {
        int active = foreign_active();
        if (active < 0) {
            drop_unrun_frame(tstate, frame);
            return NULL;
        }
        if (active) {
            return _PyEval_EvalFrameDefault(tstate, frame, 0);
        }
    }
    PyObject *fn = lookup_and_run(tstate, frame, cb, code, st);
    if (fn == RUN_DEFAULT) {
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    if (fn == RUN_UNHOOKED) {
        return eval_suspended(tstate, frame);
    }
    if (fn == NULL) {
        return NULL;
    }
    /* A hit: its transformed code runs from this small C frame, not from inside
     * lookup_and_run's (a recursive compiled function nests one of these per level).
     * The arguments are still the unrun frame's first slots. */
    int nargs = code->co_argcount + code->co_kwonlyargcount +
                ((code->co_flags & CO_VARARGS) != 0) + ((code->co_flags & CO_VARKEYWORDS) != 0);
    PyObject *result = PyObject_Vectorcall(fn, frame->localsplus, nargs, NULL);
    Py_DECREF(fn);
    drop_unrun_frame(tstate, frame);
    return result;
}

/* Guards, then the callback on a miss.  Returns RUN_DEFAULT when the frame runs
 * unchanged, NULL on an error (the frame dropped), or a new reference to the function
 * that runs a hit's transformed code (the frame left for the caller to drop). */
static PyObject *
lookup_and_run(PyThreadState *tstate, _PyInterpreterFrame *frame, PyObject *cb,
               PyCodeObject *code, CodeState *st)
{
    int nargs = code->co_argcount + code->co_kwonlyargcount +
                ((code->co_flags & CO_VARARGS) != 0) + ((code->co_flags & CO_VARKEYWORDS) != 0);
    PyFunctionObject *func = FRAME_FUNC(frame);
    PyObject *small[MAX_STACK_ARGS + 1];
    PyObject **argv = small;
    if (nargs + 1 > MAX_STACK_ARGS + 1) {
        argv = PyMem_Malloc((nargs + 1) * sizeof(PyObject *));
        if (argv == NULL) {
            PyErr_NoMemory();
            drop_unrun_frame(tstate, frame);
            return NULL;
        }
    }
    for (int i = 0; i < nargs; i++) {
        argv[i] = frame->localsplus[i];
    }
    argv[nargs] = (PyObject *)func;

    /* Guards and the callback run unhooked.  `cb` stays alive: the callback can only
     * be swapped by a Hooked call, which restores it before returning. */
    Py_INCREF(cb);
    tls_suspended++;
    CacheEntry *hit = NULL;
    PyObject *result = NULL;
    int failed = 0, unhooked = 0;
    if (st != NULL) {
        /* Guards run Python: a garbage collection inside one can drop entries (weak
         * identity guards) or reset() can drop the whole state.  Hold the list and
         * the entry being checked; re-read the size on every pass. */
        PyObject *entries = Py_NewRef(st->entries);
        FTDispatch memo;
        memo.used = 0;
        /* The cheap key only pays among several entries of this callback: of one, the
         * check itself reads the same dtype and sizes, and the key's reads (a shape
         * tuple made per call) were a fifth of a cached call's own cost. */
        int use_key = 0;
        for (Py_ssize_t i = 0, mine = 0; i < PyList_GET_SIZE(entries) && !use_key; i++) {
            use_key = ((CacheEntry *)PyList_GET_ITEM(entries, i))->callback == cb && ++mine > 1;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
            CacheEntry *e = (CacheEntry *)PyList_GET_ITEM(entries, i);
            if (e->callback != cb) {
                continue;   /* compiled for another optimize() (backend, fullgraph) */
            }
            Py_INCREF(e);
            int ok;
            if (PyObject_TypeCheck(e->check, &FTGuardCheckType)) {
                /* A cheap key first: of many entries, most differ in it. */
                ok = use_key ? ft_guard_may_pass(e->check, argv, nargs + 1, &memo) : 1;
                if (ok == 1) {
                    ok = ft_guard_check(e->check, argv, nargs + 1);
                }
            }
            else {
                PyObject *r = PyObject_Vectorcall(e->check, argv, nargs + 1, NULL);
                ok = r == NULL ? -1 : r == Py_True;
                Py_XDECREF(r);
            }
            if (ok < 0) {
                Py_DECREF(e);
                failed = 1;
                break;
            }
            if (ok) {
                hit = e;            /* keeps the reference taken above */
                break;
            }
            Py_DECREF(e);
        }
        Py_DECREF(entries);
        st = get_code_state((PyObject *)code, 0);
        if (st == NULL && PyErr_Occurred()) {
            failed = 1;
        }
    }
    if (!failed && hit == NULL && !(st != NULL && st->miss_default)) {
        PyObject *args = PyTuple_New(nargs);
        if (args == NULL) {
            failed = 1;
        }
        else {
            for (int i = 0; i < nargs; i++) {
                PyObject *v = argv[i] != NULL ? argv[i] : Py_None;
                PyTuple_SET_ITEM(args, i, Py_NewRef(v));
            }
            Py_ssize_t n_entries = st != NULL ? PyList_GET_SIZE(st->entries) : 0;
            PyObject *decision = PyObject_CallFunction(
                cb, "OOOn", (PyObject *)code, (PyObject *)func, args, n_entries);
            Py_DECREF(args);
            if (decision == NULL) {
                failed = 1;
            }
            else if (PyTuple_Check(decision) && PyTuple_GET_SIZE(decision) == 2) {
                CacheEntry *e = new_entry(PyTuple_GET_ITEM(decision, 0),
                                          PyTuple_GET_ITEM(decision, 1), cb);
                st = e != NULL ? get_code_state((PyObject *)code, 1) : NULL;
                if (st == NULL || PyList_Insert(st->entries, 0, (PyObject *)e) < 0) {
                    failed = 1;
                    Py_XDECREF(e);
                }
                else {
                    hit = e;        /* keeps our reference */
                }
            }
            else if (PyLong_Check(decision)) {
                long d = PyLong_AsLong(decision);
                st = get_code_state((PyObject *)code, 1);
                if (st == NULL) {
                    failed = 1;
                }
                else if (d == DECIDE_SKIP) {
                    st->skip = 1;
                }
                else if (d == DECIDE_RUN_DEFAULT_ON_MISS) {
                    st->miss_default = 1;
                }
                else if (d == DECIDE_RUN_UNHOOKED) {
                    unhooked = 1;
                }
            }
            Py_XDECREF(decision);
        }
    }
    tls_suspended--;

    if (failed) {
        drop_unrun_frame(tstate, frame);
    }
    else if (unhooked) {
        result = RUN_UNHOOKED;
    }
    else if (hit == NULL || hit->code == Py_None) {
        result = RUN_DEFAULT;
    }
    else {
        result = entry_function(hit, func);
        Py_XINCREF(result);     /* the entry may be dropped while it runs */
        if (result == NULL) {
            drop_unrun_frame(tstate, frame);
        }
    }
    Py_XDECREF(hit);
    Py_DECREF(cb);
    if (argv != small) {
        PyMem_Free(argv);
    }
    return result;
}

/* ---- Unhooked / Hooked callables ---- */

/* Calls its function with this thread's callback cleared: compiled graphs and
 * frametrace.disable()d functions run as plain CPython. */
typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *callback;  /* Hooked only: the callback to set around the call */
    PyObject *dict;
    vectorcallfunc vectorcall;
} Wrapper;

static PyObject *
Unhooked_vectorcall(Wrapper *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    tls_suspended++;
    PyObject *r = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    tls_suspended--;
    return r;
}

/* ---- stances ----
 * Under frametrace.set_stance("force_eager"), or torch.compiler.set_stance("force_eager")
 * while frametrace's own stance is "default", an optimized call runs as plain CPython:
 * nothing compiled, no entry used (the other stances are the Python callback's, on a
 * miss).  torch keeps its stance in the module global `_stance` of
 * torch._dynamo.eval_frame, a DynamoStance that each set_stance replaces (never changes
 * in place): read only once the program has imported that module (never imported
 * here), and its `stance` read again only when the object is another. */
static int own_stance = 0;      /* 0: default (torch's counts), 1: force_eager, 2: another */
static PyObject *torch_stance_module = NULL;   /* interned names */
static PyObject *torch_stance_name = NULL;
static PyObject *torch_stance_globals = NULL;  /* that module's dict, once imported */
static PyObject *torch_stance_seen = NULL;     /* the DynamoStance last read */
static int torch_stance_eager = 0;

/* 1: run this optimized call as plain CPython; 0: hooked; -1: an error. */
static int
stance_force_eager(void)
{
    if (own_stance) {
        return own_stance == 1;
    }
    if (torch_stance_globals == NULL) {
        PyObject *m = PyDict_GetItemWithError(PyImport_GetModuleDict(), torch_stance_module);
        if (m == NULL || !PyModule_Check(m)) {
            return PyErr_Occurred() ? -1 : 0;
        }
        torch_stance_globals = Py_NewRef(PyModule_GetDict(m));
    }
    PyObject *stance = PyDict_GetItemWithError(torch_stance_globals, torch_stance_name);
    if (stance == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (stance != torch_stance_seen) {
        PyObject *name = PyObject_GetAttrString(stance, "stance");
        if (name == NULL) {
            return -1;
        }
        torch_stance_eager = PyUnicode_Check(name) &&
                             PyUnicode_CompareWithASCIIString(name, "force_eager") == 0;
        Py_DECREF(name);
        Py_XSETREF(torch_stance_seen, Py_NewRef(stance));
    }
    return torch_stance_eager;
}

static PyObject *
py_set_own_stance(PyObject *m, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (v < 0 || v > 2) {
        PyErr_SetString(PyExc_ValueError, "stance code must be 0, 1 or 2");
        return NULL;
    }
    own_stance = (int)v;
    Py_RETURN_NONE;
}

static PyObject *
py_force_eager(PyObject *m, PyObject *noargs)
{
    int eager = stance_force_eager();
    if (eager < 0) {
        return NULL;
    }
    return PyBool_FromLong(eager);
}

/* Calls its function with this thread's callback set, so the frames it runs
 * are caught by the hook: what frametrace.optimize returns. */
static PyObject *
Hooked_vectorcall(Wrapper *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    int eager = stance_force_eager();
    if (eager) {
        return eager < 0 ? NULL : Unhooked_vectorcall(self, args, nargsf, kwnames);
    }
    /* An optimized call inside an unhooked region (a disable()d function, a backend
     * compiling) is hooked again for its own duration. */
    /* Inside a torch.compile region, torch.compile is off for the call (as its own
     * torch.compiler.disable does): the frames it runs are ours. */
    PyObject *foreign_prev = NULL;
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get());
    /* (torch.compile active on this thread means its hook is installed: only then ask) */
    if (foreign_get != NULL && current != frametrace_eval && current != _PyEval_EvalFrameDefault) {
        foreign_prev = PyObject_CallNoArgs(foreign_get);
        if (foreign_prev == NULL) {
            return NULL;
        }
        if (foreign_prev == Py_None) {
            Py_CLEAR(foreign_prev);
        }
        else {
            PyObject *was = PyObject_CallOneArg(foreign_set, Py_None);
            if (was == NULL) {
                Py_DECREF(foreign_prev);
                return NULL;
            }
            Py_DECREF(was);
        }
    }
    int suspended = tls_suspended;
    tls_suspended = 0;
    PyObject *prev = swap_callback(self->callback);
    PyObject *r = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    PyObject *mine = swap_callback(prev);
    tls_suspended = suspended;
    Py_DECREF(prev);
    Py_DECREF(mine);
    if (foreign_prev != NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *was = PyObject_CallOneArg(foreign_set, foreign_prev);
        Py_DECREF(foreign_prev);
        if (was == NULL) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            Py_XDECREF(r);
            return NULL;
        }
        Py_DECREF(was);
        PyErr_Restore(type, value, tb);
    }
    return r;
}

static void
Wrapper_dealloc(Wrapper *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->fn);
    Py_XDECREF(self->callback);
    Py_XDECREF(self->dict);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Wrapper_traverse(Wrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->callback);
    Py_VISIT(self->dict);
    return 0;
}

static int
Wrapper_clear(Wrapper *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->callback);
    Py_CLEAR(self->dict);
    return 0;
}

/* Bind like a function, so wrapped methods get `self`. */
static PyObject *
Wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
Unhooked_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "O:Unhooked", &fn)) {
        return NULL;
    }
    Wrapper *self = (Wrapper *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->vectorcall = (vectorcallfunc)Unhooked_vectorcall;
    return (PyObject *)self;
}

static PyObject *
Hooked_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fn, *callback;
    if (!PyArg_ParseTuple(args, "OO:Hooked", &fn, &callback)) {
        return NULL;
    }
    Wrapper *self = (Wrapper *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->callback = Py_NewRef(callback);
    self->vectorcall = (vectorcallfunc)Hooked_vectorcall;
    return (PyObject *)self;
}

static PyMemberDef Wrapper_members[] = {
    {"fn", T_OBJECT, offsetof(Wrapper, fn), READONLY, "the wrapped callable"},
    {"callback", T_OBJECT, offsetof(Wrapper, callback), READONLY, "the callback set around calls"},
    {NULL},
};

static PyGetSetDef Wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

#define WRAPPER_TYPE(NAME, DOC)                                                        \
    static PyTypeObject NAME##Type = {                                                 \
        PyVarObject_HEAD_INIT(NULL, 0)                                                 \
        .tp_name = "frametrace._C." #NAME,                                             \
        .tp_basicsize = sizeof(Wrapper),                                               \
        .tp_dealloc = (destructor)Wrapper_dealloc,                                     \
        .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),                         \
        .tp_call = PyVectorcall_Call,                                                  \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | \
                    Py_TPFLAGS_METHOD_DESCRIPTOR,                                      \
        .tp_doc = DOC,                                                                 \
        .tp_traverse = (traverseproc)Wrapper_traverse,                                 \
        .tp_clear = (inquiry)Wrapper_clear,                                            \
        .tp_members = Wrapper_members,                                                 \
        .tp_getset = Wrapper_getset,                                                   \
        .tp_descr_get = Wrapper_descr_get,                                             \
        .tp_dictoffset = offsetof(Wrapper, dict),                                      \
        .tp_new = NAME##_new,                                                          \
    };

WRAPPER_TYPE(Unhooked, "Unhooked(fn): calls fn with the frame hook off for this thread.")
WRAPPER_TYPE(Hooked, "Hooked(fn, callback): calls fn with `callback` set as this thread's frame callback.")

/* ---- module functions ---- */

static PyObject *
py_set_callback(PyObject *m, PyObject *cb)
{
    if (cb != Py_None && !PyCallable_Check(cb)) {
        PyErr_SetString(PyExc_TypeError, "callback must be callable or None");
        return NULL;
    }
    return swap_callback(cb);
}

static PyObject *
py_get_callback(PyObject *m, PyObject *noargs)
{
    /* The callback in effect: none inside an unhooked region. */
    return Py_NewRef(tls_callback != NULL && !tls_suspended ? tls_callback : Py_None);
}

static PyObject *
py_entries(PyObject *m, PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "expected a code object");
        return NULL;
    }
    CodeState *st = get_code_state(code, 0);
    if (st == NULL) {
        return PyErr_Occurred() ? NULL : PyList_New(0);
    }
    return PyList_GetSlice(st->entries, 0, PyList_GET_SIZE(st->entries));
}

static PyObject *
py_code_flags(PyObject *m, PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "expected a code object");
        return NULL;
    }
    CodeState *st = get_code_state(code, 0);
    if (st == NULL) {
        return PyErr_Occurred() ? NULL : Py_BuildValue("(ii)", 0, 0);
    }
    return Py_BuildValue("(ii)", st->skip, st->miss_default);
}

static PyObject *
py_clear_code(PyObject *m, PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "expected a code object");
        return NULL;
    }
    CodeState *st = get_code_state(code, 0);
    if (st == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    /* Unhook the state before its entries die: their deaths run Python (weakref
     * callbacks calling remove_entry, guards of this very code), which must find the
     * code without state, not a state that SetExtra is in the middle of freeing. */
    PyObject *entries = st->entries;
    st->entries = NULL;
    if (CODE_SET_EXTRA(code, extra_index, NULL) < 0) {
        st->entries = entries;
        return NULL;
    }
    Py_XDECREF(entries);
    Py_RETURN_NONE;
}

static PyObject *
py_remove_entry(PyObject *m, PyObject *args)
{
    PyObject *code, *check;
    if (!PyArg_ParseTuple(args, "O!O:remove_entry", &PyCode_Type, &code, &check)) {
        return NULL;
    }
    CodeState *st = get_code_state(code, 0);
    if (st == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(st->entries); i++) {
        if (((CacheEntry *)PyList_GET_ITEM(st->entries, i))->check == check) {
            if (PyList_SetSlice(st->entries, i, i + 1, NULL) < 0) {
                return NULL;
            }
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

static PyObject *
py_mark_skip(PyObject *m, PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "expected a code object");
        return NULL;
    }
    if (mark_skip(code) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
py_hook_installed(PyObject *m, PyObject *noargs)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(interp) == frametrace_eval);
}

static PyObject *
py_set_foreign_hook(PyObject *m, PyObject *args)
{
    PyObject *get, *set;
    if (!PyArg_ParseTuple(args, "OO:set_foreign_hook", &get, &set)) {
        return NULL;
    }
    if (get == Py_None) {
        Py_CLEAR(foreign_get);
        Py_CLEAR(foreign_set);
        Py_RETURN_NONE;
    }
    if (!PyCallable_Check(get) || !PyCallable_Check(set)) {
        PyErr_SetString(PyExc_TypeError, "set_foreign_hook expects two callables, or None, None");
        return NULL;
    }
    Py_XSETREF(foreign_get, Py_NewRef(get));
    Py_XSETREF(foreign_set, Py_NewRef(set));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_foreign_hook", py_set_foreign_hook, METH_VARARGS,
     "set_foreign_hook(get, set): another frame hook's per-thread callback getter and setter"},
    {"set_callback", py_set_callback, METH_O,
     "set_callback(cb) -> previous: set this thread's frame callback (None to clear)."},
    {"get_callback", py_get_callback, METH_NOARGS, "this thread's frame callback, or None"},
    {"entries", py_entries, METH_O, "entries(code) -> list of CacheEntry, most recent first"},
    {"code_flags", py_code_flags, METH_O, "code_flags(code) -> (skip, run_default_on_miss)"},
    {"clear_code", py_clear_code, METH_O, "clear_code(code): drop all cached state of code"},
    {"mark_skip", py_mark_skip, METH_O, "mark_skip(code): never trace code"},
    {"remove_entry", py_remove_entry, METH_VARARGS,
     "remove_entry(code, check) -> bool: drop the entry whose guard is `check`"},
    {"hook_installed", py_hook_installed, METH_NOARGS, "whether the frame hook is installed"},
    {"set_own_stance", py_set_own_stance, METH_O,
     "set_own_stance(n): frametrace's stance for the hook: 0 default (torch's counts), "
     "1 force_eager, 2 another"},
    {"force_eager", py_force_eager, METH_NOARGS,
     "whether optimized calls run as plain CPython now (frametrace's or torch's stance)"},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "frametrace._C", "frametrace's frame-evaluation hook", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    extra_index = REQUEST_EXTRA_INDEX(free_code_state);
    if (extra_index < 0) {
        PyErr_SetString(PyExc_RuntimeError, "no code extra index left");
        return NULL;
    }
    if (PyType_Ready(&CacheEntryType) < 0 || PyType_Ready(&UnhookedType) < 0 ||
        PyType_Ready(&HookedType) < 0) {
        return NULL;
    }
    torch_stance_module = PyUnicode_InternFromString("torch._dynamo.eval_frame");
    torch_stance_name = PyUnicode_InternFromString("_stance");
    if (torch_stance_module == NULL || torch_stance_name == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (ft_guards_init(m) < 0 ||
        PyModule_AddObjectRef(m, "CacheEntry", (PyObject *)&CacheEntryType) < 0 ||
        PyModule_AddObjectRef(m, "Unhooked", (PyObject *)&UnhookedType) < 0 ||
        PyModule_AddObjectRef(m, "Hooked", (PyObject *)&HookedType) < 0 ||
        PyModule_AddIntConstant(m, "SKIP", DECIDE_SKIP) < 0 ||
        PyModule_AddIntConstant(m, "RUN_DEFAULT_ON_MISS", DECIDE_RUN_DEFAULT_ON_MISS) < 0 ||
        PyModule_AddIntConstant(m, "RUN_UNHOOKED", DECIDE_RUN_UNHOOKED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
