/* What the CUDA driver's virtual memory calls cost, by physical handle size.
 *
 * Why: reclaim (allocator/segments) moves free memory to where it is needed
 * by unmapping and mapping physical handles; how large the handles are and
 * whether a run of them is unmapped in one call decide what a move costs.
 * This measures, for 1 GiB made of handles of 2 to 64 MiB: cuMemCreate,
 * cuMemMap (one call a handle), cuMemSetAccess (once over the range, and
 * once a handle), cuMemUnmap (once a handle, and once over the whole range:
 * the driver accepts a range that spans several mappings), mapping the same
 * handles at a second range, and cuMemRelease. Figures are the median of
 * ROUNDS rounds, in microseconds per call and per GiB.
 *
 * With --pieces: whether the driver maps part of a handle (cuMemMap at a
 * non-zero offset into it, which the CUDA 13 documentation says must be
 * zero), tried once and reported; where it does, physical handles of 64 MiB
 * to 1 GiB mapped in 8 MiB mappings, to learn whether setting access and
 * unmapping cost per mapping or per physical handle; and handles of 8 MiB to
 * 1 GiB mapped whole. Why: with fewer, larger handles a run of granules
 * would cost fewer driver calls, but a handle mapped whole is also the
 * smallest unit that can be unmapped, moved or given back.
 *
 * With --peers (two GPUs or more): the same, with every mapping made
 * readable and writable by device 1 as well (cuMemSetAccess given two
 * descriptors, as torchalloc's peer access does), beside the one-device
 * figures: what granting a peer at map time costs.
 *
 * Build and run (a GPU machine):
 *   gcc -O2 -std=c11 bench/vmm_costs.c -I/usr/local/cuda/include -lcuda -o vmm_costs && ./vmm_costs [--peers|--pieces] */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB ((size_t)1 << 20)
#define TOTAL ((size_t)1 << 30)
#define ROUNDS 5
#define MAX_HANDLES 512

enum { CREATE, MAP, ACCESS_RANGE, UNMAP_EACH, MAP2, ACCESS_EACH, UNMAP_RANGE, RELEASE, NSTEPS };
static const char *const STEP_NAMES[NSTEPS] = {"create",       "map",     "access (range)", "unmap (each)",
                                               "map again",    "access (each)", "unmap (range)", "release"};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int check(CUresult e, const char *what) {
  if (e == CUDA_SUCCESS) return 0;
  const char *s = NULL;
  cuGetErrorString(e, &s);
  fprintf(stderr, "vmm_costs: %s failed: %s\n", what, s ? s : "unknown error");
  return -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Map the TOTAL bytes of the handles in mappings of `piece` bytes, one
 * call each, back to back from `va` (a handle larger than a piece is mapped
 * in several, at its offsets). */
static int map_each(CUdeviceptr va, const CUmemGenericAllocationHandle *h, size_t handle, size_t piece,
                    const char *what) {
  for (size_t i = 0; i < TOTAL / piece; i++)
    if (check(cuMemMap(va + i * piece, piece, (i * piece) % handle, h[i * piece / handle], 0), what)) return -1;
  return 0;
}

/* One round for handles of `handle` bytes mapped in mappings of `piece`
 * bytes, access for `ndevices` devices (device 0, then 1): the time of each
 * step, in us. */
static int one_round(CUdevice dev, size_t handle, size_t piece, int ndevices, double out[NSTEPS]) {
  size_t n = TOTAL / handle, pieces = TOTAL / piece;
  CUmemGenericAllocationHandle h[MAX_HANDLES];
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = (int)dev;
  CUmemAccessDesc access[2] = {{.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                               {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
  access[1].location.id = 1;
  CUdeviceptr va = 0;
  if (check(cuMemAddressReserve(&va, TOTAL, handle, 0, 0), "cuMemAddressReserve")) return -1;
  double t = now_us();
  for (size_t i = 0; i < n; i++)
    if (check(cuMemCreate(&h[i], handle, &prop, 0), "cuMemCreate")) return -1;
  out[CREATE] = now_us() - t;
  t = now_us();
  if (map_each(va, h, handle, piece, "cuMemMap")) return -1;
  out[MAP] = now_us() - t;
  t = now_us();
  if (check(cuMemSetAccess(va, TOTAL, access, (size_t)ndevices), "cuMemSetAccess (range)")) return -1;
  out[ACCESS_RANGE] = now_us() - t;
  if (check(cuMemsetD8(va, 1, TOTAL), "cuMemsetD8") || check(cuCtxSynchronize(), "cuCtxSynchronize")) return -1;
  t = now_us();
  for (size_t i = 0; i < pieces; i++)
    if (check(cuMemUnmap(va + i * piece, piece), "cuMemUnmap (each)")) return -1;
  out[UNMAP_EACH] = now_us() - t;
  t = now_us();
  if (map_each(va, h, handle, piece, "cuMemMap (again)")) return -1;
  out[MAP2] = now_us() - t;
  t = now_us();
  for (size_t i = 0; i < pieces; i++)
    if (check(cuMemSetAccess(va + i * piece, piece, access, (size_t)ndevices), "cuMemSetAccess (each)")) return -1;
  out[ACCESS_EACH] = now_us() - t;
  t = now_us();
  if (check(cuMemUnmap(va, TOTAL), "cuMemUnmap (range)")) return -1;
  out[UNMAP_RANGE] = now_us() - t;
  t = now_us();
  for (size_t i = 0; i < n; i++)
    if (check(cuMemRelease(h[i]), "cuMemRelease")) return -1;
  out[RELEASE] = now_us() - t;
  return check(cuMemAddressFree(va, TOTAL), "cuMemAddressFree");
}

/* The median of ROUNDS rounds (after one for the driver's warm-up) of each
 * step, one table row a step: us per call and ms per GiB. */
static int measure(CUdevice dev, size_t handle_mib, size_t piece_mib, int ndevices) {
  size_t handle = handle_mib * MIB, piece = piece_mib * MIB, pieces = TOTAL / piece;
  double rounds[ROUNDS][NSTEPS];
  double warm[NSTEPS];
  if (one_round(dev, handle, piece, ndevices, warm)) return -1;
  for (int r = 0; r < ROUNDS; r++)
    if (one_round(dev, handle, piece, ndevices, rounds[r])) return -1;
  for (int k = 0; k < NSTEPS; k++) {
    double v[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) v[r] = rounds[r][k];
    qsort(v, ROUNDS, sizeof v[0], cmp_double);
    double med = v[ROUNDS / 2];
    size_t calls = (k == ACCESS_RANGE || k == UNMAP_RANGE) ? 1 : (k == CREATE || k == RELEASE) ? TOTAL / handle : pieces;
    printf("| %zu | %zu | %d | %s | %.1f | %.2f |\n", handle_mib, piece_mib, ndevices, STEP_NAMES[k],
           med / (double)calls, med / 1e3);
  }
  return 0;
}

/* cuMemMap of 8 MiB at offset 8 MiB into a 16 MiB handle: what the driver
 * says (CUDA_SUCCESS where it maps part of a handle). */
static CUresult map_at_offset(CUdevice dev) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = (int)dev;
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = 0;
  if (check(cuMemCreate(&h, 16 * MIB, &prop, 0), "cuMemCreate")) return CUDA_ERROR_UNKNOWN;
  if (check(cuMemAddressReserve(&va, 16 * MIB, 0, 0, 0), "cuMemAddressReserve")) return CUDA_ERROR_UNKNOWN;
  CUresult e = cuMemMap(va, 8 * MIB, 8 * MIB, h, 0);
  if (e == CUDA_SUCCESS) cuMemUnmap(va, 8 * MIB);
  cuMemAddressFree(va, 16 * MIB);
  cuMemRelease(h);
  return e;
}

int main(int argc, char **argv) {
  int peers = argc > 1 && strcmp(argv[1], "--peers") == 0, in_pieces = argc > 1 && strcmp(argv[1], "--pieces") == 0;
  if (argc > 1 && !peers && !in_pieces) {
    fprintf(stderr, "usage: vmm_costs [--peers|--pieces]\n");
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  if (check(cuInit(0), "cuInit") || check(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
      check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
      check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
    return 1;
  char name[128] = "";
  cuDeviceGetName(name, sizeof name, dev);
  int version = 0;
  cuDriverGetVersion(&version);
  int count = 0, can = 0;
  cuDeviceGetCount(&count);
  if (peers && (count < 2 || cuDeviceCanAccessPeer(&can, 1, dev) != CUDA_SUCCESS || !can)) {
    fprintf(stderr, "vmm_costs: --peers needs a second GPU that can reach device 0 (found %d devices)\n", count);
    return 2;
  }
  printf("%s, driver API %d; 1 GiB in handles of each size, mapped whole%s; median of %d rounds%s\n\n", name, version,
         in_pieces ? " (and in 8 MiB mappings where the driver maps part of a handle)" : "", ROUNDS,
         peers ? "; access for device 0 alone, and for devices 0 and 1" : "");
  printf("| handle MiB | mapping MiB | devices with access | step | us per call | ms per GiB |\n|---|---|---|---|---|---|\n");
  if (in_pieces) {
    CUresult e = map_at_offset(dev);
    const char *said = NULL;
    cuGetErrorName(e, &said);
    printf("cuMemMap of 8 MiB at offset 8 MiB into a 16 MiB handle: %s\n\n", said ? said : "unknown result");
    static const size_t handles[] = {8, 64, 256, 1024};
    for (size_t s = 0; s < sizeof handles / sizeof handles[0]; s++)
      if ((e == CUDA_SUCCESS && handles[s] > 8 && measure(dev, handles[s], 8, 1)) ||
          measure(dev, handles[s], handles[s], 1))
        return 1;
  } else {
    static const size_t sizes[] = {2, 4, 8, 16, 32, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (int ndevices = 1; ndevices <= (peers ? 2 : 1); ndevices++)
        if (measure(dev, sizes[s], sizes[s], ndevices)) return 1;
  }
  cuDevicePrimaryCtxRelease(dev);
  return 0;
}
