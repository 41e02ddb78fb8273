/*
 * The floor for sampling: what C pays per thread to pread its /proc/PID/task/TID/stat through a kept
 * fd and parse the fields the ratio engine uses (after the LAST ')': 14 utime, 15 stime,
 * 22 starttime, 39 processor). The bench compares the helper's sampling cost with this.
 *
 *   stat-floor ROUNDS PID...  ->  threads=N ns_per_thread=X   (process CPU time per thread per round)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sum of the four fields, or -1 when the line is not understood. */
static long long parse(const char *b, size_t n) {
  const char *close = memrchr(b, ')', n);
  if (!close) return -1;
  const char *p = close + 2, *end = b + n;
  long long sum = 0;
  for (int field = 3; field <= 39 && p < end; field++) {
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    if (!sp) sp = end;
    if (field == 14 || field == 15 || field == 22 || field == 39) {
      unsigned long long v = 0;
      for (const char *q = p; q < sp; q++) {
        if (*q < '0' || *q > '9') return -1;
        v = v * 10 + (unsigned)(*q - '0');
      }
      sum += (long long)v;
    }
    p = sp + 1;
  }
  return sum;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: stat-floor ROUNDS PID...\n"); return 2; }
  int rounds = atoi(argv[1]);
  int cap = 1024, nfd = 0;
  int *fds = malloc((size_t)cap * sizeof *fds);
  for (int i = 2; i < argc; i++) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%s/task", argv[i]);
    DIR *d = opendir(dir);
    if (!d) continue;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      char p[320];
      snprintf(p, sizeof p, "%s/%s/stat", dir, e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      if (nfd == cap) { cap *= 2; fds = realloc(fds, (size_t)cap * sizeof *fds); }
      fds[nfd++] = fd;
    }
    closedir(d);
  }
  if (nfd == 0) { fprintf(stderr, "stat-floor: no threads\n"); return 2; }
  char buf[4096];
  volatile long long sink = 0;
  uint64_t t0 = cpu_ns();
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < nfd; i++) {
      ssize_t n = pread(fds[i], buf, sizeof buf, 0);
      if (n > 0) sink += parse(buf, (size_t)n);
    }
  uint64_t t1 = cpu_ns();
  printf("threads=%d ns_per_thread=%.1f\n", nfd, (double)(t1 - t0) / rounds / nfd);
  return sink == -1;
}
