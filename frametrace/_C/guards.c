/* frametrace's guard evaluator: an entry's guards as a straight-line program over
 * registers, built once by guards.py (GuardSet.compile) and run here on every call.
 *
 * A load puts a value in the next register: an argument slot, a constant, or an
 * attribute, item or membership of an earlier register.  Every source is loaded
 * once, so guards on `self._modules['h']._modules['0']` and everything below it
 * share that prefix (the program is the guard tree, walked depth-first in the
 * order the guards were made).  A check tests one register: a type or identity
 * as a pointer compare, a value, a length, dict keys, a tensor's metadata.  The
 * first failing check ends the run: the entry does not apply.  Guards without a
 * form here run afterwards in `residual`, a Python function taking the same
 * arguments (the whole check is exactly as before: every guard must hold, and an
 * Exception raised while evaluating one means "does not hold").
 *
 * Registers own their values and the program owns its constants, so user code run
 * by a check (an __eq__, a property, a __hash__ that collects garbage, a weakref
 * callback dropping this very entry) cannot free what the run still reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include "guards.h"
#include "tensor_reads.h"

#if PY_VERSION_HEX >= 0x030D0000
#define LOOKUP_ATTR PyObject_GetOptionalAttr
#else
#define LOOKUP_ATTR _PyObject_LookupAttr
#endif

/* 1 when weak reference `ref` still refers to `v` (3.13 deprecates the borrowed
 * PyWeakref_GET_OBJECT; PyWeakref_GetRef gives a strong reference). */
static inline int
weak_refers_to(PyObject *ref, PyObject *v)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return 0;
    }
    int same = target == v;
    Py_XDECREF(target);
    return same;
#else
    return PyWeakref_GET_OBJECT(ref) == v;
#endif
}

enum {
    /* loads: regs[reg] = ... */
    OP_ARG,             /* args[n] */
    OP_CONST,           /* a */
    OP_ATTR,            /* regs[src].a */
    OP_ITEM,            /* regs[src][a] */
    OP_ODICT,           /* object.__getattribute__(regs[src], '__dict__'): the instance dict,
                         * past a __getattribute__ of the class's own */
    OP_DGET,            /* dict.get(regs[src], a): None when absent (fails if not a dict) */
    OP_IN,              /* a in regs[src], as a bool */
    OP_DVIEW,           /* [*regs[src].keys()] (n 0) or [*regs[src].values()] (n 1); a: the name */
    OP_LAST_LOAD = OP_DVIEW,
    /* checks of regs[reg] */
    OP_TYPE,            /* type(v) is a */
    OP_IS,              /* v is a */
    OP_WEAK,            /* a() is v is not None */
    OP_EQ_ANY,          /* v == a */
    OP_EQ,              /* type(v) is b and same_key(v, a) */
    OP_NOT_NONE,        /* v is not None */
    OP_LEN,             /* type(v) is a and len(v) == n */
    OP_LEN_ANY,         /* len(v) == n */
    OP_KEYS,            /* type(v) is dict and tuple(v) matches a, key by key by same_key */
    OP_TUPLE_EQ,        /* tuple(v) matches a, item by item by same_key */
    OP_CONTAINS,        /* a in v */
    OP_NOT_CONTAINS,    /* a not in v */
    OP_FALSY,           /* not v */
    OP_HASATTR,         /* hasattr(v, a) is bool(n); b: nn.Module.__getattr__ or None */
    OP_TENSOR,          /* the tensor guard: type, dtype, device, sizes, strides, bits */
    OP_IS_REG,          /* v is regs[src] */
    OP_IS_NOT_REG,      /* v is not regs[src] */
    OP_CALL_IS,         /* a() is b (reg unused) */
    OP_CALL_EQ,         /* a() == b (reg unused) */
    OP_FUNC,            /* a == (code, defaults, kwdefaults): v.__code__ is code, ... each by identity */
    OP_NO_HOOKS,        /* a: a tuple of attribute names; not (v.<a[0]> or v.<a[1]> or ...) */
    OP_UNSHARED,        /* a, b: tuples of registers; the tensors in a are distinct objects with
                           storages of their own, shared with no tensor in b (reg unused) */
    OP_DISTINCT,        /* a: a tuple of registers, holding distinct objects (reg unused) */
    OP_COUNT
};

/* How a tensor class answers the guard's reads, resolved once from its MRO: the
 * getters of `dtype`, `layout`, `device`, `shape`, `requires_grad` and the method descriptors
 * of `stride`, `is_neg`, `is_conj`, all of torch's C base class.  Borrowed: valid
 * while the class's version tag is `version` (a class or base changed by assignment
 * gets a new tag, and tags are never reused). */
enum { RD_DTYPE, RD_LAYOUT, RD_DEVICE, RD_SHAPE, RD_REQUIRES_GRAD, RD_STRIDE, RD_IS_NEG, RD_IS_CONJ, RD_COUNT };

typedef struct {
    unsigned int version;   /* 0: not resolved (the generic lookups run) */
    PyGetSetDef *get[RD_STRIDE];
    PyObject *method[RD_COUNT - RD_STRIDE];
} TensorReads;

typedef struct {
    PyObject *type, *dtype, *layout, *device, *sizes, *strides, *requires_grad;
    int conj;           /* -1: not read (a real tensor), else the expected bit */
    int neg;
    Py_ssize_t ndim;
    /* sizes then strides, as C integers: each within [lo, hi], lo = dims, hi = dims +
     * 2 * ndim.  lo == hi for a static one; a symbolic one has its symbol's range, or
     * PY_SSIZE_T_MIN..PY_SSIZE_T_MAX where the Python shape guards check it. */
    Py_ssize_t *dims;
    int ranged;         /* some dim is symbolic: `sizes` and `strides` hold None there */
    TensorReads reads;
    int cxx;            /* the C++ reads: 0 not tried yet, 1 encoded in `codes`, -1 never */
    FtTensorCodes codes;
} TensorSpec;

/* The C++ reads (frametrace._tensor_reads), when guards.py found them built for this
 * torch; NULL: every tensor is read through its Python getters. */
static const FtTensorReads *cxx_reads = NULL;
static unsigned long long cxx_answers;     /* checks they answered (for tests) */

/* What a load or check saw the last time it ran, while the dicts it read are
 * unchanged (see `cached_attr`).  Borrowed pointers: valid only on a version match. */
typedef struct {
    PyTypeObject *type;
    unsigned int type_version;
    uint64_t dict_version;
    PyObject *value;
    int of_class;       /* an attribute of the class `type` itself; dict_version: its metatype's version */
} Memo;

typedef struct {
    int op;
    int reg;
    int src;
    Py_ssize_t n;
    PyObject *a;
    PyObject *b;
    TensorSpec *t;
    Memo memo;
    PyObject **vals;    /* NO_HOOKS: the attributes' values as last read (borrowed, see memo) */
    struct StoreMemo *stores;   /* HASATTR of a module: its three tables as last read */
} Instr;

/* The _parameters, _buffers and _modules dicts of a module's instance dict (borrowed:
 * valid while that dict's version is the memo's; NULL where absent) and their versions. */
typedef struct StoreMemo {
    PyObject *table[3];
    uint64_t version[3];
} StoreMemo;

enum { DISC_NONE = 0, DISC_TENSOR = 1, DISC_VALUE = 2 };

typedef struct {
    PyObject_HEAD
    Py_ssize_t nargs;       /* argument slots + the function */
    Py_ssize_t ninstr;
    Py_ssize_t nregs;
    Instr *code;
    PyObject *residual;     /* Python check of the remaining guards, or None */
    PyObject *program;      /* the tuples the program was built from (for people) */
    /* The entry's dispatch key (ft_guard_may_pass). */
    int disc_kind;
    Py_ssize_t disc_arg;
    PyObject *disc_type;
    Py_hash_t disc_hash;
    PyObject *dict;
    PyObject *weakrefs;
    vectorcallfunc vectorcall;
} GuardCheck;

static PyObject *s_dtype, *s_layout, *s_device, *s_shape, *s_stride, *s_requires_grad, *s_is_conj, *s_is_neg;
static PyObject *s_getattr, *s_getattribute, *s_dict, *s_stores[3];
static PyObject *s_code, *s_defaults, *s_kwdefaults;
static PyObject *s_untyped_storage, *s_data_ptr;
static PyObject *object_getattribute;   /* object.__getattribute__ */

/* ---- running ---- */

/* An Exception raised by a guard means the guard does not hold; anything else
 * (KeyboardInterrupt, SystemExit) goes to the caller, as from a Python check. */
static int
failed_with_error(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* `a == b` as Python's `if` reads it: 1, 0, or -1 with an exception set. */
static int
equals(PyObject *a, PyObject *b)
{
    PyObject *r = PyObject_RichCompare(a, b, Py_EQ);
    if (r == NULL) {
        return -1;
    }
    int ok = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* `v` stands for the traced constant `a` wherever a program can look: same type, and
 * equal as the program would see it (dict keys, a value guard).  `==` alone is not
 * that: 1 == True == 1.0, a str subclass or an IntEnum equals its plain value, and
 * 0.0 == -0.0; a key read out of a dict (`next(iter(d))`, `list(d)`) answers
 * `type(k)`, `k is True` and `str(k)` from the traced object.  Tuples and slices
 * compare item by item; floats (and complex parts) also by the sign of a zero; a
 * NaN matches only itself (it is found in a dict only by identity).  1, 0, or -1
 * with an exception set. */
static int same_key(PyObject *v, PyObject *a);

static int
same_float(double x, double y)
{
    return x == y && copysign(1.0, x) == copysign(1.0, y);
}

static int
same_key(PyObject *v, PyObject *a)
{
    if (v == a) {
        return 1;
    }
    PyTypeObject *tp = Py_TYPE(a);
    if (Py_TYPE(v) != tp) {
        return 0;
    }
    if (tp == &PyLong_Type || tp == &PyUnicode_Type) {
        return PyObject_RichCompareBool(v, a, Py_EQ);     /* (no subclass: no user __eq__) */
    }
    if (tp == &PyFloat_Type) {
        return same_float(PyFloat_AS_DOUBLE(v), PyFloat_AS_DOUBLE(a));
    }
    if (tp == &PyComplex_Type) {
        Py_complex x = PyComplex_AsCComplex(v), y = PyComplex_AsCComplex(a);
        return same_float(x.real, y.real) && same_float(x.imag, y.imag);
    }
    if (tp == &PyTuple_Type) {
        Py_ssize_t n = PyTuple_GET_SIZE(a);
        if (PyTuple_GET_SIZE(v) != n) {
            return 0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int ok = same_key(PyTuple_GET_ITEM(v, i), PyTuple_GET_ITEM(a, i));
            if (ok != 1) {
                return ok;
            }
        }
        return 1;
    }
    if (tp == &PySlice_Type) {
        PySliceObject *x = (PySliceObject *)v, *y = (PySliceObject *)a;
        int ok = same_key(x->start, y->start);
        if (ok == 1) {
            ok = same_key(x->stop, y->stop);
        }
        return ok == 1 ? same_key(x->step, y->step) : ok;
    }
    if (tp == &PyFrozenSet_Type || tp == &PySet_Type) {
        /* Equal sets, then each member of `a` matched to the member of `v` that
         * equals it (a set holds no two equal members) and compared strictly:
         * frozenset({1}) == frozenset({True}). */
        int ok = equals(v, a);
        PyObject *ia = ok == 1 ? PyObject_GetIter(a) : NULL, *x;
        if (ia == NULL) {
            return ok == 1 ? -1 : ok;
        }
        while (ok == 1 && (x = PyIter_Next(ia)) != NULL) {
            PyObject *iv = PyObject_GetIter(v), *y;
            ok = iv == NULL ? -1 : 0;
            while (iv != NULL && ok == 0 && (y = PyIter_Next(iv)) != NULL) {
                int eq = PyObject_RichCompareBool(y, x, Py_EQ);
                if (eq == 1) {
                    eq = same_key(y, x);
                    ok = eq == 1 ? 1 : eq == 0 ? -2 : -1;     /* -2: found, not the same */
                }
                else {
                    ok = eq;
                }
                Py_DECREF(y);
            }
            if (ok == 0 && PyErr_Occurred()) {
                ok = -1;
            }
            ok = ok == -2 ? 0 : ok;
            Py_XDECREF(iv);
            Py_DECREF(x);
        }
        Py_DECREF(ia);
        return ok == 1 && PyErr_Occurred() ? -1 : ok;
    }
    return equals(v, a);
}

/* item <op> bound, as Python compares them: 1, 0, or -1. */
static int
compare_int(PyObject *item, Py_ssize_t bound, int op)
{
    PyObject *b = PyLong_FromSsize_t(bound);
    if (b == NULL) {
        return -1;
    }
    int r = PyObject_RichCompareBool(item, b, op);
    Py_DECREF(b);
    return r;
}

/* What the Python check of a tensor with symbolic sizes compares: the length, each
 * static item by ==, each symbolic one against its range by >= and <=. */
static int
ints_within(PyObject *seq, const Py_ssize_t *lo, const Py_ssize_t *hi, Py_ssize_t n)
{
    Py_ssize_t len = PyObject_Length(seq);
    if (len != n) {
        return len < 0 ? -1 : 0;
    }
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok == 1; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (item == NULL) {
            return -1;
        }
        if (lo[i] == hi[i]) {
            ok = compare_int(item, lo[i], Py_EQ);
        }
        else {
            if (lo[i] != PY_SSIZE_T_MIN) {
                ok = compare_int(item, lo[i], Py_GE);
            }
            if (ok == 1 && hi[i] != PY_SSIZE_T_MAX) {
                ok = compare_int(item, hi[i], Py_LE);
            }
        }
        Py_DECREF(item);
    }
    return ok;
}

/* A tensor's sizes (a torch.Size) or strides (a stride() tuple) against the traced
 * ones: exact ints as C integers, each within [lo[i], hi[i]]; anything else by
 * Python's comparisons, as the guard's Python expression makes them. */
static int
ints_equal(PyObject *seq, PyObject *expected, const Py_ssize_t *lo, const Py_ssize_t *hi,
           Py_ssize_t n, int ranged)
{
    if (PyTuple_Check(seq)) {
        if (PyTuple_GET_SIZE(seq) != n) {
            return 0;
        }
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(seq, i);
            if (!PyLong_CheckExact(item)) {
                break;
            }
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                break;
            }
            if (v < (long long)lo[i] || v > (long long)hi[i]) {
                return 0;
            }
        }
        if (i == n) {
            return 1;
        }
    }
    return ranged ? ints_within(seq, lo, hi, n) : equals(seq, expected);
}

static inline unsigned int type_version(PyTypeObject *tp);

/* Fills `r` for `tp` when each name resolves, through a type whose attribute
 * lookup is the generic one, to a getter or a method of one static C class (torch's
 * TensorBase, whose dict cannot change: the descriptors live as long as the
 * process).  Then what `v.name` runs is known without the lookup, and a getter (a
 * data descriptor) is not shadowed by the instance dict.  A method can be: called
 * here it reads the tensor's own strides and bits, which is what the guard is about
 * (an instance attribute named `stride` changes neither). */
static void
resolve_tensor_reads(PyTypeObject *tp, TensorReads *r)
{
    static PyObject **names[RD_COUNT] = {&s_dtype, &s_layout, &s_device, &s_shape, &s_requires_grad,
                                         &s_stride, &s_is_neg, &s_is_conj};
    r->version = 0;
    if (tp->tp_getattro != PyObject_GenericGetAttr &&
        (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || _PyType_Lookup(tp, s_getattribute) != object_getattribute ||
         _PyType_Lookup(tp, s_getattr) != NULL)) {
        return;
    }
    PyTypeObject *owner = NULL;
    for (int i = 0; i < RD_COUNT; i++) {
        PyObject *d = _PyType_Lookup(tp, *names[i]);
        if (d == NULL) {
            return;
        }
        if (i < RD_STRIDE) {
            if (!Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
                return;
            }
            r->get[i] = ((PyGetSetDescrObject *)d)->d_getset;
            if (r->get[i]->get == NULL) {
                return;
            }
        }
        else {
            if (!Py_IS_TYPE(d, &PyMethodDescr_Type)) {
                return;
            }
            r->method[i - RD_STRIDE] = d;
        }
        if (owner != NULL && PyDescr_TYPE(d) != owner) {
            return;
        }
        owner = PyDescr_TYPE(d);
    }
    if (!(owner->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        r->version = type_version(tp);
    }
}

/* v.<name> for one of the reads: the resolved getter, else the generic lookup. */
static inline PyObject *
tensor_get(PyObject *v, const TensorReads *r, int which, PyObject *name)
{
    if (r->version != 0) {
        return r->get[which]->get(v, r->get[which]->closure);
    }
    return PyObject_GetAttr(v, name);
}

/* v.<name>(): the resolved method, else the generic method call. */
static inline PyObject *
tensor_call(PyObject *v, const TensorReads *r, int which, PyObject *name)
{
    if (r->version != 0) {
        return PyObject_Vectorcall(r->method[which - RD_STRIDE], &v, 1, NULL);
    }
    return PyObject_CallMethodNoArgs(v, name);
}

/* v.<name> is `expected` (a singleton: a dtype, a layout, True/False): 1, 0, or -1. */
static int
get_is(PyObject *v, const TensorReads *rd, int which, PyObject *name, PyObject *expected)
{
    PyObject *r = tensor_get(v, rd, which, name);
    if (r == NULL) {
        return -1;
    }
    int ok = r == expected;
    Py_DECREF(r);
    return ok;
}

static int
bool_call_is(PyObject *v, const TensorReads *rd, int which, PyObject *name, int expected)
{
    PyObject *r = tensor_call(v, rd, which, name);
    if (r == NULL) {
        return -1;
    }
    int ok = r == (expected ? Py_True : Py_False);
    Py_DECREF(r);
    return ok;
}

/* The order and the comparisons of GuardSet.tensor's Python expression. */
static int
tensor_matches(PyObject *v, TensorSpec *t)
{
    if ((PyObject *)Py_TYPE(v) != t->type) {
        return 0;
    }
    TensorReads *rd = &t->reads;
    unsigned int version = type_version(Py_TYPE(v));
    if (rd->version != version || version == 0) {
        resolve_tensor_reads(Py_TYPE(v), rd);
    }
    /* The getters being torch's own (rd->version), the C++ accessors they call give
     * the same answers. */
    if (rd->version != 0 && cxx_reads != NULL && t->cxx >= 0) {
        if (t->cxx == 0) {
            t->cxx = cxx_reads->encode(t->dtype, t->layout, t->device, &t->codes) ? 1 : -1;
        }
        if (t->cxx == 1) {
            int r = cxx_reads->check(v, &t->codes, t->dims, t->dims + 2 * t->ndim, t->ndim,
                                     t->requires_grad == Py_True,
                                     t->conj, t->neg);
            if (r != -2) {
                cxx_answers++;
                return r;
            }
        }
    }
    int ok = get_is(v, rd, RD_DTYPE, s_dtype, t->dtype);
    if (ok != 1) {
        return ok;
    }
    /* Layouts are singletons.  Sparse COO and mkldnn tensors answer stride() (with
     * zeros), so without this one a strided graph would run on them. */
    if ((ok = get_is(v, rd, RD_LAYOUT, s_layout, t->layout)) != 1) {
        return ok;
    }
    PyObject *r = tensor_get(v, rd, RD_DEVICE, s_device);
    if (r == NULL) {
        return -1;
    }
    ok = equals(r, t->device);
    Py_DECREF(r);
    if (ok != 1) {
        return ok;
    }
    if ((r = tensor_get(v, rd, RD_SHAPE, s_shape)) == NULL) {
        return -1;
    }
    ok = ints_equal(r, t->sizes, t->dims, t->dims + 2 * t->ndim, t->ndim, t->ranged);
    Py_DECREF(r);
    if (ok != 1) {
        return ok;
    }
    if ((r = tensor_call(v, rd, RD_STRIDE, s_stride)) == NULL) {
        return -1;
    }
    ok = ints_equal(r, t->strides, t->dims + t->ndim, t->dims + 3 * t->ndim, t->ndim, t->ranged);
    Py_DECREF(r);
    if (ok != 1) {
        return ok;
    }
    if ((ok = get_is(v, rd, RD_REQUIRES_GRAD, s_requires_grad, t->requires_grad)) != 1) {
        return ok;
    }
    if (t->conj >= 0 && (ok = bool_call_is(v, rd, RD_IS_CONJ, s_is_conj, t->conj)) != 1) {
        return ok;
    }
    return bool_call_is(v, rd, RD_IS_NEG, s_is_neg, t->neg);
}

/* tuple(v) == keys, without building the tuple while the dict's keys are the very
 * objects traced (str keys: the usual case). */
static int
dict_keys_equal(PyObject *v, PyObject *keys)
{
    if (PyDict_GET_SIZE(v) != PyTuple_GET_SIZE(keys)) {
        return 0;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(v, &pos, &key, &value)) {
        PyObject *want = PyTuple_GET_ITEM(keys, i++);
        if (key != want) {
            /* (the dict may change under a key's __eq__: the size is checked again) */
            Py_INCREF(key);
            int ok = same_key(key, want);
            Py_DECREF(key);
            if (ok != 1) {
                return ok;
            }
            if (PyDict_GET_SIZE(v) != PyTuple_GET_SIZE(keys)) {
                return 0;
            }
        }
    }
    return 1;
}

/* tuple(v) matches the tuple `keys` key by key, each by same_key. */
static int
tuple_same_keys(PyObject *v, PyObject *keys)
{
    PyObject *t = PySequence_Tuple(v);
    if (t == NULL) {
        return -1;
    }
    int ok = PyTuple_GET_SIZE(t) == PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; ok == 1 && i < PyTuple_GET_SIZE(t); i++) {
        ok = same_key(PyTuple_GET_ITEM(t, i), PyTuple_GET_ITEM(keys, i));
    }
    Py_DECREF(t);
    return ok;
}

/* hasattr(v, name) for an object whose class runs `module_getattr` (nn.Module's
 * __getattr__) after the generic lookup: what CPython does for such a class, with
 * that __getattr__'s search of _parameters, _buffers and _modules done here, so a
 * missing attribute costs no AttributeError (nn.Module formats one: microseconds).
 * -2 when the class is not such a class. */
static int
module_hasattr(PyObject *v, PyObject *name, PyObject *module_getattr)
{
    PyTypeObject *tp = Py_TYPE(v);
    if (module_getattr == Py_None || _PyType_Lookup(tp, s_getattr) != module_getattr ||
        _PyType_Lookup(tp, s_getattribute) != object_getattribute) {
        return -2;
    }
    PyObject *r = _PyObject_GenericGetAttrWithDict(v, name, NULL, 1);
    if (r != NULL || PyErr_Occurred()) {
        Py_XDECREF(r);
        return r != NULL ? 1 : -1;
    }
    PyObject *d = PyObject_GetAttr(v, s_dict);
    if (d == NULL) {
        return -1;
    }
    int found = 0;
    for (int i = 0; i < 3 && found == 0; i++) {
        found = PySequence_Contains(d, s_stores[i]);
        if (found == 1) {
            PyObject *table = PyObject_GetItem(d, s_stores[i]);
            found = table == NULL ? -1 : PySequence_Contains(table, name);
            Py_XDECREF(table);
        }
    }
    Py_DECREF(d);
    return found;
}

/* ---- dict versions ----
 * A dict's version tag changes on every mutation and is unique across all dicts
 * (a new dict gets a fresh one), and a type's version tag changes whenever it or a
 * base is modified: so an unchanged (type version, instance-dict version) pair
 * means `obj.name` is still the value the instance dict held last time, and an
 * unchanged dict version means `d[key]` and `key in d` answer as last time.  The
 * field is deprecated in 3.12 (for dict watchers) but kept and maintained. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static inline uint64_t
dict_version(PyObject *d)
{
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13: a dict sharing an object's inline values (its __dict__, once read) keeps
     * its version while attribute stores through the object write those values: no
     * version to rely on (0, which no memo accepts) until the dict holds its own. */
    if (((PyDictObject *)d)->ma_values != NULL) {
        return 0;
    }
#endif
    return ((PyDictObject *)d)->ma_version_tag;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* 0 when the type has no valid version.  3.13 no longer sets
 * Py_TPFLAGS_VALID_VERSION_TAG: a modified type's tag is reset to 0 instead. */
static inline unsigned int
type_version(PyTypeObject *tp)
{
#if PY_VERSION_HEX >= 0x030D0000
    return tp->tp_version_tag;
#else
    return (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? tp->tp_version_tag : 0;
#endif
}

/* The instance dict of `obj` when its attributes are looked up generically (no
 * __getattribute__ of its own; a __getattr__ runs only for missing names), else
 * NULL.  (Materializes a managed dict: the same attributes, held in a dict.) */
static PyObject *
generic_instance_dict(PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp->tp_getattro != PyObject_GenericGetAttr &&
        (!(tp->tp_flags & Py_TPFLAGS_HEAPTYPE) || _PyType_Lookup(tp, s_getattribute) != object_getattribute)) {
        return NULL;
    }
    PyObject **dp = _PyObject_GetDictPtr(obj);
    return dp != NULL && *dp != NULL && PyDict_CheckExact(*dp) ? *dp : NULL;
}

/* What an ATTR load of a function's state reads directly (in->n, set when built). */
enum { FN_NONE, FN_CODE, FN_DEFAULTS, FN_KWDEFAULTS };

static Py_ssize_t
function_field(PyObject *name)
{
    return PyUnicode_CompareWithASCIIString(name, "__code__") == 0 ? FN_CODE :
           PyUnicode_CompareWithASCIIString(name, "__defaults__") == 0 ? FN_DEFAULTS :
           PyUnicode_CompareWithASCIIString(name, "__kwdefaults__") == 0 ? FN_KWDEFAULTS : FN_NONE;
}

/* v's type and instance dict are the versions `m` recorded: what was read from that
 * dict (or decided by that type's MRO) then is what a read would give now. */
static inline int
memo_holds(const Memo *m, PyObject *v)
{
    PyTypeObject *tp = Py_TYPE(v);
    if (m->type != tp || m->type_version == 0 || type_version(tp) != m->type_version) {
        return 0;
    }
    PyObject **dp = _PyObject_GetDictPtr(v);
    return dp != NULL && *dp != NULL && PyDict_CheckExact(*dp) && m->dict_version != 0 &&
           dict_version(*dp) == m->dict_version;
}

/* The memos of ATTR loads (class attributes on the class's and metatype's version
 * tags, instance attributes on the type's and instance dict's): on unless
 * frametrace.config.memoize_attr_guards is False (set_attr_memos), when every load
 * is a plain getattr.  attr_memo_hits: loads a memo answered (for tests). */
static int attr_memos = 1;
static unsigned long long attr_memo_hits;

/* cls.name for a class whose metatype looks attributes up as `type` does, memoized
 * while the class and its metatype keep their version tags, when the answer is what
 * the class's MRO holds, unchanged by a descriptor (a plain value, or a function,
 * which a class gives as itself) and not overridden by a data descriptor of the
 * metatype: then it depends on nothing else. */
static PyObject *
class_attr_memo(Instr *in, PyObject *base)
{
    Memo *m = &in->memo;
    PyTypeObject *cls = (PyTypeObject *)base, *meta = Py_TYPE(base);
    if (attr_memos && m->of_class && m->type == cls && m->type_version != 0 && type_version(cls) == m->type_version &&
        m->dict_version != 0 && type_version(meta) == m->dict_version) {
        attr_memo_hits++;
        return Py_NewRef(m->value);
    }
    PyObject *v = PyObject_GetAttr(base, in->a);
    if (!attr_memos) {
        m->of_class = 0;
        return v;
    }
    if (v == NULL || meta->tp_getattro != PyType_Type.tp_getattro) {
        return v;
    }
    m->of_class = 0;
    PyObject *raw = _PyType_Lookup(cls, in->a), *on_meta = _PyType_Lookup(meta, in->a);
    if (raw == v && (Py_TYPE(raw)->tp_descr_get == NULL || PyFunction_Check(raw)) &&
        (on_meta == NULL || Py_TYPE(on_meta)->tp_descr_set == NULL) &&
        type_version(cls) != 0 && type_version(meta) != 0) {
        m->of_class = 1;
        m->type = cls;
        m->type_version = type_version(cls);
        m->dict_version = type_version(meta);
        m->value = v;
    }
    return v;
}

/* regs[src].name, answered from the memo while the type and the instance dict are
 * unchanged; the memo is refilled when the value came from the instance dict. */
static PyObject *
cached_attr(Instr *in, PyObject *base)
{
    PyTypeObject *tp = Py_TYPE(base);
    Memo *m = &in->memo;
    if (in->n != FN_NONE && PyFunction_Check(base)) {
        /* (a function's own fields: the type cannot be subclassed or patched) */
        PyObject *r = in->n == FN_CODE ? PyFunction_GET_CODE(base) :
                      in->n == FN_DEFAULTS ? PyFunction_GET_DEFAULTS(base) : PyFunction_GET_KW_DEFAULTS(base);
        return Py_NewRef(r != NULL ? r : Py_None);
    }
    if (PyType_Check(base)) {
        return class_attr_memo(in, base);
    }
    if (attr_memos && !m->of_class && memo_holds(m, base)) {
        attr_memo_hits++;
        return Py_NewRef(m->value);
    }
    PyObject *v = PyObject_GetAttr(base, in->a);
    if (v == NULL) {
        return NULL;
    }
    m->type = NULL;
    m->of_class = 0;
    if (!attr_memos) {
        return v;
    }
    PyObject *d = generic_instance_dict(base);
    if (d != NULL) {
        PyObject *descr = _PyType_Lookup(tp, in->a);   /* (assigns the type a version) */
        unsigned int tv = type_version(tp);
        uint64_t dv = dict_version(d);
        /* (the dict lookup can run a colliding key's __eq__: nothing may change
         * meanwhile for the answer to be memoized) */
        if ((descr == NULL || Py_TYPE(descr)->tp_descr_set == NULL) && tv != 0 &&
            PyDict_GetItemWithError(d, in->a) == v && type_version(tp) == tv && dict_version(d) == dv) {
            m->type = tp;
            m->type_version = tv;
            m->dict_version = dv;
            m->value = v;
        }
        PyErr_Clear();      /* (a lookup error only leaves the memo empty) */
    }
    return v;
}

/* The getter of a plain class's `__dict__` (CPython's subtype_dict), read once from a
 * class made for the purpose: a class whose MRO gives `__dict__` through it answers
 * `object.__getattribute__(v, '__dict__')` with the instance's own dict. */
static getter plain_dict_getter;

/* object.__getattribute__(v, '__dict__'): while v's type keeps the version it had when
 * its `__dict__` was found to be the plain getter's, the dict at the instance's dict
 * pointer, with no attribute lookup. */
static PyObject *
instance_dict_load(Instr *in, PyObject *v)
{
    PyTypeObject *tp = Py_TYPE(v);
    Memo *m = &in->memo;
    if (m->type == tp && m->type_version != 0 && type_version(tp) == m->type_version) {
        PyObject **dp = _PyObject_GetDictPtr(v);
        if (dp != NULL && *dp != NULL) {
            return Py_NewRef(*dp);
        }
    }
    m->type = NULL;
    PyObject *r = PyObject_GenericGetAttr(v, s_dict);
    if (r == NULL || plain_dict_getter == NULL) {
        return r;
    }
    PyObject *descr = _PyType_Lookup(tp, s_dict);
    unsigned int tv = type_version(tp);
    PyObject **dp = _PyObject_GetDictPtr(v);
    if (tv != 0 && descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type) &&
        ((PyGetSetDescrObject *)descr)->d_getset->get == plain_dict_getter && dp != NULL && *dp == r) {
        m->type = tp;
        m->type_version = tv;
    }
    return r;
}

/* module_hasattr(v, in->a, in->b), answered from the memo while v's type and instance
 * dict keep their versions and, when the name is not in that dict, the module's
 * three tables keep theirs.  Memoized only for a name the type's MRO does not hold
 * (a descriptor could answer differently each time) and tables that are plain
 * dicts.  memo.value: Py_True or Py_False, the answer.  (A name found in the instance
 * dict records no tables: they do not change the answer.) */
static int
module_hasattr_memo(Instr *in, PyObject *v)
{
    PyTypeObject *tp = Py_TYPE(v);
    Memo *m = &in->memo;
    StoreMemo *st = in->stores;
    if (st != NULL && memo_holds(m, v)) {
        int same = 1;
        for (int i = 0; i < 3; i++) {
            same &= st->table[i] == NULL || dict_version(st->table[i]) == st->version[i];
        }
        if (same) {
            return m->value == Py_True;
        }
    }
    m->type = NULL;
    int ok = module_hasattr(v, in->a, in->b);
    PyObject *d;
    unsigned int tv = type_version(tp);
    if (ok < 0 || tv == 0 || _PyType_Lookup(tp, in->a) != NULL || (d = generic_instance_dict(v)) == NULL) {
        return ok;
    }
    if (st == NULL && (st = in->stores = PyMem_Calloc(1, sizeof(StoreMemo))) == NULL) {
        return ok;      /* (no memo; the answer stands) */
    }
    uint64_t dv = dict_version(d);
    PyObject *own = PyDict_GetItemWithError(d, in->a);
    memset(st, 0, sizeof(StoreMemo));
    for (int i = 0; i < 3 && own == NULL && !PyErr_Occurred(); i++) {
        PyObject *t = PyDict_GetItemWithError(d, s_stores[i]);
        if (t != NULL && (!PyDict_CheckExact(t) || dict_version(t) == 0)) {
            return ok;
        }
        st->table[i] = t;
        st->version[i] = t != NULL ? dict_version(t) : 0;
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return ok;
    }
    if (type_version(tp) == tv && dict_version(d) == dv) {
        m->type = tp;
        m->type_version = tv;
        m->dict_version = dv;
        m->value = ok ? Py_True : Py_False;
    }
    return ok;
}

/* v.__code__, v.__defaults__ and v.__kwdefaults__ are the objects in `expected` (a
 * function's fields read directly; anything else through getattr). */
static int
function_is(PyObject *v, PyObject *expected)
{
    if (PyFunction_Check(v)) {
        PyObject *d = PyFunction_GET_DEFAULTS(v), *kw = PyFunction_GET_KW_DEFAULTS(v);
        return PyFunction_GET_CODE(v) == PyTuple_GET_ITEM(expected, 0) &&
               (d != NULL ? d : Py_None) == PyTuple_GET_ITEM(expected, 1) &&
               (kw != NULL ? kw : Py_None) == PyTuple_GET_ITEM(expected, 2);
    }
    PyObject *names[3] = {s_code, s_defaults, s_kwdefaults};
    for (int i = 0; i < 3; i++) {
        PyObject *r = PyObject_GetAttr(v, names[i]);
        if (r == NULL) {
            return -1;
        }
        int ok = r == PyTuple_GET_ITEM(expected, i);
        Py_DECREF(r);
        if (!ok) {
            return 0;
        }
    }
    return 1;
}

/* A hook table whose truth is its size: a dict or an OrderedDict, not a subclass. */
static inline int
plain_table(PyObject *v)
{
    return Py_IS_TYPE(v, &PyDict_Type) || Py_IS_TYPE(v, &PyODict_Type);
}

/* not (v.<name> or ...) for the names in in->a (a module's hook tables).  While v's
 * type and instance dict keep their versions, and the type holds none of the names,
 * each v.<name> is the instance dict's value read last time (in->vals), and when that
 * is a plain table its truth is its size: no lookup at all. */
static int
no_hooks(Instr *in, PyObject *v)
{
    PyTypeObject *tp = Py_TYPE(v);
    Memo *m = &in->memo;
    Py_ssize_t n = PyTuple_GET_SIZE(in->a);
    if (memo_holds(m, v)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyDict_GET_SIZE(in->vals[i]) != 0) {
                return 0;
            }
        }
        return 1;
    }
    m->type = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyObject_GetAttr(v, PyTuple_GET_ITEM(in->a, i));
        if (r == NULL) {
            return -1;
        }
        int truth = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (truth != 0) {
            return truth < 0 ? -1 : 0;
        }
    }
    /* Memoize when every name is a plain table of the instance dict, unshadowed. */
    PyObject *d = generic_instance_dict(v);
    unsigned int tv = type_version(tp);
    if (d == NULL || tv == 0) {
        return 1;
    }
    uint64_t dv = dict_version(d);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(in->a, i);
        PyObject *val = _PyType_Lookup(tp, name) == NULL ? PyDict_GetItemWithError(d, name) : NULL;
        if (val == NULL || !plain_table(val)) {
            PyErr_Clear();
            return 1;
        }
        in->vals[i] = val;
    }
    if (type_version(tp) == tv && dict_version(d) == dv) {
        m->type = tp;
        m->type_version = tv;
        m->dict_version = dv;
    }
    return 1;
}

/* [*d.keys()] or [*d.values()] (`values` 0 or 1; `name` the method's name).  A dict
 * whose class takes the method from dict and has no instance dict to shadow it is
 * read with PyDict_Keys/Values (what the method's view iterates); anything else calls
 * the method, as Python would. */
static PyObject *
dict_view_list(PyObject *d, PyObject *name, int values)
{
    PyTypeObject *tp = Py_TYPE(d);
    if (PyDict_CheckExact(d) ||
        (PyDict_Check(d) && tp->tp_dictoffset == 0 &&
         _PyType_Lookup(tp, name) == _PyType_Lookup(&PyDict_Type, name))) {
        return values ? PyDict_Values(d) : PyDict_Keys(d);
    }
    PyObject *view = PyObject_CallMethodNoArgs(d, name);
    if (view == NULL) {
        return NULL;
    }
    PyObject *list = PySequence_List(view);
    Py_DECREF(view);
    return list;
}

/* t.untyped_storage().data_ptr() into *out: 1, or -1 with an exception (what Python
 * raises for a tensor without storage, or an object that is no tensor). */
static int
storage_ptr(PyObject *t, uintptr_t *out)
{
    if (cxx_reads != NULL) {
        int r = cxx_reads->storage_ptr(t, out);
        if (r != -2) {
            cxx_answers++;
            return r;
        }
    }
    PyObject *s = PyObject_CallMethodNoArgs(t, s_untyped_storage);
    if (s == NULL) {
        return -1;
    }
    PyObject *p = PyObject_CallMethodNoArgs(s, s_data_ptr);
    Py_DECREF(s);
    if (p == NULL) {
        return -1;
    }
    *out = (uintptr_t)PyLong_AsUnsignedLongLongMask(p);
    Py_DECREF(p);
    return PyErr_Occurred() ? -1 : 1;
}

static int
compare_uintptr(const void *x, const void *y)
{
    uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
    return (a > b) - (a < b);
}

static int
sorted_has(const uintptr_t *v, Py_ssize_t n, uintptr_t key)
{
    return bsearch(&key, v, (size_t)n, sizeof(uintptr_t), compare_uintptr) != NULL;
}

static int
sorted_unique(const uintptr_t *v, Py_ssize_t n)
{
    for (Py_ssize_t i = 1; i < n; i++) {
        if (v[i] == v[i - 1]) {
            return 0;
        }
    }
    return 1;
}

/* The addresses of the objects in `registers` (a tuple of register numbers) into
 * `ids`, sorted: whether they are distinct. */
static int
sorted_ids(PyObject *registers, PyObject **regs, uintptr_t *ids)
{
    Py_ssize_t n = PyTuple_GET_SIZE(registers);
    for (Py_ssize_t i = 0; i < n; i++) {
        ids[i] = (uintptr_t)regs[PyLong_AsSsize_t(PyTuple_GET_ITEM(registers, i))];
    }
    qsort(ids, (size_t)n, sizeof(uintptr_t), compare_uintptr);
    return sorted_unique(ids, n);
}

/* The objects in registers `a` are distinct (sorted: a step's hundreds of parameters). */
static int
distinct(Instr *in, PyObject **regs)
{
    uintptr_t *ids = PyMem_Malloc((size_t)(PyTuple_GET_SIZE(in->a) + 1) * sizeof(uintptr_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int ok = sorted_ids(in->a, regs, ids);
    PyMem_Free(ids);
    return ok;
}

/* The optimizer's no-alias guard (guards._unshared, in the same order of reads): the
 * written tensors are distinct objects, their non-empty storages are distinct, and no
 * other input is one of them or shares one of those storages.  Sorting makes it
 * n log n: an optimizer step writes hundreds of tensors. */
static int
unshared(Instr *in, PyObject **regs)
{
    Py_ssize_t nw = PyTuple_GET_SIZE(in->a), no = PyTuple_GET_SIZE(in->b), np = 0;
    uintptr_t *ids = PyMem_Malloc((size_t)(2 * nw + 1) * sizeof(uintptr_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uintptr_t *ptrs = ids + nw, p;
    int ok = 1;
    if (!sorted_ids(in->a, regs, ids)) {
        ok = 0;
        goto done;
    }
    for (Py_ssize_t i = 0; i < nw; i++) {
        if (storage_ptr(regs[PyLong_AsSsize_t(PyTuple_GET_ITEM(in->a, i))], &p) < 0) {
            ok = -1;
            goto done;
        }
        if (p != 0) {
            ptrs[np++] = p;
        }
    }
    qsort(ptrs, (size_t)np, sizeof(uintptr_t), compare_uintptr);
    if (!sorted_unique(ptrs, np)) {
        ok = 0;
        goto done;
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        PyObject *t = regs[PyLong_AsSsize_t(PyTuple_GET_ITEM(in->b, i))];
        if (sorted_has(ids, nw, (uintptr_t)t)) {
            ok = 0;
            goto done;
        }
        if (storage_ptr(t, &p) < 0) {
            ok = -1;
            goto done;
        }
        if (p != 0 && sorted_has(ptrs, np, p)) {
            ok = 0;
            goto done;
        }
    }
done:
    PyMem_Free(ids);
    return ok;
}

/* One check of regs[in->reg]: 1 holds, 0 does not, -1 exception. */
static int
run_check(Instr *in, PyObject **regs)
{
    PyObject *v = in->reg >= 0 ? regs[in->reg] : NULL;
    PyObject *r;
    int ok;
    Py_ssize_t n;
    uint64_t version;
    switch (in->op) {
    case OP_TYPE:
        return (PyObject *)Py_TYPE(v) == in->a;
    case OP_IS:
        return v == in->a;
    case OP_WEAK:
        return v != Py_None && weak_refers_to(in->a, v);
    case OP_EQ_ANY:
        return equals(v, in->a);
    case OP_EQ:
        if ((PyObject *)Py_TYPE(v) != in->b) {
            return 0;
        }
        return same_key(v, in->a);
    case OP_NOT_NONE:
        return v != Py_None;
    case OP_LEN:
        if ((PyObject *)Py_TYPE(v) != in->a) {
            return 0;
        }
        /* fall through */
    case OP_LEN_ANY:
        n = PyObject_Size(v);
        return n < 0 ? -1 : n == in->n;
    case OP_KEYS:
        return PyDict_CheckExact(v) ? dict_keys_equal(v, in->a) : 0;
    case OP_TUPLE_EQ:
        return tuple_same_keys(v, in->a);
    case OP_CONTAINS:
    case OP_NOT_CONTAINS:
        if (PyDict_CheckExact(v) && in->memo.dict_version == dict_version(v) && in->memo.dict_version != 0) {
            return 1;       /* the dict is as when this check last held */
        }
        version = PyDict_CheckExact(v) ? dict_version(v) : 0;
        ok = PySequence_Contains(v, in->a);
        if (ok >= 0 && in->op == OP_NOT_CONTAINS) {
            ok = !ok;
        }
        if (ok == 1 && version != 0 && dict_version(v) == version) {
            in->memo.dict_version = version;
        }
        return ok;
    case OP_FALSY:
        ok = PyObject_IsTrue(v);
        return ok < 0 ? -1 : !ok;
    case OP_HASATTR:
        if (PyType_Check(v) && Py_TYPE(v)->tp_getattro == PyType_Type.tp_getattro &&
            _PyType_Lookup(Py_TYPE(v), in->a) == NULL && _PyType_Lookup((PyTypeObject *)v, in->a) == NULL) {
            /* A class without the name in its MRO or its metaclass's: type's own
             * lookup finds nothing and runs no code (only the AttributeError it
             * would format is saved). */
            return in->n == 0;
        }
        ok = module_hasattr_memo(in, v);
        if (ok == -2) {
            ok = LOOKUP_ATTR(v, in->a, &r);
            Py_XDECREF(r);
        }
        return ok < 0 ? -1 : ok == (in->n != 0);
    case OP_TENSOR:
        return tensor_matches(v, in->t);
    case OP_IS_REG:
        return v == regs[in->src];
    case OP_IS_NOT_REG:
        return v != regs[in->src];
    case OP_FUNC:
        return function_is(v, in->a);
    case OP_NO_HOOKS:
        return no_hooks(in, v);
    case OP_UNSHARED:
        return unshared(in, regs);
    case OP_DISTINCT:
        return distinct(in, regs);
    case OP_CALL_IS:
    case OP_CALL_EQ:
        if ((r = PyObject_CallNoArgs(in->a)) == NULL) {
            return -1;
        }
        ok = in->op == OP_CALL_IS ? r == in->b : equals(r, in->b);
        Py_DECREF(r);
        return ok;
    }
    PyErr_SetString(PyExc_SystemError, "frametrace: bad guard instruction");
    return -1;
}

#define STACK_REGS 128

static int
run_program(GuardCheck *g, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != g->nargs) {
        PyErr_Format(PyExc_TypeError, "guard check takes %zd arguments (%zd given)", g->nargs, nargs);
        return -1;
    }
    PyObject *small[STACK_REGS];
    PyObject **regs = small;
    if (g->nregs > STACK_REGS && (regs = PyMem_Malloc(g->nregs * sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t filled = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < g->ninstr && ok == 1; i++) {
        Instr *in = &g->code[i];
        if (in->op > OP_LAST_LOAD) {
            ok = run_check(in, regs);
            continue;
        }
        PyObject *base = in->op >= OP_ATTR ? regs[in->src] : NULL, *v;
        switch (in->op) {
        case OP_ARG:
            v = Py_NewRef(args[in->n]);
            break;
        case OP_CONST:
            v = Py_NewRef(in->a);
            break;
        case OP_ATTR:
            v = cached_attr(in, base);
            break;
        case OP_ITEM:
            if (PyDict_CheckExact(base)) {
                uint64_t version = dict_version(base);
                if (in->memo.dict_version == version && version != 0) {
                    v = Py_NewRef(in->memo.value);
                    break;
                }
                v = PyDict_GetItemWithError(base, in->a);
                if (v != NULL && dict_version(base) == version) {
                    in->memo.dict_version = version;
                    in->memo.value = v;
                }
                if (v == NULL) {
                    ok = PyErr_Occurred() ? -1 : 0;     /* a KeyError: the guard fails */
                    continue;
                }
                Py_INCREF(v);
            }
            else {
                v = PyObject_GetItem(base, in->a);
            }
            break;
        case OP_ODICT:
            v = instance_dict_load(in, base);
            break;
        case OP_DVIEW:
            v = dict_view_list(base, in->a, (int)in->n);
            break;
        case OP_DGET:
            if (!PyDict_Check(base)) {
                ok = 0;         /* dict.get would raise TypeError: the guard fails */
                continue;
            }
            v = PyDict_GetItemWithError(base, in->a);
            if (v == NULL && PyErr_Occurred()) {
                break;
            }
            v = Py_NewRef(v != NULL ? v : Py_None);
            break;
        default: {  /* OP_IN */
            int found = PySequence_Contains(base, in->a);
            v = found < 0 ? NULL : Py_NewRef(found ? Py_True : Py_False);
        }
        }
        if (v == NULL) {
            ok = -1;
            continue;
        }
        regs[filled++] = v;
    }
    if (ok < 0) {
        ok = failed_with_error();
    }
    for (Py_ssize_t i = 0; i < filled; i++) {
        Py_DECREF(regs[i]);
    }
    if (regs != small) {
        PyMem_Free(regs);
    }
    return ok;
}

int
ft_guard_check(PyObject *check, PyObject *const *args, Py_ssize_t nargs)
{
    GuardCheck *g = (GuardCheck *)check;
    Py_INCREF(g);       /* a collection inside a guard may drop the entry holding us */
    int ok = run_program(g, args, nargs);
    if (ok == 1 && g->residual != Py_None) {
        PyObject *r = PyObject_Vectorcall(g->residual, args, nargs, NULL);
        ok = r == NULL ? -1 : r == Py_True;
        Py_XDECREF(r);
    }
    Py_DECREF(g);
    return ok;
}

static PyObject *
GuardCheck_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "guard check takes positional arguments only");
        return NULL;
    }
    int ok = ft_guard_check(self, args, PyVectorcall_NARGS(nargsf));
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* ---- dispatch on a cheap key ---- */

static Py_hash_t
mix(Py_hash_t h, Py_ssize_t v)
{
    return (Py_hash_t)(((Py_uhash_t)h ^ (Py_uhash_t)v) * (Py_uhash_t)1000003);
}

/* The key of a tensor: its dtype object and sizes; 0 when it cannot be read as
 * plain integers (the check decides). */
static int
tensor_key(PyObject *v, Py_hash_t *out)
{
    PyObject *dtype = PyObject_GetAttr(v, s_dtype);
    if (dtype == NULL) {
        return failed_with_error();
    }
    Py_hash_t h = mix(0x5bd1e995, (Py_ssize_t)dtype);
    Py_DECREF(dtype);
    PyObject *shape = PyObject_GetAttr(v, s_shape);
    if (shape == NULL) {
        return failed_with_error();
    }
    int ok = PyTuple_Check(shape);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(shape); i++) {
        PyObject *item = PyTuple_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(item)) {
            ok = 0;
            break;
        }
        Py_ssize_t d = PyLong_AsSsize_t(item);
        if (d == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        h = mix(h, d);
    }
    if (ok) {
        h = mix(h, PyTuple_GET_SIZE(shape));
    }
    Py_DECREF(shape);
    *out = h;
    return ok;
}

int
ft_guard_may_pass(PyObject *check, PyObject *const *args, Py_ssize_t nargs, FTDispatch *memo)
{
    GuardCheck *g = (GuardCheck *)check;
    if (g->disc_kind == DISC_NONE || g->disc_arg >= nargs) {
        return 1;
    }
    PyObject *v = args[g->disc_arg];
    if ((PyObject *)Py_TYPE(v) != g->disc_type) {
        return 0;       /* the entry's type check of this argument fails */
    }
    int i;
    for (i = 0; i < memo->used; i++) {
        if (memo->slot[i].arg == g->disc_arg && memo->slot[i].kind == g->disc_kind &&
            memo->slot[i].type == g->disc_type) {
            break;
        }
    }
    if (i == memo->used) {
        Py_hash_t h = 0;
        int known;
        if (g->disc_kind == DISC_TENSOR) {
            known = tensor_key(v, &h);
        }
        else {
            h = PyObject_Hash(v);       /* an exact int or str: no user code */
            known = h == -1 ? failed_with_error() : 1;
        }
        if (known < 0) {
            return -1;
        }
        if (memo->used == FT_DISPATCH_SLOTS) {
            return known ? h == g->disc_hash : 1;
        }
        memo->slot[i].arg = g->disc_arg;
        memo->slot[i].kind = g->disc_kind;
        memo->slot[i].type = g->disc_type;
        memo->slot[i].hash = h;
        memo->slot[i].known = known;
        memo->used++;
    }
    return memo->slot[i].known ? memo->slot[i].hash == g->disc_hash : 1;
}

/* ---- building ---- */

static void
free_code(GuardCheck *g)
{
    Instr *code = g->code;
    Py_ssize_t n = g->ninstr;
    g->code = NULL;
    g->ninstr = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(code[i].a);
        Py_XDECREF(code[i].b);
        PyMem_Free(code[i].vals);
        PyMem_Free(code[i].stores);
        TensorSpec *t = code[i].t;
        if (t != NULL) {
            code[i].t = NULL;
            Py_XDECREF(t->type);
            Py_XDECREF(t->dtype);
            Py_XDECREF(t->layout);
            Py_XDECREF(t->device);
            Py_XDECREF(t->sizes);
            Py_XDECREF(t->strides);
            Py_XDECREF(t->requires_grad);
            PyMem_Free(t->dims);
            PyMem_Free(t);
        }
    }
    PyMem_Free(code);
}

/* A bound of a symbolic dim's range: an int, or None for none. */
static int
bound(PyObject *b, Py_ssize_t none, Py_ssize_t *out)
{
    *out = b == Py_None ? none : PyLong_AsSsize_t(b);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Each item of `seq` into [lo[i], hi[i]]: an int (static), None (symbolic, checked
 * by the Python shape guards) or (lower or None, upper or None), a symbol's range. */
static int
int_tuple(PyObject *seq, Py_ssize_t n, Py_ssize_t *lo, Py_ssize_t *hi, int *ranged)
{
    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_ValueError, "tensor guard: sizes and strides must be tuples of one length");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (item == Py_None) {
            lo[i] = PY_SSIZE_T_MIN;
            hi[i] = PY_SSIZE_T_MAX;
            *ranged = 1;
        }
        else if (PyTuple_Check(item)) {
            if (PyTuple_GET_SIZE(item) != 2) {
                PyErr_SetString(PyExc_ValueError, "tensor guard: a range is (lower, upper)");
                return -1;
            }
            if (bound(PyTuple_GET_ITEM(item, 0), PY_SSIZE_T_MIN, &lo[i]) < 0 ||
                bound(PyTuple_GET_ITEM(item, 1), PY_SSIZE_T_MAX, &hi[i]) < 0) {
                return -1;
            }
            *ranged = 1;
        }
        else {
            lo[i] = hi[i] = PyLong_AsSsize_t(item);
            if (lo[i] == -1 && PyErr_Occurred()) {
                return -1;
            }
        }
    }
    return 0;
}

/* (type, dtype, device, sizes, strides, requires_grad, conj or None, neg, layout) */
static TensorSpec *
tensor_spec(PyObject *spec)
{
    PyObject *type, *dtype, *device, *sizes, *strides, *rg, *conj, *neg, *layout;
    if (!PyArg_ParseTuple(spec, "O!OOO!O!O!OO!O:tensor guard", &PyType_Type, &type, &dtype, &device,
                          &PyTuple_Type, &sizes, &PyTuple_Type, &strides, &PyBool_Type, &rg,
                          &conj, &PyBool_Type, &neg, &layout)) {
        return NULL;
    }
    TensorSpec *t = PyMem_Calloc(1, sizeof(TensorSpec));
    if (t == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    t->ndim = PyTuple_GET_SIZE(sizes);
    t->dims = PyMem_Calloc(4 * t->ndim + 1, sizeof(Py_ssize_t));
    t->type = Py_NewRef(type);
    t->dtype = Py_NewRef(dtype);
    t->layout = Py_NewRef(layout);
    t->device = Py_NewRef(device);
    t->sizes = Py_NewRef(sizes);
    t->strides = Py_NewRef(strides);
    t->requires_grad = Py_NewRef(rg);
    t->conj = conj == Py_None ? -1 : conj == Py_True;
    t->neg = neg == Py_True;
    Py_ssize_t n = t->ndim;
    if (t->dims == NULL || int_tuple(sizes, n, t->dims, t->dims + 2 * n, &t->ranged) < 0 ||
        int_tuple(strides, n, t->dims + n, t->dims + 3 * n, &t->ranged) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        Py_DECREF(t->type);
        Py_DECREF(t->dtype);
        Py_DECREF(t->layout);
        Py_DECREF(t->device);
        Py_DECREF(t->sizes);
        Py_DECREF(t->strides);
        Py_DECREF(t->requires_grad);
        PyMem_Free(t->dims);
        PyMem_Free(t);
        return NULL;
    }
    return t;
}

/* program: a sequence of (op, reg, src, n, a, b); loads must fill registers 0, 1, ...
 * in order and every register read must be loaded before. */
static int
build(GuardCheck *g, PyObject *program)
{
    PyObject *seq = PySequence_Fast(program, "guard program must be a sequence");
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    g->code = PyMem_Calloc(n > 0 ? n : 1, sizeof(Instr));
    if (g->code == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t nregs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Instr *in = &g->code[i];
        PyObject *a, *b;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiinOO:guard instruction",
                              &in->op, &in->reg, &in->src, &in->n, &a, &b)) {
            goto error;
        }
        g->ninstr = i + 1;
        if (in->op == OP_TENSOR) {
            if ((in->t = tensor_spec(a)) == NULL) {
                goto error;
            }
        }
        else {
            in->a = Py_NewRef(a);
            in->b = Py_NewRef(b);
        }
        int bad = in->op < 0 || in->op >= OP_COUNT;
        if (in->op <= OP_LAST_LOAD) {
            bad |= in->reg != nregs++;
            bad |= in->op == OP_ARG && (in->n < 0 || in->n >= g->nargs);
            bad |= in->op >= OP_ATTR && (in->src < 0 || in->src >= in->reg);
            bad |= in->op == OP_ATTR && !PyUnicode_Check(a);
            if (!bad && in->op == OP_ATTR) {
                in->n = function_field(a);
            }
            if (!bad && in->op == OP_DVIEW) {
                int keys = PyUnicode_Check(a) && PyUnicode_CompareWithASCIIString(a, "keys") == 0;
                int values = PyUnicode_Check(a) && PyUnicode_CompareWithASCIIString(a, "values") == 0;
                bad |= !(keys || values);
                in->n = values;
            }
        }
        else if (in->op == OP_UNSHARED || in->op == OP_DISTINCT) {
            int sides = in->op == OP_UNSHARED ? 2 : 1;     /* (DISTINCT: b unused) */
            bad |= !PyTuple_Check(a) || (sides == 2 && !PyTuple_Check(b));
            for (int side = 0; !bad && side < sides; side++) {
                PyObject *t = side ? b : a;
                for (Py_ssize_t k = 0; !bad && k < PyTuple_GET_SIZE(t); k++) {
                    PyObject *r = PyTuple_GET_ITEM(t, k);
                    Py_ssize_t index = PyLong_Check(r) ? PyLong_AsSsize_t(r) : -1;
                    if (index == -1 && PyErr_Occurred()) {
                        PyErr_Clear();
                    }
                    bad |= index < 0 || index >= nregs;
                }
            }
        }
        else if (in->op != OP_CALL_IS && in->op != OP_CALL_EQ) {
            bad |= in->reg < 0 || in->reg >= nregs;
            bad |= (in->op == OP_IS_REG || in->op == OP_IS_NOT_REG) && (in->src < 0 || in->src >= nregs);
            bad |= (in->op == OP_TYPE || in->op == OP_LEN) && !PyType_Check(a);
            bad |= in->op == OP_EQ && !PyType_Check(b);
            bad |= in->op == OP_WEAK && !PyWeakref_CheckRef(a);
            bad |= (in->op == OP_KEYS || in->op == OP_TUPLE_EQ) && !PyTuple_CheckExact(a);
            bad |= in->op == OP_HASATTR && !PyUnicode_Check(a);
            bad |= in->op == OP_FUNC && !(PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 3);
            if (!bad && in->op == OP_NO_HOOKS) {
                bad |= !PyTuple_Check(a) || PyTuple_GET_SIZE(a) == 0;
                for (Py_ssize_t k = 0; !bad && k < PyTuple_GET_SIZE(a); k++) {
                    bad |= !PyUnicode_Check(PyTuple_GET_ITEM(a, k));
                }
                if (!bad && (in->vals = PyMem_Calloc(PyTuple_GET_SIZE(a), sizeof(PyObject *))) == NULL) {
                    PyErr_NoMemory();
                    goto error;
                }
            }
        }
        if (bad) {
            PyErr_Format(PyExc_ValueError, "bad guard instruction %zd", i);
            goto error;
        }
    }
    g->nregs = nregs;
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    free_code(g);
    return -1;
}

static PyObject *
GuardCheck_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"nargs", "program", "residual", "dispatch", NULL};
    Py_ssize_t nargs;
    PyObject *program, *residual = Py_None, *dispatch = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO|OO:GuardCheck", kwlist, &nargs, &program,
                                     &residual, &dispatch)) {
        return NULL;
    }
    if (residual != Py_None && !PyCallable_Check(residual)) {
        PyErr_SetString(PyExc_TypeError, "residual must be callable or None");
        return NULL;
    }
    GuardCheck *g = (GuardCheck *)type->tp_alloc(type, 0);
    if (g == NULL) {
        return NULL;
    }
    g->nargs = nargs;
    g->residual = Py_NewRef(residual);
    g->program = Py_NewRef(program);
    g->vectorcall = GuardCheck_vectorcall;
    g->disc_type = Py_NewRef(Py_None);
    if (build(g, program) < 0) {
        Py_DECREF(g);
        return NULL;
    }
    /* dispatch: None, or (arg index, "tensor", type, dtype, sizes) or
     * (arg index, "value", type, value): a guard of the program on that argument. */
    if (dispatch != Py_None) {
        Py_ssize_t arg;
        const char *kind;
        PyObject *t, *x, *sizes = NULL;
        if (!PyArg_ParseTuple(dispatch, "nsO!O|O!:dispatch", &arg, &kind, &PyType_Type, &t, &x,
                              &PyTuple_Type, &sizes)) {
            Py_DECREF(g);
            return NULL;
        }
        Py_hash_t h = 0;
        if (strcmp(kind, "tensor") == 0 && sizes != NULL) {
            h = mix(0x5bd1e995, (Py_ssize_t)x);
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); i++) {
                Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes, i));
                if (d == -1 && PyErr_Occurred()) {
                    Py_DECREF(g);
                    return NULL;
                }
                h = mix(h, d);
            }
            h = mix(h, PyTuple_GET_SIZE(sizes));
            g->disc_kind = DISC_TENSOR;
        }
        else if (strcmp(kind, "value") == 0 && (PyLong_CheckExact(x) || PyUnicode_CheckExact(x))) {
            h = PyObject_Hash(x);
            g->disc_kind = DISC_VALUE;
        }
        else {
            PyErr_SetString(PyExc_ValueError, "bad dispatch key");
            Py_DECREF(g);
            return NULL;
        }
        if (arg < 0 || arg >= nargs) {
            PyErr_SetString(PyExc_ValueError, "dispatch argument out of range");
            Py_DECREF(g);
            return NULL;
        }
        g->disc_arg = arg;
        Py_SETREF(g->disc_type, Py_NewRef(t));
        g->disc_hash = h;
    }
    return (PyObject *)g;
}

static int
GuardCheck_traverse(GuardCheck *g, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < g->ninstr; i++) {
        Py_VISIT(g->code[i].a);
        Py_VISIT(g->code[i].b);
        if (g->code[i].t != NULL) {
            Py_VISIT(g->code[i].t->type);
            Py_VISIT(g->code[i].t->device);
        }
    }
    Py_VISIT(g->residual);
    Py_VISIT(g->program);
    Py_VISIT(g->disc_type);
    Py_VISIT(g->dict);
    return 0;
}

static int
GuardCheck_clear(GuardCheck *g)
{
    free_code(g);
    Py_CLEAR(g->residual);
    Py_CLEAR(g->program);
    Py_CLEAR(g->disc_type);
    Py_CLEAR(g->dict);
    return 0;
}

static void
GuardCheck_dealloc(GuardCheck *g)
{
    PyObject_GC_UnTrack(g);
    if (g->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)g);
    }
    GuardCheck_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyObject *
GuardCheck_get_program(GuardCheck *g, void *c)
{
    return Py_NewRef(g->program != NULL ? g->program : Py_None);
}

static PyObject *
GuardCheck_get_residual(GuardCheck *g, void *c)
{
    return Py_NewRef(g->residual != NULL ? g->residual : Py_None);
}

static PyGetSetDef GuardCheck_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {"program", (getter)GuardCheck_get_program, NULL, "the instructions, as built", NULL},
    {"residual", (getter)GuardCheck_get_residual, NULL, "Python check of the other guards", NULL},
    {NULL},
};

PyTypeObject FTGuardCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "frametrace._C.GuardCheck",
    .tp_basicsize = sizeof(GuardCheck),
    .tp_dealloc = (destructor)GuardCheck_dealloc,
    .tp_vectorcall_offset = offsetof(GuardCheck, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_BASETYPE,
    .tp_doc = "GuardCheck(nargs, program, residual=None, dispatch=None): an entry's guards, "
              "run in C; called with the argument slots and the function, returns a bool.",
    .tp_traverse = (traverseproc)GuardCheck_traverse,
    .tp_clear = (inquiry)GuardCheck_clear,
    .tp_getset = GuardCheck_getset,
    .tp_dictoffset = offsetof(GuardCheck, dict),
    .tp_weaklistoffset = offsetof(GuardCheck, weakrefs),
    .tp_new = GuardCheck_new,
};

/* set_tensor_reads(capsule or None) -> bool: whether C++ reads were on before. */
static PyObject *
py_set_tensor_reads(PyObject *self, PyObject *arg)
{
    int was = cxx_reads != NULL;
    if (arg == Py_None) {
        cxx_reads = NULL;
    }
    else {
        const FtTensorReads *api = PyCapsule_GetPointer(arg, FT_TENSOR_READS_CAPSULE);
        if (api == NULL) {
            return NULL;
        }
        if (api->abi != FT_TENSOR_READS_ABI) {
            PyErr_Format(PyExc_ImportError, "tensor reads: ABI %d, expected %d", api->abi,
                         FT_TENSOR_READS_ABI);
            return NULL;
        }
        cxx_reads = api;
    }
    return PyBool_FromLong(was);
}

/* set_attr_memos(bool) -> bool: ATTR loads memoized on version tags from now on (False:
 * each one a getattr, and the memos made before are dropped); whether they were. */
static PyObject *
py_set_attr_memos(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    int was = attr_memos;
    attr_memos = on;
    return PyBool_FromLong(was);
}

static PyObject *
py_attr_memo_hits(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(attr_memo_hits);
}

static PyObject *
py_tensor_reads_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(cxx_answers);
}

/* The Python checks (and first_failure) compare keys and values as the C program does. */
static PyObject *
py_same_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "same_key(value, traced) takes 2 arguments");
        return NULL;
    }
    int ok = same_key(args[0], args[1]);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyObject *
py_same_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "same_keys(iterable, traced tuple) takes 2 arguments");
        return NULL;
    }
    int ok = tuple_same_keys(args[0], args[1]);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyMethodDef guard_functions[] = {
    {"same_key", (PyCFunction)(void (*)(void))py_same_key, METH_FASTCALL,
     "same_key(value, traced) -> bool: the same type and, as a program sees it, the same value "
     "(1, True and 1.0 differ; so do 0.0 and -0.0; tuples item by item)"},
    {"same_keys", (PyCFunction)(void (*)(void))py_same_keys, METH_FASTCALL,
     "same_keys(iterable, traced) -> bool: tuple(iterable) matches the tuple traced, item by item by same_key"},
    {"set_attr_memos", py_set_attr_memos, METH_O,
     "set_attr_memos(bool) -> bool: memoize attribute loads on version tags (False: each one a "
     "getattr); whether they were memoized"},
    {"attr_memo_hits", py_attr_memo_hits, METH_NOARGS,
     "how many attribute loads a version-tag memo has answered"},
    {"tensor_reads_count", py_tensor_reads_count, METH_NOARGS,
     "how many tensor checks the C++ reads have answered"},
    {"set_tensor_reads", py_set_tensor_reads, METH_O,
     "set_tensor_reads(capsule or None) -> bool: read tensor guards through frametrace._tensor_reads "
     "(None: through Python's getters); whether they were on"},
    {NULL, NULL, 0, NULL},
};

int
ft_guards_init(PyObject *m)
{
    if (PyModule_AddFunctions(m, guard_functions) < 0) {
        return -1;
    }
    if (PyType_Ready(&FTGuardCheckType) < 0) {
        return -1;
    }
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
    INTERN(s_layout, "layout");
    INTERN(s_dtype, "dtype");
    INTERN(s_device, "device");
    INTERN(s_shape, "shape");
    INTERN(s_stride, "stride");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_is_conj, "is_conj");
    INTERN(s_is_neg, "is_neg");
    INTERN(s_getattr, "__getattr__");
    INTERN(s_getattribute, "__getattribute__");
    INTERN(s_dict, "__dict__");
    INTERN(s_code, "__code__");
    INTERN(s_defaults, "__defaults__");
    INTERN(s_kwdefaults, "__kwdefaults__");
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_stores[0], "_parameters");
    INTERN(s_stores[1], "_buffers");
    INTERN(s_stores[2], "_modules");
    PyObject *probe = PyObject_CallFunction((PyObject *)&PyType_Type, "s()N", "_frametrace_probe", PyDict_New());
    if (probe == NULL) {
        return -1;
    }
    PyObject *descr = _PyType_Lookup((PyTypeObject *)probe, s_dict);
    if (descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        plain_dict_getter = ((PyGetSetDescrObject *)descr)->d_getset->get;
    }
    Py_DECREF(probe);
    object_getattribute = _PyType_Lookup(&PyBaseObject_Type, s_getattribute);
    if (object_getattribute == NULL) {
        return -1;
    }
    Py_INCREF(object_getattribute);
#undef INTERN
    static const char *names[] = {
        "ARG", "CONST", "ATTR", "ITEM", "ODICT", "DGET", "IN", "DVIEW", "TYPE", "IS", "WEAK", "EQ_ANY", "EQ", "NOT_NONE",
        "LEN", "LEN_ANY", "KEYS", "TUPLE_EQ", "CONTAINS", "NOT_CONTAINS", "FALSY", "HASATTR",
        "TENSOR", "IS_REG", "IS_NOT_REG", "CALL_IS", "CALL_EQ", "FUNC", "NO_HOOKS", "UNSHARED", "DISTINCT"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == OP_COUNT, "one name per op");
    PyObject *ops = PyDict_New();
    if (ops == NULL) {
        return -1;
    }
    for (int i = 0; i < OP_COUNT; i++) {
        PyObject *v = PyLong_FromLong(i);
        if (v == NULL || PyDict_SetItemString(ops, names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(ops);
            return -1;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, "GUARD_OPS", ops) < 0) {
        Py_DECREF(ops);
        return -1;
    }
    return PyModule_AddObjectRef(m, "GuardCheck", (PyObject *)&FTGuardCheckType);
}
