// dcnb's per-call path: a compiled module's forward and backward called from C++, with PyTorch's C++ autograd.
//
// The Python path (module.py's Runner and _Apply) costs ~90 us a forward+backward when hot; after a kernel has
// streamed megabytes through the caches it costs ~0.5 ms, as the interpreter's, autograd's and ctypes' code and
// objects come back from memory: 10-15% of a Softmax forward+backward over 8 MB. Here everything between the
// module's Python forward and the kernels is C++, and the backward has no Python at all.
//
// A Plan says, for each argument of each binary in its C signature's order, where it comes from (slots).
//
// CUDA tensors take the same path: device pointers go to the binaries, outputs are allocated on the tensors'
// device by PyTorch's caching allocator, and the work is ordered on PyTorch's current stream. Building this needs
// no CUDA header, library or nvcc: the current stream and events come through c10's device guard interface
// (libc10, in CPU-only wheels too; a CUDA PyTorch registers its CUDA implementation), and the few graph functions
// from the CUDA driver (libcuda), opened when a first graph is captured: the driver is the same library whatever
// CUDA runtime PyTorch and DaCe's binaries were built against. So one extension serves every machine.

#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dcnb {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- output buffers (memory.py documents why) ----

// smaller tensors often come from the heap, already mapped: neither pooled nor advised
constexpr int64_t kThreshold = 4 << 20;

// Pooled buffers are mappings of their own, outside malloc's heap: held there, they would split it, and the heap
// above them, which the rest of the process (eager PyTorch) allocates from, would go back to the system at each
// free and fault in again (a 12-layer BERT-base encoder, interleaved with eager: eager's faults per call 0 -> 85k
// with the buffers on the heap). Resizable, as a tensor of PyTorch's own allocator is.
class MappedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::kCPU)};
    void* data = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(data != MAP_FAILED, "dcnb: mapping ", n, " bytes for an output failed");
    if (huge_pages) madvise(data, n, MADV_HUGEPAGE);  // advice only; 512x fewer faults on the first write
    return {data, new Mapping{data, n}, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  bool huge_pages = true;

 private:
  struct Mapping {
    void* data;
    size_t bytes;
  };
  static void release(void* context) {
    auto* mapping = static_cast<Mapping*>(context);
    if (mapping == nullptr) return;
    munmap(mapping->data, mapping->bytes);
    delete mapping;
  }
};

// Large output buffers, kept once made and handed out again by (shape, dtype) once no tensor refers to them, as
// PyTorch's CUDA caching allocator keeps device memory: as many of a shape as a call holds at once (a 12-layer
// encoder's backward returns 12 weight gradients of each shape: with four kept, the others were fresh pages every
// call, 209k faults and 0.7 s of the kernel's time), up to a budget of bytes. Past it, idle buffers of other
// shapes make room; where none can, the tensor is fresh and not kept.
class Pool {
 public:
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype) {
    auto options = at::TensorOptions().dtype(dtype);
    const int64_t nbytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
    if (nbytes < kThreshold) return at::empty(shape, options);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(shape.vec(), dtype);
    if (auto found = storages_.find(key); found != storages_.end()) {
      for (const auto& storage : found->second) {
        // the pool's reference is the only one: no tensor or view uses this memory any more. A new TensorImpl each
        // time, so that nothing (autograd's history above all) carries over from the last user.
        if (storage.use_count() == 1) return at::empty({0}, options).set_(storage, 0, shape);
      }
    }
    // a mapping of its own either way (advised to use huge pages), kept where the budget has room
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, &allocator_, /*resizable=*/true);
    if (room_for(nbytes)) {
      storages_[key].push_back(storage);
      held_ += nbytes;
    }
    return at::empty({0}, options).set_(storage, 0, shape);
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

  void configure(int64_t budget, bool huge_pages) {
    std::lock_guard<std::mutex> lock(mutex_);
    budget_ = budget;
    allocator_.huge_pages = huge_pages;
    storages_.clear();  // buffers in use stay with their tensors, no longer counted
    held_ = 0;
  }

  std::pair<int64_t, int64_t> limits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {kThreshold, budget_};
  }

 private:
  // whether ``nbytes`` more fit the budget, once idle buffers are let go of where they must
  bool room_for(int64_t nbytes) {
    if (nbytes > budget_) return false;
    for (auto entry = storages_.begin(); entry != storages_.end() && held_ + nbytes > budget_;) {
      auto& kept = entry->second;
      for (auto it = kept.begin(); it != kept.end() && held_ + nbytes > budget_;) {
        if (it->use_count() == 1) {
          held_ -= static_cast<int64_t>(it->nbytes());
          it = kept.erase(it);
        } else {
          ++it;
        }
      }
      entry = kept.empty() ? storages_.erase(entry) : std::next(entry);
    }
    return held_ + nbytes <= budget_;
  }

  static int64_t quarter_of_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 4 : int64_t{4} << 30;
  }

  std::mutex mutex_;
  MappedAllocator allocator_;
  int64_t budget_ = quarter_of_memory();  // bytes the pool keeps, idle and in use
  int64_t held_ = 0;
  std::map<std::pair<std::vector<int64_t>, at::ScalarType>, std::vector<c10::Storage>> storages_;
};

Pool& pool() {
  static Pool instance;
  return instance;
}

// ---- the CUDA driver's graph functions (cuda.h's declarations, the types made opaque) ----

namespace cu {

using Result = int;  // CUresult: 0 is success
using Stream = void*;
using Graph = void*;
using GraphExec = void*;
using Context = void*;
constexpr int kCaptureThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' work goes on as usual
constexpr unsigned kNonBlocking = 1;    // CU_STREAM_NON_BLOCKING

struct Driver {
  Result (*init)(unsigned) = nullptr;
  Result (*device_get)(int*, int) = nullptr;
  Result (*primary_context)(Context*, int) = nullptr;
  Result (*current_context)(Context*) = nullptr;
  Result (*set_current_context)(Context) = nullptr;
  Result (*stream_create)(Stream*, unsigned) = nullptr;
  Result (*begin_capture)(Stream, int) = nullptr;
  Result (*is_capturing)(Stream, int*) = nullptr;  // status 0: CU_STREAM_CAPTURE_STATUS_NONE
  Result (*end_capture)(Stream, Graph*) = nullptr;
  Result (*instantiate)(GraphExec*, Graph, unsigned long long) = nullptr;
  Result (*launch)(GraphExec, Stream) = nullptr;
  Result (*destroy_graph)(Graph) = nullptr;
  Result (*destroy_exec)(GraphExec) = nullptr;
  Result (*error_name)(Result, const char**) = nullptr;
  std::string error;  // why it cannot be used; empty where it can

  std::string describe(Result result) const {
    const char* name = nullptr;
    return error_name != nullptr && error_name(result, &name) == 0 && name != nullptr ? name
                                                                                     : "CUDA error " + std::to_string(result);
  }

  // the device's primary context, which PyTorch's runtime calls use, current on this thread (an autograd thread
  // that has made no runtime call yet may have none)
  Result enter(int device) const {
    Context context = nullptr;
    if (Result r = current_context(&context); r != 0 || context != nullptr) return r;
    int handle = 0;
    if (Result r = device_get(&handle, device); r != 0) return r;
    if (Result r = primary_context(&context, handle); r != 0) return r;
    return set_current_context(context);
  }
};

template <class F>
void bind(void* library, const char* name, F& function, std::string& error) {
  function = reinterpret_cast<F>(dlsym(library, name));
  if (function == nullptr && error.empty()) error = std::string("the CUDA driver has no ") + name;
}

const Driver& driver() {
  static const Driver loaded = [] {
    Driver d;
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      d.error = why != nullptr ? why : "libcuda.so.1 could not be opened";
      return d;
    }
    // the versioned names are those cuda.h's macros choose (cuStreamBeginCapture is cuStreamBeginCapture_v2)
    bind(library, "cuInit", d.init, d.error);
    bind(library, "cuDeviceGet", d.device_get, d.error);
    bind(library, "cuDevicePrimaryCtxRetain", d.primary_context, d.error);
    bind(library, "cuCtxGetCurrent", d.current_context, d.error);
    bind(library, "cuCtxSetCurrent", d.set_current_context, d.error);
    bind(library, "cuStreamCreate", d.stream_create, d.error);
    bind(library, "cuStreamBeginCapture_v2", d.begin_capture, d.error);
    bind(library, "cuStreamIsCapturing", d.is_capturing, d.error);
    bind(library, "cuStreamEndCapture", d.end_capture, d.error);
    bind(library, "cuGraphInstantiateWithFlags", d.instantiate, d.error);
    bind(library, "cuGraphLaunch", d.launch, d.error);
    bind(library, "cuGraphDestroy", d.destroy_graph, d.error);
    bind(library, "cuGraphExecDestroy", d.destroy_exec, d.error);
    bind(library, "cuGetErrorName", d.error_name, d.error);
    if (d.error.empty()) {
      if (Result r = d.init(0); r != 0) d.error = "cuInit: " + d.describe(r);
    }
    return d;
  }();
  return loaded;
}

}  // namespace cu

// ---- CUDA graphs: a binary's call captured once, then replayed with one launch ----

// one graph per set of argument addresses: a graph replays its kernels with the pointers it was captured with, and
// PyTorch's caching allocator hands out the same addresses call after call in a loop of the same shapes
constexpr size_t kGraphs = 8;

class CudaGraphs {
 public:
  explicit CudaGraphs(int device) : device_(device) {}

  CudaGraphs(const CudaGraphs&) = delete;
  CudaGraphs& operator=(const CudaGraphs&) = delete;

  ~CudaGraphs() {
    // at the interpreter's exit the driver may have shut down already: an error then is no leak worth reporting
    for (const auto& entry : execs_) cu::driver().destroy_exec(entry.second);
  }

  // runs the call through a graph on `stream`: false where it cannot (and then nothing ran)
  bool launch(const std::vector<void*>& args, cu::Stream stream, const std::function<void(cu::Stream)>& run) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) return false;
    const cu::Driver& d = cu::driver();
    if (!d.error.empty()) return fail(d.error);
    if (cu::Result r = d.enter(device_); r != 0) return fail("no CUDA context: " + d.describe(r));
    auto hit = std::find_if(execs_.begin(), execs_.end(), [&](const auto& entry) { return entry.first == args; });
    if (hit != execs_.end()) {
      execs_.splice(execs_.begin(), execs_, hit);
    } else {
      cu::GraphExec exec = capture(d, run);
      if (exec == nullptr) return false;
      execs_.emplace_front(args, exec);
      ++captured_;
      if (execs_.size() > kGraphs) {
        d.destroy_exec(execs_.back().second);
        execs_.pop_back();
      }
    }
    if (cu::Result r = d.launch(execs_.front().second, stream); r != 0) return fail("cuGraphLaunch: " + d.describe(r));
    return true;
  }

  int64_t captured() {
    std::lock_guard<std::mutex> lock(mutex_);
    return captured_;
  }

  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  // the call's launches recorded, not run, on a stream of our own (the legacy default stream, PyTorch's usual
  // one, cannot be captured); the graph is then launched on PyTorch's current stream, after its work
  cu::GraphExec capture(const cu::Driver& d, const std::function<void(cu::Stream)>& run) {
    if (stream_ == nullptr) {
      if (cu::Result r = d.stream_create(&stream_, cu::kNonBlocking); r != 0) {
        fail("cuStreamCreate: " + d.describe(r));
        return nullptr;
      }
    }
    if (cu::Result r = d.begin_capture(stream_, cu::kCaptureThreadLocal); r != 0) {
      fail("cuStreamBeginCapture: " + d.describe(r));
      return nullptr;
    }
    run(stream_);
    cu::Graph graph = nullptr;
    cu::GraphExec exec = nullptr;
    cu::Result r = d.end_capture(stream_, &graph);
    if (r == 0) r = d.instantiate(&exec, graph, 0);
    if (graph != nullptr) d.destroy_graph(graph);
    if (r != 0) {
      fail("capturing a call: " + d.describe(r));
      return nullptr;
    }
    return exec;
  }

  bool fail(const std::string& reason) {
    error_ = reason;
    TORCH_WARN("dcnb calls this binary without CUDA graphs from now on: ", reason);
    return false;
  }

  std::mutex mutex_;
  const int device_;
  // the capture stream, made at the first capture and never destroyed: a plan may end after the driver (at exit)
  cu::Stream stream_ = nullptr;
  std::list<std::pair<std::vector<void*>, cu::GraphExec>> execs_;  // most recently used first
  int64_t captured_ = 0;
  std::string error_;  // why graphs are off for this binary; empty while they are on
};

// ---- calling a binary: through the entry build.py adds to its code, `__dcnb_call_<name>(state, args)` ----

using CudaInterface = c10::impl::DeviceGuardImplInterface;

// `from`'s work so far happens before what is issued on `to` from now on
void order(const CudaInterface& cuda, const c10::Stream& from, const c10::Stream& to) {
  void* event = nullptr;
  cuda.record(&event, from, from.device_index(), c10::EventFlag::PYTORCH_DEFAULT);
  cuda.block(event, to);
  cuda.destroyEvent(event, from.device_index());  // CUDA frees it once recorded: the wait stands
}

// one lock per loaded binary (its state): a CPU binary keeps its scratch arrays in its state, allocated once
// (passes/lifetimes.py), so two threads must not run it at the same time; plans of several steps share a binary
std::shared_ptr<std::mutex> serial(void* state) {
  static std::mutex guard;
  static std::map<void*, std::weak_ptr<std::mutex>> locks;
  std::lock_guard<std::mutex> hold(guard);
  auto lock = locks[state].lock();
  if (lock == nullptr) {
    lock = std::make_shared<std::mutex>();
    locks[state] = lock;
  }
  return lock;
}

struct Binary {
  using Entry = void (*)(void* state, void* const* args);
  using SetStreams = void (*)(void* state, void* stream);
  Entry entry = nullptr;
  void* state = nullptr;
  // (CUDA) its `__dace_gpu_set_all_streams`, where its kernels launch on the streams it is given; null where they
  // launch on the legacy default stream (builds with DaCe's max_concurrent_streams = -1)
  SetStreams set_streams = nullptr;
  std::shared_ptr<CudaGraphs> graphs;  // (CUDA) where its calls are replayed from graphs
  std::shared_ptr<std::mutex> serial;  // (CPU) held while it runs

  // a scalar's slot holds a one-element tensor: the entry reads the value behind the pointer
  void operator()(const std::vector<at::Tensor>& args, const c10::Device& device) const {
    std::vector<void*> pointers;
    pointers.reserve(args.size());
    for (const auto& a : args) pointers.push_back(a.data_ptr());
    if (!device.is_cuda()) {
      std::lock_guard<std::mutex> hold(*serial);
      return entry(state, pointers.data());
    }
    const CudaInterface& cuda = *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream current = cuda.getStream(device);
    if (set_streams == nullptr) {
      // PyTorch's default stream is the legacy one: in order already. A side stream is created non-blocking:
      // the call waits for its work, and its later work for the call.
      const c10::Stream legacy = cuda.getDefaultStream(device);
      const bool aside = current != legacy;
      if (aside) order(cuda, current, legacy);
      entry(state, pointers.data());
      if (aside) order(cuda, legacy, current);
      return;
    }
    auto run = [&](cu::Stream stream) {
      set_streams(state, stream);
      entry(state, pointers.data());
    };
    if (graphs != nullptr) {
      // while PyTorch captures its own graph (torch.cuda.graph), the call goes into that graph as it is; asked of
      // the driver: c10's DeviceGuardImplInterface has no isStreamCapturing before PyTorch 2.12
      int capture = 0;
      const bool capturing = cu::driver().is_capturing(current.native_handle(), &capture) == 0 && capture != 0;
      if (!capturing && graphs->launch(pointers, current.native_handle(), run)) return;
    }
    run(current.native_handle());
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
  std::vector<std::vector<int64_t>> reached_by;  // per tensor of the call: the outputs computed from it
  py::object again;     // Runner.again: gradients with a history, for create_graph=True
  py::object binaries;  // the CompiledSDFGs: their code must outlive every graph that calls it
  c10::Device device = c10::kCPU;  // of the call's tensors, and so of the binaries' arguments

  ~Plan() override {
    // CUDA graphs hold the binaries' kernels: destroyed before the libraries may be unloaded
    forward.graphs.reset();
    backward.graphs.reset();
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      binaries = py::object();
      again = py::object();
    } else {
      // a graph that outlived the interpreter (an output kept in a global): without a GIL to take, the reference
      // is let go of, not dropped (pybind11 aborts the process on a dec_ref without the GIL)
      binaries.release();
      again.release();
    }
  }

  // inputs as the binaries take them: contiguous, starting on a 64-byte boundary (vectorized code loads aligned)
  static at::Tensor ready(const at::Tensor& t) {
    auto c = t.contiguous();
    return reinterpret_cast<uintptr_t>(c.data_ptr()) % 64 == 0 ? c : c.clone();
  }

  // the pool is for host memory (memory.py); on a GPU, PyTorch's caching allocator reuses buffers already
  at::Tensor make(const Spec& spec, bool zero = false) const {
    if (device.is_cuda()) {
      auto options = at::TensorOptions().dtype(spec.second).device(device);
      return zero ? at::zeros(spec.first, options) : at::empty(spec.first, options);
    }
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
    forward(args, device);
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
    ctx->saved_data["tensors"] = tensors.vec();  // as called, with their history: for Again
    ctx->set_materialize_grads(false);  // an unused output's gradient is zeros of our own, from the pool
    ctx->mark_non_differentiable(updates);
    outputs.insert(outputs.end(), updates.begin(), updates.end());
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<Call>(ctx->saved_data["call"].toCapsule());
    const Plan& plan = *call->plan;
    grad_outputs.resize(plan.outputs.size());  // (the buffers' new values have none)
    if (at::GradMode::is_enabled()) return again(plan, ctx->saved_data["tensors"].toTensorVector(), grad_outputs);
    auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> grads(plan.grads.size());
    for (size_t i = 0; i < grads.size(); ++i)
      if (plan.grads[i]) grads[i] = plan.make(*plan.grads[i], plan.accumulated[i]);
    std::vector<at::Tensor> args;
    args.reserve(plan.backward_slots.size());
    for (const auto& [kind, i] : plan.backward_slots) {
      switch (kind) {
        case kSaved: args.push_back(saved[i]); break;
        case kOutputGrad: {
          const auto& spec = plan.outputs[i];
          const auto& g = grad_outputs[i];
          args.push_back(g.defined() ? Plan::ready(g.reshape(spec.first)) : plan.make(spec, true));
          break;
        }
        case kGrad: args.push_back(grads[i]); break;
        default: args.push_back(plan.backward_constants[i]);
      }
    }
    plan.backward(args, plan.device);
    variable_list result{at::Tensor()};  // the plan's
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto& g = grads[i];
      // a tensor none of whose outputs got a gradient gets None, as in eager (not zeros an optimizer would use)
      const auto& by = plan.reached_by[i];
      const bool reached = std::any_of(by.begin(), by.end(), [&](int64_t j) { return grad_outputs[j].defined(); });
      if (!g.defined() || !reached)
        result.push_back(at::Tensor());
      else
        result.push_back(g.sizes() == at::IntArrayRef(call->shapes[i]) ? g : g.view(call->shapes[i]));
    }
    return result;
  }

  // create_graph=True: the compiled backward's gradients have no history, so Python's Again makes them
  static variable_list again(const Plan& plan, std::vector<at::Tensor> tensors, const variable_list& grad_outputs) {
    py::gil_scoped_acquire gil;
    py::list given;
    for (const auto& g : grad_outputs) given.append(g.defined() ? py::cast(g) : py::none());
    py::list got = plan.again(tensors, given);
    variable_list result{at::Tensor()};  // the plan's
    for (auto item : got) result.push_back(item.is_none() ? at::Tensor() : item.cast<at::Tensor>());
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
                                   std::vector<at::Tensor> backward_constants,
                                   std::vector<std::vector<int64_t>> reached_by, py::object again, py::object binaries,
                                   const std::string& device, std::pair<int64_t, bool> forward_cuda,
                                   std::pair<int64_t, bool> backward_cuda) {
  auto plan = c10::make_intrusive<Plan>();
  plan->device = c10::Device(device);
  if (plan->device.is_cuda() && !plan->device.has_index()) plan->device.set_index(0);  // DaCe's binaries select 0
  // (CUDA) per binary: the address of its __dace_gpu_set_all_streams (0: it launches on the legacy default
  // stream), and whether its calls are replayed from CUDA graphs
  auto binary = [&](int64_t entry, int64_t state, std::pair<int64_t, bool> cuda) {
    Binary b{reinterpret_cast<Binary::Entry>(entry), reinterpret_cast<void*>(state),
             reinterpret_cast<Binary::SetStreams>(cuda.first), nullptr, serial(reinterpret_cast<void*>(state))};
    if (cuda.second) b.graphs = std::make_shared<CudaGraphs>(plan->device.index());
    return b;
  };
  plan->forward = binary(forward_entry, forward_state, forward_cuda);
  plan->backward = binary(backward_entry, backward_state, backward_cuda);
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
  plan->reached_by = std::move(reached_by);
  plan->again = std::move(again);
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
  m.def("configure_pool", [](int64_t budget, bool huge_pages) { d::pool().configure(budget, huge_pages); });
  m.def("pool_limits", [] { return d::pool().limits(); });
  // why the CUDA driver's graph functions cannot be used here; empty where they can
  m.def("cuda_driver", [] { return d::cu::driver().error; });
  // per binary of a plan (forward, backward): the CUDA graphs it captured, and why graphs are off ("" if they are not)
  m.def("graphs", [](const c10::intrusive_ptr<d::Plan>& plan) {
    std::vector<std::pair<int64_t, std::string>> result;
    for (const auto* b : {&plan->forward, &plan->backward})
      result.emplace_back(b->graphs ? b->graphs->captured() : 0, b->graphs ? b->graphs->error() : "");
    return result;
  });
}
