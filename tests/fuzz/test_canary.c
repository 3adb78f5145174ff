/* The API driver's canary store (canary.h) detects what it is there for,
 * and its deletion keeps every other word findable: a check that passes
 * because the store lost track would hide exactly the bugs it exists for. */
#include "../check.h"
#include "canary.h"

#define DEV0 ((uintptr_t)1 << 52)

TEST(a_block_handed_out_again_while_live_loses_its_canary) {
  canary_reset();
  uintptr_t bad = 0;
  CHECK(canary_write(DEV0, 4096, 1) == 0);
  CHECK(canary_intact(DEV0, 4096, 1, &bad));
  CHECK(!canary_intact(DEV0, 4096, 2, &bad)); /* another allocation's pattern */
  CHECK(canary_write(DEV0, 512, 2) == 0);     /* the same start handed out again */
  CHECK(!canary_intact(DEV0, 4096, 1, &bad));
  CHECK_EQ(bad, DEV0);
  CHECK(canary_write(DEV0 + 4096 - 512, 512, 3) == 0); /* over the first block's last word */
  CHECK(canary_write(DEV0, 4096, 1) == 0);
  CHECK(!canary_intact(DEV0 + 4096 - 512, 512, 3, &bad));
  CHECK_EQ(bad, DEV0 + 4096 - 8);
  canary_reset();
  CHECK_EQ(canary_words(), 0);
}

TEST(tiny_and_huge_blocks_have_their_words) {
  canary_reset();
  uintptr_t bad = 0;
  CHECK(canary_write(DEV0, 1, 7) == 0); /* one word: first, middle and last coincide */
  CHECK_EQ(canary_words(), 1);
  CHECK(canary_write(DEV0 + 512, (size_t)80 << 30, 8) == 0);
  CHECK_EQ(canary_words(), 4);
  CHECK(canary_intact(DEV0 + 512, (size_t)80 << 30, 8, &bad));
  canary_erase(DEV0, 1);
  canary_erase(DEV0 + 512, (size_t)80 << 30);
  CHECK_EQ(canary_words(), 0);
}

/* Random writes and erases of up to 500 blocks crowded into a few MiB (the
 * probe runs collide): after each erase every live block is still intact,
 * and erased ones are gone. */
TEST(erasing_keeps_every_other_word_findable) {
  canary_reset();
  enum { N = 500 };
  uintptr_t addr[N];
  size_t size[N];
  int live[N] = {0};
  uint64_t rng = 12345, serial[N];
  int failures = 0;
  for (int step = 0; step < 20000; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((rng >> 33) % N);
    uintptr_t bad;
    if (live[i]) {
      canary_erase(addr[i], size[i]);
      live[i] = 0;
      if (canary_intact(addr[i], size[i], serial[i], &bad)) failures++;
      for (int j = 0; j < N; j++)
        if (live[j] && !canary_intact(addr[j], size[j], serial[j], &bad)) failures++;
    } else {
      addr[i] = DEV0 + (uintptr_t)i * 8192; /* disjoint blocks, clustered slots */
      size[i] = 8 + (size_t)((rng >> 20) % 8000);
      serial[i] = (uint64_t)step + 1;
      if (canary_write(addr[i], size[i], serial[i]) != 0) failures++; /* one line at the end, not one per step */
      live[i] = 1;
    }
  }
  CHECK_EQ(failures, 0);
  for (int j = 0; j < N; j++)
    if (live[j]) canary_erase(addr[j], size[j]);
  CHECK_EQ(canary_words(), 0);
}
