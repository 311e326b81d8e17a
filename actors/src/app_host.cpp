#include "app_host.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "app_data_wire.hpp"
#include "protocol.hpp"
#include "task_common.hpp"
#include "troupe/transport/bulk_channel.hpp"
#include "troupe/transport/random.hpp"

namespace troupe::actors {

// The messages of one frame from the data port to one actor, in its mailbox as one message.
struct data_job {
  struct item {
    std::uint8_t kind = 0;
    bool ack = false;
    std::uint64_t number = 0;
    std::string name;
    std::string payload;
  };
  std::shared_ptr<data_wire::host_conn> conn;
  std::shared_ptr<data_wire::conn_counts> counts;
  std::uint64_t actor = 0;
  std::vector<item> items;
};
using data_job_ptr = std::shared_ptr<data_job>;

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::data_job_ptr)

namespace troupe::actors {

// --- the hosted actor ---------------------------------------------------------------------------

namespace {

// What a hosted actor counts of the one-way messages from each sender, to acknowledge them.
struct send_counts {
  std::map<caf::actor_addr, std::uint64_t> received;
};

caf::behavior hosted_actor(caf::event_based_actor* self, std::string type, actor_receive receive) {
  auto counts = std::make_shared<send_counts>();
  // A request's reply: the actor's, or its error (a name or payload beyond the bounds refused
  // before it sees them).
  auto answer = [=](const std::string& name, const std::string& payload) -> call_reply {
    if (name.size() > app_message_limits::max_name_bytes) {
      return call_reply{false, "actor " + type + ": a message name of " + std::to_string(name.size()) +
                                   " bytes (at most " + std::to_string(app_message_limits::max_name_bytes) + ")"};
    }
    if (payload.size() > app_message_limits::max_payload_bytes) {
      return call_reply{false, "actor " + type + ": message '" + name + "' carries " + std::to_string(payload.size()) +
                                   " bytes (at most " + std::to_string(app_message_limits::max_payload_bytes) + ")"};
    }
    try {
      return receive(name, payload);
    } catch (const std::exception& e) {
      return call_reply{false, e.what()};
    } catch (...) {
      return call_reply{false, "actor " + type + " threw something that is not a std::exception on '" + name + "'"};
    }
  };
  return {
      // One-way messages, in a batch: their replies and errors are dropped; each ack_every-th of
      // the sender's (or a batch the sender asks it for: its window is full) is acknowledged with
      // the count so far.
      [=](asendv_atom, bool ack, const std::vector<std::string>& names, const std::vector<std::string>& payloads) {
        if (names.size() != payloads.size()) return;
        for (std::size_t i = 0; i < names.size(); ++i) {
          if (names[i].size() > app_message_limits::max_name_bytes ||
              payloads[i].size() > app_message_limits::max_payload_bytes) {
            continue;
          }
          try {
            (void)receive(names[i], payloads[i]);
          } catch (...) {
            // A one-way message's error goes nowhere, as its reply.
          }
        }
        const auto& sender = self->current_sender();
        if (!sender || names.empty()) return;
        auto& n = counts->received[caf::actor_cast<caf::actor_addr>(sender)];
        const std::uint64_t before = n;
        n += names.size();
        if (ack || n / send_window::ack_every != before / send_window::ack_every) {
          self->send(caf::actor_cast<caf::actor>(sender), asent_atom::value, n);
        }
      },
      // A request: answered to its sender with the token, as a plain message (its sender keeps
      // the deadline).
      [=](amsg_atom, std::uint64_t token, const std::string& name, const std::string& payload) {
        call_reply r = answer(name, payload);
        const auto& sender = self->current_sender();
        if (!sender) return;
        self->send(caf::actor_cast<caf::actor>(sender), areply_atom::value, token, r.ok, std::move(r.payload));
      },
      // A message from the data port: its reply (or a one-way message's acknowledgement) is
      // written back on its connection from here, together with the others of its connection to
      // this actor once none is left in the mailbox.
      [=](afast_atom, const data_job_ptr& job) {
        auto& j = *job;
        for (auto& m : j.items) {
          if (m.kind == data_wire::send) {
            try {
              (void)receive(m.name, m.payload);
            } catch (...) {
              // A one-way message's error goes nowhere, as its reply.
            }
            const std::uint64_t n = ++j.counts->received;
            if (m.ack || n % send_window::ack_every == 0) {
              j.conn->add(data_wire::make_record(data_wire::ack, data_wire::ok, n, j.actor, {}, {}));
            }
          } else {
            call_reply r = answer(m.name, m.payload);
            if (!r.ok && r.payload.size() > data_wire::max_error_bytes) r.payload.resize(data_wire::max_error_bytes);
            j.conn->add(data_wire::make_record(data_wire::reply, r.ok ? data_wire::ok : data_wire::failed, m.number,
                                               j.actor, {}, std::move(r.payload)));
          }
          std::string().swap(m.payload);  // its bytes go now, not with the batch
          if (j.conn->waiting() >= data_wire::max_records) j.conn->flush();
        }
        if ((j.counts->queued -= j.items.size()) == 0) j.conn->flush();
      },
  };
}

}  // namespace

caf::actor spawn_hosted(caf::actor_system& system, std::string type, actor_receive receive) {
  return system.spawn<caf::detached>(hosted_actor, std::move(type), std::move(receive));
}


// --- a task's actor data port -------------------------------------------------------------------

struct app_data_host::impl {
  std::string task;
  std::string host;
  std::string token;
  std::chrono::milliseconds timeout{0};
  std::function<void(const std::string&)> event;
  std::mutex mutex;
  std::map<std::uint64_t, caf::actor> actors;  // by their number on the port
  std::map<caf::actor_addr, std::uint64_t> numbers;
  std::uint64_t next = 1;
  std::string secret;
  std::unique_ptr<transport::bulk_listener> listener;
  bool failed = false;   // it could not listen: the control plane carries everything
  bool stopped = false;

  caf::actor find(std::uint64_t number) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = actors.find(number);
    return it == actors.end() ? caf::actor{} : it->second;
  }

  // One proven connection, on its own thread (the listener's): each frame's messages go to their
  // actors' mailboxes once the whole frame (and its tag) is in; a number with no actor is
  // answered with an error at once.
  void serve(transport::bulk_stream& stream) {
    auto conn = std::make_shared<data_wire::host_conn>();
    conn->stream = &stream;
    if (event) event("an actor spawner connected to the actor data port (" + stream.name() + ")");
    struct detach {
      std::shared_ptr<data_wire::host_conn> conn;
      ~detach() {
        std::lock_guard<std::mutex> lock(conn->write_mutex);
        conn->stream = nullptr;
      }
    } guard{conn};
    std::map<std::uint64_t, std::shared_ptr<data_wire::conn_counts>> counts;
    std::vector<data_wire::in_record> records;
    std::vector<char> scratch;
    for (;;) {
      if (!stream.wait_message(-1)) continue;
      if (!data_wire::read_frame(stream, true, records, scratch)) return;
      bool refusals = false;
      // One mailbox message per actor per frame, sent in the order of each actor's first
      // message; a stop goes after what came before it.
      std::vector<std::pair<caf::actor, data_job_ptr>> batches;
      const auto send_batch = [&](std::size_t i) {
        auto& [a, job] = batches[i];
        if (!job || job->items.empty()) return;
        job->counts->queued += job->items.size();
        caf::anon_send(a, afast_atom::value, std::move(job));
        job = nullptr;
      };
      for (auto& r : records) {
        caf::actor a = find(r.actor);
        if (!a) {
          if (r.kind == data_wire::request) {
            conn->add(data_wire::make_record(data_wire::reply, data_wire::refused, r.number, r.actor, {},
                                             "no actor #" + std::to_string(r.actor) + " on " + task +
                                                 " (it stopped, or was never spawned there)"));
            refusals = true;
          }
          continue;
        }
        std::size_t i = 0;
        while (i < batches.size() && batches[i].first != a) ++i;
        if (i == batches.size()) batches.emplace_back(a, nullptr);
        if (r.kind == data_wire::stop) {
          send_batch(i);
          caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
          continue;
        }
        auto& job = batches[i].second;
        if (!job) {
          auto& c = counts[r.actor];
          if (!c) c = std::make_shared<data_wire::conn_counts>();
          job = std::make_shared<data_job>();
          job->conn = conn;
          job->counts = c;
          job->actor = r.actor;
        }
        job->items.push_back(data_job::item{r.kind, r.kind == data_wire::send && r.status == data_wire::ask_ack,
                                            r.number, std::move(r.name), std::move(r.payload)});
      }
      for (std::size_t i = 0; i < batches.size(); ++i) send_batch(i);
      if (refusals) conn->flush();
    }
  }
};

app_data_host::app_data_host(std::string task, std::string host, std::string token, std::chrono::milliseconds timeout,
                             std::function<void(const std::string&)> event)
    : impl_(std::make_shared<impl>()) {
  impl_->task = std::move(task);
  impl_->host = std::move(host);
  impl_->token = std::move(token);
  impl_->timeout = timeout;
  impl_->event = std::move(event);
}

app_data_host::~app_data_host() { stop(); }

std::string app_data_host::add(const caf::actor& a) {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.stopped) return {};
  if (!s.listener && !s.failed) {
    try {
      const auto bytes = transport::random_bytes(32, s.task + ": the actor data port's secret");
      s.secret.assign(bytes.begin(), bytes.end());
      auto* self = &s;
      s.listener = std::make_unique<transport::bulk_listener>(
          s.host, 0, transport::ring_auth{s.token, s.secret}, s.timeout, s.task + "'s actor data port",
          [self](transport::bulk_stream& stream) { self->serve(stream); });
      if (s.event) s.event("actor data port " + address_of(s.host, s.listener->port()));
    } catch (const std::exception& e) {
      s.failed = true;
      if (s.event) s.event(std::string("no actor data port (") + e.what() + "): actors' messages use the control plane");
    }
  }
  const std::uint64_t number = s.next++;
  s.actors[number] = a;
  s.numbers[a.address()] = number;
  if (!s.listener) return {};
  std::string out(10, '\0');
  const std::uint16_t port = s.listener->port();
  out[0] = static_cast<char>(port & 0xff);
  out[1] = static_cast<char>(port >> 8);
  for (int i = 0; i < 8; ++i) out[2 + i] = static_cast<char>((number >> (8 * i)) & 0xff);
  return out + s.secret;
}

void app_data_host::remove(const caf::actor_addr& a) {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.numbers.find(a);
  if (it == s.numbers.end()) return;
  s.actors.erase(it->second);
  s.numbers.erase(it);
}

void app_data_host::stop() {
  auto& s = *impl_;
  std::unique_ptr<transport::bulk_listener> listener;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopped = true;
    listener.swap(s.listener);
  }
  listener.reset();  // its connections' threads take the mutex: joined outside it
  std::lock_guard<std::mutex> lock(s.mutex);
  s.actors.clear();
  s.numbers.clear();
}

}  // namespace troupe::actors
