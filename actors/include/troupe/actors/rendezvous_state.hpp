#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "troupe/actors/rendezvous.hpp"

namespace troupe::actors {

/// What went wrong in a rendezvous. Travels between workers as a caf::error of category
/// "rendezvous" whose context is the message every worker shows.
enum class rendezvous_errc : std::uint8_t {
  protocol_mismatch = 1,  ///< a worker speaks another rendezvous protocol version
  bad_token,              ///< a worker failed the cluster token proof
  not_in_cluster,         ///< a worker claims a rank the cluster does not have
  duplicate_rank,         ///< two processes claim one rank
  device_mismatch,        ///< workers have different device counts
  bad_join,               ///< a join carries a value out of range (port, host)
  workers_missing,        ///< the start timeout ended with workers still missing
  bad_peer_table,         ///< the peer table a worker received does not fit its cluster
};

/// A rendezvous failure: its kind, and the message (starting "rendezvous") that names the
/// culprit and the fix.
struct rendezvous_error {
  rendezvous_errc code = rendezvous_errc::protocol_mismatch;
  std::string message;
};

/// The limits a peer's values must keep. A table or a join outside them is refused.
struct rendezvous_limits {
  static constexpr std::size_t max_host_chars = 255;           ///< a DNS name's limit
  static constexpr std::size_t max_collective_id_chars = 1024; ///< hex; an ncclUniqueId is 256
  static constexpr std::size_t incarnation_chars = 32;         ///< hex: 128 random bits
  static constexpr std::size_t max_workers = 65536;
  /// Nonces handed out and not yet used: at most this many (the oldest goes first), one per
  /// peer (a peer's new nonce replaces its old one), each good for nonce_lifetime.
  static constexpr std::size_t max_nonces = 1024;
  static constexpr std::chrono::milliseconds nonce_lifetime{10000};
};

/// A worker's join, as the chief's agent receives it.
struct join_request {
  std::uint32_t version = 0;
  std::int32_t rank = 0;
  std::string nonce;
  std::string proof;  ///< HMAC-SHA256(token, nonce), hex
  std::int32_t devices = 0;
  std::string data_host;
  std::uint16_t data_port = 0;
  /// Who sent it (the sender's node, as the agent sees it): the nonce must have been handed to
  /// the same peer, and the rank's heartbeats and goodbye count only from it.
  std::string peer;
  std::chrono::steady_clock::time_point at{};  ///< when it arrived
};

/// A worker declared gone: who, why, and the ranks whose watchers are to be told.
struct verdict {
  int rank = 0;
  std::string reason;
  std::vector<int> tell;
};

/// The chief's cluster agent without CAF, so every rule can be tested alone. Two phases:
/// joining (nonces, joins, the start deadline) until the table is complete or the rendezvous
/// failed, then watching (heartbeats, goodbyes, closed connections) once start_watch is called.
/// Time is passed in, never read, so tests decide it.
class rendezvous_state {
 public:
  using clock = std::chrono::steady_clock;

  /// The chief's bookkeeping for `options` (the chief's own): it holds rank 0 from the start.
  /// Throws std::invalid_argument when options.tasks is empty.
  explicit rendezvous_state(rendezvous_options options);

  // --- joining ---

  /// Who the chief itself is (its node): rank 0's heartbeats and goodbye count only from it.
  void set_chief_peer(std::string peer);
  /// Records a nonce handed to `peer` at `now`; each is good for one join by that peer within
  /// rendezvous_limits::nonce_lifetime. Bounded: see rendezvous_limits::max_nonces.
  void add_nonce(std::string nonce, std::string peer = {}, clock::time_point now = {});
  /// Nonces held now (at most rendezvous_limits::max_nonces).
  std::size_t nonces() const noexcept { return nonces_.size(); }
  /// Checks a join against the rules (protocol version, token proof, rank in the cluster and
  /// free, device count equal to the chief's, a data-plane endpoint in range), in that order.
  /// A join that fails the token proof (an unknown, expired or replayed nonce, another peer's
  /// nonce, a wrong proof) is refused alone: a stranger cannot abort the start. Any other bad
  /// join fails the whole rendezvous and returns its error; a good one takes the rank. Once
  /// failed, every join gets the same error.
  std::optional<rendezvous_error> join(const join_request& request);
  /// The start deadline passed: fails the rendezvous naming the missing tasks, unless it is
  /// complete or failed already. Returns whether this call failed it.
  bool expire();
  bool complete() const noexcept { return complete_; }
  const std::optional<rendezvous_error>& failure() const noexcept { return failure_; }
  /// The peer table in rank order; complete only once complete().
  const std::vector<member>& table() const noexcept { return members_; }
  /// The tasks that have not joined, comma-separated.
  std::string missing() const;

  // --- watching ---

  /// The rendezvous is complete: from `now`, every worker is expected to beat every `interval`.
  void start_watch(std::chrono::milliseconds interval, clock::time_point now);
  /// Whether `peer` is the one that joined as `rank` (the chief's own for rank 0): heartbeats and
  /// goodbyes naming a rank count only from it.
  bool is_member(int rank, const std::string& peer) const;
  /// A heartbeat from `rank`, sent by `peer`. Returns true when it is the first from that rank's
  /// watcher, which is then to be monitored and told every verdict. Ignored (false) before
  /// start_watch, for a rank outside the cluster, or from a peer that is not that rank's.
  bool on_beat(int rank, clock::time_point now, const std::string& peer = {});
  /// `rank` leaves cleanly: it will not be declared gone. Ignored from a peer not that rank's.
  void on_bye(int rank, const std::string& peer = {});
  /// The connection to `rank`'s watcher closed: a verdict unless that rank is settled already.
  std::optional<verdict> on_connection_closed(int rank);
  /// The periodic check (every interval): a verdict for each worker silent for more than
  /// options.missed_heartbeats intervals, unless the previous check is more than two intervals
  /// before `now` (liveness_policy::paused: the chief itself was stopped or starved), when nobody
  /// is blamed and every worker not settled starts a fresh limit from `now`.
  std::vector<verdict> check(clock::time_point now);
  /// Whether `rank` was declared gone or said goodbye.
  bool settled(int rank) const;

  // --- joining a running cluster (elastic membership) ---

  /// Checks a request to join the running cluster as `task` (request.rank is ignored): protocol
  /// version, token proof (a nonce this peer got, as for a join), the cluster watched already,
  /// the device count equal to the chief's, the data-plane endpoint in range. Every refusal is
  /// the asker's alone: nothing of the cluster changes. Whether the membership has room for it
  /// is membership_state's to say.
  std::optional<rendezvous_error> check_enlist(const join_request& request, const std::string& task);
  /// A joiner admitted: it is watched from `now` as id table().size() (returned), its heartbeats
  /// and goodbye counted only from `peer`. Ids are never reused: a change of membership does not
  /// renumber the watch.
  int add_member(member m, std::string peer, clock::time_point now);

 private:
  rendezvous_error fail(rendezvous_errc code, const std::string& what);
  bool proves_token(const join_request& r);  // consumes the nonce
  verdict declare_gone(int rank, std::string reason);
  bool watched(int rank) const noexcept { return rank >= 0 && static_cast<std::size_t>(rank) < last_beat_.size(); }

  rendezvous_options options_;
  std::vector<member> members_;  // by rank; members_[0] is the chief
  std::vector<bool> joined_;
  struct issued {
    std::string peer;
    clock::time_point at;
  };
  void forget_nonce(const std::string& nonce);
  std::map<std::string, issued> nonces_;              // by nonce
  std::map<std::string, std::string> nonce_of_peer_;  // one per peer
  std::deque<std::string> nonce_order_;               // oldest first (may hold used ones)
  std::vector<std::string> peers_;                    // by rank: who joined
  std::optional<rendezvous_error> failure_;
  bool complete_ = false;
  std::chrono::milliseconds interval_{0};
  std::vector<clock::time_point> last_beat_;  // sized by start_watch
  clock::time_point checked_;                 // the previous check (the watch's start before one)
  std::vector<bool> has_watcher_;
  std::vector<bool> settled_;
};

/// Checks the peer table a worker received against its own view of the cluster (`options`):
/// one entry per task in rank order with the task names it knows, ports in 1..65535, hosts and
/// collective ids within rendezvous_limits, every device count equal to its own, a collective id
/// (hex) only in the chief's entry, and its own entry as it sent it. A table from the network is
/// never used unchecked.
/// A fresh incarnation: incarnation_chars random hex digits (std::runtime_error when the system
/// has no randomness). The chief's rendezvous_state makes one.
std::string new_incarnation();

std::optional<rendezvous_error> check_peer_table(const rendezvous_options& options, const std::vector<member>& table);

/// Checks a worker's own rendezvous options before anything travels: tasks present, rank,
/// device count, ports and the collective id in range. Throws std::invalid_argument naming the
/// field, the value and the valid range.
void check_options(const rendezvous_options& options);

}  // namespace troupe::actors
