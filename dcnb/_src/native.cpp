// dcnb's per-call path: a compiled module's forward and backward called from C++, with PyTorch's C++ autograd.
//
// The Python path (module.py's Runner and _Apply) costs ~90 us a forward+backward when hot; after a kernel has
// streamed megabytes through the caches it costs ~0.5 ms, as the interpreter's, autograd's and ctypes' code and
// objects come back from memory: 10-15% of a Softmax forward+backward over 8 MB. Here everything between the
// module's Python forward and the kernels is C++, and the backward has no Python at all.
//
// A Plan says, for each argument of each binary in its C signature's order, where it comes from (slots).

#include <torch/extension.h>

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace dcnb {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- output buffers (memory.py documents why) ----

// smaller tensors often come from the heap, already mapped: neither pooled nor advised
constexpr int64_t kThreshold = 4 << 20;

class Pool {
 public:
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype) {
    auto options = at::TensorOptions().dtype(dtype);
    const int64_t nbytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
    if (nbytes < kThreshold) return at::empty(shape, options);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& storages = storages_[{shape.vec(), dtype}];
    for (const auto& storage : storages) {
      // the pool's reference is the only one: no tensor or view uses this memory any more. A new TensorImpl each
      // time, so that nothing (autograd's history above all) carries over from the last user.
      if (storage.use_count() == 1) return at::empty({0}, options).set_(storage, 0, shape);
    }
    auto tensor = at::empty(shape, options);
    if (huge_pages_) advise(tensor.data_ptr(), nbytes);
    if (storages.size() < per_shape_) storages.push_back(tensor.storage());
    return tensor;
  }

  at::Tensor zeros(at::IntArrayRef shape, at::ScalarType dtype) { return empty(shape, dtype).zero_(); }

  // (bytes, in use) of each pooled buffer
  std::vector<std::pair<int64_t, bool>> buffers() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<int64_t, bool>> result;
    for (const auto& entry : storages_)
      for (const auto& storage : entry.second)
        result.emplace_back(static_cast<int64_t>(storage.nbytes()), storage.use_count() > 1);
    return result;
  }

  void configure(int64_t per_shape, bool huge_pages) {
    std::lock_guard<std::mutex> lock(mutex_);
    per_shape_ = static_cast<size_t>(per_shape);
    huge_pages_ = huge_pages;
    storages_.clear();
  }

  std::pair<int64_t, int64_t> limits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {kThreshold, static_cast<int64_t>(per_shape_)};
  }

 private:
  static void advise(void* data, int64_t nbytes) {
    constexpr uintptr_t huge = 2 << 20;
    const auto address = reinterpret_cast<uintptr_t>(data);
    const uintptr_t start = (address + huge - 1) / huge * huge, end = (address + nbytes) / huge * huge;
    if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);  // advice only
  }

  std::mutex mutex_;
  size_t per_shape_ = 4;  // buffers kept per (shape, dtype); beyond, tensors are fresh
  bool huge_pages_ = true;
  std::map<std::pair<std::vector<int64_t>, at::ScalarType>, std::vector<c10::Storage>> storages_;
};

Pool& pool() {
  static Pool instance;
  return instance;
}

// ---- calling a binary: through the entry build.py adds to its code, `__dcnb_call_<name>(state, args)` ----

struct Binary {
  using Entry = void (*)(void* state, void* const* args);
  Entry entry = nullptr;
  void* state = nullptr;

  // a scalar's slot holds a one-element tensor: the entry reads the value behind the pointer
  void operator()(const std::vector<at::Tensor>& args) const {
    std::vector<void*> pointers;
    pointers.reserve(args.size());
    for (const auto& a : args) pointers.push_back(a.data_ptr());
    entry(state, pointers.data());
  }
};

// ---- a compiled module ----

// where an argument comes from
enum Kind : int64_t {
  kInput = 0,       // the i-th tensor of the call (inputs, then parameters and buffers)
  kOutput = 1,      // a new tensor for the i-th output
  kStored = 2,      // a new tensor for the i-th value the forward stores for the backward
  kUpdate = 3,      // a new tensor for the i-th new buffer value (running statistics)
  kConstant = 4,    // the i-th constant of this binary
  kSaved = 5,       // (backward) the i-th tensor the forward saved
  kOutputGrad = 6,  // (backward) the gradient of the i-th output
  kGrad = 7,        // (backward) a new tensor for the gradient of the i-th tensor of the call
};

using Slots = std::vector<std::pair<int64_t, int64_t>>;
using Spec = std::pair<std::vector<int64_t>, at::ScalarType>;

struct Plan : torch::CustomClassHolder {
  Binary forward, backward;
  Slots forward_slots, backward_slots;
  std::vector<Spec> outputs, stored, updates;
  std::vector<std::optional<Spec>> grads;  // per tensor of the call: none where it gets no gradient
  std::vector<bool> accumulated;           // per tensor: the backward adds into its gradient, which starts at zero
  std::vector<int64_t> saved;              // what the forward saves: indices into inputs ++ outputs ++ stored
  std::vector<at::Tensor> forward_constants, backward_constants;
  py::object binaries;  // the CompiledSDFGs: their code must outlive every graph that calls it

  ~Plan() override {
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      binaries = py::object();
    } else {
      // a graph that outlived the interpreter (an output kept in a global): without a GIL to take, the reference
      // is let go of, not dropped (pybind11 aborts the process on a dec_ref without the GIL)
      binaries.release();
    }
  }

  // inputs as the binaries take them: contiguous, starting on a 64-byte boundary (vectorized code loads aligned)
  static at::Tensor ready(const at::Tensor& t) {
    auto c = t.contiguous();
    return reinterpret_cast<uintptr_t>(c.data_ptr()) % 64 == 0 ? c : c.clone();
  }

  static at::Tensor make(const Spec& spec, bool zero = false) {
    return zero ? pool().zeros(spec.first, spec.second) : pool().empty(spec.first, spec.second);
  }

  // runs the forward: (inputs, outputs, stored, updates), each in the order of its slots' indices
  std::array<std::vector<at::Tensor>, 4> run_forward(at::TensorList tensors) const {
    std::array<std::vector<at::Tensor>, 4> made;
    auto& [inputs, outs, keep, news] = made;
    for (const auto& t : tensors) inputs.push_back(ready(t));
    for (const auto& s : outputs) outs.push_back(make(s));
    for (const auto& s : stored) keep.push_back(make(s));
    for (const auto& s : updates) news.push_back(make(s));
    std::vector<at::Tensor> args;
    args.reserve(forward_slots.size());
    for (const auto& [kind, i] : forward_slots) {
      switch (kind) {
        case kInput: args.push_back(inputs[i]); break;
        case kOutput: args.push_back(outs[i]); break;
        case kStored: args.push_back(keep[i]); break;
        case kUpdate: args.push_back(news[i]); break;
        default: args.push_back(forward_constants[i]);
      }
    }
    forward(args);
    return made;
  }
};

// what a graph node keeps besides its saved tensors
struct Call : torch::CustomClassHolder {
  c10::intrusive_ptr<Plan> plan;
  std::vector<std::vector<int64_t>> shapes;  // of the call's tensors: gradients take them
};

struct Apply : torch::autograd::Function<Apply> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<Plan>& plan, at::TensorList tensors) {
    auto [inputs, outputs, stored, updates] = plan->run_forward(tensors);
    std::vector<at::Tensor> all(inputs);
    all.insert(all.end(), outputs.begin(), outputs.end());
    all.insert(all.end(), stored.begin(), stored.end());
    variable_list saved;
    for (auto i : plan->saved) saved.push_back(all[i]);
    ctx->save_for_backward(saved);
    auto call = c10::make_intrusive<Call>();
    call->plan = plan;
    for (const auto& t : tensors) call->shapes.push_back(t.sizes().vec());
    ctx->saved_data["call"] = at::IValue::make_capsule(call);
    ctx->set_materialize_grads(false);  // an unused output's gradient is zeros of our own, from the pool
    ctx->mark_non_differentiable(updates);
    outputs.insert(outputs.end(), updates.begin(), updates.end());
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<Call>(ctx->saved_data["call"].toCapsule());
    const Plan& plan = *call->plan;
    auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> grads(plan.grads.size());
    for (size_t i = 0; i < grads.size(); ++i)
      if (plan.grads[i]) grads[i] = Plan::make(*plan.grads[i], plan.accumulated[i]);
    std::vector<at::Tensor> args;
    args.reserve(plan.backward_slots.size());
    for (const auto& [kind, i] : plan.backward_slots) {
      switch (kind) {
        case kSaved: args.push_back(saved[i]); break;
        case kOutputGrad: {
          const auto& spec = plan.outputs[i];
          const auto& g = grad_outputs[i];
          args.push_back(g.defined() ? Plan::ready(g.reshape(spec.first)) : Plan::make(spec, true));
          break;
        }
        case kGrad: args.push_back(grads[i]); break;
        default: args.push_back(plan.backward_constants[i]);
      }
    }
    plan.backward(args);
    variable_list result{at::Tensor()};  // the plan's
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto& g = grads[i];
      result.push_back(!g.defined() || g.sizes() == at::IntArrayRef(call->shapes[i]) ? g : g.view(call->shapes[i]));
    }
    return result;
  }
};

// outputs, then new buffer values; through autograd where there is something to differentiate (as PyTorch's own
// ops decide: grad mode on and a tensor that requires grad), else without its bookkeeping
std::vector<at::Tensor> call(const c10::intrusive_ptr<Plan>& plan, const std::vector<at::Tensor>& tensors) {
  const bool differentiable = plan->backward.entry != nullptr && at::GradMode::is_enabled() &&
                              std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.requires_grad(); });
  py::gil_scoped_release nogil;
  if (differentiable) return Apply::apply(plan, at::TensorList(tensors));  // a TensorList: autograd sees its tensors
  auto made = plan->run_forward(tensors);
  auto& outputs = made[1];
  outputs.insert(outputs.end(), made[3].begin(), made[3].end());
  return outputs;
}

c10::intrusive_ptr<Plan> make_plan(int64_t forward_entry, int64_t forward_state, int64_t backward_entry,
                                   int64_t backward_state, Slots forward_slots, Slots backward_slots,
                                   std::vector<Spec> outputs, std::vector<Spec> stored, std::vector<Spec> updates,
                                   std::vector<std::optional<Spec>> grads, std::vector<bool> accumulated,
                                   std::vector<int64_t> saved, std::vector<at::Tensor> forward_constants,
                                   std::vector<at::Tensor> backward_constants, py::object binaries) {
  auto plan = c10::make_intrusive<Plan>();
  plan->forward = {reinterpret_cast<Binary::Entry>(forward_entry), reinterpret_cast<void*>(forward_state)};
  plan->backward = {reinterpret_cast<Binary::Entry>(backward_entry), reinterpret_cast<void*>(backward_state)};
  plan->forward_slots = std::move(forward_slots);
  plan->backward_slots = std::move(backward_slots);
  plan->outputs = std::move(outputs);
  plan->stored = std::move(stored);
  plan->updates = std::move(updates);
  plan->grads = std::move(grads);
  plan->accumulated = std::move(accumulated);
  plan->saved = std::move(saved);
  plan->forward_constants = std::move(forward_constants);
  plan->backward_constants = std::move(backward_constants);
  plan->binaries = std::move(binaries);
  return plan;
}

}  // namespace
}  // namespace dcnb

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace d = dcnb;
  py::class_<d::Plan, c10::intrusive_ptr<d::Plan>>(m, "Plan");
  m.def("plan", &d::make_plan);
  m.def("call", &d::call);
  m.def("empty", [](std::vector<int64_t> shape, at::ScalarType dtype) { return d::pool().empty(shape, dtype); });
  m.def("zeros", [](std::vector<int64_t> shape, at::ScalarType dtype) { return d::pool().zeros(shape, dtype); });
  m.def("pooled", [] { return d::pool().buffers(); });
  m.def("configure_pool", [](int64_t per_shape, bool huge_pages) { d::pool().configure(per_shape, huge_pages); });
  m.def("pool_limits", [] { return d::pool().limits(); });
}
