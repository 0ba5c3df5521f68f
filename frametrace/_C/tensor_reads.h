/* The tensor guard's reads done on torch's C++ tensor (tensor_reads.cpp), as the C
 * guard evaluator (guards.c) calls them.  Plain C on both sides: guards.c never sees
 * a torch header, and the C++ module is optional (built only where torch's headers
 * and a C++ compiler are found at install time). */
#ifndef FRAMETRACE_TENSOR_READS_H
#define FRAMETRACE_TENSOR_READS_H
#include <Python.h>
#include <stdint.h>

#define FT_TENSOR_READS_ABI 3
#define FT_TENSOR_READS_CAPSULE "frametrace._tensor_reads.api"

/* A traced tensor's dtype, layout and device as torch's C++ enums. */
typedef struct {
    int8_t scalar_type;
    int8_t device_type;
    int16_t device_index;
} FtTensorCodes;

typedef struct {
    int abi;
    /* Fills `out` from a guard's torch.dtype, torch.layout and torch.device: 1, or 0
     * when these cannot be read in C++ (then the check never takes the fast path). */
    int (*encode)(PyObject *dtype, PyObject *layout, PyObject *device, FtTensorCodes *out);
    /* 1: `v` matches (same dtype, strided layout, device, sizes and strides each
     * within [lo[i], hi[i]] (sizes then strides, 2 * ndim of each), requires_grad,
     * conj and neg bits), 0: it does not, -2: it cannot be told here
     * (not an exact torch.Tensor or Parameter, a torch function mode is on, symbolic
     * or custom sizes...): the Python-level reads decide.  Never sets an exception.
     * conj: -1 to skip that bit. */
    int (*check)(PyObject *v, const FtTensorCodes *codes, const Py_ssize_t *lo, const Py_ssize_t *hi,
                 Py_ssize_t ndim,
                 int requires_grad, int conj, int neg);
    /* `v.untyped_storage().data_ptr()` into *out: 1, or -2 when it cannot be told here
     * (the same cases as `check`, a tensor without storage, a copy-on-write storage,
     * whose Python read would materialize it): Python reads it.  Never sets an exception. */
    int (*storage_ptr)(PyObject *v, uintptr_t *out);
} FtTensorReads;

#endif
