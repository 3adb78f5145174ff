/* Parsing of TORCHALLOC_CONF ("key:value,key:value"), in the style of
 * PYTORCH_CUDA_ALLOC_CONF. An unknown key or a bad value is an error that
 * names the key; there are no silent defaults for what the user wrote.
 *
 * Every key is one row of `keys` below: its name, the kind of value it takes
 * and the range, the ta_config field it sets, its default and a line of help.
 * The parser, the defaults, the key list (torchalloc_config_keys, the
 * unknown-key message) and the description (torchalloc_config_help, which
 * `torchalloc info --keys` prints and the README's table is checked against)
 * all walk that table: a new key is one row and its field. */
#include "context/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "log/log_format.h"
#include "policy/policy.h"

enum conf_kind {
  CONF_INT,    /* a decimal integer from lo to hi; an int or uint64_t field */
  CONF_SIZE,   /* a size with an optional unit (ta_parse_bytes) from lo to hi; a size_t field */
  CONF_CHOICE, /* one of `choices`, stored as its value; an int field */
  CONF_POLICY, /* the name of a registered policy; a text field */
  CONF_TEXT,   /* any non-empty text that fits the field; a text field */
  CONF_ROUNDUP, /* roundup_power2_divisions's value (roundup.h); a ta_roundup field */
};

typedef struct conf_choice {
  const char *name;
  int value;
} conf_choice;

typedef struct conf_key {
  const char *name;
  enum conf_kind kind;
  size_t offset, width;       /* the ta_config field: offsetof, sizeof */
  uint64_t lo, hi;            /* INT, SIZE: the range accepted (INT ranges fit a long) */
  uint64_t step;              /* SIZE: values are multiples of it; 0: any */
  int zero_ok;                /* SIZE: 0 (meaning "none") is accepted below lo */
  const conf_choice *choices; /* CHOICE: in the order the message lists them, ended by {NULL} */
  int numbered;               /* CHOICE: each value's number is accepted too, from 0 to the highest */
  const char *expected;       /* SIZE, TEXT: what the message says the key expects (INT, CHOICE and POLICY
                               * have theirs worded from the range, the choices and the registry) */
  const char *empty_alias;    /* TEXT: the value that stands for "" (oom_report: "on") */
  size_t given_flag;          /* offset of an int field set to 1 when the key is given; 0: none */
  int salvaged;               /* obeyed even when the rest of the text is refused (ta_config_salvage) */
  const char *default_value;  /* parsed as a given value is; NULL: the field stays zero ("none") */
  const char *help;           /* one line: what the key does */
} conf_key;

/* given_flag's 0 can mean "none" because offset 0 is text, never a flag. */
_Static_assert(offsetof(ta_config, policy) == 0, "given_flag uses offset 0 for 'no flag'");
/* size_t and uint64_t fields are stored the same way (store_number). */
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "a size_t field is 8 bytes");

#define FIELD(f) .offset = offsetof(ta_config, f), .width = sizeof(((ta_config *)0)->f)

static const conf_choice backend_choices[] = {{"cuda", TA_BACKEND_CUDA}, {"sim", TA_BACKEND_SIM}, {NULL, 0}};
static const conf_choice oom_choices[] = {
    {"abort", TA_OOM_ABORT}, {"null", TA_OOM_NULL}, {"auto", TA_OOM_AUTO}, {NULL, 0}};
static const conf_choice expandable_choices[] = {{"off", TA_EXPANDABLE_OFF},
                                                 {"on", TA_EXPANDABLE_GROW},
                                                 {"compact", TA_EXPANDABLE_COMPACT},
                                                 {"reclaim", TA_EXPANDABLE_RECLAIM},
                                                 {NULL, 0}};
static const conf_choice peers_choices[] = {{"all", TA_PEERS_ALL}, {"asked", TA_PEERS_ASKED}, {NULL, 0}};

/* In the order torchalloc_config_keys lists them. */
static const conf_key keys[] = {
    {.name = "policy", .kind = CONF_POLICY, FIELD(policy), /* default: the registry's (policy id 0) */
     .help = "policy for new requests (switchable at run time)"},
    {.name = "backend", .kind = CONF_CHOICE, FIELD(backend), .choices = backend_choices, .salvaged = 1,
     .default_value = "cuda", .help = "real device (cudart, loaded at run time) or the simulated device"},
    {.name = "sim_capacity", .kind = CONF_SIZE, FIELD(sim_capacity), .lo = 1, .hi = (uint64_t)1 << 50,
     .expected = "a size such as 80GiB, between 1 B and 1 PiB", .default_value = "80GiB",
     .help = "capacity of each simulated device"},
    {.name = "sim_devices", .kind = CONF_INT, FIELD(sim_devices), .lo = 1, .hi = 64, .default_value = "1",
     .help = "number of simulated devices"},
    {.name = "sim_fail_alloc", .kind = CONF_INT, FIELD(sim_fail_alloc), .lo = 0, .hi = 0x7fffffff,
     .default_value = "0", .help = "fault injection: the Nth device allocation fails"},
    {.name = "sim_event_polls", .kind = CONF_INT, FIELD(sim_event_polls), .lo = 0, .hi = 1000000,
     .default_value = "0", .help = "simulated stream events complete on their Nth query"},
    {.name = "sim_held_elsewhere", .kind = CONF_SIZE, FIELD(sim_held_elsewhere), .lo = 0, .hi = (uint64_t)1 << 50,
     .expected = "a size such as 2GiB, at most sim_capacity", .default_value = "0",
     .help = "bytes of each simulated device held by someone else (another process): never available to torchalloc"},
    {.name = "warn", .kind = CONF_INT, FIELD(warn), .lo = 0, .hi = 1, .default_value = "1",
     .help = "print misuse warnings and OOM reports on stderr"},
    {.name = "log", .kind = CONF_TEXT, FIELD(log_path), .expected = "a file path",
     .help = "write the block log there"},
    /* A cap past what can be mapped would be refused only when the log opens, and then every allocation fails. */
    {.name = "log_max", .kind = CONF_SIZE, FIELD(log_max), .lo = TA_LOG_MIN_MAX_BYTES, .hi = TA_LOG_MAX_MAX_BYTES,
     .zero_ok = 1, .expected = "0 for no cap, or a size from 4 KiB to 1 TiB, such as 1GiB", .default_value = "0",
     .help = "cap on the log file; a \"truncated\" record marks the cut"},
    {.name = "stacks", .kind = CONF_INT, FIELD(stacks), .lo = 0, .hi = 1, .default_value = "0",
     .help = "record the Python stack of every alloc and free"},
    {.name = "stack_depth", .kind = CONF_INT, FIELD(stack_depth), .lo = 1, .hi = 64, .default_value = "16",
     .help = "frames kept per stack"},
    {.name = "oom", .kind = CONF_CHOICE, FIELD(oom), .choices = oom_choices, .salvaged = 1,
     .default_value = "auto", .help = "what a failed torchalloc_malloc does"},
    {.name = "oom_report", .kind = CONF_TEXT, FIELD(oom_report), .expected = "on, off or a directory",
     .empty_alias = "on", .default_value = "on", .help = "where the full out-of-memory report goes"},
    /* Ordinary segments where the device has no virtual memory, whatever this says. */
    {.name = "expandable", .kind = CONF_CHOICE, FIELD(expandable), .choices = expandable_choices, .numbered = 1,
     .default_value = "reclaim", .help = "how caching and phase_arena use the device's memory"},
    /* Why 8 MiB: config.h, TA_DEFAULT_LARGE_HANDLE (test_config checks that the two agree). */
    {.name = "handle", .kind = CONF_SIZE, FIELD(large_handle), .lo = TA_MIN_LARGE_HANDLE, .hi = TA_MAX_LARGE_HANDLE,
     .step = TA_MIN_LARGE_HANDLE, .given_flag = offsetof(ta_config, large_handle_set),
     .expected = "a multiple of 2 MiB from 2 MiB to 1 GiB, such as 16MiB", .default_value = "8MiB",
     .help = "the size of each physical allocation of large-pool expandable segments: the unit they grow, give "
             "back and move memory in"},
    /* Why runs, and why of 32 MiB by default: config.h, TA_DEFAULT_RUN. */
    {.name = "run", .kind = CONF_SIZE, FIELD(run_bytes), .lo = TA_MIN_LARGE_HANDLE, .hi = TA_MAX_LARGE_HANDLE,
     .step = TA_MIN_LARGE_HANDLE, .zero_ok = 1,
     .expected = "0 for none, or a multiple of 2 MiB up to 1 GiB, such as 64MiB", .default_value = "32MiB",
     .help = "while the reserve grows past its most in the first ramp (the warm-up), large-pool memory is made in physical "
             "allocations of this size: fewer driver calls, each moved and given back whole"},
    {.name = "peers", .kind = CONF_CHOICE, FIELD(peers), .choices = peers_choices, .default_value = "all",
     .help = "which other GPUs may read and write memory mapped on a GPU"},
    /* Why no limit by default: segments_moves.c. */
    {.name = "move_time", .kind = CONF_INT, FIELD(move_time), .lo = 0, .hi = 1000, .default_value = "0",
     .help = "per mille of the time reclaim may spend moving memory while the GPU waits for the host (0: no "
             "limit); past it the reserve grows instead of moving"},
    /* Why never by default: segments_moves.c. */
    {.name = "grow_below", .kind = CONF_SIZE, FIELD(grow_below), .lo = 0, .hi = (uint64_t)1 << 50, .zero_ok = 1,
     .expected = "a size such as 1GiB, or 0 for never", .default_value = "0",
     .help = "while the reserve is below this size and below twice the most allocated, reclaim maps new memory "
             "where it would move memory (0: never)"},
    {.name = "time_calls", .kind = CONF_INT, FIELD(time_calls), .lo = 0, .hi = 1, .default_value = "0",
     .help = "count the host time spent in malloc and free (stats host_ns, timed_calls; two clock reads a call)"},
    /* PyTorch's option, in PyTorch's syntax; PYTORCH_CUDA_ALLOC_CONF and _set_allocator_settings reach it through
     * install() (torchalloc_set_allocator_settings). */
    {.name = "roundup_power2_divisions", .kind = CONF_ROUNDUP, FIELD(roundup),
     .expected = "a power of 2, or a list such as [256:1,512:2,>:8] (MiB:divisions), as PyTorch takes it",
     .help = "round each request up to the next of N equal steps between two powers of 2, as PyTorch's option "
             "of that name does"},
    /* PyTorch's option; `graph_capture_record_stream_reuse:True` in PyTorch's settings sets it too. */
    {.name = "graph_capture_record_stream_reuse", .kind = CONF_INT, FIELD(capture_reuse), .lo = 0, .hi = 1,
     .default_value = "0",
     .help = "during a CUDA graph capture, reuse a block freed after record_stream once the captured work of "
             "every stream that used it precedes the allocating stream's, as PyTorch's option of that name does"},
    {.name = "sim_vmm", .kind = CONF_INT, FIELD(sim_vmm), .lo = 0, .hi = 1, .default_value = "1",
     .help = "the simulated device has virtual memory (0: model one without, for tests)"},
    {.name = "sim_lag", .kind = CONF_INT, FIELD(sim_lag), .lo = 0, .hi = 1000000000, .default_value = "0",
     .help = "the simulated device runs N ticks behind the host"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

const char *ta_expandable_name(int mode) {
  for (const conf_choice *c = expandable_choices; c->name; c++)
    if (c->value == mode) return c->name;
  return "?";
}

int ta_parse_bytes(const char *text, size_t *out) {
  static const struct {
    const char *suffix;
    uint64_t mult;
  } units[] = {
      {"", 1},          {"B", 1},           {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
      {"TiB", 1ull << 40}, {"PiB", 1ull << 50}, {"KB", 1000ull}, {"MB", 1000000ull},  {"GB", 1000000000ull},
      {"TB", 1000000000000ull}, {"PB", 1000000000000000ull}, {"K", 1ull << 10}, {"M", 1ull << 20},
      {"G", 1ull << 30},   {"T", 1ull << 40}, {"P", 1ull << 50},
  };
  if (!text || !isdigit((unsigned char)*text)) return -1;
  errno = 0;
  char *end = NULL;
  unsigned long long n = strtoull(text, &end, 10);
  if (errno) return -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) == 0) {
      if (n > SIZE_MAX / units[i].mult) return -1;
      *out = (size_t)(n * units[i].mult);
      return 0;
    }
  }
  return -1;
}

static int parse_int(const char *text, long lo, long hi, long *out) {
  if (!text || !*text) return -1;
  errno = 0;
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int choice_value(const conf_key *k, const char *val, int *out) {
  int highest = 0;
  for (const conf_choice *c = k->choices; c->name; c++) {
    if (strcmp(val, c->name) == 0) {
      *out = c->value;
      return 0;
    }
    if (c->value > highest) highest = c->value;
  }
  long n;
  if (!k->numbered || parse_int(val, 0, highest, &n)) return -1;
  *out = (int)n;
  return 0;
}

/* Text from the user is echoed at most this long, so a long mistake never
 * pushes out of the message what the key expects. */
#define SHOWN_MAX 64

/* `text` as a message shows it: whole, or its start and its length. */
static const char *show(const char *text, char out[SHOWN_MAX + 32]) {
  size_t n = strlen(text);
  if (n <= SHOWN_MAX) return text;
  snprintf(out, SHOWN_MAX + 32, "%.*s... (%zu characters)", SHOWN_MAX - 16, text, n);
  return out;
}

static int size_accepted(const conf_key *k, size_t bytes) {
  if (bytes == 0 && k->zero_ok) return 1;
  return bytes >= k->lo && bytes <= k->hi && (!k->step || bytes % k->step == 0);
}

/* What `k` accepts, worded as its error message and its help say it. */
static void describe_values(const conf_key *k, char *out, size_t len) {
  switch (k->kind) {
  case CONF_INT:
    snprintf(out, len, "an integer from %" PRIu64 " to %" PRIu64, k->lo, k->hi);
    return;
  case CONF_SIZE:
  case CONF_ROUNDUP:
    snprintf(out, len, "%s", k->expected);
    return;
  case CONF_TEXT:
    snprintf(out, len, "%s, at most %zu bytes", k->expected, k->width - 1);
    return;
  case CONF_POLICY:
    snprintf(out, len, "%s", ta_policy_choices());
    return;
  case CONF_CHOICE: {
    int n = 0, highest = 0;
    while (k->choices[n].name) n++;
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
      const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
      used += (size_t)snprintf(out + used, len - used, "%s%s", sep, k->choices[i].name);
      if (k->choices[i].value > highest) highest = k->choices[i].value;
    }
    if (k->numbered && used < len) snprintf(out + used, len - used, ", or an integer from 0 to %d", highest);
    return;
  }
  }
}

static void store_number(char *field, size_t width, uint64_t value) {
  if (width == sizeof(int)) {
    int n = (int)value;
    memcpy(field, &n, sizeof n);
  } else {
    ta_assert(width == sizeof(uint64_t));
    memcpy(field, &value, sizeof value);
  }
}

/* Parse `val` as key `k` takes it into its field of `c`. Returns 0, or -1 with the key's message. */
static int store_value(ta_config *c, const conf_key *k, const char *val, char *err, size_t errlen) {
  char *field = (char *)c + k->offset;
  long n;
  size_t bytes;
  int value;
  char why[160] = ""; /* ROUNDUP: what in the value is wrong */
  switch (k->kind) {
  case CONF_INT:
    if (parse_int(val, (long)k->lo, (long)k->hi, &n)) break;
    store_number(field, k->width, (uint64_t)n);
    return 0;
  case CONF_SIZE:
    if (ta_parse_bytes(val, &bytes) || !size_accepted(k, bytes)) break;
    store_number(field, k->width, bytes);
    return 0;
  case CONF_CHOICE:
    if (choice_value(k, val, &value)) break;
    store_number(field, k->width, (uint64_t)value);
    return 0;
  case CONF_POLICY:
    if (!ta_policy_by_name(val, NULL)) break;
    snprintf(field, k->width, "%s", val);
    return 0;
  case CONF_TEXT:
    if (!*val || strlen(val) >= k->width) break;
    snprintf(field, k->width, "%s", k->empty_alias && strcmp(val, k->empty_alias) == 0 ? "" : val);
    return 0;
  case CONF_ROUNDUP: {
    ta_roundup parsed;
    if (ta_roundup_parse(val, &parsed, why, sizeof why)) break;
    memcpy(field, &parsed, sizeof parsed);
    return 0;
  }
  }
  char expected[256], shown[SHOWN_MAX + 32];
  describe_values(k, expected, sizeof expected);
  if (k->kind == CONF_TEXT) /* a refused path is not echoed: it may be longer than the whole message */
    snprintf(err, errlen, "TORCHALLOC_CONF: bad value for key '%s' (expected %s)", k->name, expected);
  else
    snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key '%s' (expected %s)%s%s", show(val, shown), k->name,
             expected, *why ? ": " : "", why + (strncmp(why, k->name, strlen(k->name)) ? 0 : strlen(k->name) + 2));
  return -1;
}

static const char *default_of(const conf_key *k) {
  return k->kind == CONF_POLICY ? ta_policy_by_id(0)->name : k->default_value;
}

void ta_config_defaults(ta_config *c) {
  memset(c, 0, sizeof *c);
  char err[256];
  for (size_t i = 0; i < NKEYS; i++) {
    const char *text = default_of(&keys[i]);
    /* Stored as a given value is, but no given_flag is set. Every default parses: test_config gives each to
     * torchalloc_init. */
    int refused = text && store_value(c, &keys[i], text, err, sizeof err);
    ta_assert(!refused);
    (void)refused;
  }
}

/* Both texts are built once from the table; after that they are only read. */
static pthread_once_t texts_once = PTHREAD_ONCE_INIT;
static char key_list[512], help_text[8192];

static void build_texts(void) {
  size_t listed = 0, helped = 0;
  for (size_t i = 0; i < NKEYS; i++) {
    const conf_key *k = &keys[i];
    char values[256];
    describe_values(k, values, sizeof values);
    const char *default_value = default_of(k);
    listed += (size_t)snprintf(key_list + listed, sizeof key_list - listed, "%s%s", i ? " " : "", k->name);
    helped += (size_t)snprintf(help_text + helped, sizeof help_text - helped, "%s\t%s\t%s\t%s\n", k->name, values,
                               default_value ? default_value : "none", k->help);
    /* Too small a buffer shows as a key missing from the text (test_config reads every key back). */
    if (listed >= sizeof key_list || helped >= sizeof help_text) return;
  }
}

const char *ta_config_key_list(void) {
  pthread_once(&texts_once, build_texts);
  return key_list;
}

const char *ta_config_help(void) {
  pthread_once(&texts_once, build_texts);
  return help_text;
}

static const conf_key *find_key(const char *name) {
  for (size_t i = 0; i < NKEYS; i++)
    if (strcmp(keys[i].name, name) == 0) return &keys[i];
  return NULL;
}

/* Apply one key:value to `c`. Returns 0, or -1 with a message. */
static int apply(ta_config *c, const char *key, const char *val, char *err, size_t errlen) {
  const conf_key *k = find_key(key);
  if (!k) {
    char shown[SHOWN_MAX + 32];
    snprintf(err, errlen, "TORCHALLOC_CONF: unknown key '%s' (known keys: %s)", show(key, shown),
             ta_config_key_list());
    return -1;
  }
  if (store_value(c, k, val, err, errlen)) return -1;
  if (k->given_flag) store_number((char *)c + k->given_flag, sizeof(int), 1);
  return 0;
}

/* The next "key:value" item of the text at *cursor, cut at the first ','
 * outside brackets (roundup_power2_divisions's list holds commas); NULL at
 * the end. */
static char *next_item(char **cursor) {
  char *start = *cursor;
  if (!start) return NULL;
  int depth = 0;
  for (char *c = start;; c++) {
    if (*c == '[') depth++;
    else if (*c == ']' && depth) depth--;
    else if ((*c == ',' && !depth) || !*c) {
      *cursor = *c ? c + 1 : NULL;
      *c = '\0';
      return start;
    }
  }
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

/* What no single key's range can say: memory another process holds on a
 * sim device is part of that device. 0, or -1 with the message. */
static int check_together(const ta_config *c, char *err, size_t errlen) {
  if (c->sim_held_elsewhere <= c->sim_capacity) return 0;
  snprintf(err, errlen, "TORCHALLOC_CONF: sim_held_elsewhere %s is more than sim_capacity %s (what other processes "
           "hold is part of the device)", ta_format_size(c->sim_held_elsewhere).text,
           ta_format_size(c->sim_capacity).text);
  return -1;
}

int ta_config_parse(ta_config *c, const char *text, char *err, size_t errlen) {
  if (!text) return 0;
  size_t len = strlen(text);
  char *copy = malloc(len + 1);
  if (!copy) {
    snprintf(err, errlen, "TORCHALLOC_CONF: out of host memory");
    return -1;
  }
  memcpy(copy, text, len + 1);
  ta_config next = *c;
  int rc = 0;
  char *cursor = copy;
  for (char *item; (item = next_item(&cursor)) != NULL;) {
    item = trim(item);
    if (!*item) continue;
    char *colon = strchr(item, ':');
    if (!colon) {
      char shown[SHOWN_MAX + 32];
      snprintf(err, errlen, "TORCHALLOC_CONF: '%s' is not key:value", show(item, shown));
      rc = -1;
      break;
    }
    *colon = '\0';
    if (apply(&next, trim(item), trim(colon + 1), err, errlen)) {
      rc = -1;
      break;
    }
  }
  free(copy);
  if (rc == 0) rc = check_together(&next, err, errlen);
  if (rc == 0) *c = next;
  return rc;
}

void ta_config_salvage(ta_config *c, const char *text) {
  size_t len = text ? strlen(text) : 0;
  char *copy = text ? malloc(len + 1) : NULL;
  if (!copy) return;
  memcpy(copy, text, len + 1);
  char *cursor = copy, err[256];
  for (char *item; (item = next_item(&cursor)) != NULL;) {
    char *colon = strchr(item, ':');
    if (!colon) continue;
    *colon = '\0';
    const conf_key *k = find_key(trim(item));
    if (k && k->salvaged) apply(c, k->name, trim(colon + 1), err, sizeof err);
  }
  free(copy);
}
