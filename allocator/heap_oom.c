/* Out of memory (heap.h): what the heap looked like when a request failed,
 * and the summary every route shows (the bridge's OutOfMemoryError, the
 * plain route's last words, stderr). */
#include <inttypes.h>
#include <stdio.h>

#include "heap.h"
#include "text.h"

void ta_heap_note_oom(ta_heap *h, ta_policy *policy, size_t size, cudaStream_t stream, int phase) {
  ta_oom_info *o = &h->oom;
  ta_backend *backend = h->seg.backend;
  o->count++;
  o->requested = size;
  o->stream = (uintptr_t)stream;
  o->device_free = o->device_total = 0;
  backend->ops->mem_info(backend, h->device, &o->device_free, &o->device_total);
  o->limit = h->seg.limit;
  o->reserved = ta_stat_total(h->stats.reserved_bytes);
  o->allocated = ta_stat_total(h->stats.allocated_bytes);
  o->largest_free = o->largest_free_stream = 0;
  const ta_segment_registry *r = &h->seg.registry;
  for (size_t i = 0; i < r->count; i++)
    for (const ta_block *b = r->items[i]->first; b; b = b->next) {
      if (b->state != TA_BLOCK_FREE) continue;
      if (b->size > o->largest_free) o->largest_free = b->size;
      if (b->stream == stream && b->size > o->largest_free_stream) o->largest_free_stream = b->size;
    }
  o->phase = phase;
  o->routing = h->routing;
  o->policy = policy->id;
}

int ta_heap_format_oom(const ta_oom_info *o, int device, char *buf, size_t len) {
  int64_t cached = o->reserved - o->allocated;
  char limit[96] = "";
  if (o->limit)
    snprintf(limit, sizeof limit, " The memory fraction caps torchalloc at %s.", ta_format_size(o->limit).text);
  return snprintf(buf, len,
                  "CUDA out of memory. Tried to allocate %s on device %d (stream %#" PRIxPTR
                  ", torchalloc policy %s). The device has %s in total, of which %s is free.%s torchalloc "
                  "reserves %s: %s allocated to tensors and %s cached but free; the largest free cached block is "
                  "%s (%s on this stream).%s",
                  ta_format_size(o->requested).text, device, o->stream, ta_policy_by_id(o->policy)->name,
                  ta_format_size(o->device_total).text, ta_format_size(o->device_free).text, limit,
                  ta_format_size((uint64_t)o->reserved).text, ta_format_size((uint64_t)o->allocated).text,
                  ta_format_size((uint64_t)(cached > 0 ? cached : 0)).text, ta_format_size(o->largest_free).text,
                  ta_format_size(o->largest_free_stream).text,
                  o->routing ? " A CUDA graph capture or MemPool context was open, so cached memory could not be "
                               "released and retried."
                             : "");
}

void ta_heap_print_oom(ta_heap *h) {
  char text[1024];
  ta_heap_format_oom(&h->oom, h->device, text, sizeof text);
  fprintf(stderr, "torchalloc: %s\n", text);
}
