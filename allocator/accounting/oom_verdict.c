/* The OOM verdict (oom_verdict.h).
 *
 * Let need = allocated + requested: the live tensors plus this request, the
 * least any allocator would have to hold. What torchalloc could have used
 * is the device minus what others hold on it (held = total - free -
 * reserved: other processes, other allocators, the CUDA context), capped
 * by the memory fraction. Then:
 *   - capacity:      need > total. Live tensors alone exceed the device; no
 *                    allocator could have served this. Shrink what lives.
 *   - held elsewhere: need <= total but need > what torchalloc could use.
 *                    Another process, another allocator or a memory
 *                    fraction took the room.
 *   - fragmentation: need <= what torchalloc could use. The bytes were
 *                    there, cached but split between live blocks (or on
 *                    another stream, or in another pool).
 * A log from an older torchalloc has no device numbers: then free bytes
 * inside reserved memory that cover the request mean fragmentation, and
 * otherwise capacity is the best guess (the report says it could not know). */
#include "accounting/oom_verdict.h"

int ta_oom_verdict(const torchalloc_oom_facts *f) {
  uint64_t need = f->allocated + f->requested;
  if (f->device_total == 0) /* unknown device */
    return f->reserved >= f->allocated + f->requested ? TORCHALLOC_OOM_FRAGMENTATION : TORCHALLOC_OOM_CAPACITY;
  if (need > f->device_total) return TORCHALLOC_OOM_CAPACITY;
  uint64_t used_by_us_or_free = f->device_free + f->reserved;
  uint64_t usable = used_by_us_or_free < f->device_total ? used_by_us_or_free : f->device_total;
  if (f->limit && f->limit < usable) usable = f->limit;
  return need > usable ? TORCHALLOC_OOM_HELD_ELSEWHERE : TORCHALLOC_OOM_FRAGMENTATION;
}

const char *ta_oom_verdict_name(int verdict) {
  switch (verdict) {
    case TORCHALLOC_OOM_FRAGMENTATION: return "fragmentation";
    case TORCHALLOC_OOM_CAPACITY: return "capacity";
    case TORCHALLOC_OOM_HELD_ELSEWHERE: return "held elsewhere";
    default: return "none";
  }
}

const char *ta_oom_verdict_meaning(int verdict) {
  switch (verdict) {
    case TORCHALLOC_OOM_FRAGMENTATION: return "the memory was there, cached but split between live blocks";
    case TORCHALLOC_OOM_CAPACITY: return "live tensors and this request exceed what the device has";
    case TORCHALLOC_OOM_HELD_ELSEWHERE:
      return "the device's memory is held outside torchalloc (another process, another allocator, the CUDA "
             "context) or capped by a memory fraction";
    default: return "";
  }
}
