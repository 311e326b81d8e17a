#include "troupe/actors/rendezvous.hpp"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <sstream>
#include <stdexcept>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

namespace troupe::actors {
namespace {

using nonce_atom = caf::atom_constant<caf::atom("nonce")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using await_atom = caf::atom_constant<caf::atom("await")>;
using expire_atom = caf::atom_constant<caf::atom("expire")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;
using check_atom = caf::atom_constant<caf::atom("check")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;

// A join's answer: ok, the error when not, the peer table ("rank|task|host|port|devices|id").
using join_reply = std::tuple<bool, std::string, std::vector<std::string>>;

std::string encode(const member& m) {
  return std::to_string(m.rank) + "|" + m.task + "|" + m.data_host + "|" + std::to_string(m.data_port) + "|" +
         std::to_string(m.devices) + "|" + m.collective_id;
}

member decode(const std::string& s) {
  std::vector<std::string> f;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, '|')) f.push_back(part);
  if (!s.empty() && s.back() == '|') f.push_back("");  // getline drops an empty last field
  if (f.size() != 6) throw std::runtime_error("rendezvous: malformed peer table entry \"" + s + "\"");
  member m;
  m.rank = std::stoi(f[0]);
  m.task = f[1];
  m.data_host = f[2];
  m.data_port = static_cast<std::uint16_t>(std::stoi(f[3]));
  m.devices = std::stoi(f[4]);
  m.collective_id = f[5];
  return m;
}

std::string random_nonce() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("rendezvous: no randomness for a nonce");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

struct agent_state {
  rendezvous_options options;
  std::vector<member> members;           // by rank; members[0] is the chief
  std::vector<bool> joined;
  std::map<std::string, bool> nonces;    // handed out, each good for one join
  std::vector<caf::typed_response_promise<bool, std::string, std::vector<std::string>>> waiting;
  std::string failure;
  bool complete = false;
  // Liveness, once complete.
  std::chrono::milliseconds interval{0};
  std::vector<std::chrono::steady_clock::time_point> last_beat;
  std::vector<caf::actor> watchers;
  std::vector<bool> settled;  // declared gone, or said goodbye

  std::string missing() const {
    std::string out;
    for (std::size_t r = 0; r < joined.size(); ++r) {
      if (!joined[r]) out += (out.empty() ? "" : ", ") + options.tasks[r];
    }
    return out;
  }
};

using reply_result = caf::result<bool, std::string, std::vector<std::string>>;

reply_result as_result(join_reply r) {
  return reply_result(std::get<0>(r), std::move(std::get<1>(r)), std::move(std::get<2>(r)));
}

join_reply table_reply(const agent_state& st) {
  std::vector<std::string> table;
  for (const auto& m : st.members) table.push_back(encode(m));
  return join_reply{true, "", table};
}

void finish(agent_state& st) {
  join_reply reply = st.failure.empty() ? table_reply(st) : join_reply{false, st.failure, {}};
  for (auto& p : st.waiting) p.deliver(std::get<0>(reply), std::get<1>(reply), std::get<2>(reply));
  st.waiting.clear();
}

caf::behavior cluster_agent(caf::stateful_actor<agent_state>* self, rendezvous_options options) {
  auto& st = self->state;
  st.options = options;
  const std::size_t n = options.tasks.size();
  st.members.resize(n);
  st.joined.assign(n, false);
  st.members[0] = member{0, options.tasks[0], options.data_host, options.data_port, options.devices,
                         options.collective_id};
  st.joined[0] = true;
  st.complete = n == 1;
  self->delayed_send(self, options.timeout, expire_atom::value);
  auto declare_gone = [=](int rank, const std::string& reason) {
    auto& s = self->state;
    if (s.settled[static_cast<std::size_t>(rank)]) return;
    s.settled[static_cast<std::size_t>(rank)] = true;
    for (auto& w : s.watchers) {
      if (w) self->send(w, gone_atom::value, static_cast<std::int32_t>(rank), reason);
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    auto& s = self->state;
    for (std::size_t r = 0; r < s.watchers.size(); ++r) {
      if (s.watchers[r] && s.watchers[r].address() == d.source) {
        s.watchers[r] = caf::actor{};
        declare_gone(static_cast<int>(r), s.options.tasks[r] + "'s connection to the chief closed (the process ended or "
                                                               "its host is unreachable)");
      }
    }
  });
  return {
      [=](beat_atom, std::int32_t rank, const caf::actor& watcher) {
        auto& s = self->state;
        if (rank < 0 || static_cast<std::size_t>(rank) >= s.last_beat.size()) return;
        s.last_beat[static_cast<std::size_t>(rank)] = std::chrono::steady_clock::now();
        if (!s.watchers[static_cast<std::size_t>(rank)]) {
          s.watchers[static_cast<std::size_t>(rank)] = watcher;
          self->monitor(watcher);
        }
      },
      [=](bye_atom, std::int32_t rank) {
        auto& s = self->state;
        if (rank >= 0 && static_cast<std::size_t>(rank) < s.settled.size()) s.settled[static_cast<std::size_t>(rank)] = true;
      },
      [=](check_atom) {
        auto& s = self->state;
        const auto now = std::chrono::steady_clock::now();
        for (std::size_t r = 1; r < s.last_beat.size(); ++r) {
          const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - s.last_beat[r]);
          if (!s.settled[r] && silent > 6 * s.interval) {
            declare_gone(static_cast<int>(r), s.options.tasks[r] + " sent no heartbeat for " +
                                                  std::to_string(silent.count()) + " ms (hung, stopped or unreachable)");
          }
        }
        self->delayed_send(self, s.interval, check_atom::value);
      },
      [=](tick_atom, std::chrono::milliseconds interval) {
        // The rendezvous is complete: start keeping watch.
        auto& s = self->state;
        s.interval = interval;
        s.last_beat.assign(s.members.size(), std::chrono::steady_clock::now());
        s.watchers.resize(s.members.size());
        s.settled.assign(s.members.size(), false);
        self->delayed_send(self, interval, check_atom::value);
      },
      [=](nonce_atom) -> std::string {
        auto nonce = random_nonce();
        self->state.nonces[nonce] = true;
        return nonce;
      },
      [=](join_atom, std::uint32_t version, std::int32_t rank, const std::string& nonce, const std::string& proof,
          std::int32_t devices, const std::string& host, std::uint16_t port) -> reply_result {
        auto& s = self->state;
        if (!s.failure.empty()) return as_result(join_reply{false, s.failure, {}});
        const std::string who = rank >= 0 && static_cast<std::size_t>(rank) < s.options.tasks.size()
                                    ? s.options.tasks[static_cast<std::size_t>(rank)]
                                    : "a worker claiming rank " + std::to_string(rank);
        std::string error;
        if (version != s.options.version) {
          error = who + " speaks rendezvous protocol version " + std::to_string(version) + ", the chief " +
                  std::to_string(s.options.version) + ": run the same troupe build everywhere";
        } else if (s.nonces.erase(nonce) == 0 || hmac_sha256_hex(s.options.token, nonce) != proof) {
          error = who + " failed the cluster token check: set the same TROUPE_CLUSTER_TOKEN on every worker";
        } else if (rank <= 0 || static_cast<std::size_t>(rank) >= s.options.tasks.size()) {
          error = who + " is not in the cluster (" + std::to_string(s.options.tasks.size()) + " workers)";
        } else if (s.joined[static_cast<std::size_t>(rank)]) {
          error = who + " joined twice: two processes have the same task index";
        } else if (devices != s.options.devices) {
          error = "workers have different device counts: " + who + " has " + std::to_string(devices) + ", " +
                  s.options.tasks[0] + " has " + std::to_string(s.options.devices) +
                  "; every worker needs the same number of local devices";
        }
        if (!error.empty()) {
          s.failure = "rendezvous failed: " + error;
          finish(s);
          return as_result(join_reply{false, s.failure, {}});
        }
        s.members[static_cast<std::size_t>(rank)] = member{rank, who, host, port, devices, {}};
        s.joined[static_cast<std::size_t>(rank)] = true;
        // Taking a promise takes over the answer: only now that this worker waits for the others.
        auto rp = self->make_response_promise<bool, std::string, std::vector<std::string>>();
        s.waiting.push_back(rp);
        if (s.missing().empty()) {
          s.complete = true;
          finish(s);
        }
        return rp;
      },
      [=](await_atom) -> reply_result {
        auto& s = self->state;
        if (!s.failure.empty()) return as_result(join_reply{false, s.failure, {}});
        if (s.complete) return as_result(table_reply(s));
        auto rp = self->make_response_promise<bool, std::string, std::vector<std::string>>();
        s.waiting.push_back(rp);
        return rp;
      },
      [=](expire_atom) {
        auto& s = self->state;
        if (s.complete || !s.failure.empty()) return;
        s.failure = "rendezvous failed: still missing after " + std::to_string(s.options.timeout.count()) +
                    " ms: " + s.missing() + " (started? reachable? same TF_CONFIG?)";
        finish(s);
      },
  };
}

std::vector<member> table_from(const join_reply& r) {
  if (!std::get<0>(r)) throw std::runtime_error(std::get<1>(r));
  std::vector<member> out;
  for (const auto& e : std::get<2>(r)) out.push_back(decode(e));
  return out;
}

struct heartbeat_state {
  bool reported = false;
};

// A worker's side of the watch: beats to the chief's agent, reports the verdicts.
caf::behavior heartbeat(caf::stateful_actor<heartbeat_state>* self, caf::actor agent, std::int32_t rank,
                        std::chrono::milliseconds interval, std::string chief,
                        std::function<void(int, const std::string&)> on_failure) {
  auto report = [=](int r, const std::string& reason) {
    if (self->state.reported) return;
    self->state.reported = true;
    on_failure(r, reason);
  };
  self->monitor(agent);
  self->set_down_handler([=](caf::down_msg& d) {
    if (d.source != agent.address()) return;
    // A chief that finished its program shuts its agent down on purpose, possibly while the
    // others still complete the last collective with it: that is no failure (a chief that dies
    // shows up as an unreachable link, and a collective that still needs it fails naming it).
    if (d.reason == caf::exit_reason::user_shutdown) return;
    report(0, "the chief " + chief + " is gone: " + self->system().render(d.reason));
  });
  self->send(agent, beat_atom::value, rank, caf::actor_cast<caf::actor>(self));
  self->delayed_send(self, interval, tick_atom::value, interval);
  return {
      [=](tick_atom, std::chrono::milliseconds every) {
        self->send(agent, beat_atom::value, rank, caf::actor_cast<caf::actor>(self));
        self->delayed_send(self, every, tick_atom::value, every);
      },
      [=](gone_atom, std::int32_t r, const std::string& reason) { report(r, reason); },
  };
}

}  // namespace

struct cluster_watch::impl {
  caf::actor_system* system = nullptr;
  caf::actor agent;      // the chief's agent (kept published on the chief)
  bool chief = false;
  std::uint16_t port = 0;
  caf::actor beat;       // this worker's heartbeat actor
  std::int32_t rank = 0;
};

cluster_watch::cluster_watch(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

cluster_watch::~cluster_watch() {
  auto& s = *impl_;
  if (s.agent) caf::anon_send(s.agent, bye_atom::value, s.rank);
  if (s.beat) caf::anon_send_exit(s.beat, caf::exit_reason::user_shutdown);
  if (s.chief && s.agent) {
    s.system->middleman().unpublish(s.agent, s.port);
    caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
  }
}

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

namespace {

// The rendezvous; with `keep` set, the chief's agent stays published (and the worker keeps its
// handle) for a cluster_watch.
std::vector<member> rendezvous_impl(caf::actor_system& system, const rendezvous_options& options, caf::actor* keep) {
  if (options.tasks.empty()) throw std::invalid_argument("rendezvous: no workers");
  caf::scoped_actor self{system};
  const auto margin = std::chrono::seconds(5);
  join_reply reply{false, "rendezvous failed: no answer from the chief", {}};
  if (options.rank == 0) {
    auto agent = system.spawn(cluster_agent, options);
    auto published = system.middleman().publish(agent, options.chief_port, options.chief_host.c_str(), true);
    if (!published) {
      caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
      throw std::runtime_error("rendezvous: the chief cannot listen on " + options.chief_host + ":" +
                               std::to_string(options.chief_port) + ": " + system.render(published.error()));
    }
    self->request(agent, options.timeout + margin, await_atom::value)
        .receive([&](bool ok, std::string& error, std::vector<std::string>& table) { reply = join_reply{ok, error, table}; },
                 [&](caf::error& e) { reply = join_reply{false, "rendezvous failed: " + system.render(e), {}}; });
    if (!std::get<0>(reply)) {
      // The chief is about to fail and its process may exit at once: give the middleman a moment
      // to deliver the same error to the workers that joined, so none waits for a lost answer.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    if (keep != nullptr && std::get<0>(reply)) {
      *keep = agent;
    } else {
      self->send_exit(agent, caf::exit_reason::user_shutdown);
      system.middleman().unpublish(agent, *published);
    }
    return table_from(reply);
  }
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  caf::actor agent;
  std::string last_error;
  while (!agent) {
    auto found = system.middleman().remote_actor(options.chief_host, options.chief_port);
    if (found) {
      agent = *found;
      break;
    }
    last_error = system.render(found.error());
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error("rendezvous failed: could not reach the chief " + options.tasks[0] + " at " +
                               options.chief_host + ":" + std::to_string(options.chief_port) + " within " +
                               std::to_string(options.timeout.count()) + " ms: " + last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string nonce;
  self->request(agent, options.timeout, nonce_atom::value)
      .receive([&](std::string& n) { nonce = n; },
               [&](caf::error& e) { last_error = system.render(e); });
  if (nonce.empty()) throw std::runtime_error("rendezvous failed: the chief sent no nonce: " + last_error);
  self->request(agent, options.timeout + margin, join_atom::value, options.version,
                static_cast<std::int32_t>(options.rank), nonce, hmac_sha256_hex(options.token, nonce),
                static_cast<std::int32_t>(options.devices), options.data_host, options.data_port)
      .receive([&](bool ok, std::string& error, std::vector<std::string>& table) { reply = join_reply{ok, error, table}; },
               [&](caf::error& e) { reply = join_reply{false, "rendezvous failed: " + system.render(e), {}}; });
  auto table = table_from(reply);
  if (keep != nullptr) *keep = agent;
  return table;
}

}  // namespace

std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options) {
  return rendezvous_impl(system, options, nullptr);
}

std::vector<member> rendezvous(caf::actor_system& system, const rendezvous_options& options,
                               std::chrono::milliseconds heartbeat_interval,
                               std::function<void(int, const std::string&)> on_failure,
                               std::unique_ptr<cluster_watch>& watch) {
  caf::actor agent;
  auto members = rendezvous_impl(system, options, &agent);
  auto w = std::make_unique<cluster_watch::impl>();
  w->system = &system;
  w->agent = agent;
  w->chief = options.rank == 0;
  w->port = options.chief_port;
  w->rank = options.rank;
  if (w->chief) caf::anon_send(agent, tick_atom::value, heartbeat_interval);
  w->beat = system.spawn(heartbeat, agent, static_cast<std::int32_t>(options.rank), heartbeat_interval,
                         options.tasks[0], std::move(on_failure));
  watch = std::make_unique<cluster_watch>(std::move(w));
  return members;
}


}  // namespace troupe::actors
