#include "troupe/actors/rendezvous_state.hpp"

#include <stdexcept>
#include <utility>

#include "troupe/actors/liveness_policy.hpp"
#include "troupe/base/quote.hpp"

namespace troupe::actors {
namespace {

// Peer text is echoed through base::quoted: quoted, escaped and cut short.
std::string quoted(const std::string& s) { return base::quoted(s); }

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The first character of `s` that is not a hex digit, or npos.
std::size_t first_non_hex(const std::string& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!is_hex(s[i])) return i;
  }
  return std::string::npos;
}

std::string joinable_ranks(std::size_t workers) {
  return workers <= 1 ? "no other worker may join" : "a joining worker's rank is in 1.." + std::to_string(workers - 1);
}

}  // namespace

rendezvous_state::rendezvous_state(rendezvous_options options) : options_(std::move(options)) {
  if (options_.tasks.empty()) throw std::invalid_argument("rendezvous: no workers");
  const std::size_t n = options_.tasks.size();
  members_.resize(n);
  joined_.assign(n, false);
  members_[0] = member{0, options_.tasks[0], options_.data_host, options_.data_port, options_.devices,
                       options_.collective_id, new_incarnation()};
  joined_[0] = true;
  peers_.assign(n, std::string());
  complete_ = n == 1;
}

void rendezvous_state::set_chief_peer(std::string peer) { peers_[0] = std::move(peer); }

void rendezvous_state::forget_nonce(const std::string& nonce) {
  auto it = nonces_.find(nonce);
  if (it == nonces_.end()) return;
  auto p = nonce_of_peer_.find(it->second.peer);
  if (p != nonce_of_peer_.end() && p->second == nonce) nonce_of_peer_.erase(p);
  nonces_.erase(it);
}

void rendezvous_state::add_nonce(std::string nonce, std::string peer, clock::time_point now) {
  // Expired ones go first, then the oldest while full; the order queue holds at most a few
  // entries more than the map (used nonces leave the map at once, the queue when reached).
  while (!nonce_order_.empty()) {
    auto it = nonces_.find(nonce_order_.front());
    const bool stale = it == nonces_.end() || now - it->second.at > rendezvous_limits::nonce_lifetime;
    if (!stale && nonces_.size() < rendezvous_limits::max_nonces && nonce_order_.size() <= 2 * rendezvous_limits::max_nonces) {
      break;
    }
    forget_nonce(nonce_order_.front());
    nonce_order_.pop_front();
  }
  if (auto old = nonce_of_peer_.find(peer); old != nonce_of_peer_.end()) forget_nonce(old->second);
  nonce_of_peer_[peer] = nonce;
  nonces_[nonce] = issued{std::move(peer), now};
  nonce_order_.push_back(std::move(nonce));
}

rendezvous_error rendezvous_state::fail(rendezvous_errc code, const std::string& what) {
  failure_ = rendezvous_error{code, "rendezvous failed: " + what};
  return *failure_;
}

std::optional<rendezvous_error> rendezvous_state::join(const join_request& r) {
  if (failure_) return failure_;
  const std::size_t n = options_.tasks.size();
  const bool known = r.rank >= 0 && static_cast<std::size_t>(r.rank) < n;
  const std::string who = known ? options_.tasks[static_cast<std::size_t>(r.rank)]
                                : "a worker claiming rank " + std::to_string(r.rank);
  if (r.version != options_.version) {
    return fail(rendezvous_errc::protocol_mismatch,
                who + " speaks rendezvous protocol version " + std::to_string(r.version) + ", the chief " +
                    std::to_string(options_.version) + ": run the same troupe build everywhere");
  }
  // A join that fails the proof is refused alone: whoever sent it proved nothing, so it cannot
  // fail the cluster.
  if (!proves_token(r)) {
    return rendezvous_error{rendezvous_errc::bad_token,
                            "rendezvous: refused a join claiming to be " + who +
                                ": it failed the cluster token check (a stranger, or a worker with another "
                                "TROUPE_CLUSTER_TOKEN: set the same on every worker)"};
  }
  if (!known || r.rank == 0) {
    return fail(rendezvous_errc::not_in_cluster, who + " is not in the cluster (" + std::to_string(n) + " workers; " +
                                                     joinable_ranks(n) + ")");
  }
  const auto rank = static_cast<std::size_t>(r.rank);
  if (joined_[rank]) {
    return fail(rendezvous_errc::duplicate_rank, who + " joined twice: two processes have the same task index");
  }
  if (r.devices != options_.devices) {
    return fail(rendezvous_errc::device_mismatch,
                "workers have different device counts: " + who + " has " + std::to_string(r.devices) + ", " +
                    options_.tasks[0] + " has " + std::to_string(options_.devices) +
                    "; every worker needs the same number of local devices");
  }
  if (r.data_port == 0) {
    return fail(rendezvous_errc::bad_join, who + " sent data-plane port 0 (expected 1..65535): its data listener is "
                                                 "not bound");
  }
  if (r.data_host.empty() || r.data_host.size() > rendezvous_limits::max_host_chars) {
    return fail(rendezvous_errc::bad_join, who + " sent a data-plane host of " + std::to_string(r.data_host.size()) +
                                               " characters (expected 1.." +
                                               std::to_string(rendezvous_limits::max_host_chars) + ")");
  }
  if (base::has_nul(r.data_host)) {
    return fail(rendezvous_errc::bad_join, who + " sent the data-plane host " + quoted(r.data_host) +
                                               ", which has a NUL character");
  }
  members_[rank] = member{r.rank, who, r.data_host, r.data_port, r.devices, {}, {}};
  joined_[rank] = true;
  peers_[rank] = r.peer;
  complete_ = missing().empty();
  return std::nullopt;
}

bool rendezvous_state::proves_token(const join_request& r) {
  // A nonce is good for one join by the peer it was handed to, whatever its outcome.
  auto issued_to = nonces_.find(r.nonce);
  const bool fresh = issued_to != nonces_.end() && issued_to->second.peer == r.peer &&
                     r.at - issued_to->second.at <= rendezvous_limits::nonce_lifetime;
  if (issued_to != nonces_.end() && issued_to->second.peer == r.peer) forget_nonce(r.nonce);
  return fresh && hmac_sha256_hex(options_.token, r.nonce) == r.proof;
}

std::optional<rendezvous_error> rendezvous_state::check_enlist(const join_request& r, const std::string& task) {
  const std::string who = "a worker asking to join as " + quoted(task);
  if (r.version != options_.version) {
    return rendezvous_error{rendezvous_errc::protocol_mismatch,
                            "rendezvous: refused " + who + ": it speaks rendezvous protocol version " +
                                std::to_string(r.version) + ", the chief " + std::to_string(options_.version) +
                                ": run the same troupe build everywhere"};
  }
  if (!proves_token(r)) {
    return rendezvous_error{rendezvous_errc::bad_token,
                            "rendezvous: refused " + who + ": it failed the cluster token check (a stranger, or a "
                                "worker with another TROUPE_CLUSTER_TOKEN: set the cluster's)"};
  }
  if (!complete_ || failure_ || last_beat_.empty()) {
    return rendezvous_error{rendezvous_errc::bad_join, "rendezvous: refused " + who + ": the cluster is not running yet "
                                                           "(a worker of its start joins without asking)"};
  }
  auto bad = [&](const std::string& what) {
    return rendezvous_error{rendezvous_errc::bad_join, "rendezvous: refused " + who + ": " + what};
  };
  if (task.empty() || task.size() > rendezvous_limits::max_host_chars || base::has_nul(task)) {
    return bad("a task name of " + std::to_string(task.size()) + " characters (expected 1.." +
               std::to_string(rendezvous_limits::max_host_chars) + ", no NUL)");
  }
  if (r.devices != options_.devices) {
    return bad("it has " + std::to_string(r.devices) + " devices, " + options_.tasks[0] + " has " +
               std::to_string(options_.devices) + " (every worker needs the same number)");
  }
  if (r.data_port == 0) return bad("data-plane port 0 (expected 1..65535)");
  if (r.data_host.empty() || r.data_host.size() > rendezvous_limits::max_host_chars || base::has_nul(r.data_host)) {
    return bad("a data-plane host of " + std::to_string(r.data_host.size()) + " characters (expected 1.." +
               std::to_string(rendezvous_limits::max_host_chars) + ", no NUL)");
  }
  if (members_.size() >= rendezvous_limits::max_workers) return bad("the watch's table is full");
  return std::nullopt;
}

int rendezvous_state::add_member(member m, std::string peer, clock::time_point now) {
  const int id = static_cast<int>(members_.size());
  m.rank = id;
  options_.tasks.push_back(m.task);
  members_.push_back(std::move(m));
  joined_.push_back(true);
  peers_.push_back(std::move(peer));
  last_beat_.push_back(now);
  has_watcher_.push_back(false);
  settled_.push_back(false);
  return id;
}

bool rendezvous_state::expire() {
  if (complete_ || failure_) return false;
  fail(rendezvous_errc::workers_missing, "still missing after " + std::to_string(options_.timeout.count()) +
                                             " ms: " + missing() + " (started? reachable? same TF_CONFIG?)");
  return true;
}

std::string rendezvous_state::missing() const {
  std::string out;
  for (std::size_t r = 0; r < joined_.size(); ++r) {
    if (!joined_[r]) out += (out.empty() ? "" : ", ") + options_.tasks[r];
  }
  return out;
}

void rendezvous_state::start_watch(std::chrono::milliseconds interval, clock::time_point now) {
  interval_ = interval;
  checked_ = now;
  last_beat_.assign(members_.size(), now);
  has_watcher_.assign(members_.size(), false);
  settled_.assign(members_.size(), false);
}

bool rendezvous_state::is_member(int rank, const std::string& peer) const {
  return rank >= 0 && static_cast<std::size_t>(rank) < peers_.size() && peers_[static_cast<std::size_t>(rank)] == peer;
}

bool rendezvous_state::on_beat(int rank, clock::time_point now, const std::string& peer) {
  if (!watched(rank) || !is_member(rank, peer)) return false;
  const auto r = static_cast<std::size_t>(rank);
  last_beat_[r] = now;
  if (has_watcher_[r]) return false;
  has_watcher_[r] = true;
  return true;
}

void rendezvous_state::on_bye(int rank, const std::string& peer) {
  if (watched(rank) && is_member(rank, peer)) settled_[static_cast<std::size_t>(rank)] = true;
}

bool rendezvous_state::settled(int rank) const { return watched(rank) && settled_[static_cast<std::size_t>(rank)]; }

verdict rendezvous_state::declare_gone(int rank, std::string reason) {
  settled_[static_cast<std::size_t>(rank)] = true;
  verdict v{rank, std::move(reason), {}};
  for (std::size_t r = 0; r < has_watcher_.size(); ++r) {
    if (has_watcher_[r]) v.tell.push_back(static_cast<int>(r));
  }
  return v;
}

std::optional<verdict> rendezvous_state::on_connection_closed(int rank) {
  if (!watched(rank)) return std::nullopt;
  const auto r = static_cast<std::size_t>(rank);
  has_watcher_[r] = false;  // nobody left there to tell
  if (settled_[r]) return std::nullopt;
  return declare_gone(rank, options_.tasks[r] + "'s connection to the chief closed (the process ended or its host "
                                                "is unreachable)");
}

std::vector<verdict> rendezvous_state::check(clock::time_point now) {
  std::vector<verdict> out;
  const liveness_policy policy{interval_, options_.missed_heartbeats};
  const bool paused = policy.paused(checked_, now);
  if (now > checked_) checked_ = now;
  if (paused) {
    for (std::size_t r = 1; r < last_beat_.size(); ++r) {
      if (!settled_[r] && now > last_beat_[r]) last_beat_[r] = now;
    }
    return out;
  }
  for (std::size_t r = 1; r < last_beat_.size(); ++r) {
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_beat_[r]);
    if (!settled_[r] && policy.silent_too_long(last_beat_[r], now)) {
      out.push_back(declare_gone(static_cast<int>(r), options_.tasks[r] + " sent no heartbeat for " +
                                                          std::to_string(silent.count()) +
                                                          " ms (hung, stopped or unreachable)"));
    }
  }
  return out;
}

std::optional<rendezvous_error> check_peer_table(const rendezvous_options& options, const std::vector<member>& table) {
  const std::string from = "rendezvous failed: the peer table from the chief " + options.tasks.front();
  auto bad = [&](const std::string& what) { return rendezvous_error{rendezvous_errc::bad_peer_table, from + what}; };
  if (table.size() != options.tasks.size()) {
    return bad(" has " + std::to_string(table.size()) + " entries, this cluster has " +
               std::to_string(options.tasks.size()) + " workers (the same TF_CONFIG on every worker?)");
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    const member& m = table[i];
    const std::string entry = " entry " + std::to_string(i);
    if (m.rank != static_cast<int>(i)) {
      return bad(entry + " has rank " + std::to_string(m.rank) + " (expected " + std::to_string(i) +
                 ": entries in rank order)");
    }
    if (m.task != options.tasks[i]) {
      return bad(entry + " names task " + quoted(m.task) + ", this worker knows rank " + std::to_string(i) + " as " +
                 options.tasks[i] + " (the same TF_CONFIG on every worker?)");
    }
    const std::string named = entry + " (" + m.task + ")";
    if (m.data_port == 0) return bad(named + " has data-plane port 0 (expected 1..65535)");
    if (m.data_host.empty() || m.data_host.size() > rendezvous_limits::max_host_chars) {
      return bad(named + " has a data-plane host of " + std::to_string(m.data_host.size()) +
                 " characters (expected 1.." + std::to_string(rendezvous_limits::max_host_chars) + ")");
    }
    if (base::has_nul(m.data_host)) {
      return bad(named + " has the data-plane host " + quoted(m.data_host) + ", which has a NUL character");
    }
    if (m.devices != options.devices) {
      return bad(named + " has " + std::to_string(m.devices) + " devices, this worker " +
                 std::to_string(options.devices) + " (expected the same on every worker)");
    }
    if (i != 0 && !m.collective_id.empty()) {
      return bad(named + " has a collective id (expected one only in the chief's entry)");
    }
    if (m.collective_id.size() > rendezvous_limits::max_collective_id_chars) {
      return bad(named + " has a collective id of " + std::to_string(m.collective_id.size()) +
                 " characters (expected at most " + std::to_string(rendezvous_limits::max_collective_id_chars) + ")");
    }
    if (const auto at = first_non_hex(m.collective_id); at != std::string::npos) {
      return bad(named + " has a collective id with " + quoted(std::string(1, m.collective_id[at])) + " at " +
                 std::to_string(at) + " (expected hex digits only)");
    }
    // The incarnation every data-plane connection proves: the chief's, fresh for this start.
    if (i != 0 && !m.incarnation.empty()) return bad(named + " has an incarnation (expected one only in the chief's entry)");
    if (i == 0 && (m.incarnation.size() != rendezvous_limits::incarnation_chars ||
                   first_non_hex(m.incarnation) != std::string::npos)) {
      return bad(named + " has an incarnation of " + std::to_string(m.incarnation.size()) + " characters (expected " +
                 std::to_string(rendezvous_limits::incarnation_chars) + " hex digits)");
    }
  }
  if (options.rank >= 0 && static_cast<std::size_t>(options.rank) < table.size()) {
    const member& own = table[static_cast<std::size_t>(options.rank)];
    if (own.data_host != options.data_host || own.data_port != options.data_port) {
      return bad(" gives this worker (" + own.task + ") the data plane " + own.data_host + ":" +
                 std::to_string(own.data_port) + ", it sent " + options.data_host + ":" +
                 std::to_string(options.data_port));
    }
  } else {
    return bad(" has no entry for this worker's rank " + std::to_string(options.rank) + " (expected 0.." +
               std::to_string(table.size() - 1) + ")");
  }
  return std::nullopt;
}

void check_options(const rendezvous_options& o) {
  if (o.tasks.empty()) throw std::invalid_argument("rendezvous: no workers");
  if (o.tasks.size() > rendezvous_limits::max_workers) {
    throw std::invalid_argument("rendezvous: " + std::to_string(o.tasks.size()) + " workers (expected at most " +
                                std::to_string(rendezvous_limits::max_workers) + ")");
  }
  const std::string who = o.rank >= 0 && static_cast<std::size_t>(o.rank) < o.tasks.size()
                              ? o.tasks[static_cast<std::size_t>(o.rank)]
                              : "the worker of rank " + std::to_string(o.rank);
  auto bad = [&](const std::string& what) { throw std::invalid_argument("rendezvous: " + who + ": " + what); };
  if (o.devices < 1) bad("devices is " + std::to_string(o.devices) + " (expected at least 1)");
  if (o.data_port == 0) bad("data_port is 0 (expected 1..65535: the port its data listener is bound to)");
  if (o.data_host.empty() || o.data_host.size() > rendezvous_limits::max_host_chars) {
    bad("data_host has " + std::to_string(o.data_host.size()) + " characters (expected 1.." +
        std::to_string(rendezvous_limits::max_host_chars) + ")");
  }
  if (o.rank != 0 && o.chief_port == 0) bad("chief_port is 0 (expected 1..65535: the chief's port in TF_CONFIG)");
  if (o.timeout.count() < 1) bad("timeout is " + std::to_string(o.timeout.count()) + " ms (expected at least 1)");
  if (o.missed_heartbeats < liveness_policy::min_missed || o.missed_heartbeats > liveness_policy::max_missed) {
    bad("missed_heartbeats is " + std::to_string(o.missed_heartbeats) + " (expected " +
        std::to_string(liveness_policy::min_missed) + ".." + std::to_string(liveness_policy::max_missed) + ")");
  }
  if (o.connect_retry.count() < 1) {
    bad("connect_retry is " + std::to_string(o.connect_retry.count()) + " ms (expected at least 1)");
  }
  if (o.answer_margin.count() < 0 || o.failure_linger.count() < 0) {
    bad("answer_margin and failure_linger are " + std::to_string(o.answer_margin.count()) + " and " +
        std::to_string(o.failure_linger.count()) + " ms (expected 0 or more)");
  }
  if (o.stall.warning < std::chrono::seconds(1) || o.stall.warning > std::chrono::hours(24 * 7)) {
    bad("stall.warning is " + std::to_string(o.stall.warning.count()) + " ms (expected 1 s..7 days)");
  }
  if (o.stall.shutdown.count() != 0 &&
      (o.stall.shutdown < std::chrono::seconds(1) || o.stall.shutdown > std::chrono::hours(24 * 7))) {
    bad("stall.shutdown is " + std::to_string(o.stall.shutdown.count()) + " ms (expected 0 for never, or 1 s..7 days)");
  }
  if (o.collective_id.size() > rendezvous_limits::max_collective_id_chars) {
    bad("collective_id has " + std::to_string(o.collective_id.size()) + " characters (expected at most " +
        std::to_string(rendezvous_limits::max_collective_id_chars) + " hex digits)");
  }
  if (const auto at = first_non_hex(o.collective_id); at != std::string::npos) {
    bad("collective_id has " + quoted(std::string(1, o.collective_id[at])) + " at " + std::to_string(at) +
        " (expected hex digits only)");
  }
}

}  // namespace troupe::actors
