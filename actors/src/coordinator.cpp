#include "troupe/actors/coordinator.hpp"

#include <stdexcept>
#include <system_error>

#include "protocol.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::actors {

std::uint64_t coordinator_state::begin_step(int replicas) {
  ++step_;
  answered_.assign(static_cast<std::size_t>(replicas), false);
  if (lost_.size() != static_cast<std::size_t>(replicas)) lost_.assign(static_cast<std::size_t>(replicas), "");
  pending_ = replicas;
  // A replica lost in an earlier step will not answer this one either.
  for (int r = 0; r < replicas; ++r) {
    if (!lost_[static_cast<std::size_t>(r)].empty()) {
      answered_[static_cast<std::size_t>(r)] = true;
      --pending_;
    }
  }
  return step_;
}

bool coordinator_state::on_done(std::uint64_t step, int replica) {
  if (step != step_ || replica < 0 || static_cast<std::size_t>(replica) >= answered_.size()) return complete();
  if (!answered_[static_cast<std::size_t>(replica)]) {
    answered_[static_cast<std::size_t>(replica)] = true;
    --pending_;
  }
  return complete();
}

bool coordinator_state::on_lost(int replica, std::string reason) {
  if (replica < 0 || static_cast<std::size_t>(replica) >= lost_.size()) return complete();
  lost_[static_cast<std::size_t>(replica)] = reason.empty() ? "actor terminated" : std::move(reason);
  if (static_cast<std::size_t>(replica) < answered_.size() && !answered_[static_cast<std::size_t>(replica)]) {
    answered_[static_cast<std::size_t>(replica)] = true;
    --pending_;
  }
  return complete();
}

struct coordinator::impl {
  impl(caf::actor_system& sys, int n, std::chrono::microseconds spin_budget, const std::string& prefix)
      : system(sys), self(sys), spin(spin_budget), pause_spins(transport::pause_spins_for(n + 1)) {
    if (n < 1) throw std::invalid_argument("coordinator: at least one replica is needed, got " + std::to_string(n));
    for (int r = 0; r < n; ++r) {
      caf::actor a;
      try {
        a = system.spawn<caf::detached>(replica_actor, r, spin, pause_spins, prefix + "-" + std::to_string(r),
                                        static_cast<const void*>(this));
      } catch (const std::system_error& e) {
        // No thread to be had (the process's thread or memory limit). CAF 0.17 counted the
        // detached thread before it failed to start it, and ~actor_system would wait for it
        // forever: the count is taken back. The replicas started so far are stopped, so that
        // nothing waits for them at exit, and the caller learns why.
        system.dec_detached_threads();
        stop_all(std::chrono::seconds(5));
        throw std::runtime_error("cannot start the thread of replica " + std::to_string(r) + " of " +
                                 std::to_string(n) + ": " + e.what() +
                                 " (the process's thread or memory limit was reached: ask for fewer replicas, or "
                                 "raise ulimit -u / ulimit -v)");
      }
      self->monitor(a);
      replicas.push_back(std::move(a));
    }
    state.begin_step(n);  // sizes lost_ for on_lost before the first step
  }

  // Stops every replica and waits, at most `bound`, for each to end.
  void stop_all(std::chrono::milliseconds bound) {
    std::size_t live = 0;
    for (auto& a : replicas) {
      if (a) {
        self->send(a, stop_atom::value);
        ++live;
      }
    }
    // Every replica answers the stop with its termination; bounded in case a replica is stuck
    // inside a user function that never returns.
    bool timed_out = false;
    while (live > 0 && !timed_out) {
      self->receive(
          [&](caf::down_msg& d) {
            int r = index_of(d.source);
            if (r >= 0) {
              replicas[static_cast<std::size_t>(r)] = caf::actor{};
              --live;
            }
          },
          [&](done_atom, std::uint64_t, std::int32_t) {}, caf::after(bound) >> [&] { timed_out = true; });
    }
  }

  int index_of(const caf::actor_addr& source) const {
    for (std::size_t r = 0; r < replicas.size(); ++r) {
      if (replicas[r] && replicas[r].address() == source) return static_cast<int>(r);
    }
    return -1;
  }

  caf::actor_system& system;
  caf::scoped_actor self;
  std::chrono::microseconds spin;
  int pause_spins;  // the coordinator and n replicas wait for each other
  std::vector<caf::actor> replicas;
  coordinator_state state;
};

coordinator::coordinator(caf::actor_system& system, int replicas, std::chrono::microseconds spin,
                         std::string thread_name_prefix)
    : impl_(std::make_unique<impl>(system, replicas, spin, thread_name_prefix)) {}

coordinator::~coordinator() { impl_->stop_all(stop_timeout); }

int coordinator::replicas() const noexcept { return static_cast<int>(impl_->replicas.size()); }

bool coordinator::on_replica_thread() const { return replica_thread_owner() == impl_.get(); }

std::vector<std::exception_ptr> coordinator::run_step(const std::function<void(int)>& fn,
                                                      const std::function<void(int, const std::string&)>& on_lost) {
  std::lock_guard<std::mutex> lock(run_mutex_);
  auto& s = *impl_;
  const int n = static_cast<int>(s.replicas.size());
  auto task = std::make_shared<step_task>();
  task->step = s.state.begin_step(n);
  task->fn = &fn;
  task->errors.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (s.replicas[static_cast<std::size_t>(r)]) s.self->send(s.replicas[static_cast<std::size_t>(r)], step_atom::value, task);
  }
  for (int r = 0; r < n; ++r) {
    if (!s.state.lost()[static_cast<std::size_t>(r)].empty()) on_lost(r, s.state.lost()[static_cast<std::size_t>(r)]);
  }
  while (!s.state.complete()) {
    spin_on_mailbox(s.self.ptr(), s.spin, s.pause_spins);
    s.self->receive(
        [&](done_atom, std::uint64_t step, std::int32_t r) { s.state.on_done(step, r); },
        [&](caf::down_msg& d) {
          int r = s.index_of(d.source);
          if (r < 0) return;
          s.replicas[static_cast<std::size_t>(r)] = caf::actor{};
          std::string why = "replica actor " + std::to_string(r) + " terminated: " + s.system.render(d.reason);
          s.state.on_lost(r, why);
          on_lost(r, why);
        });
  }
  std::vector<std::exception_ptr> errors = std::move(task->errors);
  for (int r = 0; r < n; ++r) {
    const std::string& why = s.state.lost()[static_cast<std::size_t>(r)];
    if (!why.empty() && !errors[static_cast<std::size_t>(r)]) {
      errors[static_cast<std::size_t>(r)] = std::make_exception_ptr(std::runtime_error(why));
    }
  }
  return errors;
}

}  // namespace troupe::actors
