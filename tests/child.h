/* Running a piece of a test in a forked child, for what may kill or hang a
 * process (an abort, a signal, a file-size limit): its wait status tells. */
#ifndef TA_TEST_CHILD_H
#define TA_TEST_CHILD_H

#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs body(arg) in a child with stderr captured into `out` (len bytes,
 * NUL-terminated); the child exits 0 when body returns. Its wait status,
 * or -1 when it could not be started. */
static inline int run_in_child(void (*body)(const void *), const void *arg, char *out, size_t len) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    body(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t got = 0;
  ssize_t r;
  while (got < len - 1 && (r = read(fds[0], out + got, len - 1 - got)) > 0) got += (size_t)r;
  out[got] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

/* Whether the child exited 0; when it did not, how it ended (its exit
 * status or its signal) goes to stderr, for the failing test's output. */
static inline int child_exited_cleanly(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
  if (WIFEXITED(status)) fprintf(stderr, "  the child exited with %d\n", WEXITSTATUS(status));
  else fprintf(stderr, "  the child died of signal %d\n", WTERMSIG(status));
  return 0;
}

#endif
