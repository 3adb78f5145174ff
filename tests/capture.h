/* Capture what the library writes on stderr (fd 2) between capture_begin()
 * and capture_end(), to check that a warning is printed exactly once.
 * Everything the test itself wants to print must wait until capture_end(). */
#ifndef TA_TEST_CAPTURE_H
#define TA_TEST_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct capture {
  int saved_fd; /* the real stderr, -1 when capturing failed */
  FILE *file;   /* the temporary file fd 2 points to meanwhile */
  char text[8192];
} capture;

static inline int capture_begin(capture *c) {
  memset(c, 0, sizeof *c);
  c->saved_fd = -1;
  fflush(stderr);
  c->file = tmpfile();
  if (!c->file) return -1;
  c->saved_fd = dup(2);
  if (c->saved_fd < 0 || dup2(fileno(c->file), 2) < 0) {
    fclose(c->file);
    c->file = NULL;
    return -1;
  }
  return 0;
}

/* Restore fd 2 and read what was written into c->text. Returns the number of
 * lines, or -1 when capturing did not work. */
static inline int capture_end(capture *c) {
  if (!c->file) return -1;
  fflush(stderr);
  dup2(c->saved_fd, 2);
  close(c->saved_fd);
  rewind(c->file);
  size_t n = fread(c->text, 1, sizeof c->text - 1, c->file);
  c->text[n] = '\0';
  fclose(c->file);
  c->file = NULL;
  int lines = 0;
  for (size_t i = 0; i < n; i++) lines += c->text[i] == '\n';
  if (n && c->text[n - 1] != '\n') lines++; /* an unterminated last line counts too */
  return lines;
}

/* Number of lines of c->text containing `needle`. */
static inline int capture_count(const capture *c, const char *needle) {
  int count = 0;
  const char *line = c->text;
  while (*line) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[1024];
    size_t m = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, line, m);
    buf[m] = '\0';
    if (strstr(buf, needle)) count++;
    line += len + (end ? 1 : 0);
  }
  return count;
}

/* Echo what was captured, for a failing check's context. */
static inline void capture_dump(const capture *c, const char *what) {
  fprintf(stderr, "  --- stderr captured during %s ---\n%s  --- end ---\n", what, c->text);
}

#endif
