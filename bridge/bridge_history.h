// The memory history of torch.cuda.memory._record_memory_history, kept by
// the bridge as PyTorch's allocator keeps it: TraceEntry records with the
// contexts PyTorch's recorder gathered, the compile context and user
// metadata of the moment, the external annotations, and the actions the
// caller asked to skip. Included once, by torchalloc_bridge.cpp, after
// PyTorch's headers; nothing here calls the C core.
#pragma once

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using alloc::TraceEntry;

constexpr int kMaxHistoryDevices = 64;

inline uint64_t now_us() {
  using namespace std::chrono;
  return (uint64_t)duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// The action names PyTorch's snapshot uses (and skip_actions takes).
inline bool action_named(const std::string& name, TraceEntry::Action* action) {
  static const std::pair<const char*, TraceEntry::Action> names[] = {
      {"alloc", TraceEntry::ALLOC},           {"free_requested", TraceEntry::FREE_REQUESTED},
      {"free_completed", TraceEntry::FREE_COMPLETED}, {"segment_alloc", TraceEntry::SEGMENT_ALLOC},
      {"segment_free", TraceEntry::SEGMENT_FREE},     {"segment_map", TraceEntry::SEGMENT_MAP},
      {"segment_unmap", TraceEntry::SEGMENT_UNMAP},   {"snapshot", TraceEntry::SNAPSHOT},
      {"oom", TraceEntry::OOM}};
  for (const auto& [n, a] : names)
    if (name == n) {
      *action = a;
      return true;
    }
  return false;
}

class History {
 public:
  struct Live {
    std::shared_ptr<c10::GatheredContext> context;
    size_t size;
    cudaStream_t stream;
    DeviceIndex device;
  };

  // The context of the call that made the core allocate or release device
  // memory (an allocation, empty_cache): the core reports those segment
  // events under its lock, on this thread, where nothing may take the GIL.
  static inline thread_local std::shared_ptr<c10::GatheredContext> segment_context;

  void configure(bool enabled, alloc::CreateContextFn recorder, size_t max_entries, alloc::RecordContext when,
                 bool clear, const std::vector<std::string>& skip_actions) {
    std::lock_guard<std::mutex> lock(mu_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : alloc::RecordContext::NEVER;
    max_entries_ = std::max<size_t>(max_entries, 1);
    skip_ = 0;
    for (const auto& name : skip_actions) {
      TraceEntry::Action action;
      TORCH_CHECK(action_named(name, &action), "torchalloc: unknown action '", name, "' in skip_actions");
      skip_ |= 1u << action;
    }
    if (!enabled || clear) {
      for (auto& h : traces_) h.clear();
      for (auto& a : annotations_) a.clear();
      live_.clear();
    }
    on_.store(enabled);
  }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // History is on but records no context: snapshot blocks get none either.
  bool contexts_off() {
    std::lock_guard<std::mutex> lock(mu_);
    return on() && when_ == alloc::RecordContext::NEVER;
  }

  // PyTorch's recorder, when the history asks for contexts at `level` (it may
  // take the GIL: never call it under the core's lock).
  std::shared_ptr<c10::GatheredContext> gather(alloc::RecordContext level) {
    alloc::CreateContextFn recorder;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (when_ < level) return nullptr;
      recorder = recorder_;
    }
    return recorder ? recorder() : nullptr;
  }

  void record(DeviceIndex device, TraceEntry::Action action, size_t addr, size_t size, void* stream,
              std::shared_ptr<c10::GatheredContext> context) {
    std::lock_guard<std::mutex> lock(mu_);
    if (device < 0 || device >= kMaxHistoryDevices || (skip_ & (1u << action))) return;
    TraceEntry entry(action, device, addr, size, stream, {0, 0}, 0,
                     when_ >= alloc::RecordContext::ALLOC ? std::move(context) : nullptr,
                     compile_contexts_.empty() ? "N/A" : compile_contexts_.back(), user_metadata_);
    entry.time_.t_ = (time_t)now_us();
    for (const auto& tracker : trackers_) tracker(entry);
    auto& h = traces_[device];
    h.push_back(std::move(entry));
    while (h.size() > max_entries_) h.pop_front();
  }

  void note_alloc(void* p, size_t size, DeviceIndex device, cudaStream_t stream,
                  std::shared_ptr<c10::GatheredContext> context) {
    record(device, TraceEntry::ALLOC, reinterpret_cast<size_t>(p), size, stream, context);
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = {std::move(context), size, stream, device};
  }

  void note_free(void* ptr) {
    Live live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return; // allocated before the history began
      live = std::move(it->second);
      live_.erase(it);
    }
    auto context = gather(alloc::RecordContext::ALL);
    record(live.device, TraceEntry::FREE_REQUESTED, reinterpret_cast<size_t>(ptr), live.size, live.stream, context);
    record(live.device, TraceEntry::FREE_COMPLETED, reinterpret_cast<size_t>(ptr), live.size, live.stream, context);
  }

  std::shared_ptr<c10::GatheredContext> live_context(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    return it == live_.end() ? nullptr : it->second.context;
  }

  void attach(alloc::AllocatorTraceTracker tracker) {
    std::lock_guard<std::mutex> lock(mu_);
    trackers_.push_back(std::move(tracker));
  }

  // torch.compile's regions ("Torch-Compiled Region: 0/0") and
  // torch.cuda.memory._set_memory_metadata: what every record made while
  // they are current carries.
  void push_compile_context(const std::string& md) {
    std::lock_guard<std::mutex> lock(mu_);
    compile_contexts_.push_back(md);
  }
  void pop_compile_context() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!compile_contexts_.empty()) compile_contexts_.pop_back();
  }
  void set_user_metadata(const std::string& md) {
    std::lock_guard<std::mutex> lock(mu_);
    user_metadata_ = md;
  }
  std::string user_metadata() {
    std::lock_guard<std::mutex> lock(mu_);
    return user_metadata_;
  }

  // An annotation of the run (record_function ranges, with
  // global_record_annotations): kept for every device while the history is on.
  void annotate(const std::vector<std::pair<std::string, std::string>>& md, int ndevices) {
    if (!on()) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (int d = 0; d < ndevices && d < kMaxHistoryDevices; d++) {
      c10::CachingDeviceAllocator::AnnotationEntry entry((DeviceIndex)d, 0);
      entry.time_.t_ = (time_t)now_us();
      for (const auto& [name, value] : md) entry.recordUserMetadata(name, value);
      annotations_[d].push_back(std::move(entry));
      while (annotations_[d].size() > max_entries_) annotations_[d].pop_front();
    }
  }

  // The traces and annotations of devices [0, ndevices) into a snapshot.
  void fill(alloc::SnapshotInfo& out, int ndevices) {
    std::lock_guard<std::mutex> lock(mu_);
    out.device_traces.resize(ndevices);
    for (int d = 0; d < ndevices && d < kMaxHistoryDevices; d++) {
      out.device_traces[d].assign(traces_[d].begin(), traces_[d].end());
      out.external_annotations.insert(out.external_annotations.end(), annotations_[d].begin(),
                                      annotations_[d].end());
    }
  }

 private:
  std::mutex mu_;
  std::atomic<bool> on_{false};
  alloc::CreateContextFn recorder_ = nullptr;
  alloc::RecordContext when_ = alloc::RecordContext::NEVER;
  size_t max_entries_ = 1;
  unsigned skip_ = 0; // bit a: TraceEntry::Action a is not recorded
  std::deque<TraceEntry> traces_[kMaxHistoryDevices];
  std::deque<c10::CachingDeviceAllocator::AnnotationEntry> annotations_[kMaxHistoryDevices];
  std::unordered_map<void*, Live> live_;
  std::vector<alloc::AllocatorTraceTracker> trackers_;
  std::vector<std::string> compile_contexts_;
  std::string user_metadata_;
};

} // namespace
