#include "troupe/distribute/multi_worker_strategy.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "distribute/cluster/cluster_net.hpp"
#include "env.hpp"
#include "flight_recorder.hpp"
#include "distribute/collectives/hierarchical_collectives.hpp"
#include "middleman.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/elastic_membership.hpp"
#include "distribute/strategies/mirrored_backend.hpp"
#include "troupe/actors/membership_state.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/errors.hpp"
#include "troupe/log.hpp"
#include "troupe/transport/tcp_ring.hpp"

namespace troupe::distribute {
namespace {

// How long an elastic worker that heard of a loss waits for the verdicts of others lost with it.
constexpr std::chrono::milliseconds loss_settle{100};

// A cluster address "host:port" (or "[v6]:port") as the rendezvous and the ring take it.
std::pair<std::string, std::uint16_t> split_address(const std::string& address, const std::string& what) {
  return detail::split_host_port(address, "MultiWorkerMirroredStrategy", what);
}

// The IPv4 address the ring's listener binds: the one this task's cluster address names, so that
// the port is not open on interfaces the cluster does not use. A name is resolved here; it falls
// back to every interface ("0.0.0.0") when the resolver gives no address of this task's own
// (mpirun: the others learn this host's name at rendezvous and may reach it on any interface),
// when the name does not resolve to IPv4 here (the ring then reports the peers' view), and when a
// host name other than "localhost" resolves to loopback (Debian maps its own name to 127.0.1.1,
// which no other host reaches). Strangers on any interface are refused by the ring's proof.
std::string listen_address(const std::string& host) {
  if (host.empty()) return "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "0.0.0.0";
  char text[INET_ADDRSTRLEN] = {};
  const auto* addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  const bool loopback = (ntohl(addr->sin_addr.s_addr) >> 24) == 127;
  inet_ntop(AF_INET, &addr->sin_addr, text, sizeof text);
  freeaddrinfo(found);
  in_addr literal{};
  const bool is_literal = inet_pton(AF_INET, host.c_str(), &literal) == 1;
  if (loopback && !is_literal && host != "localhost") return "0.0.0.0";
  return text;
}

// Task names of the training tasks in rank order: the chief first, then the workers.
std::vector<std::string> training_tasks(const ClusterSpec& spec) {
  std::vector<std::string> tasks;
  if (spec.has_job("chief")) tasks.push_back(detail::task_name("chief", 0));
  if (spec.has_job("worker")) {
    for (int i = 0; i < spec.num_tasks("worker"); ++i) tasks.push_back(detail::task_name("worker", i));
  }
  return tasks;
}

// A cluster that spans more than loopback needs a token unless told insecure (cluster_net.hpp).
void require_token(const ClusterSpec& spec, const std::string& coordinator, const MultiWorkerOptions& settings) {
  std::vector<std::string> addresses{coordinator};
  for (const auto& a : detail::cluster_addresses(spec)) addresses.push_back(a);
  detail::require_token(addresses, settings.cluster_token, settings.insecure, "MultiWorkerMirroredStrategy",
                        "MultiWorkerOptions::insecure");
}

}  // namespace

const char* compression_name(Compression c) noexcept {
  switch (c) {
    case Compression::none: return "none";
    case Compression::fp16: return "fp16";
    case Compression::bf16: return "bf16";
  }
  return "?";
}

namespace {

// An elastic worker asked to leave (SIGUSR2): set by the handler, read at each step boundary. A
// handler reaches nothing but globals, and a lock-free atomic is safe to write from it.
std::atomic<int> leave_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the leave flag is written from a signal handler");
extern "C" void troupe_on_leave_signal(int) { leave_signal.store(1); }

// SIGUSR2's handler while an elastic backend lives (the previous one back after it).
class LeaveSignal {
 public:
  LeaveSignal() {
    leave_signal.store(0);
    struct sigaction action {};
    action.sa_handler = troupe_on_leave_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    installed_ = ::sigaction(SIGUSR2, &action, &previous_) == 0;
  }
  ~LeaveSignal() {
    if (installed_) ::sigaction(SIGUSR2, &previous_, nullptr);
  }
  LeaveSignal(const LeaveSignal&) = delete;
  LeaveSignal& operator=(const LeaveSignal&) = delete;
  bool requested() const { return leave_signal.load() != 0; }
  void drop() { leave_signal.store(0); }

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

// What an elastic cluster needs beyond its ring: the rules, the secrets its rings prove, bounds.
struct ElasticSettings {
  MultiWorkerOptions options;
  std::string incarnation;  // the start's (the chief's, from the rendezvous)
  std::shared_ptr<actors::join_queue> joins;  // the chief's: workers asking to join
  // A joiner's: where the cluster it joined stands.
  std::optional<actors::join_answer> joined;
};

class MultiWorkerBackend final : public detail::MirroredBackend, public detail::ElasticMembership {
 public:
  MultiWorkerBackend(Runtime& runtime, std::vector<Device> devices, std::unique_ptr<detail::RingWorkerGroup> workers,
                     std::size_t bytes_per_pack, Compression compression, detail::NcclWorld world,
                     std::optional<ElasticSettings> elastic)
      : MirroredBackend(runtime, devices, std::make_shared<ReductionToOneDevice>(), std::move(world)),
        gpu_(devices[0].is_gpu()),
        bytes_per_pack_(bytes_per_pack),
        compression_(compression),
        workers_(std::move(workers)),
        hierarchical_(std::make_unique<detail::HierarchicalCollectives>(
            shm_collectives(), *workers_, workers_->size() * static_cast<int>(devices.size()), bytes_per_pack,
            compression)),
        elastic_(std::move(elastic)) {
    if (elastic_) {
      std::vector<std::string> tasks;
      for (const auto& m : workers_->members()) tasks.push_back(m.task);
      if (const auto& j = elastic_->joined) {
        rules_.emplace(std::move(tasks), elastic_->options.min_workers, std::max<int>(j->max_workers, workers_->size()),
                       j->generation, j->changes + 1);
        watch_ids_ = std::vector<int>(j->watch_ids.begin(), j->watch_ids.end());
      } else {
        rules_.emplace(std::move(tasks), elastic_->options.min_workers, elastic_->options.max_workers);
        for (int r = 0; r < workers_->size(); ++r) watch_ids_.push_back(r);
      }
      leave_signal_.emplace();
    }
  }

  bool leave_requested() const override { return leave_signal_ && leave_signal_->requested() && !workers_->left(); }

  detail::MembershipChange leave(const std::vector<int>& ranks) override {
    const auto started = std::chrono::steady_clock::now();
    const std::string fallback = "elastic membership falls back to the restart path: ";
    const auto& members = workers_->members();
    // The chief decides (its rules hold the bounds), every worker applies its decision.
    std::string text;
    if (workers_->rank() == 0) {
      std::vector<std::string> refused;
      const auto decided = rules_->leave(ranks, refused);
      nlohmann::json j;
      j["generation"] = decided ? decided->generation : 0;
      j["leaving"] = std::vector<int>();
      if (decided) {
        for (int r = 0; r < static_cast<int>(members.size()); ++r) {
          if (decided->new_rank(r) < 0) j["leaving"].push_back(r);
        }
      }
      j["refused"] = refused;
      text = j.dump();
    }
    text = broadcast_text(text);
    detail::MembershipChange out;
    out.generation = workers_->generation();
    out.workers = workers_->size();
    out.rank = workers_->rank();
    std::vector<int> leaving;
    std::uint64_t generation = 0;
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      generation = j.at("generation").get<std::uint64_t>();
      leaving = j.at("leaving").get<std::vector<int>>();
      out.refused = j.at("refused").get<std::vector<std::string>>();
    } catch (const std::exception& e) {
      rules_->abort(std::string("the chief's decision on a leave is unreadable: ") + e.what());
      throw CollectiveAborted(rules_->fallback());
    }
    const bool me_asked = std::find(ranks.begin(), ranks.end(), workers_->rank()) != ranks.end();
    const bool me_leaving = std::find(leaving.begin(), leaving.end(), workers_->rank()) != leaving.end();
    if (me_asked && !me_leaving && leave_signal_) {
      leave_signal_->drop();  // refused: it stops asking
      std::string why;
      for (const std::string& r : out.refused) why += (why.empty() ? "" : "; ") + r;
      troupe::log(LogLevel::warning, "elastic membership: this worker asked to leave and the chief refused (" + why +
                                         "); it trains on");
    }
    if (leaving.empty()) return out;
    // Every worker applies the chief's decision to its own rules (the chief's own did already).
    if (workers_->rank() != 0) {
      std::vector<std::string> ignored;
      const auto decided = rules_->leave(leaving, ignored);
      if (!decided || decided->generation != generation || decided->left.size() != leaving.size()) {
        throw CollectiveAborted(fallback + "this worker cannot apply the chief's leave of generation " +
                                std::to_string(generation) + " (at generation " + std::to_string(rules_->generation()) +
                                ")");
      }
    }
    for (int r : leaving) out.left.push_back(members[static_cast<std::size_t>(r)].task);
    if (me_leaving) {
      workers_->leave();
      if (leave_signal_) leave_signal_->drop();
      out.rank = -1;
      out.workers = workers_->size() - static_cast<int>(leaving.size());
      out.generation = generation;
      out.waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
      return out;
    }
    std::vector<int> ids;
    std::vector<actors::member> next;
    int rank = -1;
    for (int r = 0; r < static_cast<int>(members.size()); ++r) {
      if (std::find(leaving.begin(), leaving.end(), r) != leaving.end()) continue;
      if (r == workers_->rank()) rank = static_cast<int>(next.size());
      ids.push_back(watch_ids_[static_cast<std::size_t>(r)]);
      actors::member m = members[static_cast<std::size_t>(r)];
      m.rank = static_cast<int>(next.size());
      next.push_back(std::move(m));
    }
    std::vector<int> gone;
    for (int r : leaving) gone.push_back(watch_ids_[static_cast<std::size_t>(r)]);
    watch_ids_ = std::move(ids);
    reform_to(rank, std::move(next), generation);
    workers_->failures().forget(gone);  // a verdict on one that left is no loss
    out.generation = generation;
    out.rank = rank;
    out.watch_ids = watch_ids_;
    out.workers = workers_->size();
    out.waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    return out;
  }

  int joiners_waiting() const override {
    return elastic_ && elastic_->joins ? static_cast<int>(elastic_->joins->size()) : 0;
  }
  bool joining() const override { return workers_->joining(); }
  void refuse_waiting(const std::string& why) override {
    if (!elastic_ || !elastic_->joins || workers_->watch() == nullptr) return;
    for (const actors::join_candidate& c : elastic_->joins->waiting()) {
      workers_->watch()->refuse(c.key, "elastic membership: refused the join of " + c.who.task + ": " + why);
    }
  }
  void end_joining() override { workers_->end_joining(); }

  detail::MembershipChange admit() override {
    const auto started = std::chrono::steady_clock::now();
    const auto& o = elastic_->options;
    const std::string fallback = "elastic membership falls back to the restart path: ";
    const auto& members = workers_->members();
    std::string text;  // the new generation as the chief decided it; empty: nobody admitted
    if (workers_->rank() == 0 && elastic_->joins) {
      std::vector<std::int64_t> keys;
      std::vector<actors::member> table = members;
      std::vector<std::string> tasks;
      for (const auto& m : members) tasks.push_back(m.task);
      for (const actors::join_candidate& c : elastic_->joins->waiting()) {
        std::optional<std::string> why = rules_->check_join(c.who.task);
        if (!why && std::find(tasks.begin(), tasks.end(), c.who.task) != tasks.end()) {
          why = c.who.task + " asked to join twice";
        }
        if (!why && static_cast<int>(tasks.size()) >= rules_->max_workers()) {
          why = "the cluster has max_workers (" + std::to_string(rules_->max_workers()) + ") with the joiners before it";
        }
        if (why) {
          workers_->watch()->refuse(c.key, "elastic membership: refused the join of " + c.who.task + ": " + *why);
          continue;
        }
        keys.push_back(c.key);
        tasks.push_back(c.who.task);
        actors::member m = c.who;
        m.rank = static_cast<int>(table.size());
        table.push_back(std::move(m));
      }
      if (!keys.empty()) {
        const std::uint64_t generation = rules_->generation() + 1;
        const std::vector<std::int32_t> known(watch_ids_.begin(), watch_ids_.end());
        const std::vector<std::int32_t> added =
            workers_->watch()->admit(keys, table, known, generation, elastic_->incarnation, rules_->changes(),
                                     rules_->max_workers(), o.start_timeout);
        nlohmann::json j;
        j["generation"] = generation;
        j["ids"] = known;
        for (std::int32_t id : added) j["ids"].push_back(id);
        for (const auto& m : table) {
          j["members"].push_back({{"task", m.task}, {"host", m.data_host}, {"port", m.data_port}, {"devices", m.devices}});
        }
        text = j.dump();
      }
    }
    text = broadcast_text(text);
    detail::MembershipChange out;
    out.generation = workers_->generation();
    out.workers = workers_->size();
    out.rank = workers_->rank();
    if (text.empty()) return out;
    std::vector<actors::member> next;
    std::vector<int> ids;
    std::uint64_t generation = 0;
    std::vector<std::string> joined;
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      generation = j.at("generation").get<std::uint64_t>();
      ids = j.at("ids").get<std::vector<int>>();
      for (const auto& e : j.at("members")) {
        actors::member m;
        m.rank = static_cast<int>(next.size());
        m.task = e.at("task").get<std::string>();
        m.data_host = e.at("host").get<std::string>();
        m.data_port = e.at("port").get<std::uint16_t>();
        m.devices = e.at("devices").get<int>();
        if (next.size() < members.size()) m = members[next.size()];  // a member's entry stays its own
        if (next.size() >= members.size()) joined.push_back(m.task);
        next.push_back(std::move(m));
      }
    } catch (const std::exception& e) {
      rules_->abort(std::string("the chief's table of the new generation is unreadable: ") + e.what());
      throw CollectiveAborted(rules_->fallback());
    }
    const auto decided = rules_->admit(joined);
    if (!decided || decided->generation != generation || ids.size() != next.size()) {
      throw CollectiveAborted(fallback + "this worker cannot apply the chief's admission of generation " +
                              std::to_string(generation) + " (at generation " + std::to_string(rules_->generation()) +
                              ")");
    }
    watch_ids_ = std::move(ids);
    reform_to(workers_->rank(), std::move(next), generation);
    out.generation = generation;
    out.joined = joined;
    out.watch_ids = watch_ids_;
    out.workers = workers_->size();
    out.waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    return out;
  }

  int commit_every_steps() const override { return elastic_ ? elastic_->options.commit_every_steps : 0; }
  int changes() const override { return rules_ ? rules_->changes() : 0; }

  detail::MembershipChange change(const std::string& failure) override {
    const auto started = std::chrono::steady_clock::now();
    const auto& o = elastic_->options;
    detail::WorkerFailures& failures = workers_->failures();
    // The chief's verdict may still be on its way: a worker whose ring broke under it often hears
    // of the loss a few heartbeats later. Bounded by the watch's own limit and a margin.
    const auto wait = o.heartbeat_interval * (o.missed_heartbeats + 2) + std::chrono::milliseconds(1000);
    const std::string reason = failures.await_reason(std::chrono::duration_cast<std::chrono::milliseconds>(wait));
    const auto& members = workers_->members();
    const std::string fallback = "elastic membership falls back to the restart path: ";
    if (reason.empty()) {
      throw CollectiveAborted(fallback + "the step failed (" + failure + ") and the cluster watch named no lost worker "
                              "within " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()) +
                              " ms");
    }
    // Workers lost at once leave in one change: the chief's watch names each within milliseconds of
    // its connection's end, so the verdicts of a short while after the first count together. One
    // that comes later, once the change is decided, fails it (the fallback, named).
    std::this_thread::sleep_for(loss_settle);
    // Every verdict so far counts (two workers lost at once leave in one change). The watch names
    // a worker by its id in the chief's table, which a change does not renumber: watch_ids_ maps
    // the ring's ranks to them.
    bool counted = false;
    for (const auto& [id, why] : failures.verdicts()) {
      if (id == 0) {
        rules_->lose(0, why);
        throw CollectiveAborted(rules_->fallback());
      }
      const auto at = std::find(watch_ids_.begin(), watch_ids_.end(), id);
      if (at == watch_ids_.end()) continue;  // a worker that left in an earlier change
      const auto r = static_cast<std::size_t>(at - watch_ids_.begin());
      if (!actors::is_loss_verdict(members[r].task, why)) {
        throw CollectiveAborted(fallback + "the cluster watch reported what no change of membership mends: " + why);
      }
      rules_->lose(static_cast<int>(r), why);
      if (!rules_->fallback().empty()) throw CollectiveAborted(rules_->fallback());
      counted = true;
    }
    if (!counted) throw CollectiveAborted(fallback + "the cluster watch reported what no change of membership mends: " + reason);
    const auto decided = rules_->decide();
    if (!decided) throw CollectiveAborted(fallback + "the chief decided no change (" + reason + ")");
    std::vector<int> ids;
    for (int old : decided->survivors) ids.push_back(watch_ids_[static_cast<std::size_t>(old)]);
    watch_ids_ = std::move(ids);
    const int rank = decided->new_rank(workers_->rank());
    std::vector<actors::member> next;
    for (int old : decided->survivors) {
      actors::member m = members[static_cast<std::size_t>(old)];
      m.rank = static_cast<int>(next.size());
      next.push_back(std::move(m));
    }
    reform_to(rank, std::move(next), decided->generation);
    detail::MembershipChange out;
    out.generation = decided->generation;
    out.left = decided->left;
    out.watch_ids = watch_ids_;
    out.workers = workers_->size();
    out.rank = rank;
    out.waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    return out;
  }

  // The ring of `generation` among `next` (this worker at `rank`), and the change complete.
  void reform_to(int rank, std::vector<actors::member> next, std::uint64_t generation) {
    const auto& o = elastic_->options;
    // The ring thread of the buckets holds the old ring: it goes first.
    hierarchical_.reset();
    try {
      workers_->reform(rank, std::move(next), generation,
                       {o.cluster_token, actors::generation_incarnation(elastic_->incarnation, generation)},
                       o.start_timeout);
    } catch (const std::exception& e) {
      rules_->abort(e.what());
      throw CollectiveAborted(rules_->fallback());
    }
    rules_->complete(generation);
    hierarchical_ = std::make_unique<detail::HierarchicalCollectives>(
        shm_collectives(), *workers_, workers_->size() * static_cast<int>(devices().size()), bytes_per_pack_,
        compression_);
  }

  // The chief's `text` on every worker (two broadcasts: its length, then its bytes).
  std::string broadcast_text(const std::string& text) {
    const bool chief = workers_->rank() == 0;
    const std::vector<std::int64_t> size{chief ? static_cast<std::int64_t>(text.size()) : 0};
    const std::int64_t n = workers_->broadcast_from_chief(Tensor::from_vector(size, {1})).to_vector<std::int64_t>()[0];
    if (n <= 0) return {};
    std::vector<std::int64_t> bytes(static_cast<std::size_t>(n), 0);
    if (chief) {
      for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
    }
    const std::vector<std::int64_t> got = workers_->broadcast_from_chief(Tensor::from_vector(bytes, {n})).to_vector<std::int64_t>();
    std::string out(got.size(), '\0');
    for (std::size_t i = 0; i < got.size(); ++i) out[i] = static_cast<char>(got[i]);
    return out;
  }

  detail::WorkerGroup& workers() const override { return *workers_; }
  // CommunicationOptions::bytes_per_pack sizes the gradient buckets too, when it is set.
  std::size_t gradient_bucket_bytes() const override {
    if (gpu_) return 0;
    if (bytes_per_pack_ > 0) return bytes_per_pack_;
    return MirroredBackend::gradient_bucket_bytes();
  }

  // One step per run on every worker: its number travels in every frame of the ring.
  void execute(Strategy& strategy, const std::function<void(int)>& fn) override {
    workers_->begin_step();
    struct ended {
      detail::RingWorkerGroup& w;
      ~ended() { w.end_step(); }
    } end{*workers_};
    MirroredBackend::execute(strategy, fn);
  }

 protected:
  // GPU replicas meet every worker's through NCCL; CPU replicas locally, then over the TCP ring.
  detail::ReplicaCollectives& replica_collectives() override {
    if (gpu_) return MirroredBackend::replica_collectives();
    if (!hierarchical_) {
      throw CollectiveAborted("MultiWorkerMirroredStrategy: a change of membership failed, so this worker cannot go "
                              "on (the restart path)");
    }
    return *hierarchical_;
  }

 private:
  bool gpu_;
  std::size_t bytes_per_pack_;
  Compression compression_;
  std::unique_ptr<detail::RingWorkerGroup> workers_;
  std::unique_ptr<detail::HierarchicalCollectives> hierarchical_;
  std::optional<ElasticSettings> elastic_;
  std::optional<actors::membership_state> rules_;  // the chief's rules, applied to its verdicts
  std::vector<int> watch_ids_;  // by ring rank: the member's id in the chief's watch
  std::optional<LeaveSignal> leave_signal_;  // elastic: SIGUSR2 asks this worker to leave
};

std::unique_ptr<detail::StrategyBackend> make_multi_worker_backend(Runtime& runtime, const CommunicationOptions& options,
                                                                   const ClusterResolver& resolver,
                                                                   const MultiWorkerOptions& settings) {
  troupe::detail::require_middleman(runtime, "MultiWorkerMirroredStrategy");
  troupe::detail::check_multi_worker_options(options, settings);
  if (options.compression != Compression::none && options.compression != Compression::fp16 &&
      options.compression != Compression::bf16) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: CommunicationOptions::compression " +
                                std::to_string(static_cast<int>(options.compression)) +
                                " is not a Compression (expected none, fp16 or bf16)");
  }
  const bool nccl = options.implementation == CommunicationImplementation::nccl;
  if (nccl && settings.elastic) {
    throw std::invalid_argument(
        "MultiWorkerMirroredStrategy: elastic membership (MultiWorkerOptions::elastic) re-forms troupe's TCP ring, "
        "and CommunicationImplementation::NCCL was asked for; use AUTO or RING");
  }
  const int gpus = Runtime::gpu_count();
  if (nccl && gpus == 0) {
    throw std::invalid_argument(
        "MultiWorkerMirroredStrategy: CommunicationImplementation::NCCL needs GPUs and this machine has none (the "
        "CUDA runtime reports none); use AUTO or RING");
  }
  const ClusterSpec spec = resolver.cluster_spec();
  const std::string task_type = resolver.task_type();
  if (task_type != "chief" && task_type != "worker") {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: task type \"" + task_type +
                                "\" does not train; only chief and worker tasks run the strategy");
  }
  if (spec.has_job("ps")) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: the cluster has " + std::to_string(spec.num_tasks("ps")) +
                                " ps task(s), which synchronous training does not use; remove them, or train with "
                                "ParameterServerStrategy");
  }
  require_token(spec, resolver.coordinator_address(), settings);
  const int start_rank = spec.id_in_cluster(task_type, resolver.task_id());
  const std::vector<std::string> tasks = training_tasks(spec);
  troupe::detail::check_elastic_size(settings, static_cast<int>(tasks.size()));

  // With NCCL every worker runs a replica on each of its GPUs (or the first devices_per_worker);
  // otherwise CPU replicas joined by the TCP ring.
  if (settings.devices_per_worker < 0 || settings.devices_per_worker > 1024) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: devices_per_worker " +
                                std::to_string(settings.devices_per_worker) + " is outside 0..1024");
  }
  const int devices_per_worker = settings.devices_per_worker > 0 ? settings.devices_per_worker : nccl ? gpus : 1;
  if (nccl && devices_per_worker > gpus) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: TROUPE_DEVICES_PER_WORKER is " +
                                std::to_string(devices_per_worker) + " but this machine has " + std::to_string(gpus) +
                                " GPU(s)");
  }
  std::vector<Device> devices;
  for (int i = 0; i < devices_per_worker; ++i) devices.emplace_back(nccl ? Device::Type::gpu : Device::Type::cpu, i);

  actors::rendezvous_options ro;
  ro.rank = start_rank;
  ro.tasks = tasks;
  std::tie(ro.chief_host, ro.chief_port) = split_address(resolver.coordinator_address(), "the chief's");
  ro.devices = devices_per_worker;
  // Where the others reach this worker's data plane: its own cluster address, or its host name
  // when the resolver learns addresses at rendezvous (mpirun).
  const std::string own = resolver.task_address();
  std::string bind_host;
  if (own.empty() || own == ClusterSpec::pending_address) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    ro.data_host = name;
  } else {
    ro.data_host = split_address(own, "this task's").first;
    bind_host = ro.data_host;
  }
  auto listener = std::make_unique<transport::listener>(listen_address(bind_host), 0);
  ro.data_port = listener->port();
  ro.token = settings.cluster_token;
  ro.timeout = settings.start_timeout;
  ro.missed_heartbeats = settings.missed_heartbeats;
  ro.stall.warning = settings.stall_warning;
  ro.stall.shutdown = settings.stall_shutdown;
  // The chief makes the NCCL id every worker joins its communicators with.
  if (nccl && start_rank == 0) ro.collective_id = detail::nccl_unique_id();
  // The chief's control plane records its cluster's health here, for the dashboard.
  auto health = std::make_shared<actors::cluster_health>();
  health->set_restart_count(settings.restart_count);
  ro.health = health;
  // What this worker says (its monitor's lines) rides on its heartbeats to the chief's dashboard.
  auto log = std::make_shared<actors::log_tail>();
  ro.log = log;
  // Where this worker is (step, phase, collective) rides on them too, for the stall inspector.
  auto position = std::make_shared<actors::position_board>();
  ro.position = position;
  auto failures = std::make_shared<detail::WorkerFailures>();
  std::unique_ptr<actors::cluster_watch> watch;
  // Elastic membership: the chief takes joiners; a process started with TROUPE_JOIN=1 joins the
  // running cluster instead of starting one.
  const bool joiner = detail::join_from_environment();
  if (joiner && !settings.elastic) {
    throw std::invalid_argument("MultiWorkerMirroredStrategy: TROUPE_JOIN=1 joins a running elastic cluster, and this "
                                "worker is not elastic (set TROUPE_ELASTIC=1, or MultiWorkerOptions::elastic)");
  }
  if (settings.elastic && start_rank == 0 && !joiner) ro.joins = std::make_shared<actors::join_queue>();
  auto on_failure = [failures](int id, const std::string& why) { failures->report(why, id); };
  std::optional<actors::join_answer> joined;
  std::vector<actors::member> members;
  if (joiner) {
    joined = actors::join_cluster(runtime.system(), ro, settings.heartbeat_interval, on_failure, watch);
    members = joined->table;
  } else {
    members = actors::rendezvous(runtime.system(), ro, settings.heartbeat_interval, on_failure, watch);
  }
  const int rank = joined ? static_cast<int>(joined->rank) : start_rank;
  const int workers = static_cast<int>(members.size());

  std::vector<transport::endpoint> peers;
  for (const auto& m : members) peers.push_back({m.data_host, m.data_port});
  std::unique_ptr<transport::tcp_ring> ring;
  transport::tcp_ring_options ring_options;
  ring_options.timeout = ro.timeout;
  // Every ring connection proves the cluster token and this start's incarnation, both ways (a
  // joiner's, the incarnation of the generation it joins).
  ring_options.auth = {settings.cluster_token,
                       joined ? actors::generation_incarnation(joined->incarnation, joined->generation)
                              : members[0].incarnation};
  try {
    ring = std::make_unique<transport::tcp_ring>(rank, workers, *listener, peers, ring_options);
  } catch (const transport::peer_error& e) {
    throw std::runtime_error("MultiWorkerMirroredStrategy: " + detail::describe_collective_failure(e, members, *failures));
  }
  // The start is bounded by the start timeout; collectives after it by options.timeout, else the
  // runtime's collective timeout (0: as long as the peers' connections live).
  ring->set_timeout(options.timeout.count() > 0 ? options.timeout
                                                : std::chrono::milliseconds(runtime.options().collective_timeout_ms));
  // Busy-polling pays while the workers have cores of their own; when they all share this host's
  // (a local test cluster larger than the machine), the worker being waited for needs the CPU.
  bool all_local = true;
  for (const auto& m : members) all_local = all_local && m.data_host == members[0].data_host;
  const bool crowded = all_local && workers * devices_per_worker > static_cast<int>(std::thread::hardware_concurrency());
  ring->set_spin(std::chrono::microseconds(runtime.options().spin_us), crowded);
  detail::NcclWorld world;
  if (nccl) {
    world.id = members[0].collective_id;
    if (world.id.empty()) {
      throw std::runtime_error(
          "MultiWorkerMirroredStrategy: this worker asked for NCCL but the chief (" + members[0].task +
          ") sent no NCCL id: every worker must ask for the same CommunicationImplementation");
    }
    world.nranks = workers * devices_per_worker;
    world.first_rank = rank * devices_per_worker;
    world.join_timeout = ro.timeout;
  }
  // The flight recorder's dump names this worker (docs/diagnosis.md).
  if (auto* recorder = troupe::detail::FlightRecorder::process()) {
    recorder->set_identity(rank, workers, members[static_cast<std::size_t>(rank)].task);
  }
  std::optional<ElasticSettings> elastic;
  if (settings.elastic) {
    elastic = ElasticSettings{settings, joined ? joined->incarnation : members[0].incarnation, ro.joins, joined};
  }
  auto group = std::make_unique<detail::RingWorkerGroup>(rank, std::move(members), std::move(listener), std::move(ring),
                                                         std::move(failures), std::move(watch), std::move(health),
                                                         std::move(log), std::move(position));
  if (joined) group->begin_joining(joined->generation);
  return std::make_unique<MultiWorkerBackend>(runtime, std::move(devices), std::move(group), options.bytes_per_pack,
                                              options.compression, std::move(world), std::move(elastic));
}

std::shared_ptr<ClusterResolver> default_resolver(std::shared_ptr<ClusterResolver> resolver) {
  if (resolver) return resolver;
  return std::make_shared<TFConfigClusterResolver>();
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options,
                                                         std::shared_ptr<ClusterResolver> resolver)
    : MultiWorkerMirroredStrategy(runtime, options, std::move(resolver), MultiWorkerOptions::from_environment()) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(Runtime& runtime, CommunicationOptions options,
                                                         std::shared_ptr<ClusterResolver> resolver,
                                                         MultiWorkerOptions settings)
    : Strategy(
          make_multi_worker_backend(runtime, options, *(resolver = default_resolver(std::move(resolver))), settings)),
      resolver_(std::move(resolver)) {}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

int MultiWorkerMirroredStrategy::membership_changes() {
  auto* elastic = dynamic_cast<detail::ElasticMembership*>(&backend());
  return elastic != nullptr ? elastic->changes() : 0;
}

}  // namespace troupe::distribute
