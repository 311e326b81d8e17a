#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/stall_inspector.hpp"

namespace caf {
class actor_system;
class actor_system_config;
}

namespace troupe::actors {

class cluster_health;
class log_tail;
class position_board;

/// One worker of a cluster, as the rendezvous tells every worker.
struct member {
  int rank = 0;
  std::string task;        ///< "/job:worker/task:1"
  std::string data_host;   ///< where its data plane listens
  std::uint16_t data_port = 0;
  int devices = 0;         ///< local replicas
  std::string collective_id;  ///< the chief's: what its GPU collectives are joined by (hex); else empty
  /// The chief's: this start of the cluster, 32 random hex digits (a new value every start); else
  /// empty. Every data-plane connection proves it (transport::ring_auth).
  std::string incarnation;
};

/// A worker that asked the chief to join a running elastic cluster and proved the token.
struct join_candidate {
  std::int64_t key = 0;  ///< the chief's agent's handle on the request
  member who;            ///< its task, data-plane endpoint and device count (rank unset)
};

/// The joins waiting for the next step boundary: the chief's agent adds each that proved the
/// token, the training loop admits or refuses them there (cluster_watch::admit / refuse).
/// Thread-safe.
class join_queue {
 public:
  void push(join_candidate c);
  /// The joins waiting, in the order they came.
  std::vector<join_candidate> waiting() const;
  std::size_t size() const;
  void remove(std::int64_t key);

 private:
  mutable std::mutex mutex_;
  std::vector<join_candidate> waiting_;
};

/// What an admitted joiner receives from the chief: the cluster it joins.
struct join_answer {
  std::vector<member> table;            ///< the new generation's members, in rank order
  std::vector<std::int32_t> watch_ids;  ///< by rank: each member's id in the chief's watch
  std::uint64_t generation = 0;         ///< the new generation
  std::string incarnation;              ///< what its ring proves (generation_incarnation)
  std::int32_t rank = 0;                ///< the joiner's rank in it
  std::int32_t changes = 0;             ///< the changes of membership completed before this one
  std::int32_t max_workers = 0;         ///< the chief's bound on the members
};

/// What one worker brings to the rendezvous.
struct rendezvous_options {
  int rank = 0;                       ///< 0 is the chief: it hosts the cluster agent
  std::vector<std::string> tasks;     ///< every worker's task name, in rank order (for errors)
  std::string chief_host;             ///< the chief agent's address (the chief's TF_CONFIG entry)
  std::uint16_t chief_port = 0;
  int devices = 1;
  std::string data_host;
  std::uint16_t data_port = 0;
  /// The shared cluster token (TROUPE_CLUSTER_TOKEN). Set: every control connection is mutual
  /// TLS from a certificate it derives (the system needs CAF's OpenSSL module). Empty: plain BASP,
  /// from the same user only on loopback. Either way behind the gate that bounds every header.
  std::string token;
  std::chrono::milliseconds timeout{60000};  ///< the start deadline: every worker joined by then
  /// Protocol version; every worker must agree (4: incarnation; 5: the chief beats to the
  /// workers; 6: every heartbeat carries a worker_report; 7: and the worker's position, for the
  /// stall inspector).
  std::uint32_t version = 7;
  /// The chief's only: an id every worker needs to join its GPU collectives (the ncclUniqueId, as
  /// hex), handed to all of them with the peer table. Hex digits only.
  std::string collective_id;
  /// The chief declares a worker gone after this many heartbeat intervals without a beat.
  int missed_heartbeats = 6;
  /// How often a worker tries again to reach the chief until the timeout.
  std::chrono::milliseconds connect_retry{50};
  /// How long past the timeout a worker waits for the chief's answer to its join (the chief
  /// answers at its own deadline, which may be a little later than this worker's).
  std::chrono::milliseconds answer_margin{5000};
  /// How long a failing chief waits before returning, so the middleman can deliver the error to
  /// the workers that joined before its process exits.
  std::chrono::milliseconds failure_linger{300};
  /// Where the chief's control plane records its cluster's health (cluster_health.hpp): every
  /// worker's heartbeats as the chief's agent receives them, workers late, back and lost, fault
  /// reports and refused connections. May be null (nothing recorded).
  std::shared_ptr<cluster_health> health;
  /// This worker's last log lines, which its heartbeat carries to the chief with its CPU and
  /// memory (worker_report.hpp). May be null (no lines).
  std::shared_ptr<log_tail> log;
  /// This worker's position (step, phase, the collective it waits in), which its heartbeat
  /// carries to the chief's stall inspector (stall_inspector.hpp). May be null (no position).
  std::shared_ptr<position_board> position;
  /// The chief's stall inspector's bounds: past `warning` it prints the stall line (and records
  /// it in `health`), past `shutdown` (when set) it ends the cluster with that line.
  stall_options stall;
  /// The chief's, under elastic membership: where its agent puts the joins that proved the token.
  /// Null: the cluster takes no joiner (a request to join is refused, named).
  std::shared_ptr<join_queue> joins;
};

/// Announces the rendezvous messages (member, the peer table, its errors) to an actor system's
/// config; it must be called before the system is constructed, in every process of a cluster.
void add_rendezvous_types(caf::actor_system_config& config);

/// The rendezvous of a multi-worker strategy, numbered as it happens:
///   1. The chief publishes its cluster agent through the CAF middleman at its own address, behind
///      troupe's gate (every BASP header bounded, every refusal logged with the peer's address);
///      with a token, over mutual TLS, so that only holders of the token reach BASP; without one,
///      a loopback peer must be the chief's own user.
///   2. Every other worker connects to it (retrying until the timeout), asks for a nonce, and
///      joins with: protocol version, rank, HMAC-SHA256(token, nonce) (the token never travels),
///      local device count and data-plane endpoint.
///   3. The chief checks each join (version, token proof, device count equal to its own, a rank
///      that is free) and, once every worker has joined, sends all of them the peer table (with
///      its collective_id and this start's random incarnation in its own entry). A join that
///      fails the token proof is refused alone and logged: whoever sent it proved nothing, so it
///      cannot fail the cluster.
///   4. Any other bad join, or the timeout with workers still missing, fails every worker with
///      the same error naming the culprit (the missing tasks by name).
///   5. Every worker checks the table it received (check_peer_table) before using it.
/// The rules of steps 3 to 5 are rendezvous_state's. Returns the peer table in rank order, or
/// throws std::runtime_error with that error (std::invalid_argument for bad options, or a system
/// built without add_rendezvous_types).
std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options);

/// Liveness after the rendezvous: every worker's heartbeat actor beats to the chief's agent every
/// `interval`, each beat with a worker_report (its process's CPU and resident memory, and its
/// log_tail's lines when it has new ones), which the agent checks (check_worker_report) and
/// records in options.health: a report it refuses is logged and dropped, the beat still counts.
/// The chief declares a worker gone when it has been silent for more than
/// options.missed_heartbeats intervals (hung, stopped, or unreachable) or its connection closed,
/// and tells every worker. The watch runs both ways: the chief's agent beats to every worker's
/// heartbeat actor every `interval` too, and a worker declares the chief gone when the agent has
/// been silent for more than options.missed_heartbeats intervals (a stopped chief keeps its
/// connections open) or its connection to the chief closed. Either side checks every interval and
/// blames nobody for a gap in its own checks (liveness_policy::paused: it was itself stopped or
/// starved). A worker that finds the workers out of step or a ring link tampered with
/// (report_fault) has the chief tell every other worker.
/// on_failure(rank, reason) runs once per rank named, on an actor thread (an elastic cluster
/// that went on after one loss hears of the next). A worker that
/// leaves cleanly says goodbye first, so it is not declared gone. Destroying the watch stops the
/// actors.
class cluster_watch {
 public:
  struct impl;
  explicit cluster_watch(std::unique_ptr<impl> impl);
  ~cluster_watch();
  cluster_watch(const cluster_watch&) = delete;
  cluster_watch& operator=(const cluster_watch&) = delete;

  /// Tells every other worker, through the chief's agent, a fault this worker found that is the
  /// cluster's (workers out of step, a ring link tampered with): their on_failure runs with (this
  /// rank, `what`). The agent acts only on a report from the peer that joined as this rank, and
  /// cuts `what` at 4 KiB.
  /// Returns once the agent has passed it on, or after `wait`.
  void report_fault(const std::string& what, std::chrono::milliseconds wait);

  /// The chief's, at a step boundary of an elastic cluster: admits the joins `keys` (of its
  /// join_queue, in that order) into `table` (the new generation's members in rank order, the
  /// joiners last, after the `ids.size()` members there were, whose watch ids `ids` are). The
  /// agent watches each joiner from now on under a new id and answers its request with the
  /// join_answer; returns the joiners' ids, in order. Throws std::runtime_error when the agent does
  /// not answer within `wait`.
  std::vector<std::int32_t> admit(const std::vector<std::int64_t>& keys, const std::vector<member>& table,
                                  const std::vector<std::int32_t>& ids, std::uint64_t generation,
                                  const std::string& incarnation, std::int32_t changes, std::int32_t max_workers,
                                  std::chrono::milliseconds wait);
  /// The chief's: refuses the join `key` with `why` (its asker fails with that message).
  void refuse(std::int64_t key, const std::string& why);

 private:
  std::unique_ptr<impl> impl_;
};

/// rendezvous(), then a cluster_watch over the cluster it formed.
std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options,
                               std::chrono::milliseconds heartbeat_interval,
                               std::function<void(int, const std::string&)> on_failure,
                               std::unique_ptr<cluster_watch>& watch);

/// Joins a running elastic cluster (its chief at options.chief_host:chief_port) as
/// options.tasks[options.rank], numbered as it happens:
///   1. It reaches the chief's agent (through the same gate and, with a token, mutual TLS), asks
///      for a nonce and sends its request: protocol version, task, HMAC-SHA256(token, nonce),
///      device count, data-plane endpoint. One that fails the token proof is refused alone.
///   2. The chief queues it; at the cluster's next step boundary the training loop admits it (or
///      refuses it, named: no room under max_workers, a member's task) and the agent answers with
///      the new generation's table (join_answer), checked here before use.
///   3. The agent watches it from then on under the id it gave it; this worker's heartbeat actor
///      beats under that id and on_failure hears of losses as a member's does.
/// Bounded by options.timeout (and answer_margin); throws std::runtime_error naming why.
join_answer join_cluster(caf::actor_system& system, const rendezvous_options& options,
                         std::chrono::milliseconds heartbeat_interval,
                         std::function<void(int, const std::string&)> on_failure,
                         std::unique_ptr<cluster_watch>& watch);

/// Checks the join_answer a joiner received against its request (`options`): ranks in order,
/// its own entry as it sent it, a watch id per member, the incarnation's form. nullopt when good.
std::optional<std::string> check_join_answer(const rendezvous_options& options, const join_answer& answer);

/// HMAC-SHA256 of `message` under `key`, hex-encoded.
std::string hmac_sha256_hex(const std::string& key, const std::string& message);

}  // namespace troupe::actors
