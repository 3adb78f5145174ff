/* Host memory that runs out on demand. The parts' test programs are linked
 * with -Wl,--wrap for calloc, malloc and realloc (tests/parts/CMakeLists.txt),
 * so every such call in the part, the fake segment layer and the test comes
 * here first: a test arms a failure, calls the part, and sees what the part
 * does when the host says no (the paths the public API can reach only by
 * luck). Single-threaded: the parts run under the heap lock. */
#ifndef TA_TEST_HOST_FAULTS_H
#define TA_TEST_HOST_FAULTS_H

/* The `n`th host allocation from now fails (1: the next), and only that
 * one; 0 disarms. */
void host_fail_in(long n);
/* Allocations refused so far. */
long host_failures(void);

#endif
