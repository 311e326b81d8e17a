#include "troupe/transport/spin.hpp"

#include <sched.h>

#include <thread>

namespace troupe::transport {

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void yield_cpu() noexcept { sched_yield(); }

int pause_spins_for(int threads) noexcept {
  static const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return threads <= cores ? 64 : 0;
}

}  // namespace troupe::transport
