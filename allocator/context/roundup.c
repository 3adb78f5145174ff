/* roundup_power2_divisions (roundup.h): its syntax, the sizes it gives, and
 * reading it (and graph_capture_record_stream_reuse) out of a PyTorch
 * settings string. The sizes and the syntax are
 * PyTorch's (c10/core/AllocatorConfig.cpp and round_size in
 * c10/cuda/CUDACachingAllocator.cpp, torch 2.11): a program that sets the
 * option gets the same block sizes, so memory_allocated() moves by the same
 * amounts, under either allocator. */
#include "context/roundup.h"

#include <stdio.h>
#include <string.h>

#define MIN_BLOCK ((size_t)512)
#define FIRST_INTERVAL_LOG2 20 /* the first interval holds every size below 2 MiB */
#define MAX_TOKENS 256
#define MAX_TOKEN 64

static int is_power_of_2(uint64_t v) { return v && !(v & (v - 1)); }

static unsigned floor_log2(uint64_t v) { return 63u - (unsigned)__builtin_clzll(v); }

/* ------------------------------------------------------------------------
 * Sizes
 * ---------------------------------------------------------------------- */

static uint64_t divisions_for(const ta_roundup *r, size_t size) {
  unsigned log_size = floor_log2(size);
  unsigned index = log_size > FIRST_INTERVAL_LOG2 ? log_size - FIRST_INTERVAL_LOG2 : 0;
  return r->divisions[index < TA_ROUNDUP_INTERVALS ? index : TA_ROUNDUP_INTERVALS - 1];
}

size_t ta_roundup_size(const ta_roundup *r, size_t size) {
  if (size < MIN_BLOCK) return size;
  uint64_t divisions = divisions_for(r, size);
  /* Below divisions x 512 B a step would be under 512 B: PyTorch rounds to 512 B there. */
  if (divisions <= 1 || size <= MIN_BLOCK * divisions || is_power_of_2(size)) return size;
  size_t floor_power = (size_t)1 << floor_log2(size);
  size_t step = floor_power >> floor_log2(divisions); /* >= 512 B: size > 512 x divisions */
  return (size + step - 1) & ~(step - 1);
}

/* ------------------------------------------------------------------------
 * Syntax: PyTorch's tokens (',', ':', '[', ']' each one token, the words
 * between them, spaces dropped)
 * ---------------------------------------------------------------------- */

typedef struct tokens {
  char text[MAX_TOKENS][MAX_TOKEN];
  int count;
} tokens;

static int tokenize(const char *s, tokens *t, char *err, size_t errlen) {
  t->count = 0;
  size_t len = 0; /* of the word being read */
  for (;; s++) {
    int separator = *s == ',' || *s == ':' || *s == '[' || *s == ']';
    if ((separator || !*s) && len) { /* a word ends */
      t->text[t->count - 1][len] = '\0';
      len = 0;
    }
    if (!*s) return 0;
    if (*s == ' ') continue;
    if (separator || len == 0) {
      if (t->count == MAX_TOKENS) {
        snprintf(err, errlen, "allocator settings: more than %d items", MAX_TOKENS);
        return -1;
      }
      t->count++;
    }
    if (separator) {
      t->text[t->count - 1][0] = *s;
      t->text[t->count - 1][1] = '\0';
      continue;
    }
    if (len + 1 == MAX_TOKEN) {
      snprintf(err, errlen, "allocator settings: '%.*s...' is too long", MAX_TOKEN - 1, t->text[t->count - 1]);
      return -1;
    }
    t->text[t->count - 1][len++] = *s;
  }
}

static int token_is(const tokens *t, int i, const char *what) { return i < t->count && !strcmp(t->text[i], what); }

static int parse_count(const char *text, uint64_t *out) {
  if (!*text) return -1;
  uint64_t v = 0;
  for (const char *c = text; *c; c++) {
    if (*c < '0' || *c > '9' || v > (UINT64_MAX - 9) / 10) return -1;
    v = v * 10 + (uint64_t)(*c - '0');
  }
  *out = v;
  return 0;
}

#define ROUNDUP_SYNTAX "a power of 2, or a list such as [256:1,512:2,>:8] (MiB:divisions)"

/* The value starting at token *i (moved to its last token) into `r`. */
static int parse_value(const tokens *t, int *i, ta_roundup *r, char *err, size_t errlen) {
  ta_roundup next = {{0}, 0};
  uint64_t v;
  if (!token_is(t, *i, "[")) { /* one number for every size */
    if (*i >= t->count || parse_count(t->text[*i], &v) || !is_power_of_2(v)) {
      snprintf(err, errlen, "roundup_power2_divisions: '%s' is not %s", *i < t->count ? t->text[*i] : "",
               ROUNDUP_SYNTAX);
      return -1;
    }
    for (int k = 0; k < TA_ROUNDUP_INTERVALS; k++) next.divisions[k] = v;
  } else {
    unsigned last = 0;
    int first = 1;
    for (++*i; !token_is(t, *i, "]"); ++*i) {
      uint64_t boundary = 0;
      int rest = token_is(t, *i, ">");
      if (*i >= t->count || (!rest && (parse_count(t->text[*i], &boundary) || !is_power_of_2(boundary)))) {
        snprintf(err, errlen, "roundup_power2_divisions: '%s' is not a size in MiB that is a power of 2, or '>'",
                 *i < t->count ? t->text[*i] : "the end");
        return -1;
      }
      if (!token_is(t, *i + 1, ":") || *i + 2 >= t->count || parse_count(t->text[*i + 2], &v) ||
          (v && !is_power_of_2(v))) {
        snprintf(err, errlen, "roundup_power2_divisions: '%s' needs ':' and 0 or a power of 2 (divisions)",
                 t->text[*i]);
        return -1;
      }
      *i += 2;
      if (rest) { /* every interval after the last one named */
        for (unsigned k = last + 1; k < TA_ROUNDUP_INTERVALS; k++) next.divisions[k] = v;
      } else {
        unsigned index = floor_log2(boundary);
        if (index >= TA_ROUNDUP_INTERVALS) index = TA_ROUNDUP_INTERVALS - 1;
        for (unsigned k = 0; first && k < index; k++) next.divisions[k] = v; /* the first covers those below */
        first = 0;
        next.divisions[index] = v;
        last = index;
      }
      if (token_is(t, *i + 1, ",")) ++*i;
      else if (!token_is(t, *i + 1, "]")) {
        snprintf(err, errlen, "roundup_power2_divisions: the list needs ',' between entries and a closing ']'");
        return -1;
      }
    }
  }
  for (int k = 0; k < TA_ROUNDUP_INTERVALS; k++) next.any |= next.divisions[k] > 1;
  *r = next;
  return 0;
}

int ta_roundup_parse(const char *text, ta_roundup *out, char *err, size_t errlen) {
  tokens t;
  if (tokenize(text ? text : "", &t, err, errlen)) return -1;
  int i = 0;
  ta_roundup r;
  if (parse_value(&t, &i, &r, err, errlen)) return -1;
  if (i + 1 != t.count) {
    snprintf(err, errlen, "roundup_power2_divisions: '%s' after the value (expected %s)", t.text[i + 1],
             ROUNDUP_SYNTAX);
    return -1;
  }
  *out = r;
  return 0;
}

/* Index of the last token of the value starting at token i ('[' ... ']' or one word). */
static int skip_value(const tokens *t, int i) {
  if (!token_is(t, i, "[")) return i;
  while (i < t->count && !token_is(t, i, "]")) i++;
  return i;
}

int ta_roundup_from_pytorch_settings(const char *text, ta_roundup *r, int *record_stream_reuse, char *err,
                                     size_t errlen) {
  tokens t;
  if (tokenize(text ? text : "", &t, err, errlen)) return -1;
  ta_roundup next = {{0}, 0}; /* PyTorch resets the option on each settings string */
  int reuse = *record_stream_reuse;
  for (int i = 0; i < t.count; i++) {
    if (!token_is(&t, i + 1, ":") || i + 2 >= t.count) {
      snprintf(err, errlen, "allocator settings: '%s' is not key:value", t.text[i]);
      return -1;
    }
    const char *key = t.text[i];
    i += 2;
    if (!strcmp(key, "roundup_power2_divisions")) {
      if (parse_value(&t, &i, &next, err, errlen)) return -1;
    } else if (!strcmp(key, "graph_capture_record_stream_reuse")) {
      if (strcmp(t.text[i], "True") && strcmp(t.text[i], "False")) {
        snprintf(err, errlen, "graph_capture_record_stream_reuse: '%s' is not True or False", t.text[i]);
        return -1;
      }
      reuse = !strcmp(t.text[i], "True");
    } else {
      i = skip_value(&t, i);
      if (i >= t.count) {
        snprintf(err, errlen, "allocator settings: '%s' opens a list that does not close", key);
        return -1;
      }
    }
    if (i + 1 < t.count && !token_is(&t, ++i, ",")) {
      snprintf(err, errlen, "allocator settings: ',' expected after the value of '%s'", key);
      return -1;
    }
  }
  *r = next;
  *record_stream_reuse = reuse;
  return 0;
}
