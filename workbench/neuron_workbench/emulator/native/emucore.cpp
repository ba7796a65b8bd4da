// The emulator's native core: a PrivateUse1 backend on host memory.
//
// Device tensors are ordinary PrivateUse1 tensors with real storage from an accounting allocator
// (so untyped_storage(), data_ptr(), resize_, set_ and out= growth behave as on any device). Every
// op without a kernel of its own reaches one boxed fallback, which runs the CPU kernel on CPU
// aliases of the same memory (no copies), applies the profile's 64-bit narrowing, and wraps the
// results back. Python is called only for what needs it: the first time an op is seen (its plan,
// from the same rules as the Python core), for fallback events (call site, autograd phase), for
// the few ops with a Python implementation, and to word refusals.
//
// Design and rationale: shared/notes/emulator.md, and emulator/native/__init__.py.

#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <atomic>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace emucore {
namespace {

using c10::DispatchKey;
using c10::DispatchKeySet;
using c10::IValue;

// ---------------------------------------------------------------------------------------------
// Memory accounting: every byte of device storage, whether the allocator made it or a CPU kernel
// did (adopted below), is counted once while it is alive.

std::mutex mem_mutex;
int64_t mem_current = 0, mem_peak = 0, mem_allocated_total = 0, mem_freed_total = 0;
int64_t mem_num_allocs = 0, mem_num_frees = 0, mem_num_ooms = 0;
int64_t mem_capacity = -1;  // -1: unlimited
std::string device_name = "neuron";

void account_alloc(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  const auto n = static_cast<int64_t>(nbytes);
  if (mem_capacity >= 0 && mem_current + n > mem_capacity) {
    mem_num_ooms += 1;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "emulated ", device_name,
                     " out of memory: tried to allocate ", n, " bytes (", mem_current,
                     " bytes allocated, capacity ", mem_capacity,
                     " bytes set by emulate(capacity_bytes=...))");
  }
  mem_current += n;
  mem_allocated_total += n;
  mem_num_allocs += 1;
  if (mem_current > mem_peak) mem_peak = mem_current;
}

void account_free(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem_current -= static_cast<int64_t>(nbytes);
  mem_freed_total += static_cast<int64_t>(nbytes);
  mem_num_frees += 1;
}

struct Block {
  void* data;
  size_t nbytes;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  c10::free_cpu(block->data);
  account_free(block->nbytes);
  delete block;
}

// Host memory labelled with a device. The CPU-labelled instance serves the CPU aliases, so a CPU
// kernel that grows an aliased out= tensor allocates counted memory the device storage then takes.
struct HostAllocator final : c10::Allocator {
  explicit HostAllocator(c10::DeviceType type) : type_(type) {}

  c10::DataPtr allocate(size_t nbytes) override {
    account_alloc(nbytes);
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {data, new Block{data, nbytes}, &free_block, device()};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }

  c10::Device device() const {
    return type_ == c10::DeviceType::CPU ? c10::Device(c10::DeviceType::CPU)
                                         : c10::Device(type_, 0);
  }

 private:
  c10::DeviceType type_;
};

HostAllocator device_allocator(c10::DeviceType::PrivateUse1);
HostAllocator alias_allocator(c10::DeviceType::CPU);

const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);
const DispatchKeySet kDeviceKeys(DispatchKey::PrivateUse1);
const DispatchKeySet kCpuKeys(DispatchKey::CPU);

// A CPU kernel's output memory, owned by a device storage from now on.
struct Adopted {
  c10::intrusive_ptr<c10::StorageImpl> cpu;
  size_t nbytes;
};

void free_adopted(void* ctx) {
  auto* adopted = static_cast<Adopted*>(ctx);
  account_free(adopted->nbytes);
  delete adopted;
}

c10::Storage adopt(const c10::Storage& cpu) {
  const size_t nbytes = cpu.nbytes();
  account_alloc(nbytes);
  void* data = cpu.mutable_data();
  auto* ctx = new Adopted{c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cpu.unsafeGetStorageImpl()),
                          nbytes};
  c10::DataPtr ptr(data, ctx, &free_adopted, kDevice);
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), &device_allocator,
                      /*resizable=*/true);
}

// A tensor on ``storage`` (device or host keys) with the geometry and lazy bits of ``like``.
at::Tensor tensor_on(c10::Storage storage, DispatchKeySet keys, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), kDeviceKeys, like);
}

// ---------------------------------------------------------------------------------------------
// CPU aliases: CPU tensors over device memory, one alias storage per device storage per call.

struct Aliases {
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages;  // device -> alias
  // (alias, device tensor): the aliases are kept alive here, the kernel's stack drops its own.
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;

  const c10::Storage& storage_for(const c10::Storage& dev) {
    auto* key = dev.unsafeGetStorageImpl();
    for (auto& entry : storages)
      if (entry.first == key) return entry.second;
    c10::DataPtr ptr(const_cast<void*>(dev.data()), c10::Device(c10::DeviceType::CPU));
    storages.emplace_back(key, c10::Storage(c10::Storage::use_byte_size_t(), dev.nbytes(),
                                            std::move(ptr), &alias_allocator,
                                            /*resizable=*/true));
    return storages.back().second;
  }

  c10::StorageImpl* device_storage_of(const c10::StorageImpl* alias) const {
    for (auto& entry : storages)
      if (entry.second.unsafeGetStorageImpl() == alias) return entry.first;
    return nullptr;
  }

  at::Tensor alias(const at::Tensor& dev) {
    at::Tensor t = tensor_on(c10::Storage(storage_for(dev.storage())), kCpuKeys, dev);
    tensors.emplace_back(t, dev);
    return t;
  }
};

void release_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// For Python (kernels that must look at device data on the host): a CPU tensor over the device
// memory that keeps the device storage alive as long as it lives.
at::Tensor cpu_alias(const at::Tensor& dev) {
  TORCH_CHECK(dev.device().is_privateuseone(), "cpu_alias expects a device tensor");
  c10::StorageImpl* impl = dev.storage().unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  c10::DataPtr ptr(const_cast<void*>(impl->data()), impl, &release_storage,
                   c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), impl->nbytes(), std::move(ptr), nullptr,
                       /*resizable=*/false);
  return tensor_on(std::move(storage), kCpuKeys, dev);
}

// After a CPU kernel ran on an alias: carry storage growth and new geometry over to the device
// tensor (resize_, set_, out= to a larger size).
void resync(const at::Tensor& alias, const at::Tensor& dev, Aliases& aliases) {
  auto* alias_impl = alias.unsafeGetTensorImpl();
  auto* dev_impl = dev.unsafeGetTensorImpl();
  c10::StorageImpl* alias_storage = alias.storage().unsafeGetStorageImpl();
  c10::StorageImpl* target = aliases.device_storage_of(alias_storage);
  if (target == nullptr) {
    // The kernel gave the alias a storage of its own: adopt it.
    auto adopted = adopt(alias.storage());
    dev_impl->set_storage_keep_dtype(adopted);
  } else {
    if (target != dev.storage().unsafeGetStorageImpl()) {
      dev_impl->set_storage_keep_dtype(c10::Storage(
          c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(target)));
    }
    if (alias_storage->data() != target->data() || alias_storage->nbytes() != target->nbytes()) {
      // Grown: the alias storage holds memory from alias_allocator; hand it to the device storage.
      c10::DataPtr grown = alias_storage->set_data_ptr(c10::DataPtr());
      grown.unsafe_set_device(kDevice);
      target->set_nbytes(alias_storage->nbytes());
      target->set_data_ptr_noswap(std::move(grown));
      // The alias storage must keep pointing at the memory for the rest of this call.
      alias_storage->set_data_ptr_noswap(
          c10::DataPtr(target->mutable_data(), c10::Device(c10::DeviceType::CPU)));
    }
  }
  if (!(alias_impl->sizes() == dev_impl->sizes()) || !(alias_impl->strides() == dev_impl->strides()) ||
      alias_impl->storage_offset() != dev_impl->storage_offset()) {
    dev_impl->set_sizes_and_strides(alias_impl->sizes(), alias_impl->strides(),
                                    alias_impl->storage_offset());
  }
}

// ---------------------------------------------------------------------------------------------
// Per-op plans, decided once in Python (the same rules as the Python core) and cached here.

enum Kind : int { kRun = 0, kFallback = 1, kPython = 2 };
enum Flag : int {
  kExempt = 1,      // CPU tensors with dimensions are allowed (copies, indexing with CPU indices)
  kFp64 = 2,        // float64 inputs are rounded through float32 (neuron)
  kIntArith = 4,    // int64 arithmetic wraps as int32 (neuron)
  kMatmul = 8,      // matmul-like: Python runs it when bf16 passes are on
};
// flags >> kGapShift: dtypes (bit = ScalarType) the CPU kernel lacks and CUDA has; a call with
// an input of one of them goes to Python, which computes it in a wider dtype.
constexpr int kGapShift = 8;

// Ops whose Python implementation (kPython) also exists here, for the calls that need nothing
// only Python does (no bf16 matmul passes, no dtype the CPU kernel lacks).
enum Native : int { kNoNative = 0, kSdpaFused = 1, kSdpaFusedBackward = 2 };

struct Plan {
  int kind = kRun;
  int flags = 0;
  int native = kNoNative;
  std::string overload;  // "aten::add.Tensor"
  int device_arg = -1;
  int pin_arg = -1;
  int layout_arg = -1;
  int memory_format_arg = -1;
  std::vector<bool> kwarg_only;
  std::vector<bool> mutated;
  // Arguments the CPU kernel writes though the schema does not mark them, when the bool argument
  // at `written_if` is true (_policy.UNMARKED_WRITES: native_batch_norm's running statistics, in
  // training); -1: none.
  std::vector<bool> written;
  int written_if = -1;
  bool writes_lists = false;  // a Tensor(a!)[] argument: a foreach or fused in-place op
};

std::mutex plan_mutex;
std::unordered_map<const c10::FunctionSchema*, std::shared_ptr<const Plan>> plans;
std::vector<std::unique_ptr<torch::Library>> libraries;

bool cpu_fallback = true;
bool narrow_64bit = true;
int matmul_passes = 0;
// The device's text refusing a memory format other than contiguous or preserve that a copy to
// the device asks for (_policy.MEMORY_FORMAT_REFUSAL); empty: the device takes every format, as
// the host does. Not checked in empty.memory_format: a structured op allocates its device output
// there in its input's layout (max_pool2d of a permuted NHWC view), which is no request of the
// cell's, and what the real device does with it is not known.
std::string memory_format_refusal;

py::object classify_fn, event_fn, python_fn, refuse_fn;

// Optional: the names of every op the boxed kernel received (torch_neuronx's get_executed_ops).
std::atomic<bool> track_executed{false};
std::mutex executed_mutex;
std::set<std::string> executed;

// Optional: the name of the op the device is running, written into a caller's buffer (a worker's
// memory-mapped file), so a crash report can name the op a dead process was in. The device's own
// kernels write it (the boxed kernel, the core's explicit kernels) and so do ops registered outside
// aten when called from Python (enter_op/exit_op, through the Python wrapper that
// record_last_op installs): no global RecordFunction callback, which would send every op of the
// process, host ops included, through the dispatcher's slow path (about 1.3 ms of a small GPT
// step). Per device op: a thread-local push/pop, an atomic load, a memcpy and a short memset; no
// lock, no allocation, no Python.
// The slot's last byte says whether the op it names is still running (0) or has ended (1, set
// when a top-level op returns), so a crash in host code after it is not read as a crash inside it.
struct LastOpSlot {
  char* data;
  size_t size;               // >= 2
  std::atomic<size_t> used;  // bytes an earlier, longer name may still occupy
};
// Replaced whole and never freed (a few bytes per set_last_op_slot): another thread may still be
// writing through the slot it loaded.
std::atomic<LastOpSlot*> last_op_slot{nullptr};
std::mutex last_op_mutex;  // turning recording on and off

// `name` (its first `length` bytes), truncated to size - 2 bytes, NUL-padded over what an earlier
// name used, marked running.
void write_last_op(LastOpSlot& slot, const char* name, size_t length) {
  const size_t n = std::min(length, slot.size - 2);
  std::memcpy(slot.data, name, n);
  const size_t before = slot.used.exchange(n, std::memory_order_relaxed);
  std::memset(slot.data + n, 0, std::min(std::max(before, n + 1), slot.size - 1) - n);
  slot.data[slot.size - 1] = 0;
}

// The ops this thread is inside (they nest and end in reverse order): when an inner op ends (a
// custom op's body running device ops, a kernel's own device ops), the slot names the op still
// running around it again, so a crash reads as the innermost op running, and after a top-level op
// the slot names that op. Each name lives as long as its op runs.
struct OpFrame {
  const char* name;
  size_t length;
};
constexpr int kMaxOpDepth = 64;  // deeper nests are counted, not remembered
thread_local OpFrame op_frames[kMaxOpDepth];
thread_local int op_depth = 0;

// Start recording `name` as the op running; false (nothing to end) when recording is off.
bool enter_op(const char* name, size_t length) {
  LastOpSlot* slot = last_op_slot.load(std::memory_order_acquire);
  if (slot == nullptr) return false;
  const int depth = op_depth++;
  if (depth < kMaxOpDepth) op_frames[depth] = {name, length};
  write_last_op(*slot, name, length);
  return true;
}

// End the innermost op enter_op started: the op around it (if any) is the one running again.
void exit_op() {
  if (op_depth == 0) return;
  const int depth = --op_depth;
  if (depth > kMaxOpDepth) return;
  LastOpSlot* slot = last_op_slot.load(std::memory_order_acquire);
  if (slot == nullptr) return;
  if (depth == 0) {  // top level: the slot keeps the op, marked ended
    slot->data[slot->size - 1] = 1;
    return;
  }
  const OpFrame& outer = op_frames[depth - 1];
  write_last_op(*slot, outer.name, outer.length);
}

// The device op a kernel runs, for the length of the kernel.
class RunningOp {
 public:
  RunningOp(const char* name, size_t length) : entered_(enter_op(name, length)) {}
  explicit RunningOp(const std::string& name) : RunningOp(name.data(), name.size()) {}
  template <size_t N>
  explicit RunningOp(const char (&name)[N]) : RunningOp(name, N - 1) {}
  ~RunningOp() {
    if (entered_) exit_op();
  }
  RunningOp(const RunningOp&) = delete;
  RunningOp& operator=(const RunningOp&) = delete;

 private:
  bool entered_;
};

// Names the Python side entered (custom ops'), kept for the process (a few): frames point into them.
std::mutex python_op_mutex;
std::unordered_set<std::string> python_op_names;

bool enter_python_op(const std::string& name) {
  if (last_op_slot.load(std::memory_order_acquire) == nullptr) return false;
  const std::string* kept;
  {
    std::lock_guard<std::mutex> lock(python_op_mutex);
    kept = &*python_op_names.insert(name).first;
  }
  return enter_op(kept->data(), kept->size());
}

[[noreturn]] void rethrow_python(py::error_already_set& e) {
  e.restore();
  python_error err;
  err.persist();
  throw std::move(err);
}

std::string overload_name(const c10::FunctionSchema& schema) {
  return schema.overload_name().empty() ? schema.name()
                                        : schema.name() + "." + schema.overload_name();
}

std::shared_ptr<const Plan> plan_for(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  {
    std::lock_guard<std::mutex> lock(plan_mutex);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  auto plan = std::make_shared<Plan>();
  const auto& schema = op.schema();
  plan->overload = overload_name(schema);
  if (plan->overload == "aten::_scaled_dot_product_fused_attention_overrideable")
    plan->native = kSdpaFused;
  else if (plan->overload == "aten::_scaled_dot_product_fused_attention_overrideable_backward")
    plan->native = kSdpaFusedBackward;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto& a = arguments[i];
    plan->kwarg_only.push_back(a.kwarg_only());
    plan->mutated.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
    if (plan->mutated.back() && a.type()->kind() == c10::TypeKind::ListType)
      plan->writes_lists = true;
    if (a.name() == "device") plan->device_arg = static_cast<int>(i);
    if (a.name() == "pin_memory") plan->pin_arg = static_cast<int>(i);
    if (a.name() == "layout") plan->layout_arg = static_cast<int>(i);
    if (a.name() == "memory_format") plan->memory_format_arg = static_cast<int>(i);
  }
  if (plan->overload == "aten::native_batch_norm" && arguments.size() > 5) {
    plan->written.assign(arguments.size(), false);
    plan->written[3] = plan->written[4] = true;  // running_mean, running_var
    plan->written_if = 5;                        // training
  }
  // The fused optimizer steps' and GradScaler's kernels bump no version on CPU or CUDA either
  // (dispatch_calls.UNVERSIONED_WRITERS): a graph that saved a weight before a fused step must
  // not fail its backward pass here alone.
  if (plan->overload.rfind("aten::_fused_", 0) == 0 || plan->overload.rfind("aten::_amp_", 0) == 0)
    plan->writes_lists = false;
  {
    py::gil_scoped_acquire gil;
    try {
      if (!classify_fn) return std::make_shared<const Plan>(*plan);  // after release_callbacks
      auto result = classify_fn(plan->overload).cast<std::pair<int, int>>();
      plan->kind = result.first;
      plan->flags = result.second;
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
  std::lock_guard<std::mutex> lock(plan_mutex);
  auto inserted = plans.emplace(key, std::move(plan));
  return inserted.first->second;
}

// The error for an op the device does not run: the Python side words it (vendor texts).
[[noreturn]] void refuse(const Plan& plan, std::optional<c10::Layout> layout) {
  std::string kind, message = "operator '" + plan.overload + "' is not implemented";
  {
    py::gil_scoped_acquire gil;
    try {
      if (!refuse_fn) TORCH_CHECK(false, message);
      py::object layout_obj = py::none();
      if (layout) {
        std::ostringstream name;
        name << *layout;
        layout_obj = py::str(name.str());
      }
      auto result = refuse_fn(plan.overload, layout_obj).cast<std::pair<std::string, std::string>>();
      kind = result.first;
      message = result.second;
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
  if (kind == "NotImplementedError") TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  TORCH_CHECK(false, message);
}

[[noreturn]] void device_error(const at::Tensor& other) {
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              device_name, ":0 and ", other.device().str(), "!");
}

[[noreturn]] void index_error(const c10::Device& d) {
  TORCH_CHECK(false, "emulated ", device_name, " has a single device (", device_name, ":0); ",
              device_name, ":", static_cast<int>(d.index()),
              " cannot be emulated (the Python device guard reports one device). Use '",
              device_name, "' or '", device_name, ":0'.");
}

void check_index(const c10::Device& d) {
  if (d.is_privateuseone() && d.has_index() && d.index() != 0) index_error(d);
}

void check_memory_format(const std::string& overload, std::optional<at::MemoryFormat> format) {
  if (memory_format_refusal.empty() || !format) return;
  TORCH_CHECK(*format == at::MemoryFormat::Contiguous || *format == at::MemoryFormat::Preserve,
              overload, ": ", memory_format_refusal);
}

// ---- numerics: 64-bit narrowing (neuron) ----------------------------------------------------

constexpr int64_t kI32Min = -(int64_t(1) << 31);

int64_t wrap_int32(int64_t v) {
  return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))));
}

// Ops each narrowing rule touched (evidence for hints): one relaxed increment per narrowed op.
// rule_int64_wrapped_ops counts the int64 ops in which narrowing to int32 changed a value (an
// input or a result beyond int32's range): the evidence that a wrap-around happened at all.
// rule_fp64_rounded_ops counts the float64 ops in which float32 changed a value (see
// Narrowing::rounded): a float64 op on values float32 holds (a GradScaler's power-of-two scale
// and its reciprocal) computes what float64 would.
std::atomic<int64_t> rule_fp64_ops{0}, rule_int64_ops{0}, rule_int64_wrapped_ops{0},
    rule_fp64_rounded_ops{0};

// Whether int32 cannot hold some value of the int64 tensor `t`, i.e. narrowing it would change it.
// One read of host memory that stops at the first such value (cheaper than the two conversions
// and the allocation narrowing costs, which are skipped where nothing would change).
bool beyond_int32(const at::Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return false;
  if (t.is_cpu() && t.is_contiguous()) {
    const int64_t* p = t.const_data_ptr<int64_t>();
    // v - INT32_MIN in unsigned arithmetic is below 2^32 exactly for the values int32 holds; the
    // values are or-ed block by block (a loop the compiler vectorises), stopping after a block
    constexpr uint64_t kOffset = static_cast<uint64_t>(int64_t(1) << 31);
    constexpr int64_t kBlock = 4096;
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t end = std::min(n, start + kBlock);
      uint64_t bits = 0;
      for (int64_t i = start; i < end; ++i) bits |= static_cast<uint64_t>(p[i]) + kOffset;
      if (bits >> 32) return true;
    }
    return false;
  }
  const auto [lo, hi] = at::aminmax(t);
  return lo.item<int64_t>() < -(int64_t(1) << 31) || hi.item<int64_t>() >= (int64_t(1) << 31);
}

// A wrapped number (a Python scalar's 0-dim host tensor, float64 or int64) with its value rounded
// to float32 or wrapped to int32: itself when the value is one already (the common case, no
// allocation), else a new wrapped number of the same dtype.
at::Tensor narrowed_scalar(const at::Tensor& t, at::ScalarType narrow) {
  const auto wrapped_number = [&t](const at::Scalar& value) {
    at::Tensor out = at::scalar_tensor(value, t.options());
    out.unsafeGetTensorImpl()->set_wrapped_number(true);
    return out;
  };
  if (narrow == at::kFloat) {
    const double value = *t.const_data_ptr<double>();
    const double rounded = static_cast<double>(static_cast<float>(value));
    return rounded == value || std::isnan(value) ? t : wrapped_number(rounded);
  }
  const int64_t value = *t.const_data_ptr<int64_t>();
  const int64_t wrapped = wrap_int32(value);
  return wrapped == value ? t : wrapped_number(wrapped);
}

// What the 64-bit narrowing of one op did. int64: whether the op has an int64 tensor input (an
// int64 op, counted as such), and whether narrowing an input or a result changed a value. float64:
// whether the op has a float64 tensor input, whether rounding one of its float64 inputs (a tensor,
// a Python float) through float32 changed a value, and whether rounding a float64 result did.
struct Narrowing {
  bool int64_op = false;
  bool wrapped = false;
  bool fp64_op = false;
  bool fp64_input_rounded = false;
  bool fp64_result_rounded = false;
};

// Whether `narrowed` (the float64 tensor `t` rounded to float32) holds another value somewhere: a
// value float32 cannot hold, or beyond its range (NaN stays NaN). A sparse tensor has no
// elementwise comparison: taken as changed, as every float64 op was before these were counted.
bool rounding_changed(const at::Tensor& t, const at::Tensor& narrowed) {
  if (t.layout() != c10::kStrided) return true;
  return !at::allclose(t, narrowed.to(at::kDouble), 0.0, 0.0, /*equal_nan=*/true);
}

// Whether a result keeps no more than float32's precision (a float32, float16 or bfloat16 tensor),
// so that float32's rounding of the float64 inputs it was computed from changes nothing in it
// (x.double() ... .float(), a float64 value copied into a float32 tensor): CUDA rounds it too.
bool no_wider_than_float32(const IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble;
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec())
      if (!no_wider_than_float32(IValue(t))) return false;
    return true;
  }
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements())
      if (!no_wider_than_float32(e)) return false;
    return true;
  }
  return false;
}

// Returns the narrowed dtype found among the inputs (Float for float64, Int for int64), if any;
// notes in `narrowing` whether narrowing an int64 input (a tensor, a Python int) to int32 changed
// it, and whether rounding a float64 input to float32 did.
std::optional<at::ScalarType> narrow_inputs(torch::jit::Stack& stack, size_t base, const Plan& plan,
                                            Narrowing& narrowing) {
  std::optional<at::ScalarType> found;
  bool saw_fp64 = false, saw_int64 = false;
  const bool fp64 = plan.flags & kFp64, int_arith = plan.flags & kIntArith;
  // A Python int in arithmetic with a floating tensor is converted to the tensor's type, as on
  // CPU: there is no int64 arithmetic to wrap (f32 / 2**32 is not f32 / 0).
  bool float_input = false;
  for (size_t i = 0; i < plan.kwarg_only.size() && !float_input; ++i) {
    const IValue& v = stack[base + i];
    if (plan.kwarg_only[i] || !v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    float_input = t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number() &&
                  (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
  }
  const bool writes_unmarked = plan.written_if >= 0 && stack[base + plan.written_if].isBool() &&
                               stack[base + plan.written_if].toBool();
  for (size_t i = 0; i < plan.kwarg_only.size(); ++i) {
    if (plan.kwarg_only[i]) continue;
    IValue& v = stack[base + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      const auto dt = t.scalar_type();
      at::ScalarType narrow;
      if (dt == at::kDouble && fp64) {
        narrow = at::kFloat;
      } else if (dt == at::kLong && int_arith) {
        narrow = at::kInt;
      } else {
        continue;
      }
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        // A Python scalar (x + 1, x * 0.5): not a 64-bit tensor op (no rule count). Its value is
        // narrowed in place of two dtype conversions, and it stays a wrapped number, so type
        // promotion treats it as CPU does (a 0-dim int32 tensor + 5 stays int32). It narrows the
        // results only where no tensor input does (f64 + 1 is rounded as float32, not wrapped).
        if (narrow == at::kInt && float_input) continue;
        at::Tensor narrowed = narrowed_scalar(t, narrow);
        if (!narrowed.is_same(t))
          (narrow == at::kInt ? narrowing.wrapped : narrowing.fp64_input_rounded) = true;
        v = std::move(narrowed);
        if (!found) found = narrow;
        continue;
      }
      found = narrow;
      (narrow == at::kFloat ? saw_fp64 : saw_int64) = true;
      if (narrow == at::kInt) {
        // int32 holds every value: narrowing changes nothing (the common case, no copies)
        if (!beyond_int32(t)) continue;
        narrowing.wrapped = true;
      }
      at::Tensor narrowed = t.to(narrow);
      if (narrow == at::kFloat && !narrowing.fp64_input_rounded)
        narrowing.fp64_input_rounded = rounding_changed(t, narrowed);
      if (plan.mutated[i] || (writes_unmarked && plan.written[i])) {
        at::Tensor target = t;
        target.copy_(narrowed);
      } else {
        v = narrowed.to(dt);
      }
    } else if (v.isInt() && int_arith && !float_input) {
      const int64_t x = v.toInt();
      if (x < kI32Min || x >= (int64_t(1) << 31)) {
        v = wrap_int32(x);
        narrowing.wrapped = true;
      }
    }
  }
  if (saw_fp64) rule_fp64_ops.fetch_add(1, std::memory_order_relaxed);
  if (saw_int64) rule_int64_ops.fetch_add(1, std::memory_order_relaxed);
  narrowing.int64_op = saw_int64;
  narrowing.fp64_op = saw_fp64;
  return found;
}

// Narrows a result to float32 / int32 in place; sets `changed` when that changed a value (an int64
// result beyond int32's range, a float64 one float32 cannot hold). int64 results that int32 holds
// are not rewritten: they would not change.
void narrow_output(const IValue& v, at::ScalarType narrow, bool& changed) {
  const at::ScalarType wide = narrow == at::kFloat ? at::kDouble : at::kLong;
  if (v.isTensor()) {
    at::Tensor t = v.toTensor();
    if (!t.defined() || t.scalar_type() != wide) return;
    if (narrow == at::kInt) {
      if (!beyond_int32(t)) return;
      changed = true;
    }
    at::Tensor narrowed = t.to(narrow);
    if (narrow == at::kFloat && !changed) changed = rounding_changed(t, narrowed);
    t.copy_(narrowed);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) narrow_output(IValue(t), narrow, changed);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) narrow_output(e, narrow, changed);
  }
}

// ---- wrapping results -------------------------------------------------------------------------

struct Wrapper {
  Aliases& aliases;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> adopted;  // CPU storage -> device

  at::Tensor wrap(const at::Tensor& out, const Plan& plan) {
    if (!out.defined()) return out;
    auto* impl = out.unsafeGetTensorImpl();
    for (auto& entry : aliases.tensors)
      if (entry.first.unsafeGetTensorImpl() == impl) return entry.second;  // in-place / out=
    if (!out.device().is_cpu()) return out;
    if (out.layout() != c10::kStrided) refuse_layout(out, plan);
    if (out._is_zerotensor()) {
      // An efficient zero tensor has no memory: the device gets real zeros.
      at::Tensor zeros = at::detail::empty_generic(out.sizes(), &device_allocator, kDeviceKeys,
                                                   out.scalar_type(), std::nullopt);
      if (zeros.nbytes()) std::memset(zeros.storage().mutable_data(), 0, zeros.storage().nbytes());
      return zeros;
    }
    c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
    if (c10::StorageImpl* dev = aliases.device_storage_of(storage)) {
      // A view of an input: share the device storage.
      return device_tensor_on(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(dev)),
                              out);
    }
    for (auto& entry : adopted)
      if (entry.first == storage) return device_tensor_on(entry.second, out);
    adopted.emplace_back(storage, adopt(out.storage()));
    return device_tensor_on(adopted.back().second, out);
  }

  [[noreturn]] void refuse_layout(const at::Tensor& out, const Plan& plan) {
    refuse(plan, out.layout());
  }

  IValue wrap_value(const IValue& v, const Plan& plan) {
    if (v.isTensor()) return wrap(v.toTensor(), plan);
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(wrap(t, plan));
      return out;
    }
    return v;
  }
};

// ---------------------------------------------------------------------------------------------
// The boxed kernel: every op without a kernel of its own, and the profile's composite natives.

void run_python(const Plan& plan, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                size_t base) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  IValue result;
  {
    py::gil_scoped_acquire gil;
    TORCH_CHECK(static_cast<bool>(python_fn), plan.overload, ": the emulator is shutting down");
    try {
      py::list args;
      for (size_t i = 0; i < nargs; ++i) args.append(torch::jit::toPyObject((*stack)[base + i]));
      py::object out = python_fn(plan.overload, args);
      const auto& returns = schema.returns();
      torch::jit::drop(*stack, nargs);
      if (returns.size() == 1) {
        stack->push_back(torch::jit::toIValue(out, returns[0].type()));
      } else {
        auto seq = out.cast<py::sequence>();
        for (size_t i = 0; i < returns.size(); ++i)
          stack->push_back(torch::jit::toIValue(seq[i], returns[i].type()));
      }
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
}

// SDPA's overrideable fused op (which TorchNeuron and TorchTPU register) on CPU's flash kernel,
// as kernels.py's Python implementation does, without entering Python: an attention layer runs it
// forward and backward on every step.
std::optional<at::Tensor> optional_tensor(const IValue& v) {
  if (v.isNone()) return std::nullopt;
  const at::Tensor& t = v.toTensor();
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

std::optional<double> optional_double(const IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<double>(v.toDouble());
}

// A result with the strides the fused op's meta function gives it (kernels.py's _laid_out_like):
// a gradient as empty_like its input, the output in the query's dimension order. A compiled graph
// is traced with those strides and views the results accordingly.
at::Tensor laid_out_like(const at::Tensor& result, const at::Tensor& like) {
  at::Tensor laid_out;
  if (result.sizes() == like.sizes()) {
    laid_out = at::empty_like(like);
  } else if (result.dim() == 4 && like.dim() == 4) {
    std::array<int64_t, 4> order{0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(),
                     [&like](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
    std::vector<int64_t> strides(4);
    int64_t stride = 1;
    for (int i = 3; i >= 0; --i) {
      strides[order[i]] = stride;
      stride *= result.size(order[i]);
    }
    laid_out = at::empty_strided(result.sizes(), strides, like.options());
  } else {
    return result;
  }
  if (laid_out.strides() == result.strides()) return result;
  return laid_out.copy_(result);
}

void sdpa_fused(torch::jit::Stack& stack, size_t base) {
  // (query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask, *, scale)
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      stack[base].toTensor(), stack[base + 1].toTensor(), stack[base + 2].toTensor(),
      stack[base + 4].toDouble(), stack[base + 5].toBool(), optional_tensor(stack[base + 3]),
      optional_double(stack[base + 7]));
  out = laid_out_like(out, stack[base].toTensor());
  const at::Tensor empty = at::empty({0});
  torch::jit::drop(stack, stack.size() - base);
  // (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug)
  for (IValue v : {IValue(out), IValue(lse), IValue(empty), IValue(empty), IValue(int64_t{0}),
                   IValue(int64_t{0}), IValue(empty), IValue(empty), IValue(empty)})
    stack.push_back(std::move(v));
}

void sdpa_fused_backward(torch::jit::Stack& stack, size_t base) {
  // (grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
  //  cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale)
  const std::optional<at::Tensor> bias = optional_tensor(stack[base + 4]);
  auto [grad_q, grad_k, grad_v] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      stack[base].toTensor(), stack[base + 1].toTensor(), stack[base + 2].toTensor(),
      stack[base + 3].toTensor(), stack[base + 6].toTensor(), stack[base + 7].toTensor(),
      stack[base + 12].toDouble(), stack[base + 13].toBool(), bias,
      optional_double(stack[base + 16]));
  const at::Tensor grad_bias = bias ? at::zeros_like(*bias) : at::empty({0});
  grad_q = laid_out_like(grad_q, stack[base + 1].toTensor());
  grad_k = laid_out_like(grad_k, stack[base + 2].toTensor());
  grad_v = laid_out_like(grad_v, stack[base + 3].toTensor());
  torch::jit::drop(stack, stack.size() - base);
  for (IValue v : {IValue(grad_q), IValue(grad_k), IValue(grad_v), IValue(grad_bias)})
    stack.push_back(std::move(v));
}

void emit_event(const Plan& plan, const std::vector<IValue>& originals, double seconds) {
  py::gil_scoped_acquire gil;
  if (!event_fn) return;
  try {
    py::list args;
    for (const auto& v : originals) args.append(torch::jit::toPyObject(v));
    event_fn(plan.overload, args, seconds);
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
}

bool has_gap_dtype(const torch::jit::Stack& stack, size_t base, size_t nargs, int mask) {
  auto gap = [mask](const at::Tensor& t) {
    return t.defined() && ((mask >> static_cast<int>(t.scalar_type())) & 1);
  };
  for (size_t i = 0; i < nargs; ++i) {
    const IValue& v = stack[base + i];
    if (v.isTensor() && gap(v.toTensor())) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec())
        if (gap(t)) return true;
  }
  return false;
}

// The device tensors an op writes through a tensor list (Tensor(a!)[]: _foreach_add_,
// _fused_adamw_, every foreach or fused optimizer step), with their versions before it ran. The
// CPU kernel bumps the versions of the CPU aliases only, and autograd's in-place layer bumps none
// for a list, so without this an optimizer step on the device changed weights whose version
// counters said they were untouched (as on CPU and CUDA, where the kernels bump them).
std::vector<std::pair<at::Tensor, uint32_t>> written_lists(const Plan& plan,
                                                           const torch::jit::Stack& stack,
                                                           size_t base) {
  std::vector<std::pair<at::Tensor, uint32_t>> written;
  if (!plan.writes_lists) return written;
  for (size_t i = 0; i < plan.mutated.size(); ++i) {
    const IValue& v = stack[base + i];
    if (!plan.mutated[i] || !v.isTensorList()) continue;
    for (const at::Tensor& t : v.toTensorList().vec())
      if (t.defined() && t.device().is_privateuseone() && !t.is_inference())
        written.emplace_back(t, t._version());
  }
  return written;
}

void bump_written(const std::vector<std::pair<at::Tensor, uint32_t>>& written) {
  for (const auto& [t, version] : written)
    if (t._version() == version) t.unsafeGetTensorImpl()->bump_version();
}

void boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto plan_ptr = plan_for(op);
  const Plan& plan = *plan_ptr;
  const RunningOp running(plan.overload);  // the plan (and its name) outlives the call
  const size_t nargs = plan.kwarg_only.size();
  const size_t base = stack->size() - nargs;
  const bool exempt = plan.flags & kExempt;
  if (track_executed.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(executed_mutex);
    executed.insert(plan.overload);
  }

  if (plan.kind == kFallback && !cpu_fallback) {
    std::optional<c10::Layout> layout;
    if (plan.layout_arg >= 0 && (*stack)[base + plan.layout_arg].isInt())
      layout = static_cast<c10::Layout>((*stack)[base + plan.layout_arg].toInt());
    refuse(plan, layout);
  }
  if (plan.pin_arg >= 0) {
    const IValue& pin = (*stack)[base + plan.pin_arg];
    TORCH_CHECK(!(pin.isBool() && pin.toBool()), "Only dense CPU tensors can be pinned");
  }
  // A memory format asked for a tensor made here (not for a copy to the host: x.to("cpu", ...)).
  if (plan.memory_format_arg >= 0 && (*stack)[base + plan.memory_format_arg].isInt()) {
    const IValue* d = plan.device_arg >= 0 ? &(*stack)[base + plan.device_arg] : nullptr;
    if (d == nullptr || !d->isDevice() || d->toDevice().is_privateuseone())
      check_memory_format(plan.overload, (*stack)[base + plan.memory_format_arg].toMemoryFormat());
  }

  std::vector<IValue> originals;
  if (plan.kind == kFallback) originals.assign(stack->begin() + base, stack->end());
  const std::vector<std::pair<at::Tensor, uint32_t>> written = written_lists(plan, *stack, base);

  // A host tensor of another layout asked onto the device (csr.to(device)): the layout error.
  if (plan.device_arg >= 0) {
    const IValue& d = (*stack)[base + plan.device_arg];
    if (d.isDevice() && d.toDevice().is_privateuseone()) {
      for (size_t i = 0; i < nargs; ++i) {
        const IValue& v = (*stack)[base + i];
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != c10::kStrided)
          refuse(plan, v.toTensor().layout());
      }
    }
  }

  // Unwrap: device tensors become CPU aliases of the same memory.
  Aliases aliases;
  bool keep_on_host = false;
  for (size_t i = 0; i < nargs; ++i) {
    IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      if (t.device().is_privateuseone()) {
        v = aliases.alias(t);
      } else if (!exempt && t.dim() > 0) {
        device_error(t);
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (t.defined() && t.device().is_privateuseone()) {
          list.push_back(aliases.alias(t));
        } else {
          if (t.defined() && !exempt && t.dim() > 0) device_error(t);
          list.push_back(t);
        }
      }
      v = list;
    } else if (v.isList()) {
      // Tensor?[] (index, index_put_)
      auto generic = v.toList();
      bool any = false;
      for (const IValue& e : generic) any = any || e.isTensor();
      if (any) {
        c10::impl::GenericList list(generic.elementType());
        for (const IValue& e : generic) {
          if (e.isTensor() && e.toTensor().defined()) {
            const at::Tensor& t = e.toTensor();
            if (t.device().is_privateuseone()) {
              list.push_back(aliases.alias(t));
              continue;
            }
            if (!exempt && t.dim() > 0) device_error(t);
          }
          list.push_back(e);
        }
        v = list;
      }
    } else if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      if (d.is_privateuseone()) {
        check_index(d);
        v = c10::Device(c10::DeviceType::CPU);
      } else if (static_cast<int>(i) == plan.device_arg) {
        keep_on_host = true;  // e.g. _to_copy(device="cpu"): the result stays on the host
      }
    }
  }

  std::optional<at::ScalarType> narrowed;
  Narrowing narrowing;
  if (narrow_64bit && (plan.flags & (kFp64 | kIntArith))) {
    narrowed = narrow_inputs(*stack, base, plan, narrowing);
  }

  const int gap_mask = plan.flags >> kGapShift;
  const bool passes = matmul_passes > 0 && (plan.flags & kMatmul);
  const bool gaps = gap_mask != 0 && has_gap_dtype(*stack, base, nargs, gap_mask);
  const bool native = plan.native != kNoNative && !passes && !gaps;
  const bool python = !native && (plan.kind == kPython || passes || gaps);
  std::chrono::steady_clock::time_point t0;
  if (plan.kind == kFallback) t0 = std::chrono::steady_clock::now();
  try {
    if (native) {
      if (plan.native == kSdpaFused)
        sdpa_fused(*stack, base);
      else
        sdpa_fused_backward(*stack, base);
    } else if (python) {
      run_python(plan, op, stack, base);
    } else {
      op.redispatchBoxed(kCpuKeys, stack);
    }
  } catch (...) {
    // The op fell back even though the CPU kernel refused its inputs: the event (its op and cell
    // line) is what explains the error, so it is recorded before the error goes on.
    if (plan.kind == kFallback) {
      emit_event(plan, originals,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    throw;
  }
  double seconds = 0;
  if (plan.kind == kFallback) {
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Mutated (and restrided) arguments follow their aliases (cheap comparisons first).
  for (size_t k = 0; k < aliases.tensors.size(); ++k) {
    const at::Tensor alias = aliases.tensors[k].first;
    c10::TensorImpl* alias_impl = alias.unsafeGetTensorImpl();
    const at::Tensor dev = aliases.tensors[k].second;
    auto* dev_impl = dev.unsafeGetTensorImpl();
    c10::StorageImpl* alias_storage = alias_impl->storage().unsafeGetStorageImpl();
    c10::StorageImpl* dev_storage = dev.storage().unsafeGetStorageImpl();
    const bool storage_changed = aliases.device_storage_of(alias_storage) != dev_storage ||
                                 alias_storage->data() != dev_storage->data() ||
                                 alias_storage->nbytes() != dev_storage->nbytes();
    const bool geometry_changed = !(alias_impl->sizes() == dev_impl->sizes()) ||
                                  !(alias_impl->strides() == dev_impl->strides()) ||
                                  alias_impl->storage_offset() != dev_impl->storage_offset();
    if (storage_changed || geometry_changed) resync(alias, dev, aliases);
  }

  const size_t nret = stack->size() - base;
  if (narrowed) {
    bool changed = false, narrow_results = nret > 0;
    for (size_t i = 0; i < nret; ++i) {
      narrow_output((*stack)[base + i], *narrowed, changed);
      narrow_results = narrow_results && no_wider_than_float32((*stack)[base + i]);
    }
    (*narrowed == at::kInt ? narrowing.wrapped : narrowing.fp64_result_rounded) |= changed;
    // counted with the int64 ops only: an int32 tensor's Python int wraps on CPU as well
    if (narrowing.int64_op && narrowing.wrapped)
      rule_int64_wrapped_ops.fetch_add(1, std::memory_order_relaxed);
    // a rounded input changes nothing in results float32 rounds anyway (x64.float())
    if (narrowing.fp64_op && (narrowing.fp64_result_rounded ||
                              (narrowing.fp64_input_rounded && !narrow_results)))
      rule_fp64_rounded_ops.fetch_add(1, std::memory_order_relaxed);
  }
  if (!keep_on_host) {
    Wrapper wrapper{aliases, {}};
    for (size_t i = 0; i < nret; ++i) {
      IValue& v = (*stack)[base + i];
      v = wrapper.wrap_value(v, plan);
    }
  }
  bump_written(written);
  if (plan.kind == kFallback) emit_event(plan, originals, seconds);
}

// ---------------------------------------------------------------------------------------------
// Kernels of the device itself (allocation, views, geometry, copies)

void check_factory(std::optional<at::Layout> layout, std::optional<at::Device> device,
                   std::optional<bool> pin_memory) {
  if (device) check_index(*device);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided, "emulated ", device_name,
              ": only strided tensors can be created on the device");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  const RunningOp running("aten::empty.memory_format");
  check_factory(layout, device, pin_memory);
  return at::detail::empty_generic(size, &device_allocator, kDeviceKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  const RunningOp running("aten::empty_strided");
  check_factory(layout, device, pin_memory);
  return at::detail::empty_strided_generic(size, stride, &device_allocator, kDeviceKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  const RunningOp running("aten::as_strided");
  return at::cpu::as_strided(self, size, stride, offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  const RunningOp running("aten::view");
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  const RunningOp running("aten::_reshape_alias");
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const RunningOp running("aten::resize_");
  // Device-generic: grows the storage through its own allocator (ours).
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  const RunningOp running("aten::set_.source_Storage_storage_offset");
  return at::cpu::set_(self, source, offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const RunningOp running("aten::set_.source_Storage");
  return at::cpu::set_(self, source);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  const RunningOp running("aten::set_.source_Tensor");
  return at::cpu::set_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  const RunningOp running("aten::set_");
  // An empty storage of the device (at::cpu::set_ would make a CPU one).
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator.allocate(0),
                       &device_allocator, /*resizable=*/true);
  return at::cpu::set_(self, storage, 0, {0}, {});
}

at::Tensor host_view(const at::Tensor& t, Aliases& aliases) {
  return t.device().is_privateuseone() ? aliases.alias(t) : t;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const RunningOp running("aten::_copy_from");
  Aliases aliases;
  at::Tensor d = host_view(dst, aliases);
  d.copy_(host_view(self, aliases));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  const RunningOp running("aten::_copy_from_and_resize");
  if (dst.numel() == 0 && self.numel() != 0) dst.resize_(self.sizes());
  Aliases aliases;
  at::Tensor d = host_view(dst, aliases);
  d.copy_(host_view(self, aliases));
  return dst;
}

// model.to(device) keeps Parameter identity (and so tied weights) only when a host tensor and a
// device tensor may shallow-copy into each other, which torch allows by default for CPU/CUDA only.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t._is_zerotensor() &&
           (t.device().is_cpu() || t.device().is_privateuseone());
  };
  return dense(self) && dense(from);
}

// ---------------------------------------------------------------------------------------------
// Device guard and hooks: one device, one stream, nothing asynchronous. In C++ so the autograd
// engine's per-node guard calls never enter Python.

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device d) const override { check_index(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // untyped_storage().resize_(): new memory from the allocator, the old bytes kept.
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr grown = device_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep) std::memcpy(grown.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(grown));
    impl->set_nbytes(newsize);
  }
};

// ---------------------------------------------------------------------------------------------
// Python API

bool register_kernels(const std::string& name) {
  TORCH_CHECK(libraries.empty(), "the native emulator core is already registered");
  if (at::isPrivateUse1HooksRegistered()) return false;  // a real backend owns the device
  device_name = name;
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  static c10::impl::DeviceGuardImplRegistrar guard(c10::DeviceType::PrivateUse1, new Guard());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &device_allocator);
  auto impl = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                               DispatchKey::PrivateUse1, __FILE__, __LINE__);
  impl->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  impl->impl("empty_strided", TORCH_FN(empty_strided));
  impl->impl("as_strided", TORCH_FN(as_strided));
  impl->impl("view", TORCH_FN(view));
  impl->impl("_reshape_alias", TORCH_FN(reshape_alias));
  impl->impl("resize_", TORCH_FN(resize_));
  impl->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  impl->impl("set_.source_Storage", TORCH_FN(set_source_storage));
  impl->impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  impl->impl("set_", TORCH_FN(set_empty));
  impl->impl("_copy_from", TORCH_FN(copy_from));
  impl->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  libraries.push_back(std::move(impl));
  // Above the Python key: a metadata query, which op profiles (dispatch modes) should not see.
  auto autograd = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  autograd->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  libraries.push_back(std::move(autograd));
  auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_",
                                                   DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_kernel>());
  libraries.push_back(std::move(fallback));
  return true;
}

// Ops the profile runs natively although they have a composite kernel: the real backend's own
// kernel runs them whole, so the dispatcher must not decompose them.
void register_whole(const std::vector<std::string>& names) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& n : names)
    lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_kernel>());
  libraries.push_back(std::move(lib));
}

// At interpreter exit (atexit): drop the Python callbacks while Python can still release them;
// ops that run later are treated as covered and record nothing.
void release_callbacks() {
  {
    std::lock_guard<std::mutex> lock(last_op_mutex);
    last_op_slot.store(nullptr);  // the buffer (an mmap) may be gone once Python finalizes
  }
  classify_fn = py::object();
  event_fn = py::object();
  python_fn = py::object();
  refuse_fn = py::object();
}

void configure(bool fallback, bool narrow, int passes) {
  cpu_fallback = fallback;
  narrow_64bit = narrow;
  matmul_passes = passes;
}

void refuse_memory_formats(const std::string& refusal) { memory_format_refusal = refusal; }

void set_track_executed(bool on) { track_executed = on; }

std::vector<std::string> executed_ops() {
  std::lock_guard<std::mutex> lock(executed_mutex);
  return std::vector<std::string>(executed.begin(), executed.end());
}

void clear_executed() {
  std::lock_guard<std::mutex> lock(executed_mutex);
  executed.clear();
}

// Record the last op into [address, address + size), or stop (address 0). The caller keeps the
// buffer alive until it sets another one or 0.
void set_last_op_slot(uintptr_t address, size_t size) {
  std::lock_guard<std::mutex> lock(last_op_mutex);
  if (address == 0) {
    last_op_slot.store(nullptr);  // an op already running writes no more
    return;
  }
  TORCH_CHECK(size >= 2, "set_last_op_slot: the buffer must hold at least two bytes");
  // The first write clears the whole buffer: its earlier bytes are not known.
  last_op_slot.store(new LastOpSlot{reinterpret_cast<char*>(address), size, {size}});
}

void reset_plans() {
  std::lock_guard<std::mutex> lock(plan_mutex);
  plans.clear();
}

py::dict memory_stats() {
  std::lock_guard<std::mutex> lock(mem_mutex);
  py::dict d;
  d["current"] = mem_current;
  d["peak"] = mem_peak;
  d["allocated_total"] = mem_allocated_total;
  d["freed_total"] = mem_freed_total;
  d["num_allocs"] = mem_num_allocs;
  d["num_frees"] = mem_num_frees;
  d["num_ooms"] = mem_num_ooms;
  d["capacity"] = mem_capacity;
  return d;
}

std::tuple<int64_t, int64_t, int64_t, int64_t> rule_counts() {
  return {rule_fp64_ops.load(), rule_int64_ops.load(), rule_int64_wrapped_ops.load(),
          rule_fp64_rounded_ops.load()};
}

void reset_rule_counts() {
  rule_fp64_ops = 0;
  rule_int64_ops = 0;
  rule_int64_wrapped_ops = 0;
  rule_fp64_rounded_ops = 0;
}

void set_capacity(int64_t capacity) {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem_capacity = capacity;
}

void reset_peak() {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem_peak = mem_current;
}

void reset_accumulated() {
  std::lock_guard<std::mutex> lock(mem_mutex);
  mem_allocated_total = mem_freed_total = mem_num_allocs = mem_num_frees = mem_num_ooms = 0;
}

}  // namespace
}  // namespace emucore

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace emucore;
  m.doc() = "neuron-workbench emulator core (PrivateUse1 on host memory)";
  m.def("register_kernels", &register_kernels, py::arg("device_name"));
  m.def("register_whole", &register_whole, py::arg("names"));
  m.def(
      "set_callbacks",
      [](py::object classify, py::object event, py::object python, py::object refuse) {
        classify_fn = std::move(classify);
        event_fn = std::move(event);
        python_fn = std::move(python);
        refuse_fn = std::move(refuse);
      },
      py::arg("classify"), py::arg("event"), py::arg("python"), py::arg("refuse"));
  m.def("configure", &configure, py::arg("cpu_fallback"), py::arg("narrow_64bit"),
        py::arg("matmul_passes"));
  m.def("refuse_memory_formats", &refuse_memory_formats, py::arg("refusal"));
  m.def("reset_plans", &reset_plans);
  m.def("set_track_executed", &set_track_executed, py::arg("on"));
  m.def("executed_ops", &executed_ops);
  m.def("clear_executed", &clear_executed);
  m.def("set_last_op_slot", &set_last_op_slot, py::arg("address"), py::arg("size"));
  m.def("enter_op", &enter_python_op, py::arg("name"));
  m.def("exit_op", &exit_op);
  m.def("memory_stats", &memory_stats);
  m.def("set_capacity", &set_capacity);
  m.def("rule_counts", &rule_counts);
  m.def("reset_rule_counts", &reset_rule_counts);
  m.def("reset_peak", &reset_peak);
  m.def("reset_accumulated", &reset_accumulated);
  m.def("cpu_alias", &cpu_alias, py::arg("tensor"));
  m.def("release_callbacks", &release_callbacks);
}
