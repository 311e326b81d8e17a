#include "dispatch_actor.hpp"

#include <utility>

#include "protocol.hpp"
#include "task_common.hpp"

namespace troupe::actors {
namespace {

using impl_ptr = std::shared_ptr<dispatcher::impl>;

// Why a task counts as silent, for the log and the coordinator's error.
std::string silence(const dispatch_actor_state& st) {
  return "it missed " + std::to_string(st.liveness.missed) + " heartbeats of " +
         std::to_string(st.liveness.interval.count()) + " ms (stopped or hung?)";
}

// Each closure of `ids` still known reaches on_done once, cancelled.
void cancel_closures(dispatch_self* self, dispatcher::impl& d, const std::vector<std::uint64_t>& ids) {
  std::uint64_t n = 0;
  for (auto id : ids) {
    if (self->state.closures.erase(id) == 1) {
      d.on_done(closure_outcome{id, false, {}, {}, true});
      ++n;
    }
  }
  d.board->closures_cancelled(n, heartbeat_state::clock::now());
}

// The queue as the board shows it, after every change.
void show_queue(dispatch_self* self, dispatcher::impl& d) {
  d.board->set_queue(self->state.rules->queued(), self->state.rules->in_flight_by_worker());
}

// A lost worker's closures in flight: run again elsewhere, or cancelled after a failure. Says which.
// `reason` (why it is lost) goes to the board; empty: it is set aside (the caller tells the board).
std::string lose_worker(dispatch_self* self, dispatcher::impl& d, int w, const std::string& reason) {
  auto& st = self->state;
  const bool requeue = !st.failed && !st.cancelling;
  auto back = st.rules->on_worker_lost(w, requeue);
  st.watch->worker_lost(w);
  const auto now = heartbeat_state::clock::now();
  if (!reason.empty()) d.board->worker_lost(w, reason, requeue ? back.size() : 0, now);
  if (requeue) {
    d.retried += back.size();
  } else {
    cancel_closures(self, d, back);
  }
  show_queue(self, d);
  d.lost = st.rules->workers_lost();
  d.up = st.rules->workers_up();
  return std::to_string(back.size()) +
         (requeue ? " closure(s) in flight go to other workers" : " closure(s) in flight cancelled (a closure failed)");
}

// Hands queued closures to the workers (or cancels them while a failure is raised).
void pump(dispatch_self* self, dispatcher::impl& d) {
  auto& st = self->state;
  if (st.cancelling) cancel_closures(self, d, st.rules->cancel_queued());
  const auto now = heartbeat_state::clock::now();
  for (auto [w, id] : st.rules->assign()) {
    auto it = st.closures.find(id);
    if (it == st.closures.end()) continue;
    self->send(st.workers[static_cast<std::size_t>(w)], call_atom::value, id, it->second.function, it->second.args);
    st.watch->sent(w, id, it->second.function, now);
  }
  show_queue(self, d);
}

// The worker whose agent has address `a`, or -1.
int worker_of(const dispatch_actor_state& st, const caf::actor_addr& a) {
  for (std::size_t w = 0; w < st.workers.size(); ++w) {
    if (st.workers[w] && st.workers[w].address() == a) return static_cast<int>(w);
  }
  return -1;
}

// Ps task p is lost (its connection closed, or it went silent): what waits on it fails now; with a
// ps restart wait the connector reaches for it at its address until the wait ends, else the
// coordinator fails.
void lose_ps(dispatch_self* self, dispatcher::impl& d, std::size_t p, const std::string& why) {
  auto& st = self->state;
  if (st.ps_down[p]) return;
  st.ps_down[p] = true;
  const auto now = heartbeat_state::clock::now();
  const auto& task = d.options.ps[p].task;
  d.board->ps_lost(static_cast<int>(p), why, now);
  st.ps_beats->forget(static_cast<int>(p));
  self->send(d.router, gone_atom::value, static_cast<std::int32_t>(p), why);
  const std::int64_t wait_ms = d.ps_restart_wait_ms.load();
  if (wait_ms <= 0) {
    d.say("lost " + task + " (" + why + ")");
    d.on_ps_lost(task, why);
    return;
  }
  d.ps_awaited_until[p] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              (now + std::chrono::milliseconds(wait_ms)).time_since_epoch())
                              .count();
  d.say("lost " + task + " (" + why + "); waiting up to " + std::to_string(wait_ms / 1000) +
        " s for it to restart at " + address_of(d.options.ps[p].host, d.options.ps[p].port) +
        " (TROUPE_PS_RESTART_WAIT_S)");
  if (d.on_ps_down) d.on_ps_down(static_cast<int>(p), task, why);
  d.wake.notify_all();
}

// The connector reached lost ps task p again (restarted, with none of its shards): it is watched,
// and the chief's router and requests go to it.
void on_ps_reached(dispatch_self* self, const impl_ptr& d, std::int32_t p, const caf::actor& agent,
                   const caf::actor& pulse) {
  auto& st = self->state;
  const auto i = static_cast<std::size_t>(p);
  if (p < 0 || i >= d->ps.size() || st.leaving) return;
  d->ps[i] = agent;
  d->ps_pulse[i] = pulse;
  self->monitor(agent);
  st.ps_down[i] = false;
  st.ps_beats->watch(p, heartbeat_state::clock::now());
  caf::anon_send(d->router, wup_atom::value, p, agent);
  d->board->ps_back(p, heartbeat_state::clock::now());
  if (d->on_ps_back) d->on_ps_back(p, d->options.ps[i].task);
}

// A ps task's connection closed (lose_ps), or a worker's (it is lost until the connector reaches
// it again).
void on_down(dispatch_self* self, dispatcher::impl& d, const caf::down_msg& m) {
  auto& st = self->state;
  if (st.leaving) return;
  for (std::size_t p = 0; p < d.ps.size(); ++p) {
    if (d.ps[p].address() == m.source) {
      lose_ps(self, d, p, "its connection closed (" + self->system().render(m.reason) + ")");
      return;
    }
  }
  const int w = worker_of(st, m.source);
  if (w < 0) return;
  const auto what = lose_worker(self, d, w, "its connection closed (" + self->system().render(m.reason) + ")");
  const auto i = static_cast<std::size_t>(w);
  st.workers[i] = caf::actor{};
  st.worker_pulses[i] = caf::actor{};
  st.worker_beats->forget(w);
  d.connected[i] = false;
  d.say("lost " + d.options.workers[i].task + " (" + self->system().render(m.reason) + "); " + what);
  d.wake.notify_all();
  pump(self, d);
}

// Beats worker w's pulse, saying the settings; a worker overdue that answers is taken back.
void beat_worker(dispatch_self* self, const impl_ptr& d, std::size_t w) {
  auto pulse = self->state.worker_pulses[w];
  if (!pulse) return;
  self->request(pulse, self->state.worker_beats->limit(), beat_atom::value,
                static_cast<std::int64_t>(self->state.liveness.interval.count()),
                static_cast<std::int32_t>(self->state.liveness.missed))
      .then(
          [self, d, w, pulse](bool) {
            auto& st = self->state;
            if (st.leaving || st.worker_pulses[w] != pulse) return;  // a newer connection
            if (!st.worker_beats->beat(static_cast<int>(w), heartbeat_state::clock::now())) return;
            st.rules->on_worker_up(static_cast<int>(w));
            d->up = st.rules->workers_up();
            d->board->worker_up(static_cast<int>(w), heartbeat_state::clock::now());
            d->say(d->options.workers[w].task + " answers again; it takes closures again");
            pump(self, *d);
          },
          [](caf::error&) {});
}

// The connector reached worker w: it is watched, hears the table and takes closures.
void on_worker_reached(dispatch_self* self, const impl_ptr& d, std::int32_t w, const caf::actor& agent,
                       const caf::actor& pulse) {
  auto& st = self->state;
  st.workers[static_cast<std::size_t>(w)] = agent;
  st.worker_pulses[static_cast<std::size_t>(w)] = pulse;
  st.worker_beats->watch(w, heartbeat_state::clock::now());
  beat_worker(self, d, static_cast<std::size_t>(w));  // says the settings to it at once
  self->monitor(agent);
  if (st.has_table) self->send(agent, table_atom::value, st.table);
  st.rules->on_worker_up(w);
  d->up = st.rules->workers_up();
  d->board->worker_up(w, heartbeat_state::clock::now());
  pump(self, *d);
}

// A worker answered a call: a stale answer (that closure ran elsewhere) changes nothing.
void on_result(dispatch_self* self, dispatcher::impl& d, std::uint64_t id, bool ok, std::string& payload) {
  auto& st = self->state;
  const int w = worker_of(st, caf::actor_cast<caf::actor_addr>(self->current_sender()));
  if (w < 0) return;
  if (st.watch->finished(w, id, heartbeat_state::clock::now())) {
    // The closure it was given up in returned (it ran elsewhere meanwhile: this answer is stale).
    st.rules->on_worker_up(w);
    d.up = st.rules->workers_up();
    d.board->worker_up(w, heartbeat_state::clock::now());
    d.say(d.options.workers[static_cast<std::size_t>(w)].task + " returned from closure " + std::to_string(id) +
          ", given up on past the stall shutdown bound; it takes closures again");
    pump(self, d);
  }
  if (!st.rules->on_finished(w, id)) return;
  auto it = st.closures.find(id);
  if (it == st.closures.end()) return;
  const std::string function = std::move(it->second.function);
  st.closures.erase(it);
  if (!ok) st.failed = true;
  const auto& task = d.options.workers[static_cast<std::size_t>(w)].task;
  d.board->closure_done(w, ok ? std::string() : "function \"" + function + "\" failed on " + task + ": " + payload,
                        heartbeat_state::clock::now());
  d.on_done(closure_outcome{id, ok, std::move(payload), d.options.workers[static_cast<std::size_t>(w)].task});
  pump(self, d);
}

// The ids a worker dropped from its queue, 8 bytes each (little-endian): each it held is cancelled.
void take_dropped(dispatch_self* self, dispatcher::impl& d, std::size_t w, const std::string& ids) {
  auto& st = self->state;
  std::vector<std::uint64_t> dropped;
  for (std::size_t at = 0; at + 8 <= ids.size(); at += 8) {
    std::uint64_t id = 0;
    for (int b = 0; b < 8; ++b) id |= std::uint64_t{static_cast<unsigned char>(ids[at + b])} << (8 * b);
    // Only what that worker holds: a stale or made-up id changes nothing.
    if (st.rules->on_finished(static_cast<int>(w), id)) {
      st.watch->finished(static_cast<int>(w), id, heartbeat_state::clock::now());
      dropped.push_back(id);
    }
  }
  cancel_closures(self, d, dropped);
  pump(self, d);
}

// The coordinator raises a closure's error: everything queued is cancelled until resume.
void on_cancel(dispatch_self* self, const impl_ptr& d) {
  auto& st = self->state;
  st.failed = false;  // being raised now: what fails from here on is a new error
  st.cancelling = true;
  pump(self, *d);
  // Closures handed to a worker that has not started them are queued too (a TensorFlow
  // worker takes one closure at a time): each worker drops them and says which.
  for (std::size_t w = 0; w < st.workers.size(); ++w) {
    auto worker = st.workers[w];
    if (!worker) continue;
    self->request(worker, std::chrono::seconds(10), cancel_atom::value)
        .then(
            [self, d, w, worker](const std::string& ids) {
              if (self->state.workers[w] != worker) return;  // lost meanwhile: lose_worker settled them
              take_dropped(self, *d, w, ids);
            },
            [](caf::error&) {});  // they run and finish as usual
  }
}

// New heartbeat settings: every peer watched so far starts a fresh limit under them.
void on_heartbeat_settings(dispatch_self* self, std::int64_t interval_ms, std::int32_t missed) {
  auto& st = self->state;
  st.liveness = liveness_policy{std::chrono::milliseconds(interval_ms), missed};
  const auto now = heartbeat_state::clock::now();
  auto renew = [&](std::optional<heartbeat_state>& beats) {
    const int peers = static_cast<int>(beats->peers());
    std::vector<bool> watched;
    // An overdue peer is watched again too, so that it is taken back when it answers.
    for (int p = 0; p < peers; ++p) watched.push_back(beats->watched(p));
    beats.emplace(peers, st.liveness);
    for (int p = 0; p < peers; ++p) {
      if (watched[static_cast<std::size_t>(p)]) beats->watch(p, now);
    }
  };
  renew(st.worker_beats);
  renew(st.ps_beats);
}

// A closure past the stall shutdown bound on worker `o.worker`: it runs elsewhere (or, given up once
// already, fails), the worker drops the calls it has not started and takes no closure until the
// stuck one returns.
void give_up(dispatch_self* self, const impl_ptr& d, const closure_overdue& o) {
  auto& st = self->state;
  const auto w = static_cast<std::size_t>(o.worker);
  const auto& name = d->options.workers[w].task;
  const std::string bound = std::to_string(st.watch->options().shutdown.count() / 1000) + " s";
  std::string line = "stall: closure " + std::to_string(o.id) + " (function \"" + o.function + "\") has run on " +
                     name + " for " + std::to_string(o.running.count() / 1000) +
                     " s, past the stall shutdown bound (" + bound + ", TROUPE_STALL_SHUTDOWN_S)";
  auto it = st.closures.find(o.id);
  if (it != st.closures.end() && !it->second.given_up_on.empty()) {
    // Stuck on a second worker: the function itself hangs; running it again would take every worker.
    const std::string why = "it ran longer than the stall shutdown bound (" + bound + ", TROUPE_STALL_SHUTDOWN_S) on " +
                            it->second.given_up_on + " and again on " + name;
    st.rules->on_finished(o.worker, o.id);
    st.closures.erase(it);
    st.failed = true;
    d->on_done(closure_outcome{o.id, false, why, name});
    line += "; it was given up on another worker before: it fails";
  } else if (it != st.closures.end()) {
    it->second.given_up_on = name;
  }
  const std::uint64_t retried_before = d->retried;
  line += "; " + name + " is set aside until it returns: " + lose_worker(self, *d, o.worker, {});
  st.watch->set_aside(o.worker, o.id);
  d->board->worker_set_aside(o.worker, line, d->retried - retried_before, heartbeat_state::clock::now());
  d->say(line);
  // Its calls not started yet ran elsewhere: it drops them (their ids are no longer its own).
  if (auto worker = st.workers[w]) {
    self->request(worker, std::chrono::seconds(10), cancel_atom::value)
        .then([](const std::string&) {}, [](caf::error&) {});
  }
}

// Beats every task, then names those silent too long: a worker is lost (its closures go to the
// others) until it answers again; a ps task fails the coordinator.
void on_tick(dispatch_self* self, const impl_ptr& d) {
  auto& st = self->state;
  if (st.leaving) return;
  const auto interval = static_cast<std::int64_t>(st.liveness.interval.count());
  const auto missed = static_cast<std::int32_t>(st.liveness.missed);
  const auto wait = st.worker_beats->limit();
  for (std::size_t w = 0; w < st.worker_pulses.size(); ++w) beat_worker(self, d, w);
  for (std::size_t p = 0; p < d->ps_pulse.size(); ++p) {
    if (st.ps_down[p]) continue;  // lost: awaited by the connector, or lost for good
    self->request(d->ps_pulse[p], wait, beat_atom::value, interval, missed)
        .then([self, p](bool) { self->state.ps_beats->beat(static_cast<int>(p), heartbeat_state::clock::now()); },
              [](caf::error&) {});
    // What the ps task holds and was asked for, for the dashboard (a ps task of an older troupe
    // that does not answer shows no counters).
    self->request(d->ps[p], wait, pstats_atom::value)
        .then(
            [d, p](std::int64_t shards, std::int64_t held, std::int64_t updates, std::int64_t in, std::int64_t out) {
              ps_task_counters c;
              c.shards = shards;
              c.bytes_held = held;
              c.updates = static_cast<std::uint64_t>(updates);
              c.bytes_in = static_cast<std::uint64_t>(in);
              c.bytes_out = static_cast<std::uint64_t>(out);
              d->board->ps_report(static_cast<int>(p), c, heartbeat_state::clock::now());
            },
            [](caf::error&) {});
  }
  const auto now = heartbeat_state::clock::now();
  for (int w : st.worker_beats->overdue(now)) {
    const auto what = lose_worker(self, *d, w, silence(st));
    d->say("lost " + d->options.workers[static_cast<std::size_t>(w)].task + " (" + silence(st) + "); " + what +
           "; it is taken back when it answers again");
  }
  for (int p : st.ps_beats->overdue(now)) lose_ps(self, *d, static_cast<std::size_t>(p), silence(st));
  auto stalls = st.watch->check(now);
  for (const auto& line : stalls.lines) {
    d->say(line);
    d->board->stall(line, now);
  }
  for (const auto& o : stalls.give_up) give_up(self, d, o);
  pump(self, *d);
  self->delayed_send(self, st.liveness.interval, tick_atom::value);
}

}  // namespace

caf::behavior dispatch_actor(dispatch_self* self, std::shared_ptr<dispatcher::impl> d) {
  const int n = static_cast<int>(d->options.workers.size());
  auto& st = self->state;
  st.rules.emplace(n, d->options.window);
  st.liveness = d->options.liveness;
  st.worker_beats.emplace(n, st.liveness);
  st.ps_beats.emplace(static_cast<int>(d->options.ps.size()), st.liveness);
  std::vector<std::string> names;
  for (const auto& w : d->options.workers) names.push_back(w.task);
  st.watch.emplace(std::move(names), d->options.stall);
  st.workers.assign(static_cast<std::size_t>(n), caf::actor{});
  st.worker_pulses.assign(static_cast<std::size_t>(n), caf::actor{});
  st.ps_down.assign(d->options.ps.size(), false);
  self->set_down_handler([self, d](caf::down_msg& m) { on_down(self, *d, m); });
  return {
      [self, d](sched_atom, std::uint64_t id, std::string& function, std::string& args) {
        self->state.closures.emplace(id, closure_record{std::move(function), std::move(args), {}});
        self->state.rules->enqueue(id);
        d->board->scheduled(heartbeat_state::clock::now());
        pump(self, *d);
      },
      [self, d](wup_atom, std::int32_t w, const caf::actor& agent, const caf::actor& pulse) {
        on_worker_reached(self, d, w, agent, pulse);
      },
      [self, d](psup_atom, std::int32_t p, const caf::actor& agent, const caf::actor& pulse) {
        on_ps_reached(self, d, p, agent, pulse);
      },
      [self](table_atom, std::string& blob) {
        auto& st = self->state;
        st.table = std::move(blob);
        st.has_table = true;
        for (const auto& w : st.workers) {
          if (w) self->send(w, table_atom::value, st.table);
        }
      },
      [self, d](result_atom, std::uint64_t id, bool ok, std::string& payload) { on_result(self, *d, id, ok, payload); },
      [self, d](window_atom, std::int32_t window) {
        self->state.rules->set_window(window);
        pump(self, *d);
      },
      [self, d](cancel_atom) -> bool {
        on_cancel(self, d);
        return true;
      },
      [self, d](resume_atom) {
        self->state.cancelling = false;
        pump(self, *d);
      },
      [self](hbset_atom, std::int64_t interval_ms, std::int32_t missed) {
        on_heartbeat_settings(self, interval_ms, missed);
      },
      // A sharded checkpoint's requests go from this actor, the one the ps tasks know as their
      // chief (it said hello): they refuse them from anyone else.
      [self, d](ckptsave_atom, std::int32_t p, std::string& directory, std::string& file, std::int64_t step,
                std::int64_t timeout_ms) -> caf::result<std::uint64_t, std::uint64_t> {
        if (p < 0 || static_cast<std::size_t>(p) >= d->ps.size()) return runtime_error("no ps task " + std::to_string(p));
        auto rp = self->make_response_promise<std::uint64_t, std::uint64_t>();
        self->request(d->ps[static_cast<std::size_t>(p)], std::chrono::milliseconds(timeout_ms), ckptsave_atom::value,
                      std::move(directory), std::move(file), step)
            .then([rp](std::uint64_t bytes, std::uint64_t hash) mutable { rp.deliver(bytes, hash); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self, d](ckptload_atom, std::int32_t p, std::string& key, std::string& elements, std::string& slots,
                std::int64_t applied, std::uint8_t optimizer, std::int64_t timeout_ms) -> caf::result<bool> {
        if (p < 0 || static_cast<std::size_t>(p) >= d->ps.size()) return runtime_error("no ps task " + std::to_string(p));
        auto rp = self->make_response_promise<bool>();
        self->request(d->ps[static_cast<std::size_t>(p)], std::chrono::milliseconds(timeout_ms), ckptload_atom::value,
                      std::move(key), std::move(elements), std::move(slots), applied, optimizer)
            .then([rp](bool ok) mutable { rp.deliver(ok); }, [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self](stallset_atom, std::int64_t warning_ms, std::int64_t shutdown_ms) {
        self->state.watch->set_options(
            closure_watch_options{std::chrono::milliseconds(warning_ms), std::chrono::milliseconds(shutdown_ms)});
      },
      [self, d](watch_ps_atom) -> bool {
        for (const auto& p : d->ps) self->monitor(p);
        const auto now = heartbeat_state::clock::now();
        for (std::size_t p = 0; p < d->ps.size(); ++p) self->state.ps_beats->watch(static_cast<int>(p), now);
        self->send(self, tick_atom::value);
        return true;
      },
      [self, d](tick_atom) { on_tick(self, d); },
      [self, d](leave_atom) -> bool {
        self->state.leaving = true;
        for (const auto& w : self->state.workers) {
          if (w) self->send(w, leave_atom::value);
        }
        for (const auto& p : d->ps) self->send(p, leave_atom::value);
        return true;
      },
  };
}

}  // namespace troupe::actors
