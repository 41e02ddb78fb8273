/*
 * A stand-in for a QEMU started with rapl=true, whose vmsr thread the guest-energy bench times: a
 * vCPU thread named "CPU 0/KVM" that spins, IDLE other threads that sleep (QEMU's rcu, worker and
 * other threads), and the main thread asking each helper (SOCKET, its DAEMON_PID; one or more) what
 * QEMU's vmsr thread asks: per window, one MSR_PKG_ENERGY_STATUS request (e_start), a 1 s sleep,
 * another (e_end), for WINDOWS windows; the helpers are asked in turn, in the same window (the
 * order reversed every window, each helper first woken by a request not measured), so they are
 * measured under the same load. Per request it prints "HELPER start|end LATENCY_NS DAEMON_CPU_NS
 * DAEMON_WAIT_NS OWN_WAIT_NS" (HELPER: its index): send to reply; the run time of the helper's main
 * thread (/proc/DAEMON_PID/schedstat field 1) and its time runnable but waiting for a CPU (field 2),
 * from before the request (the thread asleep) to when it sleeps again after the reply; this
 * thread's own wait for a CPU from the send to the reply read. (What it does right after replying counts; a
 * request that finds it busy waits, up to 100 ms, so other work is not counted). The literal below is what
 * QEMU's --version prints: the helper reads a peer's QEMU version from its executable.
 *   vmsr-thread WINDOWS IDLE SOCKET DAEMON_PID [SOCKET DAEMON_PID]...
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char qemu_version[] = "QEMU emulator version 10.0.2";
static volatile pid_t vcpu_tid;

static void *vcpu(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "CPU 0/KVM");
  vcpu_tid = (pid_t)syscall(SYS_gettid);
  for (volatile uint64_t x = 0;; x++) {
  }
  return NULL;
}

static void *idle(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* A thread's schedstat: field 1 (run time) and field 2 (time waiting for a CPU, runnable), ns. */
static void sched_ns(const char *path, int64_t v[2]) {
  char buf[128], *end = buf;
  FILE *f = fopen(path, "r");
  v[0] = v[1] = -1;
  if (f == NULL) return;
  if (fgets(buf, sizeof buf, f) != NULL) v[0] = strtoll(buf, &end, 10), v[1] = strtoll(end, NULL, 10);
  fclose(f);
}

/* Waits (up to 100 ms) until the thread whose stat file is `stat` sleeps (state S). */
static void wait_asleep(const char *stat) {
  char buf[1024];
  for (int i = 0; i < 2000; i++) {
    FILE *f = fopen(stat, "r");
    if (f == NULL) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *close = strrchr(buf, ')');
    if (close == NULL || close[1] == 0 || close[2] == 'S') return;
    usleep(50);
  }
}

struct helper {
  int fd;
  char sched[64], stat[64];
};

/* MSR_RAPL_POWER_UNIT, not measured: wakes the helper and this process after the 1 s sleep, so
 * that the requests measured next find both awake, whichever helper is asked first. */
static void wake(struct helper *h) {
  uint32_t req[3] = {0x606, 0, (uint32_t)vcpu_tid};
  uint64_t reply;
  if (write(h->fd, req, sizeof req) != sizeof req || read(h->fd, &reply, sizeof reply) != sizeof reply) {
    perror("request");
    exit(2);
  }
}

static void ask(int who, struct helper *h, const char *kind) {
  uint32_t req[3] = {0x611, 0, (uint32_t)vcpu_tid};
  uint64_t reply;
  int64_t d0[2], d1[2], s0[2], s1[2];
  wait_asleep(h->stat);
  sched_ns(h->sched, d0);
  sched_ns("/proc/thread-self/schedstat", s0);
  int64_t t0 = now_ns();
  if (write(h->fd, req, sizeof req) != sizeof req || read(h->fd, &reply, sizeof reply) != sizeof reply) {
    perror("request");
    exit(2);
  }
  int64_t t1 = now_ns();
  sched_ns("/proc/thread-self/schedstat", s1);
  wait_asleep(h->stat);
  sched_ns(h->sched, d1);
  printf("%d %s %lld %lld %lld %lld\n", who, kind, (long long)(t1 - t0), (long long)(d1[0] - d0[0]), (long long)(d1[1] - d0[1]),
         (long long)(s1[1] - s0[1]));
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 5 || argc % 2 == 0) {
    fprintf(stderr, "usage: vmsr-thread WINDOWS IDLE SOCKET DAEMON_PID [SOCKET DAEMON_PID]... (a %s stand-in)\n", qemu_version);
    return 2;
  }
  int windows = atoi(argv[1]), n_idle = atoi(argv[2]), n = (argc - 3) / 2;
  struct helper *h = calloc((size_t)n, sizeof *h);
  pthread_t t;
  pthread_create(&t, NULL, vcpu, NULL);
  for (int i = 0; i < n_idle; i++) pthread_create(&t, NULL, idle, NULL);
  while (vcpu_tid == 0) usleep(1000);
  for (int i = 0; i < n; i++) {
    snprintf(h[i].sched, sizeof h[i].sched, "/proc/%s/schedstat", argv[4 + 2 * i]);
    snprintf(h[i].stat, sizeof h[i].stat, "/proc/%s/stat", argv[4 + 2 * i]);
    h[i].fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, argv[3 + 2 * i], sizeof a.sun_path - 1);
    if (connect(h[i].fd, (struct sockaddr *)&a, sizeof a) != 0) {
      perror("connect");
      return 2;
    }
  }
  for (int w = 0; w < windows; w++) {
    /* Each window in the other order: neither helper is always asked first. */
    for (int k = 0; k < n; k++) wake(&h[k]);
    for (int k = 0; k < n; k++) ask(w % 2 ? n - 1 - k : k, &h[w % 2 ? n - 1 - k : k], "start");
    usleep(1000000);
    for (int k = 0; k < n; k++) wake(&h[k]);
    for (int k = 0; k < n; k++) ask(w % 2 ? n - 1 - k : k, &h[w % 2 ? n - 1 - k : k], "end");
  }
  return 0;
}
