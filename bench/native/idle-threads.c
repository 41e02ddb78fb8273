/*
 * A stand-in for a QEMU process: THREADS threads that sleep (vCPUs), the main thread waiting for
 * stdin to close. Prints "ready" once every thread exists.   idle-threads THREADS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *sleeper(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8;
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
