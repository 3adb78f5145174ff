// Memory the bridge hands PyTorch without taking it from the device through
// the core: a MemPool's own allocator (torch.cuda.MemPool(allocator=...)),
// whose segments the core still carves, counts and logs; and requests made
// while PyTorch's caching is disabled (torch.cuda.caching_allocator_enable(
// False)), each a cudaMalloc of its own as under PyTorch's allocator. Also
// the blocks told to torch.profiler. Included once, by torchalloc_bridge.cpp,
// after PyTorch's headers.
#pragma once

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;

std::string format_size(uint64_t bytes) { // as PyTorch's messages write sizes
  char text[64];
  if (bytes <= 1024) snprintf(text, sizeof text, "%llu bytes", (unsigned long long)bytes);
  else if (bytes <= (1ull << 20)) snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
  else if (bytes <= (1ull << 30)) snprintf(text, sizeof text, "%.2f MiB", bytes / 1048576.0);
  else snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  return text;
}

// A MemPool's own allocator (torch.cuda.MemPool(allocator=...)), held
// until the core says the pool and its last segment are gone: PyTorch's
// pools keep theirs alive as long as a tensor of theirs lives.
struct PoolSource {
  std::shared_ptr<alloc::CUDAAllocator> allocator;

  // The core calls these under its lock: nothing here may reach torchalloc.
  static void* alloc(void* ctx, size_t size, int device, cudaStream_t stream) {
    try {
      c10::cuda::CUDAGuard guard((DeviceIndex)device);
      return static_cast<PoolSource*>(ctx)->allocator->raw_alloc_with_stream(size, stream);
    } catch (const std::exception& e) { // the request fails as out of memory, with this reason beside it
      TORCH_WARN("torchalloc: the MemPool's allocator could not allocate ", size, " bytes: ", e.what());
      return nullptr;
    }
  }
  static void free(void* ctx, void* ptr, size_t, int device, cudaStream_t) {
    try {
      c10::cuda::CUDAGuard guard((DeviceIndex)device);
      static_cast<PoolSource*>(ctx)->allocator->raw_delete(ptr);
    } catch (const std::exception& e) {
      TORCH_WARN("torchalloc: the MemPool's allocator could not free ", ptr, ": ", e.what());
    }
  }
  static void release(void* ctx) { delete static_cast<PoolSource*>(ctx); }
};

// Allocations made while caching is disabled: cudaMalloc and cudaFree,
// outside torchalloc's stats and log, as PyTorch's allocator does then.
class Uncached {
 public:
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }
  void* alloc(size_t size, DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) (void)cudaGetLastError();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", format_size(size), ". GPU ",
                       (int)device, " has a total capacity of ", format_size(total), " of which ",
                       format_size(free_bytes), " is free. The caching allocator is disabled "
                       "(torch.cuda.caching_allocator_enable(False)): cudaMalloc refused the request.");
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[p] = device;
    count_.fetch_add(1);
    return p;
  }
  // True when `p` was one of these (freed now).
  bool free(void* p) {
    DeviceIndex device;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(p);
      if (it == blocks_.end()) return false;
      device = it->second;
      blocks_.erase(it);
    }
    count_.fetch_sub(1);
    c10::cuda::CUDAGuard guard(device);
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError(); // a deleter must not throw
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<void*, DeviceIndex> blocks_;
  std::atomic<int64_t> count_{0};
};

// The blocks told to torch.profiler (profile_memory=True) as allocated, so
// that their frees are told with their size.
class ProfiledBlocks {
 public:
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }
  void add(void* p, size_t size, DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (blocks_.emplace(p, std::make_pair(size, device)).second) count_.fetch_add(1);
  }
  bool take(void* p, std::pair<size_t, DeviceIndex>* block) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return false; // allocated while no profiler listened
    *block = it->second;
    blocks_.erase(it);
    count_.fetch_sub(1);
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<void*, std::pair<size_t, DeviceIndex>> blocks_;
  std::atomic<int64_t> count_{0};
};

} // namespace
