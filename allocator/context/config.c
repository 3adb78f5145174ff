/* Parsing of TORCHALLOC_CONF ("key:value,key:value"), in the style of
 * PYTORCH_CUDA_ALLOC_CONF. An unknown key or a bad value is an error that
 * names the key; there are no silent defaults for what the user wrote. */
#include "context/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log/log_format.h"
#include "policy/policy.h"

void ta_config_defaults(ta_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->policy, sizeof c->policy, "%s", ta_policy_by_id(0)->name); /* the registry's default */
  c->backend = TA_BACKEND_CUDA;
  c->sim_capacity = 80 * TA_GiB;
  c->sim_devices = 1;
  c->warn = 1;
  c->stack_depth = 16;
  c->sim_vmm = 1;
  c->expandable = TA_EXPANDABLE_RECLAIM; /* ordinary segments where the device has no virtual memory */
  c->large_handle = TA_DEFAULT_LARGE_HANDLE;
}

static const char *const expandable_names[] = {"off", "on", "compact", "reclaim"};

const char *ta_expandable_name(int mode) {
  return mode >= 0 && mode <= TA_EXPANDABLE_RECLAIM ? expandable_names[mode] : "?";
}

int ta_parse_bytes(const char *text, size_t *out) {
  static const struct {
    const char *suffix;
    uint64_t mult;
  } units[] = {
      {"", 1},          {"B", 1},           {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
      {"TiB", 1ull << 40}, {"KB", 1000ull}, {"MB", 1000000ull},  {"GB", 1000000000ull}, {"TB", 1000000000000ull},
      {"K", 1ull << 10}, {"M", 1ull << 20},  {"G", 1ull << 30},   {"T", 1ull << 40},
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

#define KEYS \
  "policy backend sim_capacity sim_devices sim_fail_alloc sim_event_polls sim_held_elsewhere warn log log_max stacks " \
  "stack_depth oom oom_report expandable handle peers sim_vmm sim_lag"
const char *ta_config_key_list(void) { return KEYS; }

/* Apply one key:value to `c`. Returns 0, or -1 with a message. */
static int apply(ta_config *c, const char *key, const char *val, char *err, size_t errlen) {
  long n, lo = 0, hi = 0; /* an integer key's range, for its message */
  if (strcmp(key, "policy") == 0) {
    if (!ta_policy_by_name(val, NULL)) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'policy' (expected %s)", val,
               ta_policy_choices());
      return -1;
    }
    snprintf(c->policy, sizeof c->policy, "%s", val);
  } else if (strcmp(key, "backend") == 0) {
    if (strcmp(val, "cuda") == 0) c->backend = TA_BACKEND_CUDA;
    else if (strcmp(val, "sim") == 0) c->backend = TA_BACKEND_SIM;
    else {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'backend' (expected cuda or sim)", val);
      return -1;
    }
  } else if (strcmp(key, "sim_capacity") == 0) {
    size_t bytes;
    if (ta_parse_bytes(val, &bytes) || bytes == 0 || bytes > ((size_t)1 << 50)) {
      snprintf(err, errlen,
               "TORCHALLOC_CONF: bad value '%s' for key 'sim_capacity' (expected a size such as 80GiB, "
               "between 1 B and 1 PiB)", val);
      return -1;
    }
    c->sim_capacity = bytes;
  } else if (strcmp(key, "sim_devices") == 0) {
    if (parse_int(val, lo = 1, hi = 64, &n)) goto bad_int;
    c->sim_devices = (int)n;
  } else if (strcmp(key, "sim_fail_alloc") == 0) {
    if (parse_int(val, lo = 0, hi = 0x7fffffffL, &n)) goto bad_int;
    c->sim_fail_alloc = (uint64_t)n;
  } else if (strcmp(key, "sim_held_elsewhere") == 0) {
    size_t bytes;
    if (ta_parse_bytes(val, &bytes)) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'sim_held_elsewhere' (expected a size such as "
               "2GiB)", val);
      return -1;
    }
    c->sim_held_elsewhere = bytes;
  } else if (strcmp(key, "sim_event_polls") == 0) {
    if (parse_int(val, lo = 0, hi = 1000000, &n)) goto bad_int;
    c->sim_event_polls = (int)n;
  } else if (strcmp(key, "warn") == 0) {
    if (parse_int(val, lo = 0, hi = 1, &n)) goto bad_int;
    c->warn = (int)n;
  } else if (strcmp(key, "oom") == 0) {
    if (strcmp(val, "abort") == 0) c->oom = TA_OOM_ABORT;
    else if (strcmp(val, "null") == 0) c->oom = TA_OOM_NULL;
    else if (strcmp(val, "auto") == 0) c->oom = TA_OOM_AUTO;
    else {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'oom' (expected abort, null or auto)", val);
      return -1;
    }
  } else if (strcmp(key, "oom_report") == 0) {
    if (!*val || strlen(val) >= sizeof c->oom_report) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value for key 'oom_report' (expected on, off or a directory, at "
               "most %zu bytes)", sizeof c->oom_report - 1);
      return -1;
    }
    snprintf(c->oom_report, sizeof c->oom_report, "%s", strcmp(val, "on") == 0 ? "" : val);
  } else if (strcmp(key, "log") == 0) {
    if (!*val || strlen(val) >= sizeof c->log_path) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value for key 'log' (expected a file path, at most %zu bytes)",
               sizeof c->log_path - 1);
      return -1;
    }
    snprintf(c->log_path, sizeof c->log_path, "%s", val);
  } else if (strcmp(key, "log_max") == 0) {
    size_t bytes;
    /* A cap past what can be mapped would be refused only when the log opens, and then every allocation fails. */
    if (ta_parse_bytes(val, &bytes) || (bytes && (bytes < TA_LOG_MIN_MAX_BYTES || bytes > TA_LOG_MAX_MAX_BYTES))) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'log_max' (expected 0 for no cap, or a size "
               "from 4 KiB to 1 TiB, such as 1GiB)", val);
      return -1;
    }
    c->log_max = bytes;
  } else if (strcmp(key, "handle") == 0) {
    size_t bytes;
    if (ta_parse_bytes(val, &bytes) || bytes < TA_MIN_LARGE_HANDLE || bytes > TA_MAX_LARGE_HANDLE ||
        bytes % TA_MIN_LARGE_HANDLE) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'handle' (expected a multiple of 2 MiB from "
               "2 MiB to 1 GiB, such as 16MiB)", val);
      return -1;
    }
    c->large_handle = bytes;
    c->large_handle_set = 1;
  } else if (strcmp(key, "stacks") == 0) {
    if (parse_int(val, lo = 0, hi = 1, &n)) goto bad_int;
    c->stacks = (int)n;
  } else if (strcmp(key, "stack_depth") == 0) {
    if (parse_int(val, lo = 1, hi = 64, &n)) goto bad_int;
    c->stack_depth = (int)n;
  } else if (strcmp(key, "expandable") == 0) {
    int mode = -1;
    for (int i = 0; i <= TA_EXPANDABLE_RECLAIM; i++)
      if (strcmp(val, expandable_names[i]) == 0) mode = i;
    if (mode < 0 && parse_int(val, 0, TA_EXPANDABLE_RECLAIM, &n) == 0) mode = (int)n;
    if (mode < 0) {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'expandable' (expected off, on, compact or "
               "reclaim, or an integer from 0 to 3)", val);
      return -1;
    }
    c->expandable = mode;
  } else if (strcmp(key, "peers") == 0) {
    if (strcmp(val, "all") == 0) c->peers = TA_PEERS_ALL;
    else if (strcmp(val, "asked") == 0) c->peers = TA_PEERS_ASKED;
    else {
      snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key 'peers' (expected all or asked)", val);
      return -1;
    }
  } else if (strcmp(key, "sim_vmm") == 0) {
    if (parse_int(val, lo = 0, hi = 1, &n)) goto bad_int;
    c->sim_vmm = (int)n;
  } else if (strcmp(key, "sim_lag") == 0) {
    if (parse_int(val, lo = 0, hi = 1000000000L, &n)) goto bad_int;
    c->sim_lag = (uint64_t)n;
  } else {
    snprintf(err, errlen, "TORCHALLOC_CONF: unknown key '%s' (known keys: %s)", key, KEYS);
    return -1;
  }
  return 0;
bad_int:
  snprintf(err, errlen, "TORCHALLOC_CONF: bad value '%s' for key '%s' (expected an integer from %ld to %ld)", val, key,
           lo, hi);
  return -1;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
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
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    item = trim(item);
    if (!*item) continue;
    char *colon = strchr(item, ':');
    if (!colon) {
      snprintf(err, errlen, "TORCHALLOC_CONF: '%s' is not key:value", item);
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
  if (rc == 0) *c = next;
  return rc;
}

void ta_config_salvage(ta_config *c, const char *text) {
  size_t len = text ? strlen(text) : 0;
  char *copy = text ? malloc(len + 1) : NULL;
  if (!copy) return;
  memcpy(copy, text, len + 1);
  char *save = NULL, err[256];
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(item, ':');
    if (!colon) continue;
    *colon = '\0';
    const char *key = trim(item);
    if (strcmp(key, "oom") == 0 || strcmp(key, "backend") == 0) apply(c, key, trim(colon + 1), err, sizeof err);
  }
  free(copy);
}
