/* A log reader for the C tests, written from docs/LOG_FORMAT.md alone (not
 * from the writer's code): header, slots, strings, and the checksums. */
#ifndef TA_TEST_LOG_READER_H
#define TA_TEST_LOG_READER_H

#include <unistd.h>

#include "log/log_format.h"
#include "sim.h"

typedef struct parsed {
  unsigned char *data;
  size_t len;
  const ta_log_record *slots; /* every slot after the header */
  size_t nslots;              /* slots up to the first incomplete one */
  uint32_t status;
  uint32_t pid;
} parsed;

/* The XOR of `len` bytes: 0 over a whole slot (or the header) whose
 * checksum byte is right. */
static inline unsigned xor_bytes(const unsigned char *p, size_t len) {
  unsigned x = 0;
  for (size_t i = 0; i < len; i++) x ^= p[i];
  return x;
}

/* -1 for a file that is not a log of the version written (TA_LOG_VERSION), or whose header or any
 * complete slot fails its checksum (said on stderr). */
static inline int parse(const char *path, parsed *p) {
  memset(p, 0, sizeof *p);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  p->len = (size_t)ftell(f);
  rewind(f);
  p->data = malloc(p->len + 1);
  size_t got = p->data ? fread(p->data, 1, p->len, f) : 0;
  fclose(f);
  if (got != p->len || p->len < TA_LOG_HEADER_SIZE) return -1;
  uint32_t version, header_size, record_size, byte_order;
  memcpy(&version, p->data + 8, 4);
  memcpy(&header_size, p->data + 12, 4);
  memcpy(&record_size, p->data + 16, 4);
  memcpy(&byte_order, p->data + 20, 4);
  memcpy(&p->pid, p->data + 40, 4);
  memcpy(&p->status, p->data + 56, 4);
  if (memcmp(p->data, "TALOG\0\0\0", 8) || version != TA_LOG_VERSION || header_size != 128 || record_size != 64 ||
      byte_order != 0x01020304u)
    return -1;
  if (xor_bytes(p->data, 128)) {
    fprintf(stderr, "  %s: the header fails its checksum\n", path);
    return -1;
  }
  p->slots = (const ta_log_record *)(p->data + header_size);
  size_t total = (p->len - header_size) / record_size;
  while (p->nslots < total && p->slots[p->nslots].kind != TA_LOG_NONE) p->nslots++;
  for (size_t i = 0; i < p->nslots; i++)
    if (xor_bytes((const unsigned char *)&p->slots[i], 64)) {
      fprintf(stderr, "  %s: slot %zu (kind %d) fails its checksum\n", path, i, p->slots[i].kind);
      return -1;
    }
  return 0;
}

static inline size_t count_kind(const parsed *p, int kind) {
  size_t n = 0;
  for (size_t i = 0; i < p->nslots; i++) n += p->slots[i].kind == kind;
  return n;
}

static inline const ta_log_record *nth_kind(const parsed *p, int kind, size_t nth) {
  for (size_t i = 0; i < p->nslots; i++)
    if (p->slots[i].kind == kind && nth-- == 0) return &p->slots[i];
  return NULL;
}

/* STRING slots: u32 id, u16 len, u16 chunk, u64 seq, 46 bytes of text. */
static inline void string_slot(const ta_log_record *r, uint32_t *id, uint16_t *len, uint16_t *chunk) {
  const unsigned char *s = (const unsigned char *)r;
  memcpy(id, s, 4);
  memcpy(len, s + 4, 2);
  memcpy(chunk, s + 6, 2);
}

static inline const char *string_of(const parsed *p, uint32_t id, char *buf, size_t buflen) {
  buf[0] = '\0';
  for (size_t i = 0; i < p->nslots; i++) {
    const unsigned char *s = (const unsigned char *)&p->slots[i];
    uint32_t sid;
    uint16_t len, chunk;
    string_slot(&p->slots[i], &sid, &len, &chunk);
    if (p->slots[i].kind != TA_LOG_STRING || sid != id || len >= buflen) continue;
    size_t at = (size_t)chunk * 46, n = len - at < 46 ? len - at : 46;
    memcpy(buf + at, s + 16, n);
    buf[len] = '\0';
  }
  return buf;
}

static inline int seq_contiguous(const parsed *p) {
  for (size_t i = 0; i < p->nslots; i++)
    if (p->slots[i].seq != i) return 0;
  return 1;
}

/* A path for a new log, named after the process and `name`, with nothing
 * there yet (a file a killed earlier run left is removed). */
static inline void temp_path(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "/tmp/talog-%d-%s.talog", (int)getpid(), name);
  unlink(buf);
}

static inline int log_reset(const char *path, const char *extra) {
  char conf[400]; /* sim_reset prefixes it within 512 bytes */
  snprintf(conf, sizeof conf, "log:%s%s%s", path, extra && *extra ? "," : "", extra ? extra : "");
  return sim_reset(conf);
}

#endif
