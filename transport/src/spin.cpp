#include "troupe/transport/spin.hpp"

#include <sched.h>

namespace troupe::transport {

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void yield_cpu() noexcept { sched_yield(); }

}  // namespace troupe::transport
