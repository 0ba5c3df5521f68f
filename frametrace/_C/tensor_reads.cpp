// The tensor guard's reads straight from torch's C++ tensor.
//
// The C guard evaluator reads a tensor the way Python does: `t.dtype`, `t.device`,
// `t.shape`, `t.stride()`, ...  Each of those builds a Python object (a torch.device,
// a torch.Size of ints, a tuple) only to compare it and throw it away: about 0.35 us a
// tensor, most of a whole model's guard check.  Here the same accessors that those
// getters call (TensorImpl's sym_sizes(), sym_strides(), device(), ...) are called
// directly and compared with the traced values as C integers, so the answer is the
// getters' answer by construction, without allocating.
//
// Only exact torch.Tensor and nn.Parameter objects are read here, with no torch
// function mode on (then the Python getters run no Python code either); a
// Python-dispatch tensor, a symbolic size or anything that throws is answered -2,
// "read it in Python".  The module records the torch version its headers came from;
// guards.py uses it only under that same torch.
#include <Python.h>

#include <c10/core/impl/COW.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/autograd/python_variable.h>

#include "plain_tensor.h"

extern "C" {
#include "tensor_reads.h"
}

namespace {

int encode(PyObject* dtype, PyObject* layout, PyObject* device, FtTensorCodes* out) {
  if (!THPDtype_Check(dtype) || !THPLayout_Check(layout) || !THPDevice_Check(device)) {
    return 0;
  }
  // A non-strided guard (sparse, mkldnn) keeps the Python reads: its stride() is
  // not the strided tensor's.
  if (reinterpret_cast<THPLayout*>(layout)->layout != at::kStrided) {
    return 0;
  }
  const c10::Device& d = reinterpret_cast<THPDevice*>(device)->device;
  out->scalar_type = static_cast<int8_t>(reinterpret_cast<THPDtype*>(dtype)->scalar_type);
  out->device_type = static_cast<int8_t>(d.type());
  out->device_index = static_cast<int16_t>(d.index());
  return 1;
}

// Each of ints within [lo[i], hi[i]] (lo == hi: a static size), or -2 when one of
// them is symbolic.
int same_ints(c10::SymIntArrayRef ints, const Py_ssize_t* lo, const Py_ssize_t* hi) {
  for (size_t i = 0; i < ints.size(); i++) {
    auto v = ints[i].maybe_as_int();
    if (!v.has_value()) {
      return -2;
    }
    if (*v < static_cast<int64_t>(lo[i]) || *v > static_cast<int64_t>(hi[i])) {
      return 0;
    }
  }
  return 1;
}

using frametrace::plain_impl;

int check(PyObject* v, const FtTensorCodes* codes, const Py_ssize_t* lo, const Py_ssize_t* hi,
          Py_ssize_t ndim, int requires_grad, int conj, int neg) {
  try {
    c10::TensorImpl* impl = plain_impl(v);
    if (impl == nullptr) {
      return -2;
    }
    // The order of the Python check: dtype, layout, device, sizes, strides,
    // requires_grad, conj, neg.  The first difference answers 0.
    if (static_cast<int8_t>(c10::typeMetaToScalarType(impl->dtype())) != codes->scalar_type ||
        impl->layout() != at::kStrided) {
      return 0;
    }
    c10::Device d = impl->device();
    if (static_cast<int8_t>(d.type()) != codes->device_type ||
        static_cast<int16_t>(d.index()) != codes->device_index) {
      return 0;
    }
    c10::SymIntArrayRef sizes = impl->sym_sizes();
    if (static_cast<Py_ssize_t>(sizes.size()) != ndim) {
      return 0;
    }
    int ok = same_ints(sizes, lo, hi);
    if (ok != 1) {
      return ok;
    }
    if ((ok = same_ints(impl->sym_strides(), lo + ndim, hi + ndim)) != 1) {
      return ok;
    }
    if (impl->requires_grad() != static_cast<bool>(requires_grad) ||
        (conj >= 0 && impl->is_conj() != static_cast<bool>(conj))) {
      return 0;
    }
    return impl->is_neg() == static_cast<bool>(neg);
  } catch (...) {
    return -2;
  }
}

int storage_ptr(PyObject* v, uintptr_t* out) {
  try {
    c10::TensorImpl* impl = plain_impl(v);
    if (impl == nullptr || !impl->has_storage()) {
      return -2;
    }
    const c10::Storage& storage = impl->unsafe_storage();
    if (c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
      return -2;
    }
    *out = reinterpret_cast<uintptr_t>(storage.data());
    return 1;
  } catch (...) {
    return -2;
  }
}

const FtTensorReads api = {FT_TENSOR_READS_ABI, encode, check, storage_ptr};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "frametrace._tensor_reads",
    "The tensor guard's reads on torch's C++ tensor (see tensor_reads.cpp).", -1, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__tensor_reads(void) {
  PyObject* m = frametrace::versioned_module(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(const_cast<FtTensorReads*>(&api), FT_TENSOR_READS_CAPSULE, nullptr);
  if (capsule == nullptr || PyModule_AddObject(m, "api", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
