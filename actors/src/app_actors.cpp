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

#include <sys/uio.h>

#include <cstring>

#include "app_data_link.hpp"
#include "app_data_wire.hpp"
#include "app_host.hpp"
#include "caf/io/all.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "protocol.hpp"
#include "task_common.hpp"
#include "troupe/transport/bulk_channel.hpp"
#include "troupe/transport/random.hpp"

namespace troupe::actors {

// --- the spawner --------------------------------------------------------------------------------

namespace {

// One actor's one-way messages not sent yet. A send appends; the requester, rung once per batch,
// sends what has gathered as one message (and a send that fills a batch sends it at once), so a
// flood of small sends crosses the middleman and the host's mailbox a batch at a time. A batch is
// sent under the mutex: whatever goes to the actor after a flush (a request) arrives after it.
struct outbox {
  static constexpr std::size_t max_messages = 256;
  static constexpr std::size_t max_bytes = std::size_t{1} << 20;  // one larger message goes alone

  std::mutex mutex;
  caf::actor from;  // the spawner's requester, which the acknowledgements reach
  caf::actor to;
  std::vector<std::string> names;
  std::vector<std::string> payloads;
  std::size_t bytes = 0;
  bool ack = false;      // a message in it filled the window
  bool rung = false;     // a flush is asked of the requester

  // Sends what it holds; the mutex is held.
  void flush_locked() {
    if (names.empty()) return;
    caf::send_as(from, to, asendv_atom::value, ack, std::move(names), std::move(payloads));
    names.clear();
    payloads.clear();
    bytes = 0;
    ack = false;
  }
  void flush() {
    std::lock_guard<std::mutex> lock(mutex);
    flush_locked();
  }
};

// The acknowledgement windows and outboxes of one spawner's actors, by the actor's address: its
// requester opens the windows as the acknowledgements arrive, and flushes the outboxes.
struct window_table {
  std::mutex mutex;
  std::map<caf::actor_addr, std::shared_ptr<send_window>> windows;
  std::map<caf::actor_addr, std::shared_ptr<outbox>> outboxes;

  std::shared_ptr<outbox> outbox_of(const caf::actor_addr& a) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = outboxes.find(a);
    return it == outboxes.end() ? nullptr : it->second;
  }
};

}  // namespace

class actor_ref {
 public:
  actor_ref() = default;
  actor_ref(const actor_ref&) = delete;
  actor_ref& operator=(const actor_ref&) = delete;
  ~actor_ref() {
    if (!table) return;
    out->flush();  // the last sends of a handle dropped at once are not lost
    std::lock_guard<std::mutex> lock(table->mutex);
    table->windows.erase(actor.address());
    table->outboxes.erase(actor.address());
  }

  std::uint64_t id = 0;
  std::string type;
  std::string task;
  caf::actor actor;
  std::shared_ptr<send_window> window = std::make_shared<send_window>();
  std::shared_ptr<outbox> out = std::make_shared<outbox>();
  std::shared_ptr<window_table> table;  // where `window` and `out` are registered
  std::shared_ptr<data_link> link;      // its host's data connection, or null: the control plane
  std::uint64_t number = 0;             // its number on its host's data port
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
        const bool stopped = table->stopped(w.id);
        options.on_down(actor_down{w.id, w.type, w.task, why, host_lost && !stopped, stopped});
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
      // A data connection failed: the actors it carried are down (and stopped, should they run).
      // It is reported one heartbeat interval later, unless the control connection said first
      // why (a host that stopped, or whose process died, closes both at once).
      [=](alost_atom, const std::string& task, const std::string& why, const std::vector<std::uint64_t>& ids,
          bool waited) {
        if (!waited) {
          self->delayed_send(self, options.liveness.interval, alost_atom::value, task, why, ids, true);
          return;
        }
        for (auto& [addr, w] : self->state.actors) {
          if (w.task != task || w.reported || std::find(ids.begin(), ids.end(), w.id) == ids.end()) continue;
          report(w, why, true);
          caf::anon_send_exit(caf::actor_cast<caf::actor>(addr), caf::exit_reason::user_shutdown);
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


// The deadlines of the asynchronous requests in flight, kept by the requester: one timer on CAF's
// clock for the earliest, not one per request.
struct requester_state {
  struct open_request {
    std::chrono::steady_clock::time_point deadline;
    std::int64_t timeout_ms = 0;
  };
  std::map<std::uint64_t, open_request> open;  // by token
  std::optional<std::chrono::steady_clock::time_point> tick_at;  // the earliest tick scheduled
};

// Sends each asynchronous request and hands its outcome to the token's callback.
caf::behavior requester(caf::stateful_actor<requester_state>* self, std::shared_ptr<pending_table> pending,
                        std::shared_ptr<window_table> windows) {
  auto finish = [=](std::uint64_t token, actor_reply r) {
    if (auto f = pending->take(token)) f(std::move(r));
  };
  // A tick at `at`, unless one comes by then already.
  auto tick_by = [=](std::chrono::steady_clock::time_point at) {
    auto& st = self->state;
    if (st.tick_at && *st.tick_at <= at) return;
    st.tick_at = at;
    const auto now = std::chrono::steady_clock::now();
    self->delayed_send(self, at > now ? at - now : std::chrono::steady_clock::duration{0}, atick_atom::value);
  };
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
      [=](aflush_atom, const caf::actor& to) {
        if (auto box = windows->outbox_of(to.address())) {
          std::lock_guard<std::mutex> lock(box->mutex);
          box->rung = false;
          box->flush_locked();
        }
      },
      // A request sent as this actor by its caller's thread (its reply comes here): its deadline.
      [=](areq_atom, std::uint64_t token, std::int64_t timeout_ms) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        self->state.open[token] = requester_state::open_request{deadline, timeout_ms};
        tick_by(deadline);
      },
      [=](areply_atom, std::uint64_t token, bool ok, std::string& bytes) {
        self->state.open.erase(token);
        finish(token, actor_reply{ok ? actor_reply::status::ok : actor_reply::status::failed, std::move(bytes)});
      },
      [=](atick_atom) {
        auto& st = self->state;
        const auto now = std::chrono::steady_clock::now();
        if (st.tick_at && *st.tick_at <= now) st.tick_at.reset();
        std::optional<std::chrono::steady_clock::time_point> next;
        for (auto it = st.open.begin(); it != st.open.end();) {
          if (it->second.deadline <= now) {
            const std::uint64_t token = it->first;
            const std::int64_t ms = it->second.timeout_ms;
            it = st.open.erase(it);
            finish(token, actor_reply{actor_reply::status::timed_out, "no answer within " + std::to_string(ms) + " ms"});
          } else {
            if (!next || it->second.deadline < *next) next = it->second.deadline;
            ++it;
          }
        }
        if (next) tick_by(*next);
      },
  };
}

// Blocking actors that synchronous requests borrow, one at a time each: the caller's own thread
// sends the request and waits for its reply, with no actor between them.
struct caller_pool {
  static constexpr std::size_t max_idle = 64;
  std::mutex mutex;
  std::vector<std::unique_ptr<caf::scoped_actor>> idle;

  std::unique_ptr<caf::scoped_actor> take(caf::actor_system& system) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!idle.empty()) {
        auto out = std::move(idle.back());
        idle.pop_back();
        return out;
      }
    }
    return std::make_unique<caf::scoped_actor>(system, true);
  }
  void give_back(std::unique_ptr<caf::scoped_actor> a) {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.size() < max_idle) idle.push_back(std::move(a));
  }
  void clear() {
    std::vector<std::unique_ptr<caf::scoped_actor>> gone;
    {
      std::lock_guard<std::mutex> lock(mutex);
      gone.swap(idle);
    }
  }
};

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
  caller_pool callers;
  std::mutex mutex;
  std::map<std::string, caf::actor> agents;  // by task
  std::vector<caf::actor> local;
  std::atomic<std::uint64_t> next_id{1};
  std::mutex links_mutex;
  std::map<std::string, std::shared_ptr<data_link>> links;  // by task
  std::vector<std::shared_ptr<data_link>> old_links;        // replaced ones, joined at the end

  // The data connection to the task at `where`, whose spawn answered `data` (the port, the
  // actor's number, the secret); null (the control plane carries the actor's messages) when the
  // task has no data port or it cannot be reached, which is logged.
  std::shared_ptr<data_link> link_for(const task_endpoint& where, const std::string& data, std::uint64_t* number) {
    if (!options.data_connections || data.size() < 11) return nullptr;
    const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(data[0]) |
                                                 static_cast<unsigned char>(data[1]) << 8);
    *number = 0;
    for (int i = 7; i >= 0; --i) *number = (*number << 8) | static_cast<unsigned char>(data[2 + i]);
    if (port == 0 || *number == 0) return nullptr;
    std::lock_guard<std::mutex> lock(links_mutex);
    if (table->closed) return nullptr;
    auto& slot = links[where.task];
    if (slot && !slot->dead && slot->port == port) return slot;
    auto link = std::make_shared<data_link>();
    link->task = where.task;
    link->port = port;
    link->pending = pending;
    link->supervisor = supervisor;
    const transport::ring_auth auth{options.credentials ? options.credentials->token() : std::string(), data.substr(10)};
    try {
      link->stream = transport::bulk_stream::connect(transport::endpoint{where.host, port}, auth,
                                                     std::min(options.connect_timeout, std::chrono::milliseconds(10000)),
                                                     "the actor data port of " + where.task);
    } catch (const std::exception& e) {
      if (options.log) options.log(std::string(e.what()) + ": its actors' messages use the control plane");
      return nullptr;
    }
    link->start();
    if (slot) old_links.push_back(std::move(slot));
    slot = link;
    return link;
  }

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
  impl_->requester = system.spawn(requester, impl_->pending, impl_->windows);
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
  // The data connections end (their threads joined) before the requests left end below.
  std::vector<std::shared_ptr<data_link>> links;
  {
    std::lock_guard<std::mutex> lock(s.links_mutex);
    for (auto& [task, l] : s.links) links.push_back(l);
    for (auto& l : s.old_links) links.push_back(l);
    s.links.clear();
    s.old_links.clear();
  }
  for (auto& l : links) l->stop_and_join();
  // The asynchronous requests in flight end now, each with its callback.
  caf::anon_send_exit(s.requester, caf::exit_reason::user_shutdown);
  std::map<std::uint64_t, pending_table::entry> left;
  {
    std::lock_guard<std::mutex> lock(s.pending->mutex);
    left.swap(s.pending->done);
  }
  for (auto& [token, e] : left) e.done(actor_reply{actor_reply::status::down, "its actor client is gone"});
  s.callers.clear();
  // The supervisor is every host's watch of this spawner: its end stops the remote actors there.
  caf::anon_send_exit(s.supervisor, caf::exit_reason::user_shutdown);
}

std::shared_ptr<actor_ref> actor_client::spawn(const task_endpoint& where, const std::string& type,
                                               const std::string& args, std::chrono::milliseconds wait_listening) {
  auto& s = *impl_;
  s.check_open("spawn of actor " + type + " on " + where.task);
  caf::actor made;
  caf::actor agent;
  std::string data;
  std::string error;
  for (int attempt = 0; attempt < 2 && !made; ++attempt) {
    // A cached connection to a host that has since died answers at once that it is down: connect
    // again, once.
    agent = s.agent_for(where, attempt > 0, wait_listening);
    bool receiver_down = false;
    caf::scoped_actor self{*s.system};
    self->request(agent, s.options.connect_timeout, aspawn_atom::value, s.options.task, s.supervisor, type, args)
        .receive(
            [&](caf::actor& a, std::string& d) {
              made = std::move(a);
              data = std::move(d);
            },
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
  ref->out->from = s.requester;
  ref->out->to = ref->actor;
  ref->table = s.windows;
  {
    std::lock_guard<std::mutex> lock(s.windows->mutex);
    s.windows->windows[ref->actor.address()] = ref->window;
    s.windows->outboxes[ref->actor.address()] = ref->out;
  }
  ref->link = s.link_for(where, data, &ref->number);
  if (ref->link) ref->link->join(ref->id, ref->number, ref->window);
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
  ref->out->from = s.requester;
  ref->out->to = ref->actor;
  ref->table = s.windows;
  {
    std::lock_guard<std::mutex> lock(s.windows->mutex);
    s.windows->windows[ref->actor.address()] = ref->window;
    s.windows->outboxes[ref->actor.address()] = ref->out;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.local.push_back(ref->actor);
  }
  caf::anon_send(s.supervisor, awatch_atom::value, ref->actor, ref->id, type, ref->task, caf::actor{});
  return ref;
}

actor_reply actor_client::request_over_data(const actor_ref& to, const std::string& name, const std::string& payload,
                                            std::chrono::milliseconds timeout) {
  // This thread writes the request (the payload from where it is) and waits for the reader
  // thread to hand it the reply, the supervisor's or the connection's word that the actor is
  // down, or the deadline.
  auto& s = *impl_;
  struct waiter {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<actor_reply> reply;
  };
  auto w = std::make_shared<waiter>();
  const std::uint64_t token = s.pending->reserve();
  s.pending->add_as(token, to.id, [w](actor_reply r) {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->reply = std::move(r);
    }
    w->done.notify_one();
  });
  // Looked at again once the request is in the table (see request_async).
  if (s.table->closed || s.table->cause(to.id)) {
    const std::string why = s.table->closed ? "its actor client is gone" : s.table->cause(to.id).value_or("the actor is down");
    s.pending->take(token);
    return actor_reply{actor_reply::status::down, why};
  }
  if (!to.link->track(token, -1)) {
    s.pending->take(token);
    return actor_reply{actor_reply::status::down, to.link->failed().value_or("its data connection failed")};
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  to.link->write_now(data_wire::make_record(data_wire::request, 0, token, to.number, name, {}, &payload));
  std::unique_lock<std::mutex> lock(w->mutex);
  if (!w->done.wait_until(lock, deadline, [&] { return w->reply.has_value(); })) {
    lock.unlock();
    to.link->untrack(token);
    if (s.pending->take(token)) {
      return actor_reply{actor_reply::status::timed_out, "no answer within " + std::to_string(timeout.count()) + " ms"};
    }
    lock.lock();  // taken meanwhile: its reply is being handed over
    w->done.wait(lock, [&] { return w->reply.has_value(); });
  }
  lock.unlock();
  to.link->untrack(token);  // ended by the supervisor (the actor is down) rather than its reply
  return std::move(*w->reply);
}

actor_reply actor_client::request(const actor_ref& to, const std::string& name, const std::string& payload,
                                  std::chrono::milliseconds timeout) {
  auto& s = *impl_;
  if (s.table->closed) return actor_reply{actor_reply::status::down, "its actor client is gone"};
  if (auto cause = s.table->cause(to.id)) return actor_reply{actor_reply::status::down, *cause};
  if (to.link) return request_over_data(to, name, payload, timeout);
  // This thread sends as a borrowed blocking actor and waits in it for the reply, or for the
  // supervisor's word that the actor went down (the request is taken out of the pending table
  // then, as an asynchronous one is), or for the deadline.
  auto caller = s.callers.take(*s.system);
  const caf::actor self = caf::actor_cast<caf::actor>(*caller);
  const std::uint64_t token = s.pending->reserve();
  s.pending->add_as(token, to.id, [self, token](actor_reply r) {
    caf::anon_send(self, adown_atom::value, token, std::move(r.payload));  // always status::down
  });
  // The actor may have gone down (or the client ended) since the look above: look again (see
  // request_async).
  if (s.table->closed || s.table->cause(to.id)) {
    const std::string why = s.table->closed ? "its actor client is gone" : s.table->cause(to.id).value_or("the actor is down");
    s.pending->take(token);
    s.callers.give_back(std::move(caller));
    return actor_reply{actor_reply::status::down, why};
  }
  to.out->flush();  // the sends before it first
  (*caller)->send(to.actor, amsg_atom::value, token, name, payload);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<actor_reply> out;
  while (!out) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      out = actor_reply{actor_reply::status::timed_out, "no answer within " + std::to_string(timeout.count()) + " ms"};
      break;
    }
    // A reply or a down word with another token is a stale one (an earlier request of this blocking
    // actor that timed out): dropped.
    (*caller)->receive(
        [&](areply_atom, std::uint64_t t, bool ok, std::string& bytes) {
          if (t == token) out = actor_reply{ok ? actor_reply::status::ok : actor_reply::status::failed, std::move(bytes)};
        },
        [&](adown_atom, std::uint64_t t, std::string& why) {
          if (t == token) out = actor_reply{actor_reply::status::down, std::move(why)};
        },
        caf::after(left) >> [] {});
  }
  s.pending->take(token);  // still there unless the supervisor or the client's end took it
  s.callers.give_back(std::move(caller));
  return std::move(*out);
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
  if (to.link) {
    // Over the data connection, after what this thread queued there before; its reader keeps the
    // deadline.
    if (!to.link->track(token, static_cast<std::int64_t>(timeout.count()))) {
      if (auto f = s.pending->take(token)) f(actor_reply{actor_reply::status::down, to.link->failed().value_or("lost")});
      return;
    }
    to.link->enqueue(data_wire::make_record(data_wire::request, 0, token, to.number, name, std::move(payload)));
    return;
  }
  // Sent from this thread as the requester, which the reply reaches, after the sends before it
  // (so that the messages of one thread arrive in order, whatever the kind); the requester keeps
  // the deadline (a reply that comes first completes it all the same).
  caf::anon_send(s.requester, areq_atom::value, token, static_cast<std::int64_t>(timeout.count()));
  to.out->flush();
  caf::send_as(s.requester, to.actor, amsg_atom::value, token, name, std::move(payload));
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
  if (to.link) {
    to.link->enqueue(data_wire::make_record(data_wire::send, ack ? data_wire::ask_ack : 0, 0, to.number, name, payload));
    return true;
  }
  // Into the actor's outbox: the requester sends it (as itself, which the acknowledgements
  // reach) once rung, or this thread at once when the batch is full.
  bool ring = false;
  {
    std::lock_guard<std::mutex> lock(to.out->mutex);
    auto& box = *to.out;
    box.names.push_back(name);
    box.payloads.push_back(payload);
    box.bytes += payload.size();
    box.ack = box.ack || ack;
    if (box.names.size() >= outbox::max_messages || box.bytes >= outbox::max_bytes) {
      box.flush_locked();
    } else if (!box.rung) {
      box.rung = true;
      ring = true;
    }
  }
  if (ring) caf::anon_send(s.requester, aflush_atom::value, to.actor);
  return true;
}

void actor_client::stop(const actor_ref& to) {
  auto& s = *impl_;
  if (s.table->closed) return;
  s.table->mark_stopped(to.id);
  if (to.link && !to.link->dead) {
    // After the messages before it on the same connection.
    to.link->enqueue(data_wire::make_record(data_wire::stop, 0, 0, to.number, {}, {}));
    return;
  }
  to.out->flush();  // the sends before the stop first
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
