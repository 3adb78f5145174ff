/* Interning for the block log: strings, frames and stacks each get an id
 * and are written to the log once, the first time they are seen, as their
 * own record kinds (docs/LOG_FORMAT.md, "Metadata records").
 *
 * One hash table holds all three, keyed by a tag byte and the content;
 * ids share one counter, so an id names one thing in the whole file. The
 * table lives under the log's mutex: interning happens before the heap
 * lock is taken (never under it), and only for rare events or stacks. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/log_intern.h"

enum { TAG_STRING = 'S', TAG_FRAME = 'F', TAG_STACK = 'K' };
#define STRING_CHUNK 46 /* text bytes per STRING slot (byte 62 is the checksum) */
#define STACK_CHUNK 11  /* frame ids per STACK slot */

typedef struct string_slot {
  uint32_t id;
  uint16_t len, chunk;
  uint64_t seq;
  char text[STRING_CHUNK];
  uint8_t checksum; /* ta_log_commit fills it */
  uint8_t kind;
} string_slot;

typedef struct frame_slot {
  uint32_t id, line;
  uint64_t seq;
  uint32_t file, func;
  uint8_t pad[39];
  uint8_t kind;
} frame_slot;

typedef struct stack_slot {
  uint32_t id;
  uint16_t nframes, chunk;
  uint64_t seq;
  uint32_t frames[STACK_CHUNK];
  uint8_t pad[3];
  uint8_t kind;
} stack_slot;

_Static_assert(sizeof(string_slot) == TA_LOG_RECORD_SIZE, "string slot");
_Static_assert(sizeof(frame_slot) == TA_LOG_RECORD_SIZE, "frame slot");
_Static_assert(sizeof(stack_slot) == TA_LOG_RECORD_SIZE, "stack slot");

typedef struct entry {
  uint64_t hash;
  uint32_t id, len; /* len counts the tag byte */
  char *key;        /* tag byte, then the content; NULL: empty slot */
} entry;

/* What id N names, for reading stacks back (torchalloc_stack_frames). */
typedef struct key_ref {
  const char *key; /* tag byte, then the content (owned by the entry) */
  uint32_t len;    /* counts the tag byte */
} key_ref;

/* Bumped whenever the table is forgotten: an id is valid only in the
 * generation it was handed out in (callers that cache ids check it). */
static _Atomic uint64_t generation = 1;

static struct {
  entry *slots;
  size_t cap, count;
  uint32_t next_id;
  key_ref *by_id; /* index id - 1 */
  size_t cap_by_id;
} T;

static uint64_t fnv1a(uint8_t tag, const void *data, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = (h ^ tag) * 0x100000001b3ull;
  for (size_t i = 0; i < len; i++) h = (h ^ ((const uint8_t *)data)[i]) * 0x100000001b3ull;
  return h;
}

static entry *probe(entry *slots, size_t cap, uint64_t hash, uint8_t tag, const void *data, size_t len) {
  for (size_t i = hash & (cap - 1);; i = (i + 1) & (cap - 1)) {
    entry *e = &slots[i];
    if (!e->key) return e;
    if (e->hash == hash && e->len == len + 1 && (uint8_t)e->key[0] == tag && memcmp(e->key + 1, data, len) == 0)
      return e;
  }
}

static int table_grow(void) {
  size_t cap = T.cap ? T.cap * 2 : 1024;
  entry *slots = calloc(cap, sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < T.cap; i++) {
    entry *e = &T.slots[i];
    if (e->key) *probe(slots, cap, e->hash, (uint8_t)e->key[0], e->key + 1, e->len - 1) = *e;
  }
  free(T.slots);
  T.slots = slots;
  T.cap = cap;
  return 0;
}

/* The id of (tag, data), and 1 in *fresh when it is new (the caller then
 * writes its records). 0 when out of host memory. */
static uint32_t intern(uint8_t tag, const void *data, size_t len, int *fresh) {
  *fresh = 0;
  if (2 * (T.count + 1) > T.cap && table_grow()) return 0;
  uint64_t hash = fnv1a(tag, data, len);
  entry *e = probe(T.slots, T.cap, hash, tag, data, len);
  if (e->key) return e->id;
  if (ta_grow(&T.by_id, &T.cap_by_id, T.next_id + 1, 1024)) return 0;
  char *key = malloc(len + 1);
  if (!key) return 0;
  key[0] = (char)tag;
  memcpy(key + 1, data, len);
  *e = (entry){.hash = hash, .id = ++T.next_id, .len = (uint32_t)len + 1, .key = key};
  T.by_id[e->id - 1] = (key_ref){key, (uint32_t)len + 1};
  T.count++;
  *fresh = 1;
  return e->id;
}

void ta_log_intern_reset(void) {
  for (size_t i = 0; i < T.cap; i++) free(T.slots[i].key);
  free(T.slots);
  free(T.by_id);
  memset(&T, 0, sizeof T);
  atomic_fetch_add(&generation, 1);
}

uint64_t ta_log_intern_generation(void) { return atomic_load_explicit(&generation, memory_order_acquire); }

/* ------------------------------------------------------------------------
 * Records (log mutex held)
 * ---------------------------------------------------------------------- */

static uint32_t string_locked(const char *s) {
  size_t len = strlen(s);
  if (len > TA_LOG_STRING_MAX) len = TA_LOG_STRING_MAX;
  int fresh;
  uint32_t id = intern(TAG_STRING, s, len, &fresh);
  if (!fresh) return id;
  uint32_t chunks = len ? (uint32_t)((len + STRING_CHUNK - 1) / STRING_CHUNK) : 1;
  uint64_t seq;
  char *p = ta_log_reserve(chunks, &seq);
  for (uint32_t c = 0; p && c < chunks; c++) {
    string_slot r = {.id = id, .len = (uint16_t)len, .chunk = (uint16_t)c, .seq = seq + c};
    size_t at = (size_t)c * STRING_CHUNK, n = len - at < STRING_CHUNK ? len - at : STRING_CHUNK;
    memcpy(r.text, s + at, n);
    ta_log_commit(p + (size_t)c * TA_LOG_RECORD_SIZE, &r, TA_LOG_STRING);
  }
  return id;
}

static uint32_t frame_locked(const ta_log_frame_text *f) {
  uint32_t key[3] = {string_locked(f->file ? f->file : "?"), string_locked(f->func ? f->func : "?"), f->line};
  int fresh;
  uint32_t id = intern(TAG_FRAME, key, sizeof key, &fresh);
  uint64_t seq;
  char *p = fresh ? ta_log_reserve(1, &seq) : NULL;
  if (p) {
    frame_slot r = {.id = id, .line = key[2], .seq = seq, .file = key[0], .func = key[1]};
    ta_log_commit(p, &r, TA_LOG_FRAME);
  }
  return id;
}

static uint32_t stack_locked(const uint32_t *frames, int n) {
  int fresh;
  uint32_t id = intern(TAG_STACK, frames, (size_t)n * sizeof *frames, &fresh);
  uint32_t chunks = (uint32_t)(n + STACK_CHUNK - 1) / STACK_CHUNK;
  uint64_t seq;
  char *p = fresh ? ta_log_reserve(chunks, &seq) : NULL;
  for (uint32_t c = 0; p && c < chunks; c++) {
    stack_slot r = {.id = id, .nframes = (uint16_t)n, .chunk = (uint16_t)c, .seq = seq + c};
    int at = (int)c * STACK_CHUNK, k = n - at < STACK_CHUNK ? n - at : STACK_CHUNK;
    memcpy(r.frames, frames + at, (size_t)k * sizeof *frames);
    ta_log_commit(p + (size_t)c * TA_LOG_RECORD_SIZE, &r, TA_LOG_STACK);
  }
  return id;
}

/* ------------------------------------------------------------------------
 * API
 * ---------------------------------------------------------------------- */

uint32_t ta_log_string(const char *s) {
  if (!s) return 0;
  ta_log_lock();
  uint32_t id = ta_log_on() ? string_locked(s) : 0;
  ta_log_unlock();
  return id;
}

void ta_log_write_labelled(ta_log_record *r, const char *label) {
  ta_log_lock();
  if (ta_log_on()) {
    r->stack = label ? string_locked(label) : 0;
    ta_log_write(r);
  }
  ta_log_unlock();
}

uint32_t ta_log_intern_stack(const ta_log_frame_text *frames, int n) { return ta_log_intern_stack_in(frames, n, NULL); }

uint32_t ta_log_intern_stack_in(const ta_log_frame_text *frames, int n, uint64_t *gen) {
  if (n <= 0) return 0;
  if (n > UINT16_MAX) n = UINT16_MAX;
  uint32_t ids[64], *frame_ids = n <= 64 ? ids : malloc((size_t)n * sizeof *frame_ids);
  if (!frame_ids) return 0;
  ta_log_lock();
  uint32_t id = 0;
  if (ta_log_on()) {
    for (int i = 0; i < n; i++) frame_ids[i] = frame_locked(&frames[i]);
    id = stack_locked(frame_ids, n);
  }
  if (gen) *gen = atomic_load_explicit(&generation, memory_order_relaxed);
  ta_log_unlock();
  if (frame_ids != ids) free(frame_ids);
  return id;
}

/* The content of id `id` if it is a `tag` entry; NULL otherwise. */
static const char *content(uint32_t id, uint8_t tag, uint32_t *len) {
  if (id == 0 || id > T.next_id) return NULL;
  const key_ref *k = &T.by_id[id - 1];
  if ((uint8_t)k->key[0] != tag) return NULL;
  *len = k->len - 1;
  return k->key + 1;
}

int ta_log_intern_visit_stack(uint32_t stack, ta_log_frame_visitor visit, void *ctx) {
  ta_log_lock();
  uint32_t len = 0;
  const char *frames = content(stack, TAG_STACK, &len);
  int n = frames ? (int)(len / sizeof(uint32_t)) : 0;
  for (int i = 0; i < n; i++) {
    uint32_t frame_id, key[3], flen = 0, file_len = 0, func_len = 0;
    memcpy(&frame_id, frames + (size_t)i * sizeof frame_id, sizeof frame_id);
    const char *frame = content(frame_id, TAG_FRAME, &flen);
    if (!frame || flen != sizeof key) continue;
    memcpy(key, frame, sizeof key);
    const char *file = content(key[0], TAG_STRING, &file_len), *func = content(key[1], TAG_STRING, &func_len);
    char file_z[TA_LOG_STRING_MAX + 1], func_z[TA_LOG_STRING_MAX + 1];
    snprintf(file_z, sizeof file_z, "%.*s", file ? (int)file_len : 1, file ? file : "?");
    snprintf(func_z, sizeof func_z, "%.*s", func ? (int)func_len : 1, func ? func : "?");
    visit(ctx, file_z, func_z, key[2]);
  }
  ta_log_unlock();
  return n;
}
