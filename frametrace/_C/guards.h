/* The guard evaluator (guards.c), as the frame hook (evalframe.c) uses it. */
#ifndef FRAMETRACE_GUARDS_H
#define FRAMETRACE_GUARDS_H
#include <Python.h>

extern PyTypeObject FTGuardCheckType;

/* 1: the entry applies, 0: it does not, -1: an exception that is not an Exception
 * (KeyboardInterrupt ...) is set.  `args` are the frame's argument slots then the
 * running function, as a Python check receives them. */
int ft_guard_check(PyObject *check, PyObject *const *args, Py_ssize_t nargs);

/* Per-lookup memo of the call's discriminating keys (see ft_guard_may_pass). */
#define FT_DISPATCH_SLOTS 4
typedef struct {
    int used;
    struct {
        Py_ssize_t arg;
        int kind;
        PyObject *type;
        Py_hash_t hash;
        int known;          /* 0: no key (the check decides), 1: hash valid */
    } slot[FT_DISPATCH_SLOTS];
} FTDispatch;

/* 0 when the check certainly fails for these arguments (a cheap discriminating key of
 * one argument, its dtype and shape or its value, differs from the entry's), else 1:
 * many entries of one function cost a hash compare each, not a guard walk. */
int ft_guard_may_pass(PyObject *check, PyObject *const *args, Py_ssize_t nargs, FTDispatch *memo);

int ft_guards_init(PyObject *module);

#endif
