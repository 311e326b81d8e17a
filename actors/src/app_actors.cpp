#include "troupe/actors/app_actors.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "app_host.hpp"
#include "caf/io/all.hpp"
#include "control_gate.hpp"
#include "protocol.hpp"
#include "task_common.hpp"

namespace troupe::actors {

// --- the hosted actor ---------------------------------------------------------------------------

namespace {

// What a hosted actor counts of the one-way messages from each sender, to acknowledge them.
struct send_counts {
  std::map<caf::actor_addr, std::uint64_t> received;
};

caf::behavior hosted_actor(caf::event_based_actor* self, std::string type, actor_receive receive) {
  auto counts = std::make_shared<send_counts>();
  return {
      // A one-way message: its reply and error are dropped; every ack_every-th (or one the sender
      // asks for: its window is full) is acknowledged with the count so far.
      [=](asend_atom, bool ack, const std::string& name, const std::string& payload) {
        if (name.size() <= app_message_limits::max_name_bytes && payload.size() <= app_message_limits::max_payload_bytes) {
          try {
            (void)receive(name, payload);
          } catch (...) {
            // A one-way message's error goes nowhere, as its reply.
          }
        }
        const auto& sender = self->current_sender();
        if (!sender) return;
        const auto n = ++counts->received[caf::actor_cast<caf::actor_addr>(sender)];
        if (ack || n % send_window::ack_every == 0) self->send(caf::actor_cast<caf::actor>(sender), asent_atom::value, n);
      },
      [type, receive](amsg_atom, const std::string& name, const std::string& payload) -> caf::result<std::string> {
        if (name.size() > app_message_limits::max_name_bytes) {
          return runtime_error("actor " + type + ": a message name of " + std::to_string(name.size()) +
                               " bytes (at most " + std::to_string(app_message_limits::max_name_bytes) + ")");
        }
        if (payload.size() > app_message_limits::max_payload_bytes) {
          return runtime_error("actor " + type + ": message '" + name + "' carries " + std::to_string(payload.size()) +
                               " bytes (at most " + std::to_string(app_message_limits::max_payload_bytes) + ")");
        }
        call_reply r;
        try {
          r = receive(name, payload);
        } catch (const std::exception& e) {
          r = call_reply{false, e.what()};
        } catch (...) {
          r = call_reply{false, "actor " + type + " threw something that is not a std::exception on '" + name + "'"};
        }
        if (!r.ok) return runtime_error(std::move(r.payload));
        return std::move(r.payload);
      },
  };
}

}  // namespace

caf::actor spawn_hosted(caf::actor_system& system, std::string type, actor_receive receive) {
  return system.spawn<caf::detached>(hosted_actor, std::move(type), std::move(receive));
}

// --- the spawner --------------------------------------------------------------------------------

namespace {

// The acknowledgement windows of one spawner's actors, by the actor's address: its requester
// opens them as the acknowledgements arrive.
struct window_table {
  std::mutex mutex;
  std::map<caf::actor_addr, std::shared_ptr<send_window>> windows;
};

}  // namespace

class actor_ref {
 public:
  actor_ref() = default;
  actor_ref(const actor_ref&) = delete;
  actor_ref& operator=(const actor_ref&) = delete;
  ~actor_ref() {
    if (!table) return;
    std::lock_guard<std::mutex> lock(table->mutex);
    table->windows.erase(actor.address());
  }

  std::uint64_t id = 0;
  std::string type;
  std::string task;
  caf::actor actor;
  std::shared_ptr<send_window> window = std::make_shared<send_window>();
  std::shared_ptr<window_table> table;  // where `window` is registered
};

namespace {

// What the spawner's threads and its supervisor share: why each actor is down.
struct down_table {
  std::mutex mutex;
  std::map<std::uint64_t, std::string> causes;
  std::set<std::uint64_t> stops;  // stopped by the spawner
  std::atomic<bool> closed{false};

  // Records the first cause; true when this is the first.
  bool mark(std::uint64_t id, const std::string& cause) {
    std::lock_guard<std::mutex> lock(mutex);
    return causes.emplace(id, cause).second;
  }
  void mark_stopped(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    stops.insert(id);
    causes.emplace(id, "stopped by its spawner");
  }
  bool stopped(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    return stops.count(id) > 0;
  }
  std::optional<std::string> cause(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = causes.find(id);
    if (it == causes.end()) return std::nullopt;
    return it->second;
  }
};

// The requests in flight, by token: each callback is taken out once, by its reply, its error, its
// actor going down or the client's end.
struct pending_table {
  struct entry {
    std::uint64_t actor = 0;  // the actor's id
    std::function<void(actor_reply)> done;
  };
  std::mutex mutex;
  std::map<std::uint64_t, entry> done;
  std::uint64_t next = 1;

  std::uint64_t add(std::uint64_t actor, std::function<void(actor_reply)> f) {
    std::lock_guard<std::mutex> lock(mutex);
    const std::uint64_t token = next++;
    done.emplace(token, entry{actor, std::move(f)});
    return token;
  }
  std::function<void(actor_reply)> take(std::uint64_t token) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = done.find(token);
    if (it == done.end()) return nullptr;
    auto f = std::move(it->second.done);
    done.erase(it);
    return f;
  }
  // Every callback of a request to `actor`.
  std::vector<std::function<void(actor_reply)>> take_actor(std::uint64_t actor) {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<std::function<void(actor_reply)>> out;
    for (auto it = done.begin(); it != done.end();) {
      if (it->second.actor == actor) {
        out.push_back(std::move(it->second.done));
        it = done.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
};

struct supervisor_state {
  struct watched {
    std::uint64_t id = 0;
    std::string type;
    std::string task;
    bool reported = false;
  };
  struct host {
    caf::actor agent;
    liveness_policy::clock::time_point last;
    bool lost = false;
  };
  std::map<caf::actor_addr, watched> actors;
  std::map<std::string, host> hosts;  // by task, for the hosts that have an agent
  liveness_policy::clock::time_point previous_check;
  bool ticking = false;
};

std::string down_cause(caf::actor_system& system, const caf::error& reason, const std::string& task) {
  if (reason == caf::exit_reason::remote_link_unreachable) {
    return "the connection to " + task + " closed (its process died, or the network failed)";
  }
  if (reason == caf::exit_reason::user_shutdown) return "stopped by its host (" + task + " stopped)";
  if (reason == caf::exit_reason::unknown) return "it was gone already (" + task + ")";
  if (!reason) return "it ended on " + task;
  return system.render(reason) + " on " + task;
}

caf::behavior supervisor(caf::stateful_actor<supervisor_state>* self, std::shared_ptr<down_table> table,
                         std::shared_ptr<pending_table> pending, actor_client_options options) {
  auto report = [=](supervisor_state::watched& w, const std::string& cause, bool host_lost) {
    if (w.reported) return;
    w.reported = true;
    table->mark(w.id, cause);
    const std::string why = table->cause(w.id).value_or(cause);  // a stop said first wins
    // A request in flight to it ends now: a request already sent to a host that died gets no
    // answer (CAF bounces only the messages sent after the connection closed), and one to a host
    // that went silent none either.
    for (auto& done : pending->take_actor(w.id)) done(actor_reply{actor_reply::status::down, why});
    if (options.log) options.log("actor " + w.type + " #" + std::to_string(w.id) + " on " + w.task + " is down: " + why);
    if (options.on_down) {
      try {
        options.on_down(actor_down{w.id, w.type, w.task, why, host_lost && !table->stopped(w.id)});
      } catch (...) {
        // The application's callback must not end the supervisor (it watches every other actor).
      }
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    auto it = self->state.actors.find(d.source);
    if (it == self->state.actors.end()) return;
    const bool lost = d.reason == caf::exit_reason::remote_link_unreachable || d.reason == caf::exit_reason::user_shutdown;
    report(it->second, down_cause(self->system(), d.reason, it->second.task), lost);
    self->state.actors.erase(it);
  });
  return {
      [=](awatch_atom, const caf::actor& a, std::uint64_t id, const std::string& type, const std::string& task,
          const caf::actor& agent) {
        auto& st = self->state;
        st.actors[a.address()] = supervisor_state::watched{id, type, task, false};
        self->monitor(a);
        // A host that just spawned an actor is alive, even one reported silent before (its earlier
        // actors stay down: they were reported so).
        auto h = st.hosts.find(task);
        if (agent && (h == st.hosts.end() || h->second.lost)) {
          st.hosts[task] = supervisor_state::host{agent, liveness_policy::clock::now(), false};
        }
        if (agent && !st.ticking) {
          st.ticking = true;
          st.previous_check = liveness_policy::clock::now();
          self->delayed_send(self, options.liveness.interval, tick_atom::value);
        }
      },
      [=](tick_atom) {
        auto& st = self->state;
        const auto now = liveness_policy::clock::now();
        const bool paused = options.liveness.paused(st.previous_check, now);  // this process was not running
        st.previous_check = now;
        bool any = false;
        for (auto& [task, h] : st.hosts) {
          if (h.lost) continue;
          bool hosts_live = false;
          for (auto& [addr, w] : st.actors) hosts_live = hosts_live || (w.task == task && !w.reported);
          if (!hosts_live) continue;
          any = true;
          if (paused) h.last = now;
          if (options.liveness.silent_too_long(h.last, now)) {
            h.lost = true;
            const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - h.last).count();
            const std::string cause = task + " answered no heartbeat for " + std::to_string(silent) + " ms (" +
                                      std::to_string(options.liveness.missed) + " x " +
                                      std::to_string(options.liveness.interval.count()) + " ms; stopped or hung?)";
            for (auto& [addr, w] : st.actors) {
              if (w.task == task) report(w, cause, true);
            }
            continue;
          }
          const std::string t = task;
          self->request(h.agent, options.liveness.limit(), aping_atom::value)
              .then(
                  [=](bool) {
                    auto it = self->state.hosts.find(t);
                    if (it != self->state.hosts.end()) it->second.last = liveness_policy::clock::now();
                  },
                  [](caf::error&) {});
        }
        st.ticking = any;
        if (any) self->delayed_send(self, options.liveness.interval, tick_atom::value);
      },
  };
}


// Sends each asynchronous request and hands its outcome to the token's callback.
caf::behavior requester(caf::event_based_actor* self, std::shared_ptr<pending_table> pending,
                        std::shared_ptr<down_table> table, std::shared_ptr<window_table> windows) {
  return {
      [=](asent_atom, std::uint64_t count) {
        std::shared_ptr<send_window> w;
        {
          std::lock_guard<std::mutex> lock(windows->mutex);
          auto it = windows->windows.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
          if (it != windows->windows.end()) w = it->second;
        }
        if (w) w->acknowledged(count);
      },
      [=](areq_atom, const caf::actor& to, std::uint64_t token, std::uint64_t id, const std::string& name,
          const std::string& payload, std::int64_t timeout_ms) {
        auto finish = [=](actor_reply r) {
          if (auto f = pending->take(token)) f(std::move(r));
        };
        self->request(to, std::chrono::milliseconds(timeout_ms), amsg_atom::value, name, payload)
            .then([=](std::string& bytes) { finish(actor_reply{actor_reply::status::ok, std::move(bytes)}); },
                  [=](caf::error& e) {
                    if (e == caf::sec::request_timeout) {
                      finish(actor_reply{actor_reply::status::timed_out,
                                         "no answer within " + std::to_string(timeout_ms) + " ms"});
                    } else if (e == caf::sec::request_receiver_down) {
                      finish(actor_reply{actor_reply::status::down, table->cause(id).value_or("the actor is down")});
                    } else {
                      finish(actor_reply{actor_reply::status::failed, error_text(self->system(), e)});
                    }
                  });
      },
  };
}

}  // namespace

struct actor_client::impl {
  caf::actor_system* system = nullptr;
  actor_client_options options;
  std::unique_ptr<control_gate> gate;
  caf::actor supervisor;
  caf::actor requester;
  std::shared_ptr<down_table> table = std::make_shared<down_table>();
  std::shared_ptr<pending_table> pending = std::make_shared<pending_table>();
  std::shared_ptr<window_table> windows = std::make_shared<window_table>();
  std::mutex mutex;
  std::map<std::string, caf::actor> agents;  // by task
  std::vector<caf::actor> local;
  std::atomic<std::uint64_t> next_id{1};

  void check_open(const std::string& what) const {
    if (table->closed) throw std::runtime_error(what + ": its actor client is gone");
  }

  // The agent of the task at `where` (cached unless `fresh`). Nothing listening there yet (the
  // connection refused, or no agent published) is tried again for up to `wait_listening`; a
  // connection refused in its handshake (another token) is not.
  caf::actor agent_for(const task_endpoint& where, bool fresh, std::chrono::milliseconds wait_listening) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = agents.find(where.task);
      if (it != agents.end() && !fresh) return it->second;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + wait_listening;
    auto pause = std::chrono::milliseconds(20);
    for (int tries = 1;; ++tries) {
      auto found = connect_to_task(*system, *gate, where.host, where.port, options.connect_timeout);
      if (found) {
        std::lock_guard<std::mutex> lock(mutex);
        agents[where.task] = *found;
        return *found;
      }
      const bool not_listening = found.error() == caf::sec::cannot_connect_to_node ||
                                 found.error() == caf::sec::no_actor_published_at_port;
      const auto now = std::chrono::steady_clock::now();
      if (!not_listening || table->closed || now + pause > deadline) {
        std::string why = error_text(*system, found.error());
        if (tries > 1) {
          why = "nothing listened there within " + std::to_string(wait_listening.count()) + " ms (" +
                std::to_string(tries) + " tries, the last: " + why + ")";
        }
        throw std::runtime_error("cannot reach " + where.task + " at " + address_of(where.host, where.port) + ": " +
                                 why + " (is it running, with this cluster's token?)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }
};

actor_client::actor_client(caf::actor_system& system, actor_client_options options)
    : impl_(std::make_shared<impl>()) {
  options.liveness.check("actor_client");
  impl_->system = &system;
  impl_->options = std::move(options);
  impl_->gate = std::make_unique<control_gate>(system, impl_->options.credentials != nullptr, gate_limits::for_tasks());
  impl_->supervisor = system.spawn(supervisor, impl_->table, impl_->pending, impl_->options);
  impl_->requester = system.spawn(requester, impl_->pending, impl_->table, impl_->windows);
}

actor_client::~actor_client() {
  auto& s = *impl_;
  s.table->closed = true;
  std::vector<caf::actor> local;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    local.swap(s.local);
    s.agents.clear();
  }
  for (auto& a : local) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  // The asynchronous requests in flight end now, each with its callback.
  caf::anon_send_exit(s.requester, caf::exit_reason::user_shutdown);
  std::map<std::uint64_t, pending_table::entry> left;
  {
    std::lock_guard<std::mutex> lock(s.pending->mutex);
    left.swap(s.pending->done);
  }
  for (auto& [token, e] : left) e.done(actor_reply{actor_reply::status::down, "its actor client is gone"});
  // The supervisor is every host's watch of this spawner: its end stops the remote actors there.
  caf::anon_send_exit(s.supervisor, caf::exit_reason::user_shutdown);
}

std::shared_ptr<actor_ref> actor_client::spawn(const task_endpoint& where, const std::string& type,
                                               const std::string& args, std::chrono::milliseconds wait_listening) {
  auto& s = *impl_;
  s.check_open("spawn of actor " + type + " on " + where.task);
  caf::actor made;
  caf::actor agent;
  std::string error;
  for (int attempt = 0; attempt < 2 && !made; ++attempt) {
    // A cached connection to a host that has since died answers at once that it is down: connect
    // again, once.
    agent = s.agent_for(where, attempt > 0, wait_listening);
    bool receiver_down = false;
    caf::scoped_actor self{*s.system};
    self->request(agent, s.options.connect_timeout, aspawn_atom::value, s.options.task, s.supervisor, type, args)
        .receive([&](caf::actor& a) { made = std::move(a); },
                 [&](caf::error& e) {
                   receiver_down = e == caf::sec::request_receiver_down;
                   error = e == caf::sec::request_timeout
                               ? where.task + " did not answer within " +
                                     std::to_string(s.options.connect_timeout.count()) + " ms"
                               : error_text(*s.system, e);
                 });
    if (!made && !receiver_down) break;
  }
  if (!made) throw std::runtime_error(error.empty() ? where.task + " answered no actor" : error);
  auto ref = std::make_shared<actor_ref>();
  ref->id = s.next_id++;
  ref->type = type;
  ref->task = where.task;
  ref->actor = made;
  ref->table = s.windows;
  {
    std::lock_guard<std::mutex> lock(s.windows->mutex);
    s.windows->windows[ref->actor.address()] = ref->window;
  }
  caf::anon_send(s.supervisor, awatch_atom::value, made, ref->id, type, where.task, agent);
  if (s.options.log) s.options.log("spawned actor " + type + " #" + std::to_string(ref->id) + " on " + where.task);
  return ref;
}

std::shared_ptr<actor_ref> actor_client::spawn_local(const std::string& type, actor_receive receive) {
  auto& s = *impl_;
  s.check_open("spawn of actor " + type);
  auto ref = std::make_shared<actor_ref>();
  ref->id = s.next_id++;
  ref->type = type;
  ref->task = "local";
  ref->actor = spawn_hosted(*s.system, type, std::move(receive));
  ref->table = s.windows;
  {
    std::lock_guard<std::mutex> lock(s.windows->mutex);
    s.windows->windows[ref->actor.address()] = ref->window;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.local.push_back(ref->actor);
  }
  caf::anon_send(s.supervisor, awatch_atom::value, ref->actor, ref->id, type, ref->task, caf::actor{});
  return ref;
}

actor_reply actor_client::request(const actor_ref& to, const std::string& name, const std::string& payload,
                                  std::chrono::milliseconds timeout) {
  // Through the requester, so that the actor going down ends the wait (the supervisor takes the
  // request out) instead of its timeout: the request's own timeout bounds the rest.
  struct waiter {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<actor_reply> reply;
  };
  auto w = std::make_shared<waiter>();
  request_async(to, name, payload, timeout, [w](actor_reply r) {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->reply = std::move(r);
    w->done.notify_all();
  });
  std::unique_lock<std::mutex> lock(w->mutex);
  w->done.wait(lock, [&] { return w->reply.has_value(); });
  return std::move(*w->reply);
}

void actor_client::request_async(const actor_ref& to, const std::string& name, std::string payload,
                                 std::chrono::milliseconds timeout, std::function<void(actor_reply)> done) {
  auto& s = *impl_;
  if (s.table->closed) return done(actor_reply{actor_reply::status::down, "its actor client is gone"});
  if (auto cause = s.table->cause(to.id)) return done(actor_reply{actor_reply::status::down, *cause});
  const std::uint64_t token = s.pending->add(to.id, std::move(done));
  // The actor may have gone down (or the client ended) since the look above, taking out the
  // requests in flight before this one was added: look again (the cause is marked, and the client
  // closed, before they are taken out).
  if (s.table->closed || s.table->cause(to.id)) {
    const std::string why = s.table->closed ? "its actor client is gone" : s.table->cause(to.id).value_or("the actor is down");
    if (auto f = s.pending->take(token)) f(actor_reply{actor_reply::status::down, why});
    return;
  }
  caf::anon_send(s.requester, areq_atom::value, to.actor, token, to.id, name, std::move(payload),
                 static_cast<std::int64_t>(timeout.count()));
}

bool actor_client::send(const actor_ref& to, const std::string& name, const std::string& payload) {
  auto& s = *impl_;
  if (s.table->closed || s.table->cause(to.id)) return false;
  // Back-pressure: wait while the actor has a window's worth unacknowledged (checking every
  // 20 ms whether it went down meanwhile, which its supervisor says within the heartbeat bound).
  bool ack = false;
  while (!to.window->reserve(payload.size(), &ack, std::chrono::milliseconds(20))) {
    if (s.table->closed || s.table->cause(to.id)) return false;
  }
  // As the requester, which the actor's acknowledgements reach.
  caf::send_as(s.requester, to.actor, asend_atom::value, ack, name, payload);
  return true;
}

bool send_window::reserve(std::size_t bytes, bool* ack, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto fits = [&] {
    return sizes_.empty() || (sizes_.size() < max_messages && outstanding_bytes_ + bytes <= max_bytes);
  };
  if (!opened_.wait_for(lock, wait, fits)) return false;
  sizes_.push_back(bytes);
  outstanding_bytes_ += bytes;
  // The message that fills the window asks for its acknowledgement, so that it opens again.
  *ack = sizes_.size() >= max_messages || outstanding_bytes_ >= max_bytes;
  return true;
}

void send_window::acknowledged(std::uint64_t count) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (acked_ < count && !sizes_.empty()) {
      outstanding_bytes_ -= sizes_.front();
      sizes_.pop_front();
      ++acked_;
    }
  }
  opened_.notify_all();
}

std::size_t send_window::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sizes_.size();
}

void actor_client::stop(const actor_ref& to) {
  auto& s = *impl_;
  if (s.table->closed) return;
  s.table->mark_stopped(to.id);
  caf::anon_send_exit(to.actor, caf::exit_reason::user_shutdown);
}

std::optional<std::string> actor_client::down(const actor_ref& of) const {
  if (impl_->table->closed) return std::string("its actor client is gone");
  return impl_->table->cause(of.id);
}

std::uint64_t actor_client::id(const actor_ref& of) { return of.id; }
const std::string& actor_client::type(const actor_ref& of) { return of.type; }
const std::string& actor_client::task(const actor_ref& of) { return of.task; }

}  // namespace troupe::actors
