#include "troupe/actors/rendezvous.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <typeindex>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "cluster_agent.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "listen_error.hpp"
#include "protocol.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/liveness_policy.hpp"
#include "troupe/actors/rendezvous_state.hpp"
#include "troupe/actors/stall_inspector.hpp"
#include "troupe/actors/worker_report.hpp"
#include "troupe/base/process_usage.hpp"
#include "troupe/transport/random.hpp"

namespace troupe::actors {
namespace {

// Empty when the system has no randomness to give.
std::string random_nonce() {
  try {
    return transport::random_hex(16, "rendezvous: a nonce");
  } catch (const std::runtime_error&) {
    return {};
  }
}

// A fault report travels to every worker; a longer one is cut.
constexpr std::size_t max_fault_bytes = 4096;
// How long the chief waits for a worker to take a fault report before it answers the reporter.
constexpr std::chrono::milliseconds fault_ack_wait{500};
// How long the chief's agent waits for each worker to take word that the chief's program ends,
// and the chief for all of them.
constexpr std::chrono::milliseconds leaving_ack_wait{1000};
constexpr std::chrono::milliseconds leaving_wait{2000};

}  // namespace

std::string peer_of(caf::local_actor* self) {
  const auto& sender = self->current_sender();
  return sender ? caf::to_string(sender->node()) : std::string("<anonymous>");
}

void log_refusal(caf::stateful_actor<chief_agent_state>* self, const std::string& what) {
  const auto n = ++self->state.refused;
  if ((n & (n - 1)) != 0) return;
  const std::string line = "troupe: " + what;
  const std::string count = " (" + std::to_string(n) + " refused so far)";
  const auto& sender = self->current_sender();
  auto health = self->state.health;
  auto record = [health, what, count](const std::string& address) {
    if (health) health->refused(address, what + count, cluster_health::clock::now());
  };
  if (!sender || sender->node() == self->node()) {
    std::cerr << line << count << std::endl;
    record(sender ? "this process" : "an unknown address");
    return;
  }
  self->request(self->system().middleman().actor_handle(), std::chrono::seconds(1), caf::get_atom::value,
                sender->node())
      .then(
          [=](const caf::node_id&, const std::string& host, std::uint16_t port) {
            std::cerr << line << " [connected from " << host << ":" << port << "]" << count << std::endl;
            record(host + ":" + std::to_string(port));
          },
          [=](caf::error&) {
            std::cerr << line << count << std::endl;
            record("an unknown address");
          });
}

namespace {

void finish(chief_agent_state& st) {
  for (auto& p : st.waiting) {
    if (st.rules->failure()) {
      p.deliver(to_caf_error(*st.rules->failure()));
    } else {
      p.deliver(st.rules->table());
    }
  }
  st.waiting.clear();
}

// Requests `xs` of every watcher but `skip`'s; true once each answered, or its `wait` passed.
template <class... Ts>
caf::result<bool> tell_watchers(caf::stateful_actor<chief_agent_state>* self, std::int32_t skip,
                                std::chrono::milliseconds wait, const Ts&... xs) {
  auto& s = self->state;
  auto promise = self->make_response_promise<bool>();
  auto pending = std::make_shared<int>(1);
  auto done = [promise, pending]() mutable {
    if (--*pending == 0) promise.deliver(true);
  };
  for (std::size_t r = 0; r < s.watchers.size(); ++r) {
    if (s.watchers[r] && static_cast<std::int32_t>(r) != skip) {
      ++*pending;
      self->request(s.watchers[r], wait, xs...)
          .then([done]() mutable { done(); }, [done](caf::error&) mutable { done(); });
    }
  }
  done();
  return promise;
}

// A member's report of a fault: recorded, then relayed to every other watcher. Answered once every
// other worker has it (or after fault_ack_wait): the reporter breaks its ring, and the chief may
// exit, only after that, so the report is not lost with the process that was to send it.
caf::result<bool> relay_fault(caf::stateful_actor<chief_agent_state>* self, std::int32_t rank, const std::string& what) {
  auto& s = self->state;
  // Only a member's word counts, and only that rank's own peer may speak for it.
  const auto peer = peer_of(self);
  if (!s.rules->is_member(rank, peer)) {
    log_refusal(self, "refused a fault report for rank " + std::to_string(rank) + " from " + peer +
                       ", which did not join as that rank");
    return false;
  }
  const std::string reason = what.size() > max_fault_bytes ? what.substr(0, max_fault_bytes) + "..." : what;
  if (s.health) s.health->fault(rank, reason, cluster_health::clock::now());
  return tell_watchers(self, rank, fault_ack_wait, gone_atom::value, rank, reason);
}

// The rendezvous is complete: the watch starts, with the beats that came before it.
void start_watch(caf::stateful_actor<chief_agent_state>* self, std::chrono::milliseconds interval) {
  auto& s = self->state;
  s.rules->start_watch(interval, rendezvous_state::clock::now());
  s.watchers.assign(s.rules->table().size(), caf::actor{});
  stall_options stall = s.stall;
  stall.late_after = interval * liveness_policy::late_after_intervals;
  s.stalls.emplace(static_cast<int>(s.rules->table().size()), stall);
  if (s.health) {
    std::vector<std::string> tasks;
    for (const auto& m : s.rules->table()) tasks.push_back(m.task);
    // Late after 2 intervals without a beat: a beat on time is never older than 1.
    s.health->start(std::move(tasks), interval, liveness_policy::late_after_intervals,
                    s.rules->table().at(0).incarnation,
                    rendezvous_state::clock::now());
  }
  for (const auto& [rank, early] : s.early) {
    if (s.health) {
      s.health->beat(rank, rendezvous_state::clock::now());
      if (early.report) s.health->report(rank, *early.report);  // checked when it came
    }
    if (s.rules->on_beat(rank, rendezvous_state::clock::now(), early.peer)) {
      s.watchers[static_cast<std::size_t>(rank)] = early.watcher;
      self->monitor(early.watcher);
    }
  }
  s.early.clear();
  self->delayed_send(self, interval, check_atom::value, interval);
}

// The stall inspector's check: its line goes to the chief's log (at its back-off) and to the
// dashboard; past the shutdown bound every worker is told, with the line as the reason.
void inspect_stalls(caf::stateful_actor<chief_agent_state>* self, rendezvous_state::clock::time_point now) {
  auto& s = self->state;
  const stall_verdict v = s.stalls->check(now);
  if (v.print || v.cleared) std::cerr << "troupe: " << v.line << std::endl;
  if (s.health && (v.stalled || v.cleared)) s.health->stall(v.line, v.print || v.cleared, now);
  if (v.shutdown) {
    const std::string reason = "the chief ended the cluster: a worker waited longer than the stall shutdown bound (" +
                               std::to_string(s.stall.shutdown.count() / 1000) + " s, TROUPE_STALL_SHUTDOWN_S): " +
                               v.line;
    std::cerr << "troupe: " << reason << std::endl;
    if (s.health) s.health->fault(0, reason, now);
    for (const auto& w : s.watchers) {
      if (w) self->send(w, gone_atom::value, std::int32_t{-1}, reason);
    }
  }
}

caf::behavior cluster_agent(caf::stateful_actor<chief_agent_state>* self, rendezvous_options options) {
  self->state.rules.emplace(options);
  self->state.health = options.health;
  self->state.stall = options.stall;
  self->state.joins = options.joins;
  self->state.rules->set_chief_peer(caf::to_string(self->node()));
  self->delayed_send(self, options.timeout, expire_atom::value);
  auto fan_out = [=](const verdict& v) {
    auto& s = self->state;
    if (s.health) s.health->lost(v.rank, v.reason, cluster_health::clock::now());
    // An elastic cluster goes on without it: the stall inspector no longer waits for it.
    if (s.joins && s.stalls) s.stalls->drop(v.rank);
    for (int r : v.tell) {
      auto& w = s.watchers[static_cast<std::size_t>(r)];
      if (w) self->send(w, gone_atom::value, static_cast<std::int32_t>(v.rank), v.reason);
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    auto& s = self->state;
    for (std::size_t r = 0; r < s.watchers.size(); ++r) {
      if (s.watchers[r] && s.watchers[r].address() == d.source) {
        s.watchers[r] = caf::actor{};
        if (auto v = s.rules->on_connection_closed(static_cast<int>(r))) fan_out(*v);
      }
    }
  });
  caf::message_handler core{
      [=](beat_atom, std::int32_t rank, const caf::actor& watcher, double cpu_percent, std::int64_t rss_bytes,
          std::uint64_t lines_total, std::vector<std::string>& lines, std::int32_t phase, std::uint64_t step,
          std::int64_t collective, std::int32_t op, std::int32_t dtype, std::uint64_t bytes, std::int64_t phase_ms,
          std::int32_t ring_peer, std::int64_t ring_idle_ms, std::uint64_t ring_sent, std::uint64_t ring_received) {
        auto& s = self->state;
        // A beat counts only from the peer that joined as that rank, naming a watcher there.
        const auto peer = peer_of(self);
        if (!s.rules->is_member(rank, peer) || !watcher || caf::to_string(watcher.node()) != peer) {
          log_refusal(self, "refused a heartbeat for rank " + std::to_string(rank) + " from " + peer +
                             ", which did not join as that rank");
          return;
        }
        // The report beside it is the network's word too: checked, and refused alone.
        std::optional<worker_report> report = worker_report{cpu_percent, rss_bytes, lines_total, std::move(lines)};
        if (auto bad = check_worker_report(*report)) {
          log_refusal(self, "refused the report beside a heartbeat of rank " + std::to_string(rank) + " from " + peer +
                                ": " + *bad);
          report.reset();
        }
        const auto now = rendezvous_state::clock::now();
        if (s.health) {
          s.health->beat(rank, now);
          if (report) s.health->report(rank, *report);
        }
        // So is the position: its codes are range-checked before they become enums.
        if (s.stalls) {
          worker_position p;
          const bool codes = phase >= 0 && phase <= static_cast<std::int32_t>(worker_phase::collective) && op >= 0 &&
                             op <= static_cast<std::int32_t>(position_op::all_gather);
          if (codes) {
            p.phase = static_cast<worker_phase>(phase);
            p.op = static_cast<position_op>(op);
          }
          p.step = step;
          p.collective = collective;
          p.dtype = dtype;
          p.bytes = bytes;
          p.phase_ms = phase_ms;
          p.ring_peer = ring_peer;
          p.ring_idle_ms = ring_idle_ms;
          p.ring_sent = ring_sent;
          p.ring_received = ring_received;
          auto bad = codes ? check_worker_position(p, static_cast<int>(s.rules->table().size()))
                           : std::optional<std::string>("phase " + std::to_string(phase) + " or op " +
                                                        std::to_string(op) + " (expected 0..3 each)");
          if (bad) {
            log_refusal(self, "refused the position beside a heartbeat of rank " + std::to_string(rank) + " from " +
                                  peer + ": " + *bad);
          } else {
            s.stalls->position(rank, p, now);
          }
        }
        if (s.rules->on_beat(rank, now, peer)) {
          s.watchers[static_cast<std::size_t>(rank)] = watcher;
          self->monitor(watcher);
        } else if (s.watchers.empty()) {
          // A worker's first beat can come before this agent starts its watch: its watcher is
          // kept for then (one per member), so that a report made early still reaches it, and so
          // is the newest worker report with lines in it (they travel once).
          auto& e = s.early[rank];
          e.watcher = watcher;
          e.peer = peer;
          if (report && (!report->lines.empty() || !e.report)) {
            e.report = std::move(report);
          } else if (report) {
            e.report->cpu_percent = report->cpu_percent;
            e.report->rss_bytes = report->rss_bytes;
          }
        }
      },
      [=](bye_atom, std::int32_t rank) {
        const auto peer = peer_of(self);
        if (!self->state.rules->is_member(rank, peer)) {
          log_refusal(self, "refused a goodbye for rank " + std::to_string(rank) + " from " + peer +
                                       ", which did not join as that rank");
          return;
        }
        self->state.rules->on_bye(rank, peer);
        if (self->state.health) self->state.health->left(rank);
        // A worker that left an elastic cluster (asked to leave) is waited for by nobody: the
        // stall inspector no longer reads its last position.
        if (self->state.joins && self->state.stalls) self->state.stalls->drop(rank);
      },
      [=](fault_atom, std::int32_t rank, const std::string& what) -> caf::result<bool> {
        return relay_fault(self, rank, what);
      },
      [=](leaving_atom) -> caf::result<bool> {
        // The chief's program ends (only its own watch says so): every watcher hears it, and
        // answers, before the chief's connections close, so that none takes their end for a lost
        // chief while it still finishes its last collective with the others.
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->node()) return false;
        return tell_watchers(self, -1, leaving_ack_wait, leaving_atom::value);
      },
      [=](check_atom, std::chrono::milliseconds interval) {
        const auto now = rendezvous_state::clock::now();
        for (const auto& v : self->state.rules->check(now)) fan_out(v);
        if (self->state.health) self->state.health->observe(now);
        if (self->state.stalls) inspect_stalls(self, now);
        // The chief's heartbeat to every watcher, which declares it gone when these stop.
        for (const auto& w : self->state.watchers) {
          if (w) self->send(w, alive_atom::value);
        }
        self->delayed_send(self, interval, check_atom::value, interval);
      },
      [=](tick_atom, std::chrono::milliseconds interval) { start_watch(self, interval); },
      [=](nonce_atom) -> caf::result<std::string> {
        auto nonce = random_nonce();
        if (nonce.empty()) return caf::make_error(caf::sec::runtime_error, "the chief has no randomness for a nonce");
        self->state.rules->add_nonce(nonce, peer_of(self), rendezvous_state::clock::now());
        return nonce;
      },
      [=](join_atom, std::uint32_t version, std::int32_t rank, const std::string& nonce, const std::string& proof,
          std::int32_t devices, const std::string& host, std::uint16_t port) -> caf::result<std::vector<member>> {
        auto& s = self->state;
        if (auto error = s.rules->join(join_request{version, rank, nonce, proof, devices, host, port, peer_of(self),
                                                    rendezvous_state::clock::now()})) {
          if (error->code == rendezvous_errc::bad_token) {
            log_refusal(self, error->message + ", from " + peer_of(self));
            return to_caf_error(*error);  // refused alone: the others go on
          }
          finish(s);  // a bad join fails everyone who waits
          return to_caf_error(*error);
        }
        // Taking a promise takes over the answer: only now that this worker waits for the others.
        auto rp = self->make_response_promise<std::vector<member>>();
        s.waiting.push_back(rp);
        if (s.rules->complete()) finish(s);
        return rp;
      },
      [=](await_atom) -> caf::result<std::vector<member>> {
        auto& s = self->state;
        if (s.rules->failure()) return to_caf_error(*s.rules->failure());
        if (s.rules->complete()) return s.rules->table();
        auto rp = self->make_response_promise<std::vector<member>>();
        s.waiting.push_back(rp);
        return rp;
      },
      [=](expire_atom) {
        if (self->state.rules->expire()) finish(self->state);
      },
  };
  return core.or_else(join_handlers(self));
}

}  // namespace

std::string describe(caf::actor_system& system, const caf::error& e) {
  if (e.category() == caf::atom("rendezvous") && e.context().match_elements<std::string>()) {
    return e.context().get_as<std::string>(0);
  }
  return "rendezvous failed: " + system.render(e);
}

namespace {

struct chief_watch_state {
  std::set<int> reported;       // the ranks reported so far: each once (an elastic cluster
                                // goes on after a loss, and a second one must be heard too)
  base::process_usage usage;    // this process's, for the report beside every beat
  std::uint64_t lines_sent = 0;  // the log tail's total as of the last report
  std::chrono::steady_clock::time_point heard;   // the chief's last sign of life
  std::chrono::steady_clock::time_point ticked;  // the previous check (liveness_policy::paused)
  bool chief_left = false;                       // its agent shut down on purpose: no more beats
};

// A worker's side of the watch: beats to the chief's agent, reports the verdicts, and watches the
// chief as the chief watches it: an agent silent for more than `missed` intervals (a stopped or
// hung chief keeps its connections open, so no down message would ever come) is declared gone,
// unless this worker was itself not running meanwhile (liveness_policy::paused).
caf::behavior heartbeat(caf::stateful_actor<chief_watch_state>* self, caf::actor agent, std::int32_t rank,
                        std::chrono::milliseconds interval, int missed, std::string chief,
                        std::shared_ptr<log_tail> log, std::shared_ptr<position_board> position,
                        std::function<void(int, const std::string&)> on_failure) {
  self->state.heard = std::chrono::steady_clock::now();
  self->state.ticked = self->state.heard;
  auto report = [=](int r, const std::string& reason) {
    if (!self->state.reported.insert(r).second) return;
    on_failure(r, reason);
  };
  self->monitor(agent);
  self->set_down_handler([=](caf::down_msg& d) {
    if (d.source != agent.address()) return;
    // A chief that finished its program says so, then shuts its agent down on purpose, possibly
    // while the others still complete the last collective with it: that is no failure (a chief
    // that dies shows up as an unreachable link, and a collective that still needs it fails naming
    // it). The word comes first: the exit's own message may be lost as the chief's process ends.
    if (self->state.chief_left || d.reason == caf::exit_reason::user_shutdown) {
      self->state.chief_left = true;
      return;
    }
    report(0, "the chief " + chief + " is gone: " + self->system().render(d.reason));
  });
  // Every beat carries this process's CPU and memory, and the log tail's lines when it has new
  // ones.
  auto beat = [=] {
    auto& st = self->state;
    const base::usage_sample usage = st.usage.sample();
    worker_report r;
    // Finite or unknown: CAF 0.17 packs a double by halving it until it is below 2, which never
    // ends for an infinity.
    r.cpu_percent = std::isfinite(usage.cpu_percent) ? usage.cpu_percent : -1;
    r.rss_bytes = usage.rss_bytes;
    if (log) log->fill(r, st.lines_sent);
    st.lines_sent = r.lines_total;
    const worker_position p = position ? position->read(std::chrono::steady_clock::now()) : worker_position{};
    self->send(agent, beat_atom::value, rank, caf::actor_cast<caf::actor>(self), r.cpu_percent, r.rss_bytes,
               r.lines_total, std::move(r.lines), static_cast<std::int32_t>(p.phase), p.step, p.collective,
               static_cast<std::int32_t>(p.op), p.dtype, p.bytes, p.phase_ms, p.ring_peer, p.ring_idle_ms,
               p.ring_sent, p.ring_received);
  };
  beat();
  self->delayed_send(self, interval, tick_atom::value, interval);
  return {
      [=](tick_atom, std::chrono::milliseconds every) {
        beat();
        self->delayed_send(self, every, tick_atom::value, every);
        const auto now = std::chrono::steady_clock::now();
        const liveness_policy policy{every, missed};
        if (policy.paused(self->state.ticked, now)) self->state.heard = now;  // we were stopped, not the chief
        self->state.ticked = now;
        const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - self->state.heard);
        if (!self->state.chief_left && policy.silent_too_long(self->state.heard, now)) {
          report(0, chief + " (the chief) sent no heartbeat for " + std::to_string(silent.count()) +
                        " ms (hung, stopped or unreachable)");
        }
      },
      [=](alive_atom) {
        // Only the agent's own word counts: a stranger's cannot hide a stopped chief.
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) == agent.address()) self->state.heard = std::chrono::steady_clock::now();
      },
      [=](gone_atom, std::int32_t r, const std::string& reason) { report(r, reason); },
      [=](leaving_atom) {
        // Only the agent's own word counts, as for its heartbeat.
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) == agent.address()) self->state.chief_left = true;
      },
  };
}

}  // namespace

caf::actor spawn_heartbeat(caf::actor_system& system, const caf::actor& agent, std::int32_t rank,
                           std::chrono::milliseconds interval, const rendezvous_options& options,
                           std::function<void(int, const std::string&)> on_failure) {
  return system.spawn(heartbeat, agent, rank, interval, options.missed_heartbeats, options.tasks[0], options.log,
                      options.position, std::move(on_failure));
}

cluster_watch::cluster_watch(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

cluster_watch::~cluster_watch() {
  auto& s = *impl_;
  if (s.agent) {
    // From an actor of this node: a goodbye counts only from the peer that joined as the rank.
    caf::scoped_actor self{*s.system};
    self->send(s.agent, bye_atom::value, s.rank);
  }
  if (s.beat) caf::anon_send_exit(s.beat, caf::exit_reason::user_shutdown);
  if (s.chief && s.agent) {
    caf::scoped_actor self{*s.system};
    self->request(s.agent, leaving_wait, leaving_atom::value).receive([](bool) {}, [](caf::error&) {});
    if (s.gate) s.gate->unpublish(s.agent, s.port);
    caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
  }
}

void cluster_watch::report_fault(const std::string& what, std::chrono::milliseconds wait) {
  auto& s = *impl_;
  if (!s.agent) return;
  caf::scoped_actor self{*s.system};
  // Answered once the agent has told every other worker: the caller may break its ring then.
  self->request(s.agent, wait, fault_atom::value, s.rank, what).receive([](bool) {}, [](caf::error&) {});
}

void add_rendezvous_types(caf::actor_system_config& config) {
  config.add_message_type<member>("troupe::actors::member");
  config.add_message_type<join_answer>("troupe::actors::join_answer");
  config.add_message_type<std::vector<member>>("std::vector<troupe::actors::member>");
  // Rendered as the message the chief wrote, which names the culprit and the fix.
  config.add_error_category(caf::atom("rendezvous"), [](std::uint8_t, caf::atom_value, const caf::message& context) {
    return context.match_elements<std::string>() ? context.get_as<std::string>(0) : std::string("rendezvous error");
  });
}

std::string new_incarnation() { return transport::random_hex(16, "rendezvous: the cluster's incarnation"); }

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key.data(), key.size(),
                reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, sizeof out,
                &len) == nullptr) {
    throw std::runtime_error("rendezvous: HMAC-SHA256 failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < len; ++i) {
    s += hex[out[i] >> 4];
    s += hex[out[i] & 15];
  }
  return s;
}

bool knows_rendezvous_types(const caf::actor_system& system) {
  return system.config().type_names_by_rtti.count(std::type_index(typeid(std::vector<member>))) != 0;
}

namespace {

// The answer to a join or an await: the table, or the error as every worker shows it.
struct answer {
  std::vector<member> table;
  std::string error = "rendezvous failed: no answer from the chief";
  bool ok = false;
};

template <class... Ts>
answer receive_table(caf::actor_system& system, caf::scoped_actor& self, const caf::actor& agent,
                     std::chrono::milliseconds wait, Ts&&... request) {
  answer a;
  self->request(agent, wait, std::forward<Ts>(request)...)
      .receive(
          [&](std::vector<member>& table) {
            a.table = std::move(table);
            a.ok = true;
          },
          [&](caf::error& e) { a.error = describe(system, e); });
  return a;
}

// Throws the answer's error, or returns its table once it passed check_peer_table.
std::vector<member> table_from(const rendezvous_options& options, answer a) {
  if (!a.ok) throw std::runtime_error(a.error);
  if (auto bad = check_peer_table(options, a.table)) throw std::runtime_error(bad->message);
  return std::move(a.table);
}

}  // namespace

caf::actor reach_chief(caf::actor_system& system, const rendezvous_options& options, control_gate& gate, bool tls) {
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  caf::actor agent;
  std::string last_error;
  while (!agent) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto found = gate.remote_actor(options.chief_host, options.chief_port,
                                   std::max(left, std::chrono::milliseconds(1000)));
    if (found) {
      agent = *found;
      break;
    }
    last_error = system.render(found.error());
    if (tls) {
      last_error += " (a TLS handshake the chief refuses looks the same: the same TROUPE_CLUSTER_TOKEN on every "
                    "worker?)";
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error("rendezvous failed: could not reach the chief " + options.tasks[0] + " at " +
                               options.chief_host + ":" + std::to_string(options.chief_port) + " within " +
                               std::to_string(options.timeout.count()) + " ms: " + last_error);
    }
    std::this_thread::sleep_for(options.connect_retry);
  }
  return agent;
}

namespace {

// The rendezvous; with `keep` set, the chief's agent stays published (and the worker keeps its
// handle) for a cluster_watch.
std::vector<member> rendezvous_impl(caf::actor_system& system, const rendezvous_options& options, caf::actor* keep,
                                    std::shared_ptr<control_credentials>& credentials,
                                    std::unique_ptr<control_gate>& gate) {
  check_options(options);
  if (!knows_rendezvous_types(system)) {
    throw std::invalid_argument(
        "rendezvous: this actor system was built without troupe's message types: call "
        "troupe::Runtime::configure(config) on its config before constructing it");
  }
  // Every control connection goes through the gate (control_gate.hpp), which bounds what a peer
  // can make this process hold. With a token, it is mutual TLS from credentials the token derives
  // (control_tls.hpp) as well; without one, plain BASP, for clusters on loopback only.
  const bool tls = !options.token.empty();
  if (tls) {
    credentials = control_credentials::shared(system, options.token, "MultiWorkerMirroredStrategy (its rendezvous)");
  }
  gate = std::make_unique<control_gate>(system, tls, gate_limits::for_cluster(static_cast<int>(options.tasks.size())),
                                        options.health);
  caf::scoped_actor self{system};
  if (options.rank == 0) {
    auto agent = system.spawn(cluster_agent, options);
    auto published = gate->publish(agent, options.chief_port, options.chief_host);
    if (!published) {
      caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
      throw_cannot_listen("rendezvous: the chief cannot listen on " + options.chief_host + ":" +
                              std::to_string(options.chief_port) + ": " + system.render(published.error()),
                          options.chief_host, options.chief_port);
    }
    auto a = receive_table(system, self, agent, options.timeout + options.answer_margin,
                           await_atom::value);
    if (!a.ok) {
      // The chief is about to fail and its process may exit at once: give the middleman a moment
      // to deliver the same error to the workers that joined, so none waits for a lost answer.
      std::this_thread::sleep_for(options.failure_linger);
    }
    if (keep != nullptr && a.ok) {
      *keep = agent;
    } else {
      self->send_exit(agent, caf::exit_reason::user_shutdown);
      gate->unpublish(agent, *published);
    }
    return table_from(options, std::move(a));
  }
  std::string last_error;
  caf::actor agent = reach_chief(system, options, *gate, tls);
  std::string nonce;
  self->request(agent, options.timeout, nonce_atom::value)
      .receive([&](std::string& n) { nonce = n; }, [&](caf::error& e) { last_error = system.render(e); });
  if (nonce.empty()) throw std::runtime_error("rendezvous failed: the chief sent no nonce: " + last_error);
  auto a = receive_table(system, self, agent, options.timeout + options.answer_margin,
                         join_atom::value, options.version, static_cast<std::int32_t>(options.rank), nonce,
                         hmac_sha256_hex(options.token, nonce), static_cast<std::int32_t>(options.devices),
                         options.data_host, options.data_port);
  auto table = table_from(options, std::move(a));
  if (keep != nullptr) *keep = agent;
  return table;
}

}  // namespace

std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options) {
  std::shared_ptr<control_credentials> credentials;
  std::unique_ptr<control_gate> gate;
  return rendezvous_impl(system, options, nullptr, credentials, gate);
}

std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options,
                               std::chrono::milliseconds heartbeat_interval,
                               std::function<void(int, const std::string&)> on_failure,
                               std::unique_ptr<cluster_watch>& watch) {
  caf::actor agent;
  auto w = std::make_unique<cluster_watch::impl>();
  auto members = rendezvous_impl(system, options, &agent, w->credentials, w->gate);
  w->system = &system;
  w->agent = agent;
  w->chief = options.rank == 0;
  w->port = options.chief_port;
  w->rank = options.rank;
  if (w->chief) caf::anon_send(agent, tick_atom::value, heartbeat_interval);
  w->beat = spawn_heartbeat(system, agent, static_cast<std::int32_t>(options.rank), heartbeat_interval, options,
                            std::move(on_failure));
  watch = std::make_unique<cluster_watch>(std::move(w));
  return members;
}

}  // namespace troupe::actors
