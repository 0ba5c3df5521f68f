// A chain of view ops run as one as_strided (the eager backend's graph runner).
//
// At batch 1 a model's graph is about a third view ops, and each is a whole dispatch:
// `addmm(...).view(1, 1, 192).split(64, 2)[1].view(1, 1, -1, 16).transpose(1, 2)` is four
// of them per attention head.  What such a chain gives is a function of its root's
// geometry alone (sizes, strides, storage offset), so once the chain has run on a root,
// its end for any root of that same geometry is `root.as_strided(sizes, strides, offset)`
// with the numbers the chain gave.
//
// `reinterpret(root, plan)` runs the plan's chain (a Python callable) the first time and
// whenever the root's geometry is not the one remembered, and remembers (root geometry,
// result geometry) when the result is a view of the root's own storage.  The shortcut
// is taken only when nothing could tell it from the chain: an exact torch.Tensor (or
// Parameter) whose TensorImpl is torch's plain one (no functorch, functionalization,
// nested or sparse wrapper), strided, no conj/neg bit, not recording autograd and with
// no forward-mode tangent, and no torch function or dispatch mode on.  So the answer is
// always the chain's.  The geometries are the ones real tensors had, never a trace's
// guess (a fake tensor may stride a size-1 dimension differently).  The module records
// the torch version its headers came from; view_chains.py uses it only under that torch.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include "plain_tensor.h"

#include <typeinfo>
#include <vector>

namespace {

const char* const kPlanName = "frametrace._views.plan";

struct Plan {
  bool known = false;  // the geometries below were seen
  std::vector<int64_t> root_sizes, root_strides;
  int64_t root_offset = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  PyObject* fallback = nullptr;  // strong: the chain itself
};

void free_plan(PyObject* capsule) {
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(capsule, kPlanName));
  if (p != nullptr) {
    Py_XDECREF(p->fallback);
    delete p;
  }
}

// plan(chain): a plan that knows no geometry yet.
PyObject* make_plan(PyObject*, PyObject* chain) {
  if (!PyCallable_Check(chain)) {
    PyErr_SetString(PyExc_TypeError, "plan: the chain must be callable");
    return nullptr;
  }
  auto* p = new Plan();
  Py_INCREF(chain);
  p->fallback = chain;
  PyObject* capsule = PyCapsule_New(p, kPlanName, free_plan);
  if (capsule == nullptr) {
    Py_DECREF(chain);
    delete p;
  }
  return capsule;
}

bool same(c10::SymIntArrayRef ints, const std::vector<int64_t>& want) {
  if (ints.size() != want.size()) {
    return false;
  }
  for (size_t i = 0; i < want.size(); i++) {
    auto v = ints[i].maybe_as_int();
    if (!v.has_value() || *v != want[i]) {
      return false;
    }
  }
  return true;
}

// v's TensorImpl when nothing could tell as_strided from a chain of views on it, else
// nullptr.
c10::TensorImpl* plain(PyObject* v) {
  c10::TensorImpl* impl = frametrace::plain_impl(v);
  if (impl == nullptr || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return nullptr;
  }
  if (typeid(*impl) != typeid(c10::TensorImpl) || impl->layout() != at::kStrided ||
      !impl->has_storage() || impl->is_conj() || impl->is_neg()) {
    return nullptr;
  }
  if (impl->requires_grad() && c10::GradMode::is_enabled()) {
    return nullptr;
  }
  // A forward-mode tangent follows as_strided with the primal's strides, which need
  // not be the tangent's own: the chain's tangent could differ.
  auto* meta = torch::autograd::impl::get_autograd_meta(THPVariable_Unpack(v));
  if (meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty()) {
    return nullptr;
  }
  return impl;
}

bool ints(c10::SymIntArrayRef in, std::vector<int64_t>* out) {
  out->clear();
  for (const auto& s : in) {
    auto v = s.maybe_as_int();
    if (!v.has_value()) {
      return false;
    }
    out->push_back(*v);
  }
  return true;
}

bool same_geometry(c10::TensorImpl* impl, const Plan& p) {
  auto offset = impl->sym_storage_offset().maybe_as_int();
  return offset.has_value() && *offset == p.root_offset && same(impl->sym_sizes(), p.root_sizes) &&
         same(impl->sym_strides(), p.root_strides);
}

// After the chain ran on `root` and gave `result`: remember both geometries when the
// result is a view of root's own storage, read as above.
void remember(Plan* p, PyObject* root, PyObject* result) {
  c10::TensorImpl* r = plain(root);
  c10::TensorImpl* v = plain(result);
  p->known = false;
  if (r == nullptr || v == nullptr || r->dtype() != v->dtype() ||
      !v->storage().is_alias_of(r->storage())) {
    return;
  }
  auto ro = r->sym_storage_offset().maybe_as_int();
  auto vo = v->sym_storage_offset().maybe_as_int();
  if (!ro.has_value() || !vo.has_value() || !ints(r->sym_sizes(), &p->root_sizes) ||
      !ints(r->sym_strides(), &p->root_strides) || !ints(v->sym_sizes(), &p->sizes) ||
      !ints(v->sym_strides(), &p->strides)) {
    return;
  }
  p->root_offset = *ro;
  p->offset = *vo;
  p->known = true;
}

// reinterpret(root, plan): the plan's chain applied to root.
PyObject* reinterpret(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "reinterpret(root, plan)");
    return nullptr;
  }
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(args[1], kPlanName));
  if (p == nullptr) {
    return nullptr;
  }
  try {
    c10::TensorImpl* impl = p->known ? plain(args[0]) : nullptr;
    if (impl != nullptr && same_geometry(impl, *p)) {
      return THPVariable_Wrap(THPVariable_Unpack(args[0]).as_strided(p->sizes, p->strides, p->offset));
    }
  } catch (...) {
    // Whatever the shortcut tripped on, the chain says what the user should see.
  }
  PyObject* result = PyObject_CallOneArg(p->fallback, args[0]);
  if (result != nullptr) {
    try {
      remember(p, args[0], result);
    } catch (...) {
      p->known = false;
    }
  }
  return result;
}

PyObject* known(PyObject*, PyObject* plan) {
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(plan, kPlanName));
  if (p == nullptr) {
    return nullptr;
  }
  return PyBool_FromLong(p->known);
}

PyMethodDef methods[] = {
    {"plan", make_plan, METH_O,
     "plan(chain): a chain of views (a callable of its root), for reinterpret()."},
    {"reinterpret", reinterpret_cast<PyCFunction>(reinterpret), METH_FASTCALL,
     "reinterpret(root, plan): chain(root), as one as_strided once the chain has shown "
     "where it lands for a root of this geometry (and nothing could tell the difference)."},
    {"known", known, METH_O, "known(plan): the plan remembers a geometry (for tests)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "frametrace._views",
    "Chains of view ops run as one as_strided (see views.cpp).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__views(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  if (PyModule_AddStringConstant(m, "TORCH_VERSION", FT_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
