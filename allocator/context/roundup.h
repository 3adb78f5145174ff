/* roundup_power2_divisions: PyTorch's option that rounds a request up to
 * the next of N equal steps between two powers of 2 (1200 B in 4 steps
 * between 1024 and 2048: 1280), so that requests of slightly different
 * sizes share cached blocks. One table of divisions per power-of-2 interval
 * of the request size (1 MiB and below, 2 MiB, ... 32 GiB and above), as
 * PyTorch keeps it; a division of 0 or 1 rounds to 512 B as usual. */
#ifndef TA_ROUNDUP_H
#define TA_ROUNDUP_H

#include "base/common.h"

#define TA_ROUNDUP_INTERVALS 16 /* PyTorch's: [1 MiB, 64 GiB) in powers of 2 */

typedef struct ta_roundup {
  uint64_t divisions[TA_ROUNDUP_INTERVALS]; /* per interval: 0 or a power of 2 */
  int any;                                  /* some division is above 1: the hot path has work */
} ta_roundup;

/* Parse PyTorch's value syntax into `out`: one power of 2 for every size
 * ("4"), or a list of "MiB:divisions" entries whose MiB are powers of 2 and
 * ">" for every interval after the last named one ("[256:1,512:2,>:8]";
 * the first entry also covers the intervals below it). 0, or -1 with a
 * message in `err` (`out` unchanged). */
ta_internal int ta_roundup_parse(const char *text, ta_roundup *out, char *err, size_t errlen);

/* PyTorch's round_size for a request of `size` bytes when a division of
 * more than 1 applies to it; otherwise `size` itself (the policy rounds it
 * to 512 B). The result is a multiple of 512 B. */
ta_internal size_t ta_roundup_size(const ta_roundup *r, size_t size);

/* Apply a PyTorch allocator settings string ("key:value,...", the syntax
 * of PYTORCH_CUDA_ALLOC_CONF and torch.cuda.memory._set_allocator_settings):
 * roundup_power2_divisions into `r`, reset to none when the string does not
 * name it, as PyTorch resets it on each settings string; and
 * graph_capture_record_stream_reuse (True or False) into
 * *record_stream_reuse, left as it was when the string does not name it, as
 * PyTorch leaves it. The other keys configure PyTorch's own allocator
 * (PyTorch checks them before torchalloc is told): their values are
 * skipped. 0, or -1 with a message (nothing changed). */
ta_internal int ta_roundup_from_pytorch_settings(const char *text, ta_roundup *r, int *record_stream_reuse,
                                                  char *err, size_t errlen);

#endif
