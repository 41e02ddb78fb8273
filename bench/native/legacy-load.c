/*
 * Legacy-protocol load generator for the bench, the same for both helpers: CLIENTS connections,
 * each with one 12-byte request (MSR_PKG_ENERGY_STATUS, cpu 0, tid = our pid) in flight at a time,
 * as QEMU sends them; one thread, epoll. It measures for SECONDS: replies, round-trip percentiles, its
 * own CPU and the server's (sum of /proc/SERVER_PID/task/STAR/schedstat), from the first reply after
 * both WARMUP seconds have passed and every connection has been answered once. New connections cost
 * each helper its own way (accept, peer checks), and a helper whose listen backlog is short makes
 * connect() wait for accept: without the second condition that cost would land outside the figures
 * of one helper and inside those of the other. It is reported apart: setup_ms, from the first
 * connect() to the last connection's first reply.
 *
 *   legacy-load SOCK CLIENTS SECONDS WARMUP SERVER_PID [LATFILE]
 *   -> requests=N seconds=S p50_us=X p99_us=Y client_cpu_s=C server_cpu_s=D setup_ms=M
 *   With LATFILE, every measured round trip is also appended to it (uint32 ns, host byte order), so
 *   that runs can be pooled.
 *   legacy-load SOCK CLIENTS hold    (each client makes one request, prints "ready", waits for EOF)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct conn { int fd; int got; int answered; uint64_t t0; };

static uint64_t now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "legacy-load: %s: %s\n", what, strerror(errno));
  exit(2);
}

/* Run time of every thread of pid, ns (first field of schedstat). */
static uint64_t server_cpu_ns(int pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  uint64_t sum = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char p[320], buf[128];
    snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", pid, e->d_name);
    int fd = open(p, O_RDONLY);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) { buf[n] = 0; sum += strtoull(buf, NULL, 10); }
  }
  closedir(d);
  return sum;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static int connect_to(const char *sock) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
  return fd;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: legacy-load SOCK CLIENTS SECONDS WARMUP SERVER_PID | SOCK CLIENTS hold\n");
    return 2;
  }
  const char *sock = argv[1];
  int n = atoi(argv[2]);
  int hold = strcmp(argv[3], "hold") == 0;
  if (n < 1 || (!hold && argc < 6)) { fprintf(stderr, "legacy-load: bad arguments\n"); return 2; }
  double secs = hold ? 0 : atof(argv[3]);
  double warm = hold ? 0 : atof(argv[4]);
  int server = hold ? 0 : atoi(argv[5]);
  const char *latfile = !hold && argc > 6 ? argv[6] : NULL;

  unsigned char req[12];
  uint32_t msr = 0x611, cpu = 0, tid = (uint32_t)getpid();
  memcpy(req, &msr, 4); memcpy(req + 4, &cpu, 4); memcpy(req + 8, &tid, 4); /* x86: little-endian */

  int ep = epoll_create1(0);
  if (ep < 0) die("epoll_create1");
  struct conn *c = calloc((size_t)n, sizeof *c);
  uint64_t t_connect = now_ns(CLOCK_MONOTONIC), t_setup = 0;
  int first_replies = 0;
  for (int i = 0; i < n; i++) {
    c[i].fd = connect_to(sock);
    fcntl(c[i].fd, F_SETFL, O_NONBLOCK);
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev) < 0) die("epoll_ctl");
  }
  size_t cap = 1 << 20, count = 0;
  uint32_t *lat = malloc(cap * sizeof *lat);
  uint64_t t_start = now_ns(CLOCK_MONOTONIC);
  uint64_t t_measure = t_start + (uint64_t)(warm * 1e9), t_end = UINT64_MAX;
  for (int i = 0; i < n; i++) {
    c[i].t0 = now_ns(CLOCK_MONOTONIC);
    if (write(c[i].fd, req, 12) != 12) die("write");
  }
  int measuring = 0;
  uint64_t cpu0 = 0, srv0 = 0, t0 = 0;
  struct epoll_event evs[512];
  unsigned char buf[64];
  for (;;) {
    int k = epoll_wait(ep, evs, 512, 2000);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { fprintf(stderr, "legacy-load: no reply for 2 s\n"); return 3; }
    uint64_t t = now_ns(CLOCK_MONOTONIC);
    if (!hold && !measuring && t >= t_measure && first_replies == n) {
      measuring = 1; t0 = t; t_end = t0 + (uint64_t)(secs * 1e9); cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID); srv0 = server_cpu_ns(server);
    }
    if (!hold && t >= t_end) {
      uint64_t cpu1 = now_ns(CLOCK_PROCESS_CPUTIME_ID), srv1 = server_cpu_ns(server);
      qsort(lat, count, sizeof *lat, cmp_u32);
      if (latfile) {
        FILE *f = fopen(latfile, "ab");
        if (!f || fwrite(lat, sizeof *lat, count, f) != count || fclose(f) != 0) die(latfile);
      }
      double p50 = count ? lat[count / 2] / 1000.0 : 0, p99 = count ? lat[(size_t)(count * 0.99)] / 1000.0 : 0;
      printf("requests=%zu seconds=%.6f p50_us=%.2f p99_us=%.2f client_cpu_s=%.6f server_cpu_s=%.6f setup_ms=%.3f\n", count, (t - t0) / 1e9,
             p50, p99, (cpu1 - cpu0) / 1e9, (srv1 - srv0) / 1e9, (t_setup - t_connect) / 1e6);
      return 0;
    }
    for (int j = 0; j < k; j++) {
      struct conn *x = &c[evs[j].data.u32];
      ssize_t r = read(x->fd, buf, (size_t)(8 - x->got));
      if (r == 0) { fprintf(stderr, "legacy-load: server closed a connection\n"); return 3; }
      if (r < 0) { if (errno == EAGAIN) continue; die("read"); }
      x->got += (int)r;
      if (x->got < 8) continue;
      x->got = 0;
      if (!x->answered) {
        x->answered = 1;
        if (++first_replies == n) t_setup = t;
      }
      if (hold) {
        if (first_replies == n) {
          printf("ready\n");
          fflush(stdout);
          while (read(0, buf, sizeof buf) > 0) {}
          return 0;
        }
        continue;
      }
      if (measuring) {
        if (count == cap) { cap *= 2; lat = realloc(lat, cap * sizeof *lat); }
        uint64_t d = t - x->t0;
        lat[count++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
      }
      x->t0 = now_ns(CLOCK_MONOTONIC);
      if (write(x->fd, req, 12) != 12) die("write");
    }
  }
}
