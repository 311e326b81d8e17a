#include "troupe/actors/dispatcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <utility>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "dispatch_actor.hpp"
#include "protocol.hpp"
#include "shard_router.hpp"
#include "task_common.hpp"

namespace troupe::actors {
namespace {

// One attempt to reach a task and hear its name: its agent and the actor that answers its
// heartbeats, or why not.
struct reached_task {
  caf::actor agent;
  caf::actor pulse;
};

caf::expected<reached_task> reach(caf::actor_system& system, const task_endpoint& t, const std::string& self_task,
                                  const caf::actor& watch, const control_gate& gate, std::chrono::milliseconds wait) {
  auto found = connect_to_task(system, gate, t.host, t.port, wait);
  if (!found) return found.error();
  caf::scoped_actor self{system};
  caf::error failed;
  std::string name;
  caf::actor pulse;
  self->request(*found, wait, hello_atom::value, self_task, watch)
      .receive(
          [&](std::string& n, caf::actor& p) {
            name = std::move(n);
            pulse = std::move(p);
          },
          [&](caf::error& e) { failed = std::move(e); });
  if (failed) return failed;
  if (auto wrong = check_hello(t, name, pulse)) return wrong;
  return reached_task{*found, std::move(pulse)};
}

// Says (leave, chief, worker) to each worker the chief never reached, once, as it leaves: such a worker
// may have come up since the last try, and would otherwise wait for a chief until its start
// timeout. Workers that answered no try promptly (a host that drops the connection attempts) are
// skipped, so leaving never waits on them.
void say_goodbye(const std::shared_ptr<dispatcher::impl>& d, const std::vector<bool>& reached,
                 const std::vector<bool>& prompt) {
  for (std::size_t w = 0; w < d->options.workers.size(); ++w) {
    if (reached[w] || !prompt[w]) continue;
    const auto& t = d->options.workers[w];
    auto agent = connect_to_task(*d->system, *d->gate, t.host, t.port, std::chrono::seconds(2));
    if (!agent) continue;  // still down: its start timeout ends it
    caf::scoped_actor self{*d->system};
    bool told = false;
    self->request(*agent, std::chrono::seconds(2), leave_atom::value, d->options.task, t.task)
        .receive([&](bool taken) { told = taken; }, [](caf::error&) {});
    if (told) d->say("told " + t.task + " that the chief leaves (it was not reached before)");
  }
}

// Lost ps tasks that are awaited: each is reached again at its address (through the gate, so a
// process without the cluster's token is refused as at the start), or, once its wait is over,
// lost for good.
void reach_awaited_ps(const std::shared_ptr<dispatcher::impl>& d, std::vector<bool>& complained) {
  const bool tls = d->options.credentials != nullptr;
  for (std::size_t p = 0; p < d->options.ps.size(); ++p) {
    const std::int64_t until = d->ps_awaited_until[p].load();
    if (until == 0) {
      complained[p] = false;
      continue;
    }
    const auto& t = d->options.ps[p];
    auto agent = reach(*d->system, t, d->options.task, d->actor, *d->gate, std::chrono::seconds(2));
    if (agent) {
      d->ps_awaited_until[p] = 0;
      d->say("reached " + t.task + " again at " + address_of(t.host, t.port) + " (restarted; its shards are made again)");
      caf::anon_send(d->actor, psup_atom::value, static_cast<std::int32_t>(p), agent->agent, agent->pulse);
      continue;
    }
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
    if (now >= until) {
      d->ps_awaited_until[p] = 0;
      const std::string why = "it did not come back within " + std::to_string(d->ps_restart_wait_ms.load() / 1000) +
                              " s (TROUPE_PS_RESTART_WAIT_S): " + error_text(*d->system, agent.error());
      d->say("lost " + t.task + " for good: " + why);
      d->on_ps_lost(t.task, why);
    } else if (!complained[p]) {
      complained[p] = true;
      d->say("cannot reach " + t.task + " at " + address_of(t.host, t.port) + " yet: " +
             error_text(*d->system, agent.error()) +
             (tls ? " (a task with another TROUPE_CLUSTER_TOKEN is refused the same way)" : "") + "; trying again");
    }
  }
}

void run_connector(std::shared_ptr<dispatcher::impl> d) {
  const bool tls = d->options.credentials != nullptr;
  const std::size_t n = d->options.workers.size();
  std::vector<bool> complained(n, false);
  std::vector<bool> reached(n, false);  // said hello at least once
  std::vector<bool> prompt(n, true);    // the last try failed (or succeeded) within a second
  std::vector<bool> ps_complained(d->options.ps.size(), false);
  auto stopping = [&] {
    std::lock_guard<std::mutex> lock(d->mutex);
    return d->stopping;
  };
  for (;;) {
    if (stopping()) return say_goodbye(d, reached, prompt);
    reach_awaited_ps(d, ps_complained);
    for (std::size_t w = 0; w < n; ++w) {
      if (stopping()) return say_goodbye(d, reached, prompt);
      if (d->connected[w]) continue;
      const auto& t = d->options.workers[w];
      const auto began = std::chrono::steady_clock::now();
      auto agent = reach(*d->system, t, d->options.task, d->actor, *d->gate, std::chrono::seconds(5));
      prompt[w] = std::chrono::steady_clock::now() - began < std::chrono::seconds(1);
      if (agent) {
        d->connected[w] = true;
        reached[w] = true;
        complained[w] = false;
        d->say("connected " + t.task + " at " + address_of(t.host, t.port));
        caf::anon_send(d->actor, wup_atom::value, static_cast<std::int32_t>(w), agent->agent, agent->pulse);
      } else if (!complained[w]) {
        complained[w] = true;
        d->say("cannot reach " + t.task + " at " + address_of(t.host, t.port) + ": " +
               error_text(*d->system, agent.error()) +
               (tls ? " (a task with another TROUPE_CLUSTER_TOKEN is refused the same way)" : "") +
               "; trying again every " + std::to_string(d->connect_retry_ms.load()) + " ms");
      }
    }
    std::unique_lock<std::mutex> lock(d->mutex);
    d->wake.wait_for(lock, std::chrono::milliseconds(d->connect_retry_ms.load()), [&] { return d->stopping; });
    if (d->stopping) {
      lock.unlock();
      return say_goodbye(d, reached, prompt);
    }
  }
}

}  // namespace

dispatcher::dispatcher(caf::actor_system& system, dispatcher_options options,
                       std::function<void(closure_outcome)> on_done,
                       std::function<void(const std::string&, const std::string&)> on_ps_lost,
                       std::function<void(const std::string&)> log,
                       std::function<void(int, const std::string&, const std::string&)> on_ps_down,
                       std::function<void(int, const std::string&)> on_ps_back)
    : impl_(std::make_shared<impl>()) {
  auto& d = *impl_;
  d.system = &system;
  d.options = std::move(options);
  d.options.liveness.check("ParameterServerStrategy");
  closure_watch({}, d.options.stall);  // its bounds, checked before the actor takes them
  d.on_done = std::move(on_done);
  d.on_ps_lost = std::move(on_ps_lost);
  d.on_ps_down = std::move(on_ps_down);
  d.on_ps_back = std::move(on_ps_back);
  d.ps_awaited_until = std::make_unique<std::atomic<std::int64_t>[]>(d.options.ps.size());
  for (std::size_t p = 0; p < d.options.ps.size(); ++p) d.ps_awaited_until[p] = 0;
  d.log = std::move(log);
  d.connect_retry_ms = d.options.connect_retry.count();
  d.connected = std::make_unique<std::atomic<bool>[]>(d.options.workers.size());
  for (std::size_t w = 0; w < d.options.workers.size(); ++w) d.connected[w] = false;
  d.gate = std::make_unique<control_gate>(system, d.options.credentials != nullptr, gate_limits::for_tasks());
  {
    std::vector<std::string> workers, ps;
    for (const auto& w : d.options.workers) workers.push_back(w.task);
    for (const auto& p : d.options.ps) ps.push_back(p.task);
    d.board = std::make_shared<ps_cluster_board>(std::move(workers), std::move(ps));
  }
  // The ps tasks hold the variables: without every one of them there is nothing to train.
  d.actor = system.spawn(dispatch_actor, impl_);
  const auto deadline = std::chrono::steady_clock::now() + d.options.ps_timeout;
  for (const auto& p : d.options.ps) {
    for (;;) {
      // Each try bounded by what is left (at least 500 ms): a ps task that accepts and never
      // answers must not outlast ps_timeout.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto wait = std::clamp(left, std::chrono::milliseconds(500), std::chrono::milliseconds(5000));
      auto agent = reach(system, p, d.options.task, d.actor, *d.gate, wait);
      if (agent) {
        d.ps.push_back(agent->agent);
        d.ps_pulse.push_back(agent->pulse);
        d.say("connected " + p.task + " at " + address_of(p.host, p.port));
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        caf::anon_send_exit(d.actor, caf::exit_reason::user_shutdown);
        throw std::runtime_error("ParameterServerStrategy: cannot reach ps task " + p.task + " at " +
                                 address_of(p.host, p.port) + " within " +
                                 std::to_string(d.options.ps_timeout.count()) +
                                 " ms: " + error_text(system, agent.error()) +
                                 // A task that answered with a refusal of its own (another chief
                                 // holds it) took the token: no hint about it then.
                                 (d.options.credentials && agent.error() != caf::sec::runtime_error
                                      ? " (is TROUPE_CLUSTER_TOKEN the same on every task?)"
                                      : ""));
      }
      std::this_thread::sleep_for(d.options.connect_retry);
    }
  }
  d.router = system.spawn(shard_router, d.options.ps, d.options.ps_timeout, d.options.task, d.gate->actor(),
                          std::shared_ptr<ps_loss_counts>{});
  {
    caf::scoped_actor self{system};
    self->request(d.actor, std::chrono::seconds(5), watch_ps_atom::value).receive([](bool) {}, [](caf::error&) {});
    for (std::size_t p = 0; p < d.ps.size(); ++p) {
      self->request(d.router, std::chrono::seconds(5), wup_atom::value, static_cast<std::int32_t>(p), d.ps[p])
          .receive([](bool) {}, [](caf::error&) {});
    }
  }
  d.connector = std::thread(run_connector, impl_);
}

dispatcher::~dispatcher() {
  auto& d = *impl_;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.stopping = true;
  }
  d.wake.notify_all();
  if (d.connector.joinable()) d.connector.join();
  {
    caf::scoped_actor self{*d.system};
    self->request(d.actor, std::chrono::seconds(5), leave_atom::value).receive([](bool) {}, [](caf::error&) {});
    self->send_exit(d.actor, caf::exit_reason::user_shutdown);
    self->send_exit(d.router, caf::exit_reason::user_shutdown);
  }
}

void dispatcher::configure(int window, std::chrono::milliseconds connect_retry) {
  if (window < 1) throw std::invalid_argument("dispatcher: window " + std::to_string(window) + " (expected >= 1)");
  impl_->connect_retry_ms = connect_retry.count();
  caf::anon_send(impl_->actor, window_atom::value, static_cast<std::int32_t>(window));
}

void dispatcher::set_heartbeat(liveness_policy liveness) {
  liveness.check("dispatcher");
  caf::anon_send(impl_->actor, hbset_atom::value, static_cast<std::int64_t>(liveness.interval.count()),
                 static_cast<std::int32_t>(liveness.missed));
}

void dispatcher::set_ps_restart_wait(std::chrono::milliseconds wait) {
  if (wait.count() < 0) throw std::invalid_argument("dispatcher: ps restart wait " + std::to_string(wait.count()) + " ms");
  impl_->ps_restart_wait_ms = wait.count();
}

void dispatcher::set_stall(closure_watch_options stall) {
  closure_watch({}, stall);  // checks the bounds here, where the caller hears it
  caf::anon_send(impl_->actor, stallset_atom::value, static_cast<std::int64_t>(stall.warning.count()),
                 static_cast<std::int64_t>(stall.shutdown.count()));
}

void dispatcher::cancel_queued() {
  caf::scoped_actor self{*impl_->system};
  self->request(impl_->actor, std::chrono::seconds(5), cancel_atom::value).receive([](bool) {}, [](caf::error&) {});
}

void dispatcher::resume() { caf::anon_send(impl_->actor, resume_atom::value); }

void dispatcher::schedule(std::uint64_t id, std::string function, std::string args) {
  caf::anon_send(impl_->actor, sched_atom::value, id, std::move(function), std::move(args));
}

void dispatcher::set_table(std::string blob) { caf::anon_send(impl_->actor, table_atom::value, std::move(blob)); }

namespace {

// Sends one request per shard to the router at once (`make` builds each message), then takes the
// answers in order (`take` gets the i-th reply); once all are in, throws for the first failure.
template <class Reply, class Make, class Take>
void all_shards(dispatcher::impl& d, std::size_t n, std::chrono::milliseconds timeout, const char* what,
                const std::function<const dispatcher::shard_op&(std::size_t)>& shard, Make make, Take take) {
  caf::scoped_actor self{*d.system};
  using handle = decltype(self->request(d.router, timeout, make(std::size_t{0})));
  std::vector<handle> pending;
  pending.reserve(n);
  for (std::size_t i = 0; i < n; ++i) pending.push_back(self->request(d.router, timeout + std::chrono::seconds(5), make(i)));
  std::size_t bad = n;
  std::string failed;
  for (std::size_t i = 0; i < n; ++i) {
    pending[i].receive([&](Reply& r) { take(i, r); },
                       [&](caf::error& e) {
                         if (bad == n) {
                           bad = i;
                           failed = error_text(*d.system, e);
                         }
                       });
  }
  if (bad == n) return;
  const auto& s = shard(bad);
  throw std::runtime_error(std::string("ParameterServerStrategy: cannot ") + what + " variable shard '" + s.key +
                           "' on ps task " + d.options.ps.at(static_cast<std::size_t>(s.ps)).task + ": " + failed);
}

}  // namespace

void dispatcher::create_shards(std::vector<shard_op> shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));  // a ps task of the cluster
  all_shards<bool>(
      d, shards.size(), timeout, "create", [&](std::size_t i) -> const shard_op& { return shards[i]; },
      [&](std::size_t i) {
        return caf::make_message(vnew_atom::value, static_cast<std::int32_t>(shards[i].ps), shards[i].key,
                                 std::move(shards[i].bytes));
      },
      [](std::size_t, bool) {});
}

std::vector<std::string> dispatcher::read_shards(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));
  std::vector<std::string> out(shards.size());
  all_shards<std::string>(
      d, shards.size(), timeout, "read", [&](std::size_t i) -> const shard_op& { return shards[i]; },
      [&](std::size_t i) {
        return caf::make_message(vread_atom::value, static_cast<std::int32_t>(shards[i].ps), shards[i].key);
      },
      [&](std::size_t i, std::string& bytes) { out[i] = std::move(bytes); });
  return out;
}

std::vector<int> dispatcher::shard_slots(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));
  std::vector<int> out(shards.size());
  all_shards<std::int32_t>(
      d, shards.size(), timeout, "ask for the optimizer slots of", [&](std::size_t i) -> const shard_op& { return shards[i]; },
      [&](std::size_t i) {
        return caf::make_message(vslots_atom::value, static_cast<std::int32_t>(shards[i].ps), shards[i].key);
      },
      [&](std::size_t i, std::int32_t n) { out[i] = n; });
  return out;
}

void dispatcher::update_shards(std::vector<shard_op> updates, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : updates) d.options.ps.at(static_cast<std::size_t>(s.ps));
  all_shards<bool>(
      d, updates.size(), timeout, "update", [&](std::size_t i) -> const shard_op& { return updates[i]; },
      [&](std::size_t i) {
        return caf::make_message(vupdate_atom::value, static_cast<std::int32_t>(updates[i].ps), updates[i].key,
                                 static_cast<std::uint8_t>(updates[i].op), std::move(updates[i].bytes));
      },
      [](std::size_t, bool) {});
}

std::vector<dispatcher::saved_file> dispatcher::save_shards(const std::string& directory, std::int64_t step,
                                                            std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  const std::size_t n = d.options.ps.size();
  caf::scoped_actor self{*d.system};
  std::vector<saved_file> out(n);
  std::vector<std::string> failed(n);
  using handle = decltype(self->request(d.actor, timeout, ckptsave_atom::value, std::int32_t{0}, std::string(),
                                        std::string(), std::int64_t{0}, std::int64_t{0}));
  std::vector<handle> pending;
  for (std::size_t p = 0; p < n; ++p) {
    pending.push_back(self->request(d.actor, timeout + std::chrono::seconds(5), ckptsave_atom::value,
                                    static_cast<std::int32_t>(p), directory,
                                    shard_file_name(static_cast<int>(p), static_cast<int>(n)), step,
                                    static_cast<std::int64_t>(timeout.count())));
  }
  for (std::size_t p = 0; p < n; ++p) {
    pending[p].receive([&](std::uint64_t bytes, std::uint64_t hash) { out[p] = saved_file{bytes, hash}; },
                       [&](caf::error& e) { failed[p] = error_text(*d.system, e); });
  }
  for (std::size_t p = 0; p < n; ++p) {
    if (!failed[p].empty()) {
      throw std::runtime_error("ps task " + d.options.ps[p].task + " did not save its shards: " + failed[p]);
    }
  }
  return out;
}

void dispatcher::restore_shards(std::vector<shard_restore> shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));
  caf::scoped_actor self{*d.system};
  using handle = decltype(self->request(d.actor, timeout, ckptload_atom::value, std::int32_t{0}, std::string(),
                                        std::string(), std::string(), std::int64_t{0}, std::uint8_t{0},
                                        std::int64_t{0}));
  std::vector<handle> pending;
  for (auto& s : shards) {
    pending.push_back(self->request(d.actor, timeout + std::chrono::seconds(5), ckptload_atom::value,
                                    static_cast<std::int32_t>(s.ps), s.key, std::move(s.elements), std::move(s.slots),
                                    s.applied, s.optimizer, static_cast<std::int64_t>(timeout.count())));
  }
  std::string first;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].receive([](bool) {},
                       [&](caf::error& e) {
                         if (first.empty()) {
                           first = "variable shard '" + shards[i].key + "' on ps task " +
                                   d.options.ps[static_cast<std::size_t>(shards[i].ps)].task +
                                   " was not restored: " + error_text(*d.system, e);
                         }
                       });
  }
  if (!first.empty()) throw std::runtime_error(first);
}

std::uint64_t dispatcher::retried() const { return impl_->retried; }
std::uint64_t dispatcher::workers_lost() const { return impl_->lost; }
int dispatcher::workers_up() const { return impl_->up; }
std::shared_ptr<ps_cluster_board> dispatcher::board() const { return impl_->board; }

}  // namespace troupe::actors
