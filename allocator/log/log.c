/* The block log's records (log.h): what each kind carries is in
 * docs/LOG_FORMAT.md, "Event records". */
#include "log/log.h"

#include <stdatomic.h>

#include "log/log_intern.h"

_Thread_local uint32_t ta_log_call_stack;

/* The devices whose DEVICE record the open file holds (the record's
 * device field is an int8_t: 128 of them). */
static atomic_uchar device_told[128];

int ta_log_open(const char *pattern, size_t max_bytes, char *err, size_t errlen) {
  ta_log_close(); /* the new file starts with no interned ids */
  for (size_t i = 0; i < sizeof device_told; i++) atomic_store(&device_told[i], 0);
  return ta_log_file_open(pattern, max_bytes, err, errlen);
}

int ta_log_device_untold(int device) {
  return device >= 0 && (size_t)device < sizeof device_told && !atomic_exchange(&device_told[device], 1);
}

void ta_log_device(int device, size_t total, size_t limit) {
  ta_log_record r = {.addr = total, .size = limit, .device = (int8_t)device, .kind = TA_LOG_DEVICE};
  ta_log_write(&r);
}

void ta_log_close(void) {
  ta_log_file_close();
  ta_log_lock();
  ta_log_intern_reset();
  ta_log_unlock();
}

/* Fills the fields alloc and free share, and returns the XOR of the words
 * they and the rest of the record occupy (the checksum's share, log_file.h). */
static inline uint64_t block_fields(ta_log_record *s, int device, const ta_block *b, uint32_t stack, uint16_t phase,
                                    uint8_t flags) {
  uintptr_t stream = (uintptr_t)b->stream;
  uint8_t pool = b->segment->pool;
  s->addr = b->addr;
  s->size = b->requested;
  s->block_size = b->size;
  s->stream = stream;
  s->stack = stack;
  s->phase = phase;
  s->device = (int8_t)device;
  s->policy = b->policy;
  s->pool = pool;
  s->flags = flags;
  return b->addr ^ b->requested ^ b->size ^ stream ^ (uint64_t)stack << 32 ^
         ta_log_tail_word(phase, (int8_t)device, b->policy, pool, flags, 0);
}

void ta_log_alloc(int device, ta_block *b) {
  b->stack_id = ta_log_call_stack;
  uint64_t sum;
  ta_log_record *s = ta_log_begin(&sum);
  if (ta_unlikely(!s)) return;
  sum ^= block_fields(s, device, b, b->stack_id, b->phase, 0);
  ta_log_end(s, sum, TA_LOG_ALLOC);
}

void ta_log_free(int device, const ta_block *b, int phase, uint8_t flags) {
  uint64_t sum;
  ta_log_record *s = ta_log_begin(&sum);
  if (ta_unlikely(!s)) return;
  sum ^= block_fields(s, device, b, ta_log_call_stack, (uint16_t)phase, flags);
  ta_log_end(s, sum, TA_LOG_FREE);
}

void ta_log_segment(uint8_t kind, int device, const ta_segment *s, uintptr_t addr, size_t size, int phase,
                    uint8_t flags) {
  ta_log_record r = {.addr = addr, .size = size, .block_size = size, .stream = (uintptr_t)s->stream,
                     .phase = (uint16_t)phase, .device = (int8_t)device, .policy = s->policy, .pool = s->pool,
                     .flags = flags, .kind = kind};
  ta_log_write(&r);
}

void ta_log_oom(int device, const torchalloc_oom_facts *f, cudaStream_t stream, int phase, int verdict,
                size_t granule) {
  ta_log_record r = {.addr = f->device_free, .size = f->requested, .block_size = f->reserved,
                     .stream = (uintptr_t)stream, .stack = ta_log_call_stack, .phase = (uint16_t)phase,
                     .device = (int8_t)device, .kind = TA_LOG_OOM};
  ta_log_write(&r);
  ta_log_record d = {.addr = f->device_total, .size = f->limit, .block_size = f->allocated,
                     .stream = f->largest_free, .stack = (uint32_t)granule, .phase = (uint16_t)phase,
                     .device = (int8_t)device, .flags = (uint8_t)verdict, .kind = TA_LOG_OOM_DEVICE};
  ta_log_write(&d);
}

void ta_log_trim(int device, size_t released, int phase, uint8_t reason) {
  ta_log_record r = {.size = released, .phase = (uint16_t)phase, .device = (int8_t)device, .flags = reason,
                     .kind = TA_LOG_TRIM};
  ta_log_write(&r);
}

void ta_log_phase(uint8_t kind, int phase, uint32_t epoch, const char *name) {
  if (!ta_log_on()) return;
  ta_log_record r = {.size = epoch, .phase = (uint16_t)phase, .device = -1, .kind = kind};
  ta_log_write_labelled(&r, name);
}

void ta_log_marker(const char *label, int phase) {
  if (!ta_log_on()) return;
  ta_log_record r = {.phase = (uint16_t)phase, .device = -1, .kind = TA_LOG_MARKER};
  ta_log_write_labelled(&r, label);
}

/* Module records carry no device: a module runs on behalf of every device,
 * like a phase, and the reader applies a MODULE to every ALLOC after it in
 * slot order (the order fetch_add gave, consistent with every thread's). */
void ta_log_module(uint32_t id, int phase) {
  if (!ta_log_on()) return;
  ta_log_record r = {.size = id, .phase = (uint16_t)phase, .device = -1, .kind = TA_LOG_MODULE};
  ta_log_write_unlocked(&r);
}

void ta_log_module_name(uint32_t id, const char *path) {
  if (!ta_log_on()) return;
  ta_log_record r = {.size = id, .device = -1, .kind = TA_LOG_MODULE_NAME};
  ta_log_write_labelled(&r, path);
}

void ta_log_module_tag(uintptr_t addr, uint32_t id, uint8_t role, int phase) {
  if (!ta_log_on()) return;
  ta_log_record r = {.addr = addr, .size = id, .phase = (uint16_t)phase, .device = -1, .flags = role,
                     .kind = TA_LOG_MODULE_TAG};
  ta_log_write_unlocked(&r);
}
