/* Public module functions (torchalloc.h, "Modules"): each is one log record,
 * written without the heap lock; the allocation path never looks at modules
 * (the reader attributes an ALLOC to the last MODULE before it). */
#include "base/errors.h"
#include "context/phase.h"
#include "log/log.h"
#include "log/log_format.h"

TORCHALLOC_API int torchalloc_module_name(uint32_t id, const char *path) {
  if (!path || id == 0) {
    ta_set_error("a module name needs an id above 0 and a path, got id %u and %s", id, path ? "a path" : "NULL");
    return -1;
  }
  ta_log_module_name(id, path);
  return 0;
}

TORCHALLOC_API void torchalloc_module_set(uint32_t id) { ta_log_module(id, ta_phase_current()); }

TORCHALLOC_API int torchalloc_module_tag(const void *ptr, uint32_t id, int role) {
  if (role < TA_LOG_TAG_PARAMETER || role > TA_LOG_TAG_OPTIMIZER_STATE) {
    ta_set_error("module tag role must be 1 (parameter), 2 (gradient) or 3 (optimizer state), got %d", role);
    return -1;
  }
  ta_log_module_tag((uintptr_t)ptr, id, (uint8_t)role, ta_phase_current());
  return 0;
}
