/* Random replay traces for the replay tests: streams, phases, lost and
 * stray frees, sizes from 0 to 24 MiB; the same seed gives the same trace. */
#ifndef TA_TEST_REPLAY_TRACES_H
#define TA_TEST_REPLAY_TRACES_H

#include <stddef.h>
#include <stdint.h>

#include "sim.h"
#include "torchalloc_replay.h"

static inline uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* `n` events on `streams` streams (0 .. streams - 1) from `seed`. */
static inline void random_trace(torchalloc_replay_event *ev, size_t n, uint64_t seed, unsigned streams) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = xorshift(&x) % 100;
    int kind = r < 55 ? TORCHALLOC_REPLAY_ALLOC : r < 97 ? TORCHALLOC_REPLAY_FREE
               : r % 2 ? TORCHALLOC_REPLAY_PHASE_BEGIN : TORCHALLOC_REPLAY_PHASE_END;
    uint64_t size = xorshift(&x) % 2 ? xorshift(&x) % (64 * KiB) : xorshift(&x) % (24 * MiB);
    ev[i] = (torchalloc_replay_event){.addr = xorshift(&x) % 256, .size = kind == TORCHALLOC_REPLAY_ALLOC ? size : 0,
                                      .stream = xorshift(&x) % streams, .phase = (uint16_t)(xorshift(&x) % 4),
                                      .kind = (uint8_t)kind};
  }
}

#endif
