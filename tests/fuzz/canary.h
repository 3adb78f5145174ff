/* The simulated device's memory, as far as the API driver needs it.
 *
 * The sim backend hands out addresses but keeps no bytes (80 GiB of fake
 * device cost a few bytes of host memory). To check end to end that every
 * range handed out stays the caller's, the driver writes what a program
 * would: a canary word, unique to the allocation, at the first, middle and
 * last 8-byte word of each block, into this sparse word store keyed by
 * device address. A block handed out again while live (or overlapping one
 * at those words) overwrites the older block's canary, and the older
 * block's next check fails. The exhaustive overlap check is the driver's
 * interval check (api_checks.c); the canary is what a user would notice.
 *
 * Single-threaded, fixed size, no allocation: the fuzzer calls it millions
 * of times. */
#ifndef TA_TEST_CANARY_H
#define TA_TEST_CANARY_H

#include <stddef.h>
#include <stdint.h>

/* Forget every word (a fresh device). */
void canary_reset(void);
/* Key words by `fn(address)` instead of the address (the driver: by the
 * physical memory behind it, so that two addresses of one memory collide);
 * NULL: by the address. Set before any word is written. */
void canary_set_translate(uint64_t (*fn)(uintptr_t addr));
/* Write block [addr, addr + size)'s canary words for allocation `serial`.
 * Returns 0, or -1 when the store is full (a driver bug: it holds at most
 * 3 words per live block). */
int canary_write(uintptr_t addr, size_t size, uint64_t serial);
/* 1 when every canary word of the block still holds `serial`'s value; else
 * 0 with *bad_addr the first word that does not. */
int canary_intact(uintptr_t addr, size_t size, uint64_t serial, uintptr_t *bad_addr);
/* The block was freed: its words are the device's again. */
void canary_erase(uintptr_t addr, size_t size);
/* The device copied [from, from + size) (keys) to [to, to + size): the
 * words there move with their values. */
void canary_move(uintptr_t from, uintptr_t to, size_t size);
/* Words held now. */
size_t canary_words(void);

#endif
