// The C++ bridge: PyTorch's CUDAAllocator interface answered by the C core.
//
// A subclass of torch::cuda::CUDAPluggableAllocator, compiled against the
// installed torch's headers (python/torchalloc/bridge.py builds it), that
// turns every virtual PyTorch calls into calls of the public C API
// (include/torchalloc.h). It is glue only: no allocation decision is made
// here. What lives here is what only C++ can do:
//   - raise c10::OutOfMemoryError (torch.OutOfMemoryError in Python) after
//     calling the attached OOM observers, instead of handing PyTorch NULL;
//   - evaluate PyTorch's per-pool routing filters (std::function) to pick
//     the private pool of a CUDA graph capture or a MemPool;
//   - hold PyTorch's own objects: DeviceStats, SnapshotInfo, the history of
//     TraceEntry with the contexts its recorder gathered, checkpoint states;
//   - give snapshot blocks the Python frames of the core's stacks (stacks:1)
//     through a CapturedTraceback unwinder of our own.
//
// The core is reached through dlsym on the copy of libtorchalloc.so the
// Python package already loaded, so both share one state. Entry point:
// torchalloc_bridge_install(), before CUDA is initialised.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../include/torchalloc.h"

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::cuda::MempoolId_t;
using alloc::TraceEntry;

// ---------------------------------------------------------------------------
// The C core, found in the library the Python package loaded.
// ---------------------------------------------------------------------------

#define TA_CORE_FUNCTIONS(X)                                                                                      \
  X(try_malloc) X(pool_malloc) X(free_ptr) X(get_stats) X(reset_peak_stats) X(reset_accumulated_stats)           \
  X(empty_cache) X(pool_empty) X(largest_cached_block) X(set_memory_fraction) X(get_memory_fraction)             \
  X(record_stream) X(init_devices) X(device_count) X(pool_retain) X(pool_release) X(pool_use_count)               \
  X(pool_live_blocks) X(pool_restore) X(routing_begin) X(routing_end) X(snapshot) X(segment_of) X(stack_frames)   \
  X(oom_summary) X(set_segment_observer) X(last_error) X(policy_name) X(enable_peer_access) X(ipc_share)         \
  X(ipc_open) X(ipc_close)

struct Core {
#define TA_FIELD(name) decltype(&torchalloc_##name) name = nullptr;
  TA_CORE_FUNCTIONS(TA_FIELD)
#undef TA_FIELD
};
Core core;

bool load_core(const char* path, std::string& why) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD); // the copy already loaded: one shared state
  if (!lib) lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    why = std::string("cannot load ") + path + ": " + dlerror();
    return false;
  }
#define TA_LOAD(name)                                                                        \
  core.name = reinterpret_cast<decltype(core.name)>(dlsym(lib, "torchalloc_" #name));        \
  if (!core.name) {                                                                          \
    why = std::string(path) + " has no torchalloc_" #name ": rebuild the library and bridge"; \
    return false;                                                                            \
  }
  TA_CORE_FUNCTIONS(TA_LOAD)
#undef TA_LOAD
  return true;
}

uint64_t now_us() {
  using namespace std::chrono;
  return (uint64_t)duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Snapshot frames from the core's stacks: a CapturedTraceback unwinder whose
// "frames" are indices into a table of (file, function, line) we read from
// the core. PyTorch's gather() asks the unwinders in turn; ours answers only
// on a thread where snapshot() set the stack to report, so every other
// gather (PyTorch's own memory history) goes to PyTorch's Python unwinder.
// ---------------------------------------------------------------------------

thread_local uint32_t stack_to_report = 0;

struct FrameText {
  std::string file, function;
  uint32_t line;
};

class CoreStackUnwinder final : public torch::CapturedTraceback::Python {
 public:
  bool canGather() override { return stack_to_report != 0; }

  std::vector<torch::CapturedTraceback::PyFrame> gather() override {
    std::vector<torch::CapturedTraceback::PyFrame> out;
    if (!stack_to_report) return out;
    struct Visit {
      CoreStackUnwinder* self;
      std::vector<torch::CapturedTraceback::PyFrame>* out;
    } v{this, &out};
    core.stack_frames(
        stack_to_report,
        [](void* ctx, const char* file, const char* function, uint32_t line) {
          auto* v = static_cast<Visit*>(ctx);
          v->out->push_back({v->self->intern(file, function, line), 0});
        },
        &v);
    return out;
  }

  void release(std::vector<torch::CapturedTraceback::PyFrame>& /*frames*/) override {} // nothing is owned

  void appendSymbolized(const std::vector<torch::CapturedTraceback::PyFrame>& to_symbolize,
                        torch::SymbolizedTracebacks& result) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& f : to_symbolize) { // one fragment of one frame per PyFrame, as PyTorch's unwinder does
      const FrameText& t = table_.at(reinterpret_cast<uintptr_t>(f.code) - 1);
      result.tracebacks.emplace_back();
      result.tracebacks.back().push_back(result.all_frames.size());
      result.all_frames.push_back(torch::unwind::Frame{t.file, t.function, t.line});
    }
  }

  int traverse(std::vector<torch::CapturedTraceback::PyFrame>&, torch::CapturedTraceback::visitproc, void*) override {
    return 0;
  }
  int clear(std::vector<torch::CapturedTraceback::PyFrame>&) override { return 0; }

 private:
  // The "code pointer" of a frame is its index + 1 in the table: never
  // dereferenced by PyTorch (only by this class), never null.
  void* intern(const char* file, const char* function, uint32_t line) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string key = std::string(file) + '\n' + function + '\n' + std::to_string(line);
    auto [it, fresh] = index_.emplace(std::move(key), table_.size());
    if (fresh) table_.push_back({file, function, line});
    return reinterpret_cast<void*>(it->second + 1);
  }

  std::mutex mu_;
  std::vector<FrameText> table_;
  std::unordered_map<std::string, size_t> index_;
};

CoreStackUnwinder* core_unwinder = nullptr; // immortal once registered, as PyTorch requires

std::shared_ptr<c10::GatheredContext> context_of_core_stack(uint32_t stack) {
  if (!stack || !core_unwinder) return nullptr;
  stack_to_report = stack;
  auto tb = torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  stack_to_report = 0;
  return tb;
}

// ---------------------------------------------------------------------------
// The allocator
// ---------------------------------------------------------------------------

void bridge_delete(void* ptr);

struct Route {
  MempoolId_t pool;
  std::function<bool(cudaStream_t)> filter;
};

struct LiveContext { // what the memory history keeps per live block
  std::shared_ptr<c10::GatheredContext> context;
  size_t size;
  cudaStream_t stream;
  DeviceIndex device;
};

struct PoolCheckpoint final : alloc::AllocatorState {
  DeviceIndex device;
  MempoolId_t pool;
  std::vector<torchalloc_block_info> live;
};

constexpr int kMaxDevices = 64;

class Bridge final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  Bridge()
      : CUDAPluggableAllocator(
            [](size_t size, int device, cudaStream_t stream) { return core.try_malloc(size, device, stream); },
            [](void* ptr, size_t, int, cudaStream_t) { core.free_ptr(ptr); }) {}

  // -- allocation --------------------------------------------------------
  c10::DataPtr allocate(size_t size) override {
    DeviceIndex device = c10::cuda::current_device();
    void* p = alloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &bridge_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &bridge_delete; }
  void* raw_alloc(size_t nbytes) override {
    DeviceIndex device = c10::cuda::current_device();
    return alloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return alloc_on(nbytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* ptr) override { free_block(ptr); }

  void free_block(void* ptr) {
    if (!ptr) return;
    if (history_on_.load(std::memory_order_relaxed)) note_free(ptr);
    core.free_ptr(ptr); // an unknown pointer is reported and counted by the core; a deleter must not throw
  }

  void init(int device_count) override {
    core.init_devices(device_count);
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }

  // -- cache, fraction, streams -------------------------------------------
  double getMemoryFraction(DeviceIndex device) override { return core.get_memory_fraction(device); }
  void setMemoryFraction(double fraction, DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "torchalloc: memory fraction ", fraction, " is outside [0, 1]");
    core.set_memory_fraction(fraction, device);
  }
  void emptyCache(MempoolId_t pool) override {
    if (pool.first == 0 && pool.second == 0) {
      core.empty_cache(-1);
      return;
    }
    for (int d = 0; d < core.device_count(); d++) core.pool_empty(d, pool.first, pool.second);
  }
  void cacheInfo(DeviceIndex device, size_t* largest) override {
    if (*largest == 0) { // as PyTorch: free device memory is the optimistic first guess
      c10::cuda::CUDAGuard guard(device);
      size_t total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(largest, &total));
    }
    int64_t cached = core.largest_cached_block(device);
    if (cached > 0) *largest = std::max(*largest, (size_t)cached);
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = nullptr;
    if (core.segment_of(ptr, &base, size, nullptr) != 0) return ptr;
    return base;
  }
  using CUDAPluggableAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Storages sent to or received from another process (CUDA IPC) carry
    // PyTorch's own deleters: their memory is not a block to defer, as
    // PyTorch's allocator skips them too.
    if (ptr.get_deleter() != &bridge_delete) return;
    core.record_stream(ptr.get(), stream.stream());
  }

  // -- several GPUs ----------------------------------------------------------
  // ATen calls this once per ordered pair of devices before their first
  // copy: `dev` will read and write `dev_to_access`'s memory. The base
  // enables the context's peer access (ordinary segments); mapped memory
  // needs its mappings to name `dev` too, old and new: the core does that.
  void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
    CUDAPluggableAllocator::enablePeerAccess(dev, dev_to_access);
    TORCH_CHECK(core.enable_peer_access(dev_to_access, dev) == 0, "torchalloc: ", core.last_error());
  }
  // As PyTorch's allocator: without a peer-to-peer path, mapped memory is
  // copied with cudaMemcpyPeerAsync (the base would use cudaMemcpyAsync,
  // which cannot reach another device's mapped memory then).
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // -- stats ---------------------------------------------------------------
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex device) override {
    torchalloc_stats s{};
    TORCH_CHECK(core.get_stats(device, &s) == 0, "torchalloc: ", core.last_error());
    c10::CachingDeviceAllocator::DeviceStats out;
    auto copy = [](const torchalloc_stat* from, c10::CachingAllocator::StatArray& to) {
      for (int i = 0; i < TORCHALLOC_NPOOLS; i++) {
        to[i].current = from[i].current;
        to[i].peak = from[i].peak;
        to[i].allocated = from[i].allocated;
        to[i].freed = from[i].freed;
      }
    };
    copy(s.allocation, out.allocation);
    copy(s.segment, out.segment);
    copy(s.active, out.active);
    copy(s.inactive_split, out.inactive_split);
    copy(s.allocated_bytes, out.allocated_bytes);
    copy(s.reserved_bytes, out.reserved_bytes);
    copy(s.active_bytes, out.active_bytes);
    copy(s.inactive_split_bytes, out.inactive_split_bytes);
    copy(s.requested_bytes, out.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.num_sync_all_streams = s.num_synchronizes; // every device synchronize torchalloc made
    out.max_split_size = -1; // torchalloc never refuses to split: PyTorch's "unlimited" (SIZE_MAX as int64)
    return out;
  }
  void resetAccumulatedStats(DeviceIndex device) override { core.reset_accumulated_stats(device); }
  void resetPeakStats(DeviceIndex device) override { core.reset_peak_stats(device); }

  // -- private pools: CUDA graphs, MemPool, cudagraph trees ---------------
  void beginAllocateToPool(DeviceIndex device, MempoolId_t pool, std::function<bool(cudaStream_t)> filter) override {
    TORCH_CHECK(core.pool_retain(device, pool.first, pool.second) > 0, "torchalloc: ", core.last_error());
    std::lock_guard<std::mutex> lock(routes_mu_);
    routes_[device].push_back({pool, std::move(filter)});
    nroutes_[device].fetch_add(1);
    core.routing_begin(device);
  }
  void endAllocateToPool(DeviceIndex device, MempoolId_t pool) override {
    std::lock_guard<std::mutex> lock(routes_mu_);
    auto& routes = routes_[device];
    auto it = std::find_if(routes.rbegin(), routes.rend(), [&](const Route& r) { return r.pool == pool; });
    TORCH_CHECK(it != routes.rend(), "torchalloc: endAllocateToPool of pool (", pool.first, ", ", pool.second,
                ") that is not being allocated to");
    routes.erase(std::next(it).base());
    nroutes_[device].fetch_sub(1);
    core.routing_end(device);
  }
  void releasePool(DeviceIndex device, MempoolId_t pool) override { core.pool_release(device, pool.first, pool.second); }
  int getPoolUseCount(DeviceIndex device, MempoolId_t pool) override {
    int n = core.pool_use_count(device, pool.first, pool.second);
    return n < 0 ? 0 : n;
  }
  void createOrIncrefPool(DeviceIndex device, MempoolId_t pool,
                          std::shared_ptr<alloc::CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator,
                "torchalloc: torch.cuda.MemPool(allocator=...) is not supported while torchalloc is PyTorch's "
                "allocator: its pools are served by torchalloc itself (create the MemPool without an allocator)");
    TORCH_CHECK(core.pool_retain(device, pool.first, pool.second) > 0, "torchalloc: ", core.last_error());
  }
  void setUseOnOOM(DeviceIndex, MempoolId_t, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom, "torchalloc does not support torch.cuda.MemPool(use_on_oom=True)");
  }
  void setNoSplit(DeviceIndex, MempoolId_t) override {
    TORCH_CHECK(false, "torchalloc does not support torch.cuda.MemPool(no_split=True)");
  }
  bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t pool,
                                const std::unordered_set<void*>& expected) override {
    std::vector<uint64_t> live(expected.size() + 1);
    int64_t n = core.pool_live_blocks(device, pool.first, pool.second, live.data(), live.size());
    TORCH_CHECK(n >= 0, "torchalloc: no memory pool (", pool.first, ", ", pool.second, ") on device ", device);
    if ((size_t)n != expected.size()) return false;
    for (int64_t i = 0; i < n; i++)
      if (!expected.count(reinterpret_cast<void*>(live[i]))) return false;
    return true;
  }
  std::shared_ptr<alloc::AllocatorState> getCheckpointState(DeviceIndex device, MempoolId_t pool) override {
    TORCH_CHECK(core.pool_use_count(device, pool.first, pool.second) > 0,
                "torchalloc: no memory pool in use to checkpoint (", pool.first, ", ", pool.second, ")");
    auto state = std::make_shared<PoolCheckpoint>();
    state->device = device;
    state->pool = pool;
    for_each_block(device, [&](const torchalloc_segment_info& seg, const torchalloc_block_info& b) {
      if (seg.pool_id[0] == pool.first && seg.pool_id[1] == pool.second && b.state == TORCHALLOC_BLOCK_LIVE)
        state->live.push_back(b);
    });
    return state;
  }
  alloc::CheckpointDelta setCheckpointPoolState(DeviceIndex device,
                                                std::shared_ptr<alloc::AllocatorState> pps) override {
    auto state = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
    TORCH_CHECK(state && state->device == device, "torchalloc: not a torchalloc checkpoint of device ", device);
    std::vector<uint64_t> freed(256);
    size_t nfreed = 0;
    for (;;) {
      TORCH_CHECK(core.pool_restore(device, state->pool.first, state->pool.second, state->live.data(),
                                    state->live.size(), freed.data(), freed.size(), &nfreed) == 0,
                  "torchalloc: ", core.last_error());
      if (nfreed <= freed.size()) break;
      // Too small to list them: the blocks are restored already, so restoring
      // again frees exactly the checkpoint's blocks; list those instead.
      freed.resize(nfreed);
    }
    alloc::CheckpointDelta delta;
    for (size_t i = 0; i < nfreed; i++) delta.ptrs_freed.push_back(reinterpret_cast<void*>(freed[i]));
    for (const auto& b : state->live) {
      void* p = reinterpret_cast<void*>(b.addr);
      delta.dataptrs_allocd.emplace_back(p, p, &bridge_delete, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // -- snapshot and history ------------------------------------------------
  alloc::SnapshotInfo snapshot(MempoolId_t pool, bool include_traces) override {
    alloc::SnapshotInfo out;
    bool all_pools = pool.first == 0 && pool.second == 0;
    int ndev = core.device_count();
    for (int d = 0; d < ndev; d++) {
      alloc::SegmentInfo* current = nullptr;
      for_each_block(d, [&](const torchalloc_segment_info& seg, const torchalloc_block_info& b) {
        bool mine = all_pools || (seg.pool_id[0] == pool.first && seg.pool_id[1] == pool.second);
        if (!mine) return;
        if (b.addr == seg.addr) {
          out.segments.emplace_back();
          current = &out.segments.back();
          current->device = (DeviceIndex)d;
          current->address = seg.addr;
          current->total_size = seg.size;
          current->stream = reinterpret_cast<void*>(seg.stream);
          current->is_large = seg.pool == TORCHALLOC_POOL_LARGE;
          current->is_expandable = seg.expandable != 0; // one stretch of mapped granules, as PyTorch shows them
          current->owner_private_pool_id = {seg.pool_id[0], seg.pool_id[1]};
        }
        c10::CachingDeviceAllocator::BlockInfo info;
        info.size = b.size;
        info.requested_size = b.requested;
        info.allocated = b.state == TORCHALLOC_BLOCK_LIVE;
        info.active = b.state != TORCHALLOC_BLOCK_FREE;
        if (info.active) {
          current->requested_size += b.requested;
          current->active_size += b.size;
          info.context_when_allocated = context_for(b);
        }
        if (info.allocated) current->allocated_size += b.size;
        current->blocks.push_back(std::move(info));
      });
    }
    out.device_traces.resize(ndev);
    if (include_traces) {
      std::lock_guard<std::mutex> lock(history_mu_);
      for (int d = 0; d < ndev && d < kMaxDevices; d++)
        out.device_traces[d].assign(history_[d].begin(), history_[d].end());
    }
    out.config_metadata.last_allocator_settings = std::string("torchalloc policy ") + core.policy_name();
    out.config_metadata.max_split_size = SIZE_MAX;
    return out;
  }

  void recordHistory(bool enabled, alloc::CreateContextFn recorder, size_t max_entries,
                     alloc::RecordContext when, bool clear, const std::vector<std::string>& /*skip_actions*/) override {
    std::lock_guard<std::mutex> lock(history_mu_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : alloc::RecordContext::NEVER;
    max_entries_ = std::max<size_t>(max_entries, 1);
    if (!enabled || clear) {
      for (auto& h : history_) h.clear();
      live_contexts_.clear();
    }
    history_on_.store(enabled);
  }
  bool isHistoryEnabled() override { return history_on_.load(); }

  void attachOutOfMemoryObserver(alloc::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(alloc::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> lock(history_mu_);
    trackers_.push_back(std::move(tracker));
  }

  // -- CUDA IPC (torch.multiprocessing): PyTorch's own wire format, so
  // either end may run PyTorch's allocator instead ------------------------
  alloc::ShareableHandle shareIpcHandle(void* ptr) override {
    std::string bytes(256, '\0');
    size_t len = 0, offset = 0;
    for (int tries = 0; tries < 2; tries++) {
      TORCH_CHECK(core.ipc_share(ptr, bytes.data(), bytes.size(), &len, &offset) == 0, "torchalloc: ",
                  core.last_error());
      if (len <= bytes.size()) break;
      bytes.resize(len); // a block over many handles: one descriptor each
    }
    bytes.resize(len);
    return {(ptrdiff_t)offset, std::move(bytes)};
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    DeviceIndex device = c10::cuda::current_device(); // the storage's device: PyTorch's guard set it
    void* p = nullptr;
    TORCH_CHECK(core.ipc_open(device, handle.data(), handle.size(), &p) == 0, "torchalloc: ", core.last_error());
    return std::shared_ptr<void>(p, [](void* q) { core.ipc_close(q); });
  }
  std::string name() override { return "torchalloc"; }

  // Called by the core under its lock (a segment observer): no GIL here.
  void note_segment(int device, int event, uint64_t addr, uint64_t size, uint64_t stream) {
    if (!history_on_.load(std::memory_order_relaxed)) return;
    auto action = event == TORCHALLOC_SEGMENT_ALLOC ? TraceEntry::SEGMENT_ALLOC : TraceEntry::SEGMENT_FREE;
    record((DeviceIndex)device, action, addr, size, reinterpret_cast<void*>(stream), nullptr);
  }

 private:
  // The private pool whose filter claims this request (last begun first), if any.
  bool routed_pool(DeviceIndex device, cudaStream_t stream, MempoolId_t* pool) {
    if (device < 0 || device >= kMaxDevices || nroutes_[device].load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(routes_mu_);
    for (auto it = routes_[device].rbegin(); it != routes_[device].rend(); ++it)
      if (it->filter(stream)) {
        *pool = it->pool;
        return true;
      }
    return false;
  }

  void* alloc_on(size_t size, DeviceIndex device, cudaStream_t stream) {
    if (size == 0) return nullptr;
    std::shared_ptr<c10::GatheredContext> context; // gathered before the core's lock: it takes the GIL
    if (history_on_.load(std::memory_order_relaxed)) context = gather(alloc::RecordContext::STATE);
    MempoolId_t pool{0, 0};
    bool routed = routed_pool(device, stream, &pool);
    auto attempt = [&] {
      return routed ? core.pool_malloc(size, device, stream, pool.first, pool.second) : core.try_malloc(size, device, stream);
    };
    void* p = attempt();
    if (!p && free_memory_callbacks()) p = attempt(); // e.g. memory other processes have closed (CUDA IPC)
    if (!p) raise_oom(size, device, stream);
    if (history_on_.load(std::memory_order_relaxed)) note_alloc(p, size, device, stream, std::move(context));
    return p;
  }

  // What PyTorch's allocator runs before it gives up on a request: the
  // registered callbacks, such as the one that frees blocks sent to other
  // processes once they have closed them (torch.cuda.ipc_collect). Called
  // without the core's lock. True when one of them freed something.
  static bool free_memory_callbacks() {
    bool freed = false;
    for (const auto& name : c10::FreeCudaMemoryCallbacksRegistry()->Keys())
      freed |= c10::FreeCudaMemoryCallbacksRegistry()->Create(name)->Execute();
    return freed;
  }

  [[noreturn]] void raise_oom(size_t size, DeviceIndex device, cudaStream_t stream) {
    char summary[8192] = ""; // the C summary with its advice lines fits in 6 KiB (TA_OOM_SUMMARY_MAX)
    if (core.oom_summary(device, summary, sizeof summary) <= 0)
      snprintf(summary, sizeof summary, "CUDA out of memory. torchalloc could not allocate %zu bytes on device %d: %s",
               size, (int)device, core.last_error());
    size_t device_free = 0, device_total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
    }
    if (history_on_.load(std::memory_order_relaxed))
      record(device, TraceEntry::OOM, device_free, size, stream, gather(alloc::RecordContext::STATE));
    std::vector<alloc::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mu_);
      observers = oom_observers_;
    }
    for (const auto& observer : observers) observer(device, size, device_total, device_free); // no lock held
    TORCH_CHECK_WITH(OutOfMemoryError, false, summary);
  }

  std::shared_ptr<c10::GatheredContext> gather(alloc::RecordContext level) {
    alloc::CreateContextFn recorder;
    {
      std::lock_guard<std::mutex> lock(history_mu_);
      if (when_ < level) return nullptr;
      recorder = recorder_;
    }
    return recorder ? recorder() : nullptr;
  }

  void record(DeviceIndex device, TraceEntry::Action action, size_t addr, size_t size, void* stream,
              std::shared_ptr<c10::GatheredContext> context) {
    std::lock_guard<std::mutex> lock(history_mu_);
    if (device < 0 || device >= kMaxDevices) return;
    TraceEntry entry(action, device, addr, size, stream, {0, 0}, 0,
                     when_ >= alloc::RecordContext::ALLOC ? std::move(context) : nullptr);
    entry.time_.t_ = (time_t)now_us();
    for (const auto& tracker : trackers_) tracker(entry);
    auto& h = history_[device];
    h.push_back(std::move(entry));
    while (h.size() > max_entries_) h.pop_front();
  }

  void note_alloc(void* p, size_t size, DeviceIndex device, cudaStream_t stream,
                  std::shared_ptr<c10::GatheredContext> context) {
    record(device, TraceEntry::ALLOC, reinterpret_cast<size_t>(p), size, stream, context);
    std::lock_guard<std::mutex> lock(history_mu_);
    live_contexts_[p] = {std::move(context), size, stream, device};
  }

  void note_free(void* ptr) {
    LiveContext live;
    {
      std::lock_guard<std::mutex> lock(history_mu_);
      auto it = live_contexts_.find(ptr);
      if (it == live_contexts_.end()) return; // allocated before the history began
      live = std::move(it->second);
      live_contexts_.erase(it);
    }
    auto context = gather(alloc::RecordContext::ALL);
    record(live.device, TraceEntry::FREE_REQUESTED, reinterpret_cast<size_t>(ptr), live.size, live.stream, context);
    record(live.device, TraceEntry::FREE_COMPLETED, reinterpret_cast<size_t>(ptr), live.size, live.stream, context);
  }

  std::shared_ptr<c10::GatheredContext> context_for(const torchalloc_block_info& b) {
    {
      std::lock_guard<std::mutex> lock(history_mu_);
      auto it = live_contexts_.find(reinterpret_cast<void*>(b.addr));
      if (it != live_contexts_.end() && it->second.context) return it->second.context;
    }
    return context_of_core_stack(b.stack);
  }

  template <typename F>
  void for_each_block(int device, F&& visit) {
    std::vector<torchalloc_segment_info> segs(64);
    std::vector<torchalloc_block_info> blocks(1024);
    size_t nsegs = 0, nblocks = 0;
    for (;;) {
      int rc = core.snapshot(device, segs.data(), segs.size(), blocks.data(), blocks.size(), &nsegs, &nblocks);
      TORCH_CHECK(rc >= 0, "torchalloc: ", core.last_error());
      if (rc == 0) break;
      segs.resize(nsegs + nsegs / 4 + 16); // it may grow between the calls
      blocks.resize(nblocks + nblocks / 4 + 64);
    }
    for (size_t s = 0; s < nsegs; s++)
      for (uint32_t k = 0; k < segs[s].nblocks; k++) visit(segs[s], blocks[segs[s].first_block + k]);
  }

  std::mutex routes_mu_;
  std::vector<Route> routes_[kMaxDevices];
  std::atomic<int> nroutes_[kMaxDevices] = {};

  std::mutex observers_mu_;
  std::vector<alloc::OutOfMemoryObserver> oom_observers_;

  std::mutex history_mu_;
  std::atomic<bool> history_on_{false};
  alloc::CreateContextFn recorder_ = nullptr;
  alloc::RecordContext when_ = alloc::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::deque<TraceEntry> history_[kMaxDevices];
  std::unordered_map<void*, LiveContext> live_contexts_;
  std::vector<alloc::AllocatorTraceTracker> trackers_;
};

std::shared_ptr<Bridge> installed;

void bridge_delete(void* ptr) {
  if (installed) installed->free_block(ptr);
  else core.free_ptr(ptr);
}

void segment_observer(void* ctx, int device, int event, uint64_t addr, uint64_t size, uint64_t stream) {
  static_cast<Bridge*>(ctx)->note_segment(device, event, addr, size, stream);
}

} // namespace

// ---------------------------------------------------------------------------
// The one entry point, called through ctypes by torchalloc.install().
// ---------------------------------------------------------------------------

extern "C" __attribute__((visibility("default"))) int torchalloc_bridge_install(const char* core_path, char* err,
                                                                                 size_t errlen) {
  try {
    std::string why;
    if (!load_core(core_path, why)) {
      snprintf(err, errlen, "%s", why.c_str());
      return -1;
    }
    if (installed) return 0;
    auto bridge = std::make_shared<Bridge>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(bridge); // throws once CUDA is initialised
    // changeCurrentAllocator swaps CUDACachingAllocator::get() only: c10::GetAllocator(kCUDA), which the
    // device-generic API asks (torch.accelerator.memory_stats() and friends), still names PyTorch's own,
    // never initialised. Registered over it, every CUDA allocator lookup finds the bridge.
    c10::SetAllocator(c10::DeviceType::CUDA, bridge.get(), /*priority=*/UINT8_MAX);
    installed = bridge;
    core.set_segment_observer(&segment_observer, bridge.get());
    if (!core_unwinder) {
      core_unwinder = new CoreStackUnwinder(); // PyTorch keeps unwinders for the life of the process
      torch::CapturedTraceback::addPythonUnwinder(core_unwinder);
    }
    return 0;
  } catch (const std::exception& e) {
    snprintf(err, errlen, "%s", e.what());
    return -1;
  }
}

// The torch version the bridge was compiled against ("2.11.0+cu130"), so a
// cached build is never loaded into another torch.
extern "C" __attribute__((visibility("default"))) const char* torchalloc_bridge_torch_version(void) {
  return TORCHALLOC_BRIDGE_TORCH_VERSION;
}
