// The C core as the bridge reaches it: its public functions, found by dlsym
// in the copy of libtorchalloc.so the Python package loaded (one shared
// state), and its interned stacks turned into the Python frames of PyTorch's
// snapshots. Included once, by torchalloc_bridge.cpp, after PyTorch's headers.
#pragma once

namespace {

// ---------------------------------------------------------------------------
// The C core, found in the library the Python package loaded.
// ---------------------------------------------------------------------------

#define TA_CORE_FUNCTIONS(X)                                                                                      \
  X(try_malloc) X(pool_malloc) X(free_ptr) X(get_stats) X(reset_peak_stats) X(reset_accumulated_stats)           \
  X(empty_cache) X(pool_empty) X(largest_cached_block) X(set_memory_fraction) X(get_memory_fraction)             \
  X(record_stream) X(init_devices) X(device_count) X(pool_retain) X(pool_release) X(pool_use_count)               \
  X(pool_live_blocks) X(pool_restore) X(routing_begin) X(routing_end) X(snapshot) X(segment_of) X(stack_frames)   \
  X(oom_summary) X(set_segment_observer) X(last_error) X(policy_name) X(enable_peer_access) X(ipc_share)         \
  X(ipc_open) X(ipc_close) X(pool_create) X(pool_flags)

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

} // namespace
