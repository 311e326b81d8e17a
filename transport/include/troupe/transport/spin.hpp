#pragma once

#include <chrono>
#include <cstdint>

namespace troupe::transport {

/// One step of a busy wait: a pause instruction, so a spinning hyperthread yields its pipeline.
void cpu_relax() noexcept;

/// sched_yield(): lets another runnable thread of this core run.
void yield_cpu() noexcept;

/// The pause-spins worth doing before yielding when `threads` threads wait for each other: 64 when
/// the machine has a core for each, else 0.
int pause_spins_for(int threads) noexcept;

/// Waits until `ready()` holds, for at most `budget`: first a few pause-spins (a hand-off between
/// two running cores takes well under a microsecond), then sched_yield between checks so that
/// more waiters than cores still let the working threads run. Returns ready()'s last value; the
/// caller blocks for real when it is false. Waking a sleeping thread costs tens of microseconds
/// on small VMs, which is why waits spin before they sleep.
/// `pause_spins` is how many pause-spins come first: useful when every waiter has a core of its own,
/// wasted when threads outnumber cores (the thread being waited for may need this very core), so
/// callers pass oversubscribed_pause_spins().
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds budget, int pause_spins = 64) {
  for (int i = 0; i < pause_spins; ++i) {
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
