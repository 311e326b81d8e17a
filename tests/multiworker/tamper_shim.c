/* A man in the middle inside one worker, for run_cluster.sh's tampered-frame scenario: preloaded
 * (LD_PRELOAD), it flips a bit of the first float32 12345.0 that the process sends with sendmsg
 * (the ring's frames; the control plane writes through TLS, not sendmsg), once: 12345.25 goes out,
 * a change that survives the sum. The byte
 * is altered on its way to the socket only: the worker's own buffer and what it tags stay as they
 * were, as if a relay on the link had altered it. Prints one line to stderr when it did. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

static int done;

ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  static ssize_t (*real)(int, const struct msghdr*, int);
  if (real == NULL) real = (ssize_t(*)(int, const struct msghdr*, int))dlsym(RTLD_NEXT, "sendmsg");
  if (done || msg == NULL || msg->msg_iovlen > 64) return real(fd, msg, flags);
  static const unsigned char pattern[4] = {0x00, 0xe4, 0x40, 0x46}; /* 12345.0f, little-endian */
  size_t before = 0; /* bytes of the message ahead of the iov searched */
  for (size_t i = 0; i < msg->msg_iovlen; ++i) {
    const unsigned char* p = msg->msg_iov[i].iov_base;
    const size_t n = msg->msg_iov[i].iov_len;
    for (size_t at = 0; n >= 4 && at + 4 <= n; at += 4) {
      if (memcmp(p + at, pattern, 4) != 0) continue;
      struct iovec iov[64];
      memcpy(iov, msg->msg_iov, msg->msg_iovlen * sizeof iov[0]);
      unsigned char* copy = malloc(n);
      if (copy == NULL) return real(fd, msg, flags);
      memcpy(copy, p, n);
      copy[at + 1] ^= 0x01;
      iov[i].iov_base = copy;
      struct msghdr altered = *msg;
      altered.msg_iov = iov;
      const ssize_t sent = real(fd, &altered, flags);
      free(copy);
      if (sent > 0 && (size_t)sent > before + at + 1) {
        done = 1;
        fprintf(stderr, "tamper: flipped a bit of a float32 12345 at byte %zu of a message of %zd bytes\n",
                before + at + 1, sent);
      }
      return sent;
    }
    before += n;
  }
  return real(fd, msg, flags);
}
