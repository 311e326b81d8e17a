#pragma once

#include <chrono>
#include <cstdint>

namespace troupe::transport {

/// One step of a busy wait: a pause instruction, so a spinning hyperthread yields its pipeline.
void cpu_relax() noexcept;

/// sched_yield(): lets another runnable thread of this core run.
void yield_cpu() noexcept;

/// Waits until `ready()` holds, for at most `budget`: first a few pause-spins (a hand-off between
/// two running cores takes well under a microsecond), then sched_yield between checks so that
/// more waiters than cores still let the working threads run. Returns ready()'s last value; the
/// caller blocks for real when it is false. Waking a sleeping thread costs tens of microseconds
/// on small VMs, which is why waits spin before they sleep.
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds budget) {
  for (int i = 0; i < 64; ++i) {
    if (ready()) return true;
    cpu_relax();
  }
  if (budget.count() <= 0) return ready();
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return true;
      yield_cpu();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace troupe::transport
