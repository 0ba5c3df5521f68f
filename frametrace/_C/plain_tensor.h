// The C++ modules' common test (tensor_reads.cpp, views.cpp): a Python object whose
// tensor can be read, or viewed, in C++ exactly as Python would see it.
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

}  // namespace frametrace

#endif
