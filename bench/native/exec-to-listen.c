/*
 * Start-up time as a user sees it: from fork+exec of COMMAND until a connect() to SOCK succeeds
 * (tried every 100 us), or with SOCK "-" until the command exits. The command is then sent SIGTERM.
 *
 * cpu_ms is the command's CPU time (user + system, all threads) until it exited after that signal.
 *
 *   exec-to-listen SOCK TIMEOUT_MS COMMAND ARGS...  ->  ms=X cpu_ms=Y
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double child_cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: exec-to-listen SOCK TIMEOUT_MS COMMAND ARGS...\n"); return 2; }
  const char *sock = argv[1];
  uint64_t timeout = (uint64_t)atoi(argv[2]) * 1000000ull;
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
  uint64_t t0 = now_ns();
  pid_t pid = fork();
  if (pid == 0) {
    execvp(argv[3], argv + 3);
    perror("exec");
    _exit(127);
  }
  int status;
  for (;;) {
    uint64_t t = now_ns();
    if (strcmp(sock, "-") == 0) {
      if (waitpid(pid, &status, WNOHANG) == pid) { printf("ms=%.3f cpu_ms=%.1f\n", (t - t0) / 1e6, child_cpu_ms()); return 0; }
    } else {
      int fd = socket(AF_UNIX, SOCK_STREAM, 0);
      if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        close(fd);
        double ms = (now_ns() - t0) / 1e6;
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        printf("ms=%.3f cpu_ms=%.1f\n", ms, child_cpu_ms());
        return 0;
      }
      close(fd);
      if (waitpid(pid, &status, WNOHANG) == pid) { fprintf(stderr, "exec-to-listen: command exited before listening\n"); return 3; }
    }
    if (t - t0 > timeout) { kill(pid, SIGKILL); waitpid(pid, &status, 0); fprintf(stderr, "exec-to-listen: timed out\n"); return 3; }
    struct timespec d = { 0, 100000 };
    nanosleep(&d, NULL);
  }
}
