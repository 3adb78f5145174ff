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
// Python package already loaded, so both share one state (bridge_core.h).
// Beside this file, one job each: bridge_history.h (the memory history of
// _record_memory_history), bridge_foreign.h (a MemPool's own allocator,
// requests while caching is disabled, the profiler's blocks). Entry point:
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
#include "bridge_core.h"
#include "bridge_foreign.h"
#include "bridge_history.h"

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::cuda::MempoolId_t;
using alloc::TraceEntry;

// ---------------------------------------------------------------------------
// The allocator
// ---------------------------------------------------------------------------

void bridge_delete(void* ptr);

struct Route {
  MempoolId_t pool;
  std::function<bool(cudaStream_t)> filter;
};

// PyTorch's own limit, checked before any allocator is asked.
constexpr size_t kOneExaByte = (size_t)1 << 60;

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
  // torch.cuda.caching_allocator_enable(False): as PyTorch's allocator,
  // every request is a cudaMalloc of its own, freed with cudaFree, outside
  // the allocator's stats (torchalloc neither sees nor logs it).
  void enable(bool value) override { caching_.store(value); }
  bool isEnabled() const override { return caching_.load(); }
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
    if (uncached_.any() && uncached_.free(ptr)) return;
    if (profiled_.any()) report_free_to_profiler(ptr);
    if (history_.on()) history_.note_free(ptr);
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
    // The segments released now are the call's: their history records get its context.
    if (history_.on()) History::segment_context = history_.gather(alloc::RecordContext::ALL);
    if (pool.first == 0 && pool.second == 0) core.empty_cache(-1);
    else
      for (int d = 0; d < core.device_count(); d++) core.pool_empty(d, pool.first, pool.second);
    History::segment_context = nullptr;
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
    if (!allocator) {
      TORCH_CHECK(core.pool_retain(device, pool.first, pool.second) > 0, "torchalloc: ", core.last_error());
      return;
    }
    auto* held = new PoolSource{std::move(allocator)};
    torchalloc_pool_source source{&PoolSource::alloc, &PoolSource::free, &PoolSource::release, held};
    if (core.pool_create(device, pool.first, pool.second, &source) > 0) return; // the core owns `held` now
    delete held;
    TORCH_CHECK(false, "torchalloc: ", core.last_error());
  }
  void setUseOnOOM(DeviceIndex device, MempoolId_t pool, bool use_on_oom) override {
    set_pool_flag(device, pool, TORCHALLOC_POOL_USE_ON_OOM, use_on_oom);
  }
  void setNoSplit(DeviceIndex device, MempoolId_t pool) override {
    set_pool_flag(device, pool, TORCHALLOC_POOL_NO_SPLIT, true);
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
    if (include_traces) history_.fill(out, ndev);
    out.config_metadata.last_allocator_settings = std::string("torchalloc policy ") + core.policy_name();
    out.config_metadata.max_split_size = SIZE_MAX;
    return out;
  }

  void recordHistory(bool enabled, alloc::CreateContextFn recorder, size_t max_entries,
                     alloc::RecordContext when, bool clear, const std::vector<std::string>& skip_actions) override {
    history_.configure(enabled, recorder, max_entries, when, clear, skip_actions);
  }
  bool isHistoryEnabled() override { return history_.on(); }
  void pushCompileContext(std::string& md) override { history_.push_compile_context(md); }
  void popCompileContext() override { history_.pop_compile_context(); }
  void setUserMetadata(const std::string& md) override { history_.set_user_metadata(md); }
  std::string getUserMetadata() override { return history_.user_metadata(); }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    history_.annotate(md, core.device_count());
  }

  void attachOutOfMemoryObserver(alloc::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(alloc::AllocatorTraceTracker tracker) override {
    history_.attach(std::move(tracker));
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
    if (!history_.on()) return;
    auto action = event == TORCHALLOC_SEGMENT_ALLOC ? TraceEntry::SEGMENT_ALLOC : TraceEntry::SEGMENT_FREE;
    history_.record((DeviceIndex)device, action, addr, size, reinterpret_cast<void*>(stream),
                    History::segment_context);
  }

 private:
  void set_pool_flag(DeviceIndex device, MempoolId_t pool, unsigned flag, bool on) {
    TORCH_CHECK(core.pool_flags(device, pool.first, pool.second, on ? flag : 0, on ? 0 : flag) >= 0, "torchalloc: ",
                core.last_error());
  }

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
    TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte, "CUDA out of memory. Tried to allocate more than 1EB memory.");
    if (!caching_.load(std::memory_order_relaxed)) return uncached_.alloc(size, device);
    std::shared_ptr<c10::GatheredContext> context; // gathered before the core's lock: it takes the GIL
    bool recording = history_.on();
    if (recording) History::segment_context = context = history_.gather(alloc::RecordContext::STATE);
    MempoolId_t pool{0, 0};
    bool routed = routed_pool(device, stream, &pool);
    auto attempt = [&] {
      return routed ? core.pool_malloc(size, device, stream, pool.first, pool.second) : core.try_malloc(size, device, stream);
    };
    void* p = attempt();
    if (!p && free_memory_callbacks()) p = attempt(); // e.g. memory other processes have closed (CUDA IPC)
    if (recording) History::segment_context = nullptr; // the hot path touches no thread-local without history
    if (!p) raise_oom(size, device, stream);
    if (history_.on()) history_.note_alloc(p, size, device, stream, std::move(context));
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      profiled_.add(p, size, device);
      report_to_profiler(p, (int64_t)size, device);
    }
    return p;
  }

  // torch.profiler(profile_memory=True): told of every block as PyTorch's allocator tells it.
  void report_free_to_profiler(void* p) {
    std::pair<size_t, DeviceIndex> block;
    if (profiled_.take(p, &block) && c10::memoryProfilingEnabled())
      report_to_profiler(p, -(int64_t)block.first, block.second);
  }
  static void report_to_profiler(void* p, int64_t delta, DeviceIndex device) {
    torchalloc_stats s{};
    core.get_stats(device, &s);
    c10::reportMemoryUsageToProfiler(p, delta, (size_t)s.allocated_bytes[0].current,
                                     (size_t)s.reserved_bytes[0].current, c10::Device(c10::DeviceType::CUDA, device));
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
    size_t device_free = 0, device_total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
    }
    char summary[8192] = ""; // the C summary with its advice lines fits in 6 KiB (TA_OOM_SUMMARY_MAX)
    std::string head = "CUDA out of memory. Tried to allocate " + format_size(size) + ". GPU " +
                       std::to_string(device) + " has a total capacity of " + format_size(device_total) +
                       " of which " + format_size(device_free) + " is free.";
    if (size > TORCHALLOC_MAX_REQUEST) // refused before any policy saw it: the last summary is another failure's
      snprintf(summary, sizeof summary, "%s torchalloc refuses requests over %s: no device has that much memory.",
               head.c_str(), format_size(TORCHALLOC_MAX_REQUEST).c_str());
    else if (core.oom_summary(device, summary, sizeof summary) <= 0)
      snprintf(summary, sizeof summary, "%s torchalloc could not allocate it: %s", head.c_str(), core.last_error());
    if (history_.on())
      history_.record(device, TraceEntry::OOM, device_free, size, stream, history_.gather(alloc::RecordContext::STATE));
    std::vector<alloc::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mu_);
      observers = oom_observers_;
    }
    for (const auto& observer : observers) observer(device, size, device_total, device_free); // no lock held
    TORCH_CHECK_WITH(OutOfMemoryError, false, summary);
  }

  // A live block's context in a snapshot: what the history gathered at its
  // allocation, else the core's own stack (stacks:1) unless the history was
  // asked to record none (context=None).
  std::shared_ptr<c10::GatheredContext> context_for(const torchalloc_block_info& b) {
    if (auto context = history_.live_context(reinterpret_cast<void*>(b.addr))) return context;
    return history_.contexts_off() ? nullptr : context_of_core_stack(b.stack);
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

  History history_;

  std::atomic<bool> caching_{true};
  Uncached uncached_;
  ProfiledBlocks profiled_;
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
