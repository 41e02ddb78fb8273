/*
 * A stand-in for a QEMU process: THREADS threads that sleep (vCPUs), the main thread waiting for
 * stdin to close. Prints "ready" once every thread exists.   idle-threads THREADS [WAKE_MS [ARGS...]]
 * With WAKE_MS > 0 each thread wakes that often (as an idle guest's timer does) and sleeps again;
 * further ARGS are ignored (QEMU-like arguments, e.g. -name, for /proc/PID/cmdline).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int wake_ms;

static void *sleeper(void *arg) {
  (void)arg;
  if (wake_ms <= 0)
    for (;;) pause();
  for (;;) usleep((useconds_t)wake_ms * 1000);
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8;
  wake_ms = argc > 2 ? atoi(argv[2]) : 0;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setstacksize(&a, 64 * 1024);
  for (int i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, &a, sleeper, NULL) != 0) { perror("pthread_create"); return 2; }
  }
  printf("ready\n");
  fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0) {}
  return 0;
}
