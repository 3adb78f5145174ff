/* Memory shared beyond one device, on the simulated device:
 *   - peer access: the sim records, per mapped granule, which devices its
 *     mapping names (cuMemSetAccess) and counts a violation when another
 *     device's copy touches memory that does not name it
 *     (torchalloc_sim_peer_use), as CUDA answers "invalid argument";
 *   - CUDA IPC: a block described in PyTorch's wire format and opened again
 *     (the sim lives in one process, so sender and receiver are the same
 *     process; an imported handle is a handle of its own over the
 *     sender's memory, as CUDA's is). */
#include <unistd.h>

#include "sim.h"
#include "torchalloc_sim.h"

#define D1 1

static int reset2(const char *extra) {
  char conf[256]; /* later keys win: `extra` may ask for more devices */
  snprintf(conf, sizeof conf, "sim_devices:2,sim_capacity:1GiB,expandable:reclaim%s%s", extra && *extra ? "," : "",
           extra ? extra : "");
  return sim_reset(conf);
}

static int64_t violations(int device) {
  char why[200] = "";
  return torchalloc_sim_capture_violations(device, why, sizeof why);
}

static uint64_t phys(int device, const void *p) {
  uint64_t x = 0;
  return torchalloc_sim_physical(device, p, &x) == 0 ? x : 0;
}

/* ------------------------------------------------------------------------
 * Peer access
 * ---------------------------------------------------------------------- */

TEST(asked_peers_reach_mapped_memory_only_once_granted) {
  REQUIRE(reset2("peers:asked") == 0);
  void *a = torchalloc_malloc(20 * MiB, 0, S0);
  REQUIRE(a);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, a, 20 * MiB), 1); /* the copy PyTorch would make fails */
  CHECK_EQ(violations(0), 1);
  CHECK_EQ(torchalloc_peer_access(0, D1), 0);
  CHECK_EQ(torchalloc_enable_peer_access(0, D1), 0);
  CHECK_EQ(torchalloc_peer_access(0, D1), 1);
  CHECK_EQ(torchalloc_peer_access(D1, 0), 0); /* one direction: device 1's memory is still its own */
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, a, 20 * MiB), 0); /* mapped before the grant */
  void *b = torchalloc_malloc(100 * MiB, 0, S0);           /* the segment grows: mapped after it */
  void *c = torchalloc_malloc(300 * KiB, 0, S1);           /* a small-pool segment of another stream */
  REQUIRE(b && c);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, b, 100 * MiB), 0);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, c, 300 * KiB), 0);
  CHECK_EQ(torchalloc_enable_peer_access(0, D1), 0); /* again: nothing changes */
  CHECK_EQ(violations(0), 1);
  torchalloc_free(a, 20 * MiB, 0, S0);
  torchalloc_free(b, 100 * MiB, 0, S0);
  torchalloc_free(c, 300 * KiB, 0, S1);
  CHECK_INVARIANTS();
}

/* Reclaim moves free memory: the granules it maps at a new address must
 * name the peers there too (a remap, not only a fresh map). */
TEST(memory_moved_by_reclaim_keeps_its_peers) {
  REQUIRE(reset2("peers:asked,handle:2MiB") == 0);
  REQUIRE(torchalloc_enable_peer_access(0, D1) == 0);
  void *a = torchalloc_malloc(24 * MiB, 0, S0);
  void *b = torchalloc_malloc(24 * MiB, 0, S0);
  REQUIRE(a && b);
  uint64_t a_phys = phys(0, a);
  torchalloc_free(a, 24 * MiB, 0, S0);
  void *c = torchalloc_malloc(40 * MiB, 0, S0); /* no hole holds it: a's granules move to the segment's end */
  REQUIRE(c);
  int moved = 0;
  for (size_t off = 0; off < 40 * MiB; off += 2 * MiB) moved |= phys(0, (char *)c + off) == a_phys;
  CHECK(moved); /* else the test proves nothing about remapping */
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, c, 40 * MiB), 0);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, b, 24 * MiB), 0);
  CHECK_EQ(violations(0), 0);
  torchalloc_free(b, 24 * MiB, 0, S0);
  torchalloc_free(c, 40 * MiB, 0, S0);
  CHECK_INVARIANTS();
}

/* peers:all (the default, the plain route's): a device the process
 * allocates on reaches every other device's memory from then on, mapped
 * before or after; one it never allocates on is never named (granting it
 * would make each map and unmap dearer for nothing). */
TEST(all_peers_in_use_are_granted_from_their_first_allocation) {
  REQUIRE(reset2("sim_devices:3") == 0);
  void *a = torchalloc_malloc(20 * MiB, 0, S0);
  REQUIRE(a);
  CHECK_EQ(torchalloc_peer_access(0, D1), 0); /* device 1 holds nothing of this process yet */
  void *b = torchalloc_malloc(20 * MiB, D1, S0);
  REQUIRE(b);
  CHECK_EQ(torchalloc_peer_access(0, D1), 1);
  CHECK_EQ(torchalloc_peer_access(D1, 0), 1);
  CHECK_EQ(torchalloc_peer_access(0, 2), 0); /* device 2 is never used */
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, a, 20 * MiB), 0); /* mapped before device 1 was in use */
  CHECK_EQ(torchalloc_sim_peer_use(D1, 0, b, 20 * MiB), 0);
  void *c = torchalloc_malloc(100 * MiB, 0, S0); /* mapped after */
  REQUIRE(c);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, c, 100 * MiB), 0);
  CHECK_EQ(torchalloc_sim_peer_use(0, 2, c, 100 * MiB), 1);
  CHECK_EQ(violations(0) + violations(D1), 1);
  torchalloc_free(a, 20 * MiB, 0, S0);
  torchalloc_free(b, 20 * MiB, D1, S0);
  torchalloc_free(c, 100 * MiB, 0, S0);
}

TEST(ordinary_segments_are_reached_through_the_context) {
  REQUIRE(reset2("peers:asked,expandable:off") == 0);
  void *a = torchalloc_malloc(20 * MiB, 0, S0);
  REQUIRE(a);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, a, 20 * MiB), 0); /* cudaDeviceEnablePeerAccess is PyTorch's call */
  torchalloc_free(a, 20 * MiB, 0, S0);
}

TEST(peer_access_to_a_device_that_does_not_exist_is_refused) {
  REQUIRE(reset2("peers:asked") == 0);
  CHECK_EQ(torchalloc_enable_peer_access(0, 5), -1);
  CHECK(strstr(torchalloc_last_error(), "device 5 does not exist") != NULL);
  CHECK_EQ(torchalloc_enable_peer_access(0, -1), -1);
  CHECK_EQ(torchalloc_enable_peer_access(7, 0), -1); /* no such heap */
  CHECK_EQ(torchalloc_enable_peer_access(0, 0), 0);  /* a device always reaches its own memory */
  CHECK_EQ(torchalloc_peer_access(0, 0), 1);
}

/* ------------------------------------------------------------------------
 * CUDA IPC
 * ---------------------------------------------------------------------- */

typedef struct wire {
  unsigned char bytes[4096];
  size_t len, offset;
} wire;

static int share(const void *p, wire *w) {
  return torchalloc_ipc_share(p, w->bytes, sizeof w->bytes, &w->len, &w->offset);
}

/* A fresh two-device sim (the default configuration) with one 8 MiB block of device 0, described in `w`. */
static void *shared_block(wire *w) {
  if (reset2(NULL) != 0) return NULL;
  void *p = torchalloc_malloc(8 * MiB, 0, S0);
  return p && share(p, w) == 0 ? p : NULL;
}

TEST(mapped_memory_travels_as_pytorchs_expandable_handles) {
  REQUIRE(reset2("peers:asked") == 0);
  void *pad = torchalloc_malloc(6 * MiB, 0, S0); /* the shared block starts inside the segment's first handle */
  void *p = torchalloc_malloc(12 * MiB, 0, S0);
  REQUIRE(pad && p);
  size_t need = 0, offset = 0;
  REQUIRE(torchalloc_ipc_share(p, NULL, 0, &need, &offset) == 0); /* asks the size */
  wire w;
  REQUIRE(share(p, &w) == 0);
  CHECK_EQ(w.len, need);
  CHECK_EQ(w.bytes[0], 2);   /* PyTorch's SHAREABLE_HANDLE_VERSION */
  CHECK_EQ(w.bytes[1], 'e'); /* SHAREABLE_CUDA_EXPANDABLE_SEGMENT */
  int32_t pid, pad_bytes, fd;
  uint64_t handle, n;
  memcpy(&pid, w.bytes + 2, 4);
  memcpy(&pad_bytes, w.bytes + 6, 4);
  memcpy(&handle, w.bytes + 10, 8);
  memcpy(&n, w.bytes + 18, 8);
  CHECK_EQ(pid, getpid());
  CHECK_EQ(pad_bytes, 0); /* zeroed: the receiver caches by these bytes */
  CHECK_EQ(handle, 8 * MiB);
  CHECK_EQ(n, 3); /* [6 MiB, 18 MiB) of the segment lies in its handles 0, 1 and 2 */
  CHECK_EQ(w.len, 2 + 24 + 3 * 4);
  CHECK_EQ(w.offset, 6 * MiB);
  memcpy(&fd, w.bytes + 26, 4);
  CHECK(fd > 0);

  void *q = NULL, *q2 = NULL;
  REQUIRE(torchalloc_ipc_open(0, w.bytes, w.len, &q) == 0);
  CHECK(q != p);
  CHECK_EQ(phys(0, (char *)q + w.offset), phys(0, p)); /* the same memory at another address */
  CHECK_EQ(phys(0, (char *)q + w.offset + 12 * MiB - 1), phys(0, (char *)p + 12 * MiB - 1));
  REQUIRE(torchalloc_ipc_open(0, w.bytes, w.len, &q2) == 0); /* the same bytes again: one mapping, two users */
  CHECK(q2 == q);
  CHECK_EQ(torchalloc_ipc_open_count(0), 1);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, q, 12 * MiB), 1); /* opened memory follows the device's peers too */
  CHECK_EQ(torchalloc_enable_peer_access(0, D1), 0);
  CHECK_EQ(torchalloc_sim_peer_use(0, D1, q, 12 * MiB), 0);

  /* The sender lets go of its block and its cache: the receiver's mapping keeps the memory. */
  uint64_t before = phys(0, p);
  torchalloc_free(p, 12 * MiB, 0, S0);
  torchalloc_free(pad, 6 * MiB, 0, S0);
  torchalloc_empty_cache(0);
  CHECK_EQ(stats0().reserved_bytes[ALL].current, 0);
  CHECK_EQ(phys(0, (char *)q + w.offset), before);
  CHECK_EQ(torchalloc_ipc_close(q), 0);
  CHECK_EQ(torchalloc_ipc_open_count(0), 1); /* one user left */
  CHECK_EQ(torchalloc_ipc_close(q), 0);
  CHECK_EQ(torchalloc_ipc_open_count(0), 0);
  CHECK_EQ(torchalloc_ipc_close(q), -1); /* closed already */
  CHECK_EQ(violations(0), 1);            /* the one peer use before the grant */
  CHECK_INVARIANTS();
}

TEST(an_ordinary_segment_travels_as_a_cuda_ipc_memory_handle) {
  REQUIRE(reset2("expandable:off") == 0);
  void *a = torchalloc_malloc(3 * MiB, 0, S0); /* a 20 MiB segment, split */
  void *b = torchalloc_malloc(3 * MiB, 0, S0);
  REQUIRE(a && b);
  wire w;
  REQUIRE(share(b, &w) == 0);
  CHECK_EQ(w.len, 66);
  CHECK_EQ(w.bytes[0], 2);
  CHECK_EQ(w.bytes[1], 'c'); /* SHAREABLE_CUDA_MALLOC */
  CHECK_EQ(w.offset, (size_t)((char *)b - (char *)a)); /* from the segment's start */
  void *q = NULL;
  REQUIRE(torchalloc_ipc_open(0, w.bytes, w.len, &q) == 0);
  CHECK(q == a); /* the sim's one process: the same allocation */
  CHECK_EQ(torchalloc_ipc_close(q), 0);
  void *bare = NULL; /* a bare 64-byte cudaIpcMemHandle_t, as older PyTorch sent */
  REQUIRE(torchalloc_ipc_open(0, w.bytes + 2, 64, &bare) == 0);
  CHECK(bare == a);
  CHECK_EQ(torchalloc_ipc_close(bare), 0);
  torchalloc_free(a, 3 * MiB, 0, S0);
  torchalloc_free(b, 3 * MiB, 0, S0);
}

TEST(bad_ipc_handles_are_refused_with_the_reason) {
  wire w;
  void *p = shared_block(&w);
  REQUIRE(p);
  void *q = NULL;
  unsigned char bad[4096];
  memcpy(bad, w.bytes, w.len);
  bad[0] = 3;
  CHECK_EQ(torchalloc_ipc_open(0, bad, w.len, &q), -1);
  CHECK(strstr(torchalloc_last_error(), "version 3") != NULL);
  CHECK_EQ(torchalloc_ipc_open(0, w.bytes, w.len - 1, &q), -1);
  CHECK(strstr(torchalloc_last_error(), "malformed") != NULL);
  CHECK_EQ(torchalloc_ipc_open(0, w.bytes, 1, &q), -1);
  memcpy(bad, w.bytes, w.len);
  int32_t other_pid = getpid() + 1;
  memcpy(bad + 2, &other_pid, 4);
  CHECK_EQ(torchalloc_ipc_open(0, bad, w.len, &q), -1);
  CHECK(strstr(torchalloc_last_error(), "process") != NULL);
  memcpy(bad, w.bytes, 26); /* one fabric handle (64 bytes) instead of a descriptor */
  memset(bad + 26, 7, 64);
  CHECK_EQ(torchalloc_ipc_open(0, bad, 26 + 64, &q), -1);
  CHECK(strstr(torchalloc_last_error(), "fabric") != NULL);
  memcpy(bad, w.bytes, w.len);
  uint64_t odd = 3 * MiB; /* pages the device cannot map */
  memcpy(bad + 10, &odd, 8);
  CHECK_EQ(torchalloc_ipc_open(0, bad, w.len, &q), -1);
  CHECK_EQ(torchalloc_ipc_open_count(0), 0);
  CHECK_EQ(torchalloc_ipc_share((char *)p + 64 * MiB, w.bytes, sizeof w.bytes, &w.len, &w.offset), -1);
  CHECK(strstr(torchalloc_last_error(), "no live torchalloc block") != NULL);
  torchalloc_free(p, 8 * MiB, 0, S0);
  CHECK_EQ(torchalloc_ipc_share(p, w.bytes, sizeof w.bytes, &w.len, &w.offset), -1); /* freed: no longer live */
  CHECK_EQ(torchalloc_ipc_close(p), -1);
  CHECK_EQ(violations(0), 0);
}

/* What the receiver has not closed at teardown is unmapped with it. */
TEST(teardown_unmaps_memory_still_open) {
  wire w;
  void *p = shared_block(&w);
  REQUIRE(p);
  void *q = NULL;
  REQUIRE(torchalloc_ipc_open(0, w.bytes, w.len, &q) == 0);
  torchalloc_free(p, 8 * MiB, 0, S0);
  torchalloc_teardown(); /* ASan would see a leak of the opening */
  REQUIRE(reset2(NULL) == 0);
  CHECK_EQ(torchalloc_ipc_open_count(0), 0);
}
