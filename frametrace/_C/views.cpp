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
// always the chain's.
//
// A view carries more than its geometry: its base (`_base`, the version counter it
// shares) and the CreationMeta autograd checks before an in-place op on it (a view made
// in no_grad, or one output of split/unbind/chunk, may not be written with grad on).
// as_strided is one single-output view made in the grad mode now in force, so it has
// the chain's base and CreationMeta exactly when every step of the chain ran in that
// mode (view_chains.py never lets a chain span a mode switch or a write) and no step
// was one of several outputs made with grad on (a multi-output plan runs its chain
// then).  Roots whose view replays a function (view replay on, a non-strided base) and
// views with separate forward and backward bases are left to the chain; and a result
// is remembered only when its base and CreationMeta are the ones as_strided would give.  The geometries are the ones real tensors had, never a trace's
// guess (a fake tensor may stride a size-1 dimension differently).  The module records
// the torch version its headers came from; view_chains.py uses it only under that torch.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
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
  bool known = false;         // the geometries below were seen
  bool multi_output = false;  // a step is one of several views split/unbind/chunk made
  uint64_t hits = 0;          // shortcuts taken (for tests)
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

// plan(chain, multi_output=False): a plan that knows no geometry yet.
PyObject* make_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2 || !PyCallable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "plan(chain, multi_output=False): the chain must be callable");
    return nullptr;
  }
  int multi = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
  if (multi < 0) {
    return nullptr;
  }
  PyObject* chain = args[0];
  auto* p = new Plan();
  p->multi_output = multi != 0;
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
  // With view replay on, each view records the function that remakes it, which
  // as_strided's would not be.
  if (c10::AutogradState::get_tls_state().get_view_replay_enabled()) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(v);
  // A forward-mode tangent follows as_strided with the primal's strides, which need
  // not be the tangent's own: the chain's tangent could differ.
  auto* meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty()) {
    return nullptr;
  }
  // A view that replays a function, or whose forward base is not its backward base:
  // a view of it composes those, step by step, as as_strided would not.  A view whose
  // base has a tangent gets its own tangent lazily, from the base's: left to the chain.
  auto* view = torch::autograd::impl::get_view_autograd_meta(t);
  if (view != nullptr) {
    if (!view->shared_view_info() || view->get_backward_view().has_view_fn()) {
      return nullptr;
    }
    auto* base = torch::autograd::impl::get_autograd_meta(view->get_backward_view().base_);
    if (base != nullptr && base->fw_grad_ && !base->fw_grad_->empty()) {
      return nullptr;
    }
  }
  return impl;
}

// The CreationMeta a single-output view op gives now (VariableTypeUtils.h's).
torch::autograd::CreationMeta single_view_meta() {
  using torch::autograd::CreationMeta;
  if (c10::InferenceMode::is_enabled()) {
    return CreationMeta::INFERENCE_MODE;
  }
  return c10::GradMode::is_enabled() ? CreationMeta::DEFAULT : CreationMeta::NO_GRAD_MODE;
}

// `result` (the chain's end) is the view `root.as_strided(...)` would be now: the
// same base, and the CreationMeta as_view would give one single view of `root`.
bool same_view_as_one_step(const at::Tensor& root, const at::Tensor& result) {
  using torch::autograd::CreationMeta;
  namespace impl = torch::autograd::impl;
  auto* out = impl::get_view_autograd_meta(result);
  if (root.is_inference()) {
    return out == nullptr;  // as_view makes no view of an inference tensor
  }
  if (out == nullptr || !out->has_bw_view()) {
    return false;
  }
  auto* in = impl::get_view_autograd_meta(root);
  bool root_is_view = in != nullptr && in->has_bw_view();
  const at::Tensor& base = root_is_view ? in->get_backward_view().base_ : root;
  if (!out->get_backward_view().base_.is_same(base)) {
    return false;
  }
  CreationMeta before = root_is_view ? in->get_creation_meta() : CreationMeta::DEFAULT;
  return out->get_creation_meta() ==
      torch::autograd::propagate_creation_meta(before, single_view_meta());
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
  // (r == v: the chain gave its root itself, `flatten` of a 1-d tensor; as_strided
  // would give a new view.)
  if (r == nullptr || v == nullptr || r == v || r->dtype() != v->dtype() ||
      !v->storage().is_alias_of(r->storage()) ||
      !same_view_as_one_step(THPVariable_Unpack(root), THPVariable_Unpack(result))) {
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
    // One of several outputs made with grad on is MULTI_OUTPUT_NODE, which no
    // single view is: the chain then.
    bool single = !(p->multi_output && c10::GradMode::is_enabled());
    c10::TensorImpl* impl = p->known && single ? plain(args[0]) : nullptr;
    if (impl != nullptr && same_geometry(impl, *p)) {
      PyObject* out =
          THPVariable_Wrap(THPVariable_Unpack(args[0]).as_strided(p->sizes, p->strides, p->offset));
      p->hits += out != nullptr;
      return out;
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

PyObject* hits(PyObject*, PyObject* plan) {
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(plan, kPlanName));
  if (p == nullptr) {
    return nullptr;
  }
  return PyLong_FromUnsignedLongLong(p->hits);
}

PyMethodDef methods[] = {
    {"plan", reinterpret_cast<PyCFunction>(make_plan), METH_FASTCALL,
     "plan(chain, multi_output=False): a chain of views (a callable of its root), for "
     "reinterpret(); multi_output: a step is one output of split/unbind/chunk."},
    {"reinterpret", reinterpret_cast<PyCFunction>(reinterpret), METH_FASTCALL,
     "reinterpret(root, plan): chain(root), as one as_strided once the chain has shown "
     "where it lands for a root of this geometry (and nothing could tell the difference)."},
    {"known", known, METH_O, "known(plan): the plan remembers a geometry (for tests)."},
    {"hits", hits, METH_O, "hits(plan): how many times the shortcut was taken (for tests)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "frametrace._views",
    "Chains of view ops run as one as_strided (see views.cpp).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__views(void) { return frametrace::versioned_module(&module_def); }
