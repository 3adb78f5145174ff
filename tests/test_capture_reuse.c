/* graph_capture_record_stream_reuse on the sim device, whose capture model
 * knows the graph's topology (backend_sim_graph.c): inside a capture, a
 * block freed after record_stream is reused by a request of its stream once
 * the capture joined the other stream back (PyTorch's test_graph_capture_
 * reclaim_2_streams), never before (a kernel of the other stream may still
 * run alongside the new use), and without the option only after the
 * capture. As PyTorch's graph capture does: the capture's allocations go to
 * its private pool, routing is on, the side stream forks from the capture
 * stream by waiting for it. */
#include "sim.h"
#include "torchalloc_sim.h"

#define POOL 7, 0 /* the graph's pool: (capture id, 0) */

typedef struct capture_run {
  void *first;  /* the block freed after record_stream on S1 */
  void *before; /* asked for on S0 before S0 waited for S1 */
  void *after;  /* asked for on S0 after it did */
  void *ended;  /* asked for on S0 after the capture */
} capture_run;

/* S0 captures; S1 forks from it, reads a block S0 wrote, and the block is
 * freed; S0 asks for the same size before and after it waits for S1. */
static capture_run run_capture(const char *conf) {
  capture_run r = {0};
  if (sim_reset(conf) != 0) {
    g_failures++;
    return r;
  }
  torchalloc_pool_retain(0, POOL);
  torchalloc_routing_begin(0);
  torchalloc_sim_capture(0, S0, 1);
  torchalloc_sim_stream_wait(0, S1, S0); /* fork: S1 joins the capture */
  r.first = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  if (!r.first) {
    g_failures++;
    return r;
  }
  torchalloc_sim_use(0, S0, r.first, 1 * MiB); /* S0 writes it */
  torchalloc_sim_stream_wait(0, S1, S0);
  torchalloc_record_stream(r.first, S1);
  torchalloc_sim_use(0, S1, r.first, 1 * MiB); /* S1 reads it */
  torchalloc_free(r.first, 1 * MiB, 0, S0);
  torchalloc_sim_use(0, S0, NULL, 0); /* S0 goes on with other work, S1 too */
  torchalloc_sim_use(0, S1, NULL, 0);
  r.before = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  torchalloc_sim_stream_wait(0, S0, S1); /* join: S0's next work comes after all of S1's */
  r.after = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  torchalloc_sim_capture(0, S0, 0);
  torchalloc_routing_end(0);
  r.ended = torchalloc_pool_malloc(1 * MiB, 0, S0, POOL);
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 0); /* no event recorded or queried in the capture */
  CHECK_INVARIANTS();
  return r;
}

TEST(reused_after_the_join_never_before) {
  capture_run r = run_capture("graph_capture_record_stream_reuse:1");
  CHECK(r.before && r.before != r.first); /* S1's read may still run: not yet */
  CHECK(r.after == r.first);              /* the graph orders S1's read before S0's next work */
  CHECK(r.ended && r.ended != r.first);
}

TEST(without_the_option_it_waits_for_the_capture_end) {
  capture_run r = run_capture("");
  CHECK(r.before && r.before != r.first);
  CHECK(r.after && r.after != r.first);
  CHECK(r.ended == r.first); /* back once the capture ended and its events completed */
}

TEST(pytorch_settings_turn_it_on_and_off) {
  REQUIRE(sim_reset("") == 0);
  REQUIRE(torchalloc_set_allocator_settings("graph_capture_record_stream_reuse:True") == 0);
  REQUIRE(torchalloc_set_allocator_settings("expandable_segments:False") == 0); /* left as it was, as PyTorch */
  torchalloc_pool_retain(0, POOL);
  torchalloc_routing_begin(0);
  torchalloc_sim_capture(0, S0, 1);
  torchalloc_sim_stream_wait(0, S1, S0);
  void *a = torchalloc_pool_malloc(4096, 0, S0, POOL);
  REQUIRE(a);
  torchalloc_record_stream(a, S1);
  torchalloc_sim_use(0, S1, a, 4096);
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_sim_stream_wait(0, S0, S1);
  void *b = torchalloc_pool_malloc(4096, 0, S0, POOL);
  CHECK(b == a);
  torchalloc_sim_capture(0, S0, 0);
  torchalloc_routing_end(0);
  CHECK(torchalloc_set_allocator_settings("graph_capture_record_stream_reuse:yes") == -1);
  CHECK(strstr(torchalloc_last_error(), "'yes' is not True or False") != NULL);
  REQUIRE(torchalloc_set_allocator_settings("graph_capture_record_stream_reuse:False") == 0);
  torchalloc_free(b, 4096, 0, S0);
}

/* A use stream that never joined the capture (its work is not in the graph)
 * gives no markers: the block waits for the capture's end, as PyTorch's. */
TEST(a_stream_outside_the_capture_keeps_it_until_the_end) {
  REQUIRE(sim_reset("graph_capture_record_stream_reuse:1") == 0);
  torchalloc_pool_retain(0, POOL);
  torchalloc_routing_begin(0);
  torchalloc_sim_capture(0, S0, 1);
  void *a = torchalloc_pool_malloc(4096, 0, S0, POOL);
  REQUIRE(a);
  torchalloc_record_stream(a, S2);
  torchalloc_free(a, 4096, 0, S0);
  torchalloc_sim_stream_wait(0, S0, S2);
  void *b = torchalloc_pool_malloc(4096, 0, S0, POOL);
  CHECK(b && b != a);
  torchalloc_sim_capture(0, S0, 0);
  torchalloc_routing_end(0);
  CHECK_EQ(torchalloc_sim_capture_violations(0, NULL, 0), 0);
  CHECK_INVARIANTS();
}
