/* Write a large torchalloc log on the simulated device, for bench/bench_scale.py.
 *
 * Drives the library (sim backend, logging on, no Python: so no stacks) with
 * a training-like pattern until about RECORDS records are written:
 *   - "init": the parameters (persistent);
 *   - every step: "forward" makes one activation per layer (its size varies
 *     with the step, as batches and sequence lengths do) and a temporary
 *     per layer freed at once; "backward" frees the activations in reverse,
 *     with a temporary per layer, the first step's gradients (kept), and a
 *     communication bucket on a second stream every few layers, freed at
 *     the end of backward; "optimizer" makes the optimizer state on the
 *     first step (kept) and temporaries per parameter;
 *   - an input batch on a third stream per step, freed after backward;
 *   - a marker "step N" every 1000 steps.
 * About 200 records per step. Not a test: a data generator.
 *
 *   make_big_log PATH RECORDS [POLICY]      e.g. make_big_log /tmp/big.talog 100000000 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "torchalloc.h"

#define LAYERS 24
#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static cudaStream_t stream_of(uintptr_t k) { return (cudaStream_t)k; }

static long long records; /* what this program caused: one per call (segment records come on top) */

static void *must(size_t size, cudaStream_t stream) {
  records++;
  void *p = torchalloc_malloc(size, 0, stream);
  if (!p) {
    fprintf(stderr, "make_big_log: allocation of %zu bytes failed: %s\n", size, torchalloc_last_error());
    exit(1);
  }
  return p;
}

static void release(void *p, size_t size, cudaStream_t stream) {
  records++;
  torchalloc_free(p, size, 0, stream);
}

static void begin(const char *phase) {
  records++;
  torchalloc_phase_begin(phase);
}

static void end(const char *phase) {
  records++;
  torchalloc_phase_end(phase);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: make_big_log PATH RECORDS [POLICY]\n");
    return 2;
  }
  long long target = atoll(argv[2]);
  const char *policy = argc > 3 ? argv[3] : "caching";
  char conf[512];
  snprintf(conf, sizeof conf, "backend:sim,sim_capacity:80GiB,warn:0,oom:null,oom_report:off,policy:%s", policy);
  if (torchalloc_init(conf) != 0 || torchalloc_log_open(argv[1]) != 0) {
    fprintf(stderr, "make_big_log: %s\n", torchalloc_last_error());
    return 1;
  }
  void *params[LAYERS], *grads[LAYERS], *state[2 * LAYERS], *acts[LAYERS], *buckets[LAYERS];
  size_t param_size[LAYERS], act_size[LAYERS], bucket_size[LAYERS];
  int nbuckets = 0;
  begin("init");
  for (int l = 0; l < LAYERS; l++) {
    param_size[l] = (size_t)(1 + l % 4) * 4 * MiB + (size_t)l * 512;
    params[l] = must(param_size[l], stream_of(0));
  }
  end("init");
  char label[32];
  for (long long step = 0; records < target; step++) {
    if (step % 1000 == 0) {
      snprintf(label, sizeof label, "step %lld", step);
      torchalloc_mark(label);
      records++;
    }
    size_t batch = (size_t)(1 + step % 4); /* batch or sequence length varies */
    void *input = must(batch * 2 * MiB, stream_of(2));
    begin("forward");
    for (int l = 0; l < LAYERS; l++) {
      act_size[l] = batch * ((size_t)(1 + (l * 7) % 5) * MiB + (size_t)(l % 3) * 96 * KiB);
      acts[l] = must(act_size[l], stream_of(0));
      size_t tmp = batch * (64 * KiB + (size_t)l * 4 * KiB);
      void *t = must(tmp, stream_of(0));
      release(t, tmp, stream_of(0));
    }
    end("forward");
    begin("backward");
    for (int l = LAYERS - 1; l >= 0; l--) {
      size_t tmp = batch * (256 * KiB + (size_t)l * 8 * KiB);
      void *t = must(tmp, stream_of(0));
      if (step == 0) grads[l] = must(param_size[l], stream_of(0));
      release(acts[l], act_size[l], stream_of(0));
      release(t, tmp, stream_of(0));
      if (l % 4 == 0) {
        bucket_size[nbuckets] = 25 * MiB;
        buckets[nbuckets] = must(bucket_size[nbuckets], stream_of(1));
        nbuckets++;
      }
    }
    for (int b = 0; b < nbuckets; b++) release(buckets[b], bucket_size[b], stream_of(1));
    nbuckets = 0;
    end("backward");
    release(input, batch * 2 * MiB, stream_of(2));
    begin("optimizer");
    for (int l = 0; l < LAYERS; l++) {
      if (step == 0) {
        state[2 * l] = must(param_size[l], stream_of(0));
        state[2 * l + 1] = must(param_size[l], stream_of(0));
      }
      void *t = must(param_size[l], stream_of(0));
      release(t, param_size[l], stream_of(0));
    }
    end("optimizer");
  }
  (void)params, (void)grads, (void)state; /* persistent: live at the end of the log */
  torchalloc_log_close();
  printf("%lld records written (counting calls; segment records come on top)\n", records);
  return 0;
}
