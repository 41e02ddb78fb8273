/*
 * vmsr-stats-read: a reader of vmsr-helper's statistics fd, written from docs/stats-fd.md alone.
 *
 *   vmsr-stats-read SOCKET HOST_VM_ID     (0 = the host's file)
 *
 * Connects to the helper's socket, sends the v2 magic and one STATS_FD request, receives the reply
 * frame with its fd (SCM_RIGHTS), closes the connection, reads the header and descriptors once, then
 * one consistent sample (generation, data block, generation; again while they differ or are odd) and
 * prints "id <id string>" then one line per descriptor: "<name> <type> <unit> <exponent> <v0> <v1>...".
 * Build: cc -O2 -Wall -o vmsr-stats-read vmsr-stats-read.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct header { uint32_t flags, name_size, num_desc, id_offset, desc_offset, data_offset; };
struct desc { uint32_t flags; int16_t exponent; uint16_t size; uint32_t offset; uint32_t reserved; };

static uint32_t le32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static int die(const char *what) { fprintf(stderr, "cannot %s: %s\n", what, errno ? strerror(errno) : "bad input"); return 1; }

static int read_all(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* The STATS_FD reply: 8-byte header + 8-byte payload, the fd riding on its first byte. */
static int get_fd(const char *path, uint32_t id) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  if (s < 0 || strlen(path) >= sizeof a.sun_path) return -1;
  strcpy(a.sun_path, path);
  if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) return -1;
  unsigned char req[16] = { 'V', 'M', 'S', '2', 0x09, 0, 0, 0, 4, 0, 0, 0 };
  req[12] = id & 0xff; req[13] = id >> 8 & 0xff; req[14] = id >> 16 & 0xff; req[15] = id >> 24;
  if (write(s, req, sizeof req) != sizeof req) return -1;
  unsigned char head[8];
  char control[CMSG_SPACE(sizeof(int))];
  struct iovec iov = { head, sizeof head };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control };
  ssize_t n = recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  if (n != 8) return -1;
  uint32_t type = head[0] | head[1] << 8, len = le32(head + 4);
  unsigned char payload[65536];
  if (len > sizeof payload || read_all(s, payload, len) < 0) return -1;
  if (type == 0xff) {
    fprintf(stderr, "helper refused: ERROR %u: %.*s\n", le32(payload), (int)(len - 8), payload + 8);
    close(s);
    errno = 0;
    return -2;
  }
  int fd = -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (type == 0x87 && c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
  close(s); /* the fd outlives the connection */
  return fd;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s SOCKET HOST_VM_ID\n", argv[0]); return 2; }
  int fd = get_fd(argv[1], (uint32_t)strtoul(argv[2], NULL, 10));
  if (fd == -2) return 3;
  if (fd < 0) return die("get the statistics fd");
  struct stat st;
  if (fstat(fd, &st) < 0 || st.st_size < 24 || st.st_size > (1 << 20)) return die("size the statistics file");
  size_t size = (size_t)st.st_size;
  unsigned char *file = malloc(size);
  if (!file || pread(fd, file, size, 0) != (ssize_t)size) return die("read the statistics file");
  struct header h = { le32(file), le32(file + 4), le32(file + 8), le32(file + 12), le32(file + 16), le32(file + 20) };
  size_t dsz = 16 + (size_t)h.name_size;
  if (h.name_size < 2 || h.name_size > 256 || h.num_desc > 256 || h.id_offset + h.name_size > size ||
      h.desc_offset + h.num_desc * dsz > h.data_offset || h.data_offset > size) return die("trust the header");
  file[h.id_offset + h.name_size - 1] = 0;
  printf("id %s\n", (char *)file + h.id_offset);
  /* Descriptors: read once; the generation is the one named "generation". */
  size_t data_size = size - h.data_offset;
  int64_t gen_off = -1;
  for (uint32_t i = 0; i < h.num_desc; i++) {
    unsigned char *d = file + h.desc_offset + i * dsz;
    d[dsz - 1] = 0;
    if (le32(d + 8) % 8 || le32(d + 8) + 8ull * (d[6] | d[7] << 8) > data_size) return die("trust a descriptor");
    if (strcmp((char *)d + 16, "generation") == 0) gen_off = h.data_offset + le32(d + 8);
  }
  if (gen_off < 0) return die("find the generation");
  unsigned char *data = malloc(data_size), g1[8], g2[8];
  for (int tries = 0;; tries++) {
    if (tries == 1000) { errno = EAGAIN; return die("read a whole sample"); }
    if (tries > 10) usleep(1000); /* the helper may be preempted mid-sample: back off, do not spin */
    if (pread(fd, g1, 8, gen_off) != 8) return die("read the generation");
    if (le64(g1) & 1) continue;
    if (pread(fd, data, data_size, h.data_offset) != (ssize_t)data_size) return die("read the data block");
    if (pread(fd, g2, 8, gen_off) != 8) return die("read the generation");
    if (le64(g1) == le64(g2)) break;
  }
  static const char *types[] = { "cumulative", "instant", "peak" };
  for (uint32_t i = 0; i < h.num_desc; i++) {
    unsigned char *d = file + h.desc_offset + i * dsz;
    uint32_t flags = le32(d), off = le32(d + 8);
    int16_t exp = (int16_t)(d[4] | d[5] << 8);
    uint16_t n = d[6] | d[7] << 8;
    printf("%s %s %u %d", (char *)d + 16, (flags & 0xf) <= 2 ? types[flags & 0xf] : "?", (flags >> 4) & 0xf, exp);
    for (uint16_t k = 0; k < n; k++) printf(" %" PRIu64, k == 0 && off + h.data_offset == (uint64_t)gen_off ? le64(g1) : le64(data + off + 8 * k));
    printf("\n");
  }
  /* The fd is read-only: a write through it fails. */
  if (write(fd, "x", 1) >= 0) { fprintf(stderr, "the statistics fd took a write\n"); return 4; }
  close(fd);
  return 0;
}
