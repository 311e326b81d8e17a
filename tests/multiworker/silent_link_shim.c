/* A relay that stops forwarding, inside one worker, for run_cluster.sh's silent-link scenario:
 * preloaded (LD_PRELOAD), it watches what the process sends with sendmsg (the ring's frames; the
 * control plane writes through TLS, not sendmsg) and, from the first message that carries a
 * float32 777.0, swallows everything later sent on that socket: each call reports every byte sent
 * and sends none. The connection stays open and both workers keep beating, as behind a relay
 * that stopped forwarding one way. Prints one line to stderr when it begins. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

static int silent_fd = -1;

ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  static ssize_t (*real)(int, const struct msghdr*, int);
  if (real == NULL) real = (ssize_t(*)(int, const struct msghdr*, int))dlsym(RTLD_NEXT, "sendmsg");
  if (msg == NULL) return real(fd, msg, flags);
  size_t total = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) total += msg->msg_iov[i].iov_len;
  if (fd == silent_fd) return (ssize_t)total;
  if (silent_fd < 0) {
    static const unsigned char pattern[4] = {0x00, 0x40, 0x42, 0x44}; /* 777.0f, little-endian */
    for (size_t i = 0; i < msg->msg_iovlen; ++i) {
      const unsigned char* p = msg->msg_iov[i].iov_base;
      const size_t n = msg->msg_iov[i].iov_len;
      for (size_t at = 0; n >= 4 && at + 4 <= n; at += 4) {
        if (memcmp(p + at, pattern, 4) != 0) continue;
        silent_fd = fd;
        fprintf(stderr, "silent link: swallowing what this worker sends on socket %d from now on\n", fd);
        return (ssize_t)total;
      }
    }
  }
  return real(fd, msg, flags);
}
