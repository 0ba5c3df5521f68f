// What Triton specializes a kernel launch on, read in C++ (static_launch.launch_key).
//
// A launcher of the triton backend keeps the kernel Triton compiled for each
// specialization of its arguments (each tensor's dtype and 16-byte alignment, each
// int's being 1, a multiple of 16 and its width) and launches it again when a later
// launch has the same one.  Computing that key in Python cost ~3 us a launch for nine
// arguments, on graphs whose sizes the data decides (a mixture of experts: 66 launches
// a call, each through that path, the call bound by the host).  Here the same facts
// are read from torch's C++ tensor and packed two bytes an argument into a `bytes`
// object: equal bytes exactly when the Python key's argument entries are equal, since
// every fact is encoded without loss (dtype by its ScalarType number).
//
// A tensor whose Python reads could run Python code (a subclass, a torch function mode,
// the Python dispatch key) is answered NotImplemented, "compute it in Python"; a
// non-CUDA tensor or an argument of another kind, None, as the Python key does.
#include <Python.h>

#include <cstdint>
#include <string>

#include "plain_tensor.h"

namespace {

enum Tag : char { kTensor = 1, kInt = 2, kFloat = 3, kBool = 4, kNone = 5 };

// an int argument's facts: being 1, a multiple of 16, its width (int32, int64, wider)
int int_code(PyObject* a) {
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
  if (v == -1 && PyErr_Occurred()) {
    return -1;
  }
  if (overflow == 0) {
    int width = (v >= INT32_MIN && v <= INT32_MAX) ? 0 : 1;
    return (v == 1) | ((v & 15) == 0) << 1 | width << 2;
  }
  // (beyond int64: its low bits in Python, as the Python key reads them)
  PyObject* fifteen = PyLong_FromLong(15);
  PyObject* low = fifteen == nullptr ? nullptr : PyNumber_And(a, fifteen);
  Py_XDECREF(fifteen);
  if (low == nullptr) {
    return -1;
  }
  long bits = PyLong_AsLong(low);
  Py_DECREF(low);
  if (bits == -1 && PyErr_Occurred()) {
    return -1;
  }
  return (bits == 0) << 1 | 2 << 2;
}

PyObject* codes(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  PyObject* args = argc >= 1 ? argv[0] : nullptr;
  if (argc < 1 || argc > 2 || (!PyTuple_Check(args) && !PyList_Check(args))) {
    PyErr_SetString(PyExc_TypeError, "codes(args, cpu=False): args a tuple or a list");
    return nullptr;
  }
  int cpu_too = argc == 2 ? PyObject_IsTrue(argv[1]) : 0;
  if (cpu_too < 0) {
    return nullptr;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(args);
  PyObject** items = PySequence_Fast_ITEMS(args);
  std::string out;
  out.reserve(2 * n);
  bool cuda = false;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = items[i];
    if (PyLong_CheckExact(a)) {
      int code = int_code(a);
      if (code < 0) {
        return nullptr;
      }
      out.push_back(kInt);
      out.push_back(static_cast<char>(code));
    } else if (THPVariable_Check(a)) {
      c10::TensorImpl* impl = frametrace::plain_impl(a);
      if (impl == nullptr) {
        Py_RETURN_NOTIMPLEMENTED;
      }
      try {
        auto device = impl->device_type();
        if (device != c10::DeviceType::CUDA && !(cpu_too && device == c10::DeviceType::CPU)) {
          Py_RETURN_NONE;
        }
        cuda = true;
        auto ptr = reinterpret_cast<uintptr_t>(THPVariable_Unpack(a).const_data_ptr());
        int dtype = static_cast<int>(impl->dtype().toScalarType());
        if (dtype < 0 || dtype > 127) {
          Py_RETURN_NOTIMPLEMENTED;   // (it and the alignment bit would not fit a byte)
        }
        out.push_back(kTensor);
        out.push_back(static_cast<char>(dtype << 1 | ((ptr & 15) == 0)));
      } catch (...) {
        Py_RETURN_NOTIMPLEMENTED;
      }
    } else if (PyFloat_CheckExact(a)) {
      out.push_back(kFloat);
      out.push_back(0);
    } else if (PyBool_Check(a)) {
      out.push_back(kBool);
      out.push_back(0);
    } else if (a == Py_None) {
      out.push_back(kNone);
      out.push_back(0);
    } else {
      Py_RETURN_NONE;
    }
  }
  if (!cuda) {
    Py_RETURN_NONE;
  }
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

PyMethodDef methods[] = {
    {"codes", reinterpret_cast<PyCFunction>(codes), METH_FASTCALL,
     "codes(args, cpu=False): bytes naming what Triton specializes a launch of args on "
     "(two an argument); None where torch's launcher would not run it (no CUDA tensor, a "
     "CPU tensor, an argument of another kind); NotImplemented where a tensor's reads may "
     "run Python code (read it in Python).  cpu: CPU tensors count as CUDA ones (tests)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "frametrace._launch_keys",
    "Launch specialization keys read in C++ (see launch_keys.cpp).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__launch_keys(void) { return frametrace::versioned_module(&module_def); }
