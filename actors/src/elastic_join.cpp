// Joins into a running elastic cluster: the chief's agent queues a joiner that proved the token
// (enlist), the chief's training loop admits or refuses it at a step boundary (admit, refuse), and
// the joiner's side (join_cluster) checks what it was given. The protocol is join_cluster's in
// rendezvous.hpp; the membership change that follows is membership_state's.

#include "cluster_agent.hpp"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "protocol.hpp"
#include "troupe/base/quote.hpp"

namespace troupe::actors {

caf::message_handler join_handlers(caf::stateful_actor<chief_agent_state>* self) {
  return caf::message_handler{
      [=](enlist_atom, std::uint32_t version, const std::string& task, const std::string& nonce,
          const std::string& proof, std::int32_t devices, const std::string& host,
          std::uint16_t port) -> caf::result<join_answer> {
        auto& s = self->state;
        const auto peer = peer_of(self);
        join_request r{version, -1, nonce, proof, devices, host, port, peer, rendezvous_state::clock::now()};
        if (auto error = s.rules->check_enlist(r, task)) {
          log_refusal(self, error->message + ", from " + peer);
          return to_caf_error(*error);
        }
        if (!s.joins) {
          return to_caf_error(rendezvous_error{rendezvous_errc::bad_join,
                                               "rendezvous: refused a worker asking to join as " + task +
                                                   ": the cluster is not elastic (MultiWorkerOptions::elastic)"});
        }
        const std::int64_t key = s.next_key++;
        member who{-1, task, host, port, devices, {}, {}};
        s.joins->push({key, who});
        auto rp = self->make_response_promise<join_answer>();
        s.pending[key] = {rp, peer};
        return rp;
      },
      [=](admit_atom, const std::vector<std::int64_t>& keys, const std::vector<member>& table,
          const std::vector<std::int32_t>& ids, std::uint64_t generation, const std::string& incarnation,
          std::int32_t changes, std::int32_t max_workers) -> caf::result<std::vector<std::int32_t>> {
        auto& s = self->state;
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->node()) {
          log_refusal(self, "refused an admission from " + peer_of(self) + ": only the chief's own process admits");
          return caf::make_error(caf::sec::request_receiver_down);
        }
        if (table.size() != ids.size() + keys.size()) {
          return caf::make_error(caf::sec::invalid_argument);
        }
        join_answer answer;
        answer.table = table;
        answer.watch_ids = ids;
        answer.generation = generation;
        answer.incarnation = incarnation;
        answer.changes = changes;
        answer.max_workers = max_workers;
        std::vector<std::int32_t> added;
        const auto now = rendezvous_state::clock::now();
        for (std::size_t i = 0; i < keys.size(); ++i) {
          auto it = s.pending.find(keys[i]);
          const member& m = table[ids.size() + i];
          const int id = s.rules->add_member(m, it != s.pending.end() ? it->second.peer : std::string(), now);
          // Seen from outside from now on: the dashboard's cluster panel and the stall inspector.
          if (s.health) s.health->add_worker(id, m.task, now);
          if (s.stalls) s.stalls->add_worker();
          added.push_back(id);
          answer.watch_ids.push_back(id);
        }
        s.watchers.resize(s.rules->table().size());
        for (std::size_t i = 0; i < keys.size(); ++i) {
          if (s.joins) s.joins->remove(keys[i]);
          auto it = s.pending.find(keys[i]);
          if (it == s.pending.end()) continue;  // its ring will not form: the change falls back
          answer.rank = static_cast<std::int32_t>(ids.size() + i);
          it->second.answer.deliver(answer);
          s.pending.erase(it);
        }
        return added;
      },
      [=](refuse_atom, std::int64_t key, const std::string& why) {
        auto& s = self->state;
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->node()) return;
        if (s.joins) s.joins->remove(key);
        auto it = s.pending.find(key);
        if (it == s.pending.end()) return;
        it->second.answer.deliver(to_caf_error(rendezvous_error{rendezvous_errc::bad_join, why}));
        s.pending.erase(it);
      },
  };
}

std::vector<std::int32_t> cluster_watch::admit(const std::vector<std::int64_t>& keys, const std::vector<member>& table,
                                               const std::vector<std::int32_t>& ids, std::uint64_t generation,
                                               const std::string& incarnation, std::int32_t changes,
                                               std::int32_t max_workers, std::chrono::milliseconds wait) {
  auto& s = *impl_;
  if (!s.chief || !s.agent) throw std::logic_error("cluster_watch::admit: only the chief admits");
  caf::scoped_actor self{*s.system};
  std::vector<std::int32_t> added;
  std::string error;
  self->request(s.agent, wait, admit_atom::value, keys, table, ids, generation, incarnation, changes,
                max_workers)
      .receive([&](std::vector<std::int32_t>& a) { added = std::move(a); },
               [&](caf::error& e) { error = s.system->render(e); });
  if (!error.empty() || added.size() != keys.size()) {
    throw std::runtime_error("elastic membership: the chief's agent did not admit the joiners: " +
                             (error.empty() ? std::string("no ids") : error));
  }
  return added;
}

void cluster_watch::refuse(std::int64_t key, const std::string& why) {
  auto& s = *impl_;
  if (!s.chief || !s.agent) return;
  caf::scoped_actor self{*s.system};
  self->send(s.agent, refuse_atom::value, key, why);
}

void join_queue::push(join_candidate c) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.push_back(std::move(c));
}

std::vector<join_candidate> join_queue::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

std::size_t join_queue::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_.size();
}

void join_queue::remove(std::int64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [key](const join_candidate& c) { return c.key == key; }),
                 waiting_.end());
}

std::optional<std::string> check_join_answer(const rendezvous_options& options, const join_answer& a) {
  const std::string from = "elastic membership: the chief's answer to the join of " +
                           options.tasks.at(static_cast<std::size_t>(options.rank));
  const std::size_t n = a.table.size();
  if (n < 2 || n > rendezvous_limits::max_workers) return from + " has " + std::to_string(n) + " members (expected 2..)";
  if (a.watch_ids.size() != n) {
    return from + " has " + std::to_string(a.watch_ids.size()) + " watch ids for " + std::to_string(n) + " members";
  }
  if (a.rank < 1 || static_cast<std::size_t>(a.rank) >= n) {
    return from + " gives it rank " + std::to_string(a.rank) + " (expected 1.." + std::to_string(n - 1) + ")";
  }
  for (std::size_t i = 0; i < n; ++i) {
    const member& m = a.table[i];
    if (m.rank != static_cast<int>(i)) return from + ": entry " + std::to_string(i) + " has rank " + std::to_string(m.rank);
    if (m.data_port == 0 || m.data_host.empty() || m.data_host.size() > rendezvous_limits::max_host_chars ||
        base::has_nul(m.data_host)) {
      return from + ": entry " + std::to_string(i) + " has a bad data-plane endpoint";
    }
    if (m.devices != options.devices) {
      return from + ": entry " + std::to_string(i) + " has " + std::to_string(m.devices) + " devices, this worker " +
             std::to_string(options.devices);
    }
  }
  const member& own = a.table[static_cast<std::size_t>(a.rank)];
  if (own.task != options.tasks[static_cast<std::size_t>(options.rank)] || own.data_host != options.data_host ||
      own.data_port != options.data_port) {
    return from + " gives this worker the entry " + own.task + " at " + own.data_host + ":" +
           std::to_string(own.data_port);
  }
  if (a.incarnation.size() != rendezvous_limits::incarnation_chars ||
      a.incarnation.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return from + " has an incarnation of " + std::to_string(a.incarnation.size()) + " characters (expected " +
           std::to_string(rendezvous_limits::incarnation_chars) + " hex digits)";
  }
  if (a.generation == 0) return from + " names generation 0 (expected a generation after the start's)";
  return std::nullopt;
}

join_answer join_cluster(caf::actor_system& system, const rendezvous_options& options,
                         std::chrono::milliseconds heartbeat_interval,
                         std::function<void(int, const std::string&)> on_failure,
                         std::unique_ptr<cluster_watch>& watch) {
  check_options(options);
  if (options.rank == 0) {
    throw std::invalid_argument("elastic membership: the chief (" + options.tasks[0] +
                                ") cannot join a running cluster; a joiner is a worker of task index 1 or more");
  }
  if (!knows_rendezvous_types(system)) {
    throw std::invalid_argument(
        "rendezvous: this actor system was built without troupe's message types: call "
        "troupe::Runtime::configure(config) on its config before constructing it");
  }
  auto w = std::make_unique<cluster_watch::impl>();
  const bool tls = !options.token.empty();
  if (tls) {
    w->credentials = control_credentials::shared(system, options.token, "MultiWorkerMirroredStrategy (its elastic join)");
  }
  w->gate = std::make_unique<control_gate>(system, tls, gate_limits::for_cluster(static_cast<int>(options.tasks.size())),
                                           options.health);
  caf::actor agent = reach_chief(system, options, *w->gate, tls);
  caf::scoped_actor self{system};
  std::string nonce;
  std::string error = "no answer from the chief";
  self->request(agent, options.timeout, nonce_atom::value)
      .receive([&](std::string& n) { nonce = n; }, [&](caf::error& e) { error = system.render(e); });
  if (nonce.empty()) throw std::runtime_error("elastic membership: the chief sent no nonce: " + error);
  const std::string& task = options.tasks[static_cast<std::size_t>(options.rank)];
  std::optional<join_answer> answer;
  bool refused = false;
  self->request(agent, options.timeout + options.answer_margin, enlist_atom::value, options.version, task, nonce,
                hmac_sha256_hex(options.token, nonce), static_cast<std::int32_t>(options.devices), options.data_host,
                options.data_port)
      .receive([&](join_answer& a) { answer = std::move(a); },
               [&](caf::error& e) {
                 // The chief's refusal is its own sentence; anything else (no answer) is ours.
                 refused = e.category() == caf::atom("rendezvous");
                 error = describe(system, e);
               });
  if (!answer && refused) throw std::runtime_error(error);
  if (!answer) {
    throw std::runtime_error("elastic membership: " + task + " was not admitted within " +
                             std::to_string((options.timeout + options.answer_margin).count()) + " ms: " + error);
  }
  if (auto bad = check_join_answer(options, *answer)) throw std::runtime_error(*bad);
  const std::int32_t id = answer->watch_ids[static_cast<std::size_t>(answer->rank)];
  w->system = &system;
  w->agent = agent;
  w->chief = false;
  w->port = options.chief_port;
  w->rank = id;
  w->beat = spawn_heartbeat(system, agent, id, heartbeat_interval, options, std::move(on_failure));
  watch = std::make_unique<cluster_watch>(std::move(w));
  return std::move(*answer);
}

}  // namespace troupe::actors
