// The C++ modules' common parts (tensor_reads.cpp, views.cpp, launch_keys.cpp): a Python
// object whose tensor can be read, or viewed, in C++ exactly as Python would see it; the
// module's creation.
#ifndef FRAMETRACE_PLAIN_TENSOR_H
#define FRAMETRACE_PLAIN_TENSOR_H
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/autograd/python_variable.h>

namespace frametrace {

// v's TensorImpl, when v's Python reads run no Python code (an exact torch.Tensor or
// Parameter, no torch function mode, no Python dispatch key), else nullptr.
inline c10::TensorImpl* plain_impl(PyObject* v) {
  if (!THPVariable_CheckTypeExact(Py_TYPE(v)) || at::impl::torch_function_mode_enabled()) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(v);
  if (!t.defined()) {
    return nullptr;
  }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->key_set().has(c10::DispatchKey::Python) ? nullptr : impl;
}

// A C++ module with its TORCH_VERSION (the torch whose headers it was built against:
// cxx_modules.load uses it only under that torch), or nullptr with the error set.
inline PyObject* versioned_module(PyModuleDef* def) {
  PyObject* m = PyModule_Create(def);
  if (m != nullptr && PyModule_AddStringConstant(m, "TORCH_VERSION", FT_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

}  // namespace frametrace

#endif
