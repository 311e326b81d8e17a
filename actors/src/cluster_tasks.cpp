#include "troupe/actors/cluster_tasks.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "openssl/rand.h"
#include "protocol.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace troupe::actors {
namespace {

// An error's own message when it carries one (ours do), else CAF's rendering.
std::string error_text(caf::actor_system& system, const caf::error& e) {
  if (e.context().match_elements<std::string>()) return e.context().get_as<std::string>(0);
  return system.render(e);
}

caf::error runtime_error(std::string text) { return caf::make_error(caf::sec::runtime_error, std::move(text)); }

std::string address_of(const std::string& host, std::uint16_t port) { return host + ":" + std::to_string(port); }

// What a task's answer to hello says about it: nothing wrong, or why it is not the task meant.
caf::error check_hello(const task_endpoint& t, const std::string& name, const caf::actor& pulse) {
  if (name != t.task) return runtime_error(address_of(t.host, t.port) + " is " + name.substr(0, 64) + ", not " + t.task);
  if (!pulse) return runtime_error(address_of(t.host, t.port) + " (" + t.task + ") answers no heartbeats");
  return {};
}

// Every connection of the cluster tasks, made or accepted, goes through a control gate
// (control_gate.hpp): with a token no byte is parsed before the peer proved it in the TLS
// handshake, the OpenSSL error queue is cleared before every session call (a stranger's failed
// handshake would otherwise make a healthy session's next read look fatal), unproven connections
// are bounded and refusals logged with the peer's address.
caf::expected<caf::actor> connect(caf::actor_system& system, const control_gate& gate, const std::string& host,
                                  std::uint16_t port, std::chrono::milliseconds wait) {
  return connect_bounded(system, gate.actor(), host, port, wait);
}

// --- the task agent ---------------------------------------------------------------------------

// A shard: its bytes (the runtime's encoding of the tensor), shared by its actor (the control
// plane's reads and updates) and the ps task's data connections. A read takes a reference to the
// bytes under the shared lock and sends them after releasing it, so that a reader that stalls
// (a stopped worker) never holds up the updates. An update, whole in hand, is applied under the
// exclusive lock, in place when no read holds the bytes, else to a copy that then replaces them
// (copy on write): a read sees the shard before or after an update, never in between.
struct shard_cell {
  std::shared_mutex mutex;
  std::shared_ptr<std::string> value = std::make_shared<std::string>();
  shard_layout layout;

  // The bytes to change, with the exclusive lock held: no new reference can be taken meanwhile,
  // so a count of one means no read holds them.
  std::string& writable() {
    if (value.use_count() > 1) value = std::make_shared<std::string>(*value);
    return *value;
  }
};

// The ps task's shards by key, for its data connections.
struct shard_store {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<shard_cell>> cells;
  std::shared_ptr<shard_cell> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cells.find(key);
    return it == cells.end() ? nullptr : it->second;
  }
  void put(const std::string& key, std::shared_ptr<shard_cell> cell) {
    std::lock_guard<std::mutex> lock(mutex);
    cells[key] = std::move(cell);
  }
};

struct shard_state {
  std::shared_ptr<shard_cell> cell;
};

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, std::shared_ptr<shard_cell> cell,
                          std::shared_ptr<const task_handlers> handlers) {
  self->state.cell = std::move(cell);
  return {
      [=](vread_atom) -> std::string {
        auto& c = *self->state.cell;
        std::shared_ptr<std::string> bytes;
        {
          std::shared_lock<std::shared_mutex> lock(c.mutex);
          bytes = c.value;
        }
        return *bytes;
      },
      [=](vupdate_atom, std::uint8_t op, const std::string& delta) -> caf::result<bool> {
        if (!handlers->update) return runtime_error("this task holds no variables");
        auto& c = *self->state.cell;
        try {
          std::unique_lock<std::shared_mutex> lock(c.mutex);
          auto& bytes = c.writable();
          if (auto bad = handlers->update(bytes, op, delta)) return runtime_error(*bad);
          if (handlers->layout) {
            if (auto l = handlers->layout(bytes)) c.layout = *l;
          }
        } catch (const std::exception& e) {
          return runtime_error(e.what());
        }
        return true;
      },
  };
}

// Reads and drops the `n` bytes of a refused request, so that the answer reaches the sender in
// order; false (the connection ends) for a count beyond any shard.
bool drain(transport::bulk_stream& s, std::uint64_t n) {
  if (n > (std::uint64_t{1} << 32)) return false;
  char sink[65536];
  for (std::uint64_t left = n; left > 0;) {
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(left, sizeof sink));
    s.receive(sink, k);
    left -= k;
  }
  return true;
}

bool same_rows(const shard_layout& a, const shard_layout& b) {
  return a.dtype == b.dtype && a.nbytes == b.nbytes && a.rows == b.rows && a.offset == b.offset;
}

// A gather or a scatter on one shard (5a of the walkthrough): some rows, by index. Its size is
// checked against the shard's rows before a byte is read or allocated, and every index against
// the rows it has. False: the connection ends.
bool serve_rows(transport::bulk_stream& s, const transport::bulk_request& r, const std::shared_ptr<shard_cell>& cell,
                std::string bad, std::vector<char>& buffer, std::vector<char>& reply, const task_handlers& h,
                const std::string& task) {
  const bool gather = r.kind == transport::bulk_request::gather;
  const std::string what = "variable shard '" + r.key.substr(0, 64) + "' on " + task;
  shard_layout layout;
  if (bad.empty()) {
    std::shared_lock<std::shared_mutex> lock(cell->mutex);
    layout = cell->layout;
  }
  const std::size_t row_bytes = layout.rows == 0 ? 0 : layout.nbytes / layout.rows;
  const std::size_t unit = gather ? 8 : 8 + row_bytes;  // one index, or one index and its row
  if (bad.empty() && (layout.dtype != r.dtype || row_bytes == 0)) {
    bad = what + " holds elements of type " + std::to_string(layout.dtype) + " in " + std::to_string(layout.rows) +
          " rows, the request says type " + std::to_string(r.dtype);
  }
  if (bad.empty() && (r.bytes % unit != 0 || r.bytes > (std::uint64_t{1} << 32))) {
    bad = what + ": a " + (gather ? "gather" : "scatter") + " of " + std::to_string(r.bytes) +
          " bytes is not a whole number of " + (gather ? "8-byte row indices" : "row indices and rows of " +
          std::to_string(row_bytes) + " bytes") + " (at most 4 GiB)";
  }
  const std::size_t count = bad.empty() ? static_cast<std::size_t>(r.bytes / unit) : 0;
  if (bad.empty() && gather && count * row_bytes > (std::size_t{1} << 32)) {
    bad = what + ": a gather of " + std::to_string(count) + " rows of " + std::to_string(row_bytes) +
          " bytes answers more than 4 GiB (ask for fewer rows at a time)";
  }
  if (!bad.empty()) {
    if (!drain(s, r.bytes)) {
      s.send_error(bad);
      return false;
    }
    s.send_error(bad);
    return true;
  }
  const auto n = static_cast<std::size_t>(r.bytes);
  if (buffer.size() < n) buffer.resize(n);
  s.receive(buffer.data(), n);
  // Row index i, in the host's byte order as every field here (the buffer need not be aligned).
  const auto row = [&](std::size_t i) {
    std::uint64_t v;
    std::memcpy(&v, buffer.data() + i * 8, 8);
    return v;
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (row(i) >= layout.rows) {
      s.send_error(what + " has " + std::to_string(layout.rows) + " rows; the request names row " +
                   std::to_string(row(i)) + " (index " + std::to_string(i) + ")");
      return true;
    }
  }
  if (gather) {
    // From a reference to the bytes taken under the shared lock, as a read does: an update meanwhile
    // goes to a copy.
    std::shared_ptr<const std::string> bytes;
    {
      std::shared_lock<std::shared_mutex> lock(cell->mutex);
      bytes = cell->value;
      if (!same_rows(cell->layout, layout)) {
        bytes = nullptr;
      }
    }
    if (!bytes) {
      s.send_error(what + " was created again with another shape meanwhile");
      return true;
    }
    if (reply.size() < count * row_bytes) reply.resize(count * row_bytes);
    const char* base = bytes->data() + layout.offset;
    for (std::size_t i = 0; i < count; ++i) std::memcpy(reply.data() + i * row_bytes, base + row(i) * row_bytes, row_bytes);
    s.send_reply(reply.data(), count * row_bytes);
    return true;
  }
  // A scatter: every row applied in order under the exclusive lock (a row named twice is applied
  // twice: additions add up, the last assignment wins).
  std::optional<std::string> failed;
  {
    std::unique_lock<std::shared_mutex> lock(cell->mutex);
    if (!same_rows(cell->layout, layout)) {
      failed = what + " was created again with another shape meanwhile";
    } else {
      char* base = cell->writable().data() + layout.offset;
      const char* from = buffer.data() + count * 8;
      for (std::size_t i = 0; i < count && !failed; ++i) {
        failed = h.combine(base + row(i) * row_bytes, from + i * row_bytes, row_bytes, r.dtype, r.op);
      }
    }
  }
  if (failed) {
    s.send_error(*failed);
  } else {
    s.send_reply(nullptr, 0);
  }
  return true;
}

// Serves one proven data connection of a ps task until the peer closes it (5a of the walkthrough).
void serve_shards(transport::bulk_stream& s, shard_store& store, const task_handlers& h, const std::string& task) {
  std::vector<char> buffer;  // an update's bytes, kept for the next (no page faults once grown)
  std::vector<char> reply;   // a gather's rows, kept likewise
  while (auto r = s.receive_request()) {
    auto cell = store.find(r->key);
    auto mismatch = [&](const shard_layout& l) -> std::string {
      if (l.dtype == r->dtype && l.nbytes == r->bytes) return {};
      return "variable shard '" + r->key.substr(0, 64) + "' on " + task + " holds " + std::to_string(l.nbytes) +
             " bytes of element type " + std::to_string(l.dtype) + ", the request says " + std::to_string(r->bytes) +
             " bytes of type " + std::to_string(r->dtype) + " (the variable was created again with another shape?)";
    };
    std::string bad;
    if (!cell) bad = "no variable shard '" + r->key.substr(0, 64) + "' on " + task;
    if (r->kind == transport::bulk_request::gather || r->kind == transport::bulk_request::scatter) {
      if (!serve_rows(s, *r, cell, std::move(bad), buffer, reply, h, task)) return;
      continue;
    }
    if (r->kind == transport::bulk_request::read) {
      if (bad.empty()) {
        std::shared_ptr<const std::string> bytes;
        shard_layout layout;
        {
          std::shared_lock<std::shared_mutex> lock(cell->mutex);
          bytes = cell->value;
          layout = cell->layout;
        }
        bad = mismatch(layout);
        if (bad.empty()) {
          s.send_reply(bytes->data() + layout.offset, layout.nbytes);
          continue;
        }
      }
      s.send_error(bad);
      continue;
    }
    // An update: its size is checked against the shard before a byte of it is read or allocated.
    if (bad.empty()) {
      std::shared_lock<std::shared_mutex> lock(cell->mutex);
      bad = mismatch(cell->layout);
    }
    if (!bad.empty()) {
      // Its bytes are read and dropped, so that the answer reaches the sender in order; a count
      // beyond any shard ends the connection instead.
      const bool drained = drain(s, r->bytes);
      s.send_error(bad);
      if (!drained) return;
      continue;
    }
    const auto n = static_cast<std::size_t>(r->bytes);
    if (buffer.size() < n) buffer.resize(n);
    s.receive(buffer.data(), n);
    std::optional<std::string> failed;
    {
      std::unique_lock<std::shared_mutex> lock(cell->mutex);
      failed = mismatch(cell->layout).empty()
                   ? h.combine(cell->writable().data() + cell->layout.offset, buffer.data(), n, r->dtype, r->op)
                   : std::optional<std::string>(mismatch(cell->layout));
    }
    if (failed) {
      s.send_error(*failed);
    } else {
      s.send_reply(nullptr, 0);
    }
  }
}

// Answers the chief's heartbeats apart from the agent (whose thread may be running a function for
// minutes) and watches them: a chief silent for more than its missed_heartbeats intervals (stopped,
// hung) is gone, as if its connection had closed. The chief says its settings in every beat.
struct pulse_state {
  std::optional<heartbeat_state> chief;
  bool ticking = false;
};

caf::behavior pulse_actor(caf::stateful_actor<pulse_state>* self, std::shared_ptr<const task_handlers> handlers) {
  return {
      [=](beat_atom, std::int64_t interval_ms, std::int32_t missed) -> bool {
        auto& st = self->state;
        const auto now = heartbeat_state::clock::now();
        if (interval_ms < 1 || interval_ms > 3600000 || missed < 1 || missed > 1000) return false;
        if (!st.chief || !st.chief->watched(0) || st.chief->interval().count() != interval_ms ||
            st.chief->missed() != missed) {
          st.chief.emplace(1, std::chrono::milliseconds(interval_ms), missed);
          st.chief->watch(0, now);
        } else {
          st.chief->beat(0, now);
        }
        if (!st.ticking) {
          st.ticking = true;
          self->delayed_send(self, st.chief->interval(), tick_atom::value);
        }
        return true;
      },
      [=](tick_atom) {
        auto& st = self->state;
        st.ticking = false;
        if (!st.chief || !st.chief->watched(0)) return;
        if (!st.chief->overdue(heartbeat_state::clock::now()).empty()) {
          st.chief->forget(0);
          if (handlers->event) {
            handlers->event("lost the chief: it missed " + std::to_string(st.chief->missed()) + " heartbeats of " +
                            std::to_string(st.chief->interval().count()) + " ms (stopped or hung?)");
          }
          if (handlers->chief_gone) handlers->chief_gone();
          return;
        }
        st.ticking = true;
        self->delayed_send(self, st.chief->interval(), tick_atom::value);
      },
      [=](hello_atom) {
        // From the agent: a chief said hello. It is watched from now on, with the last settings
        // it said (the defaults before its first beat), so that a chief stopped before its first
        // beat is noticed too.
        auto& st = self->state;
        if (!st.chief) {
          const dispatcher_options defaults;
          st.chief.emplace(1, defaults.heartbeat_interval, defaults.missed_heartbeats);
        }
        st.chief->watch(0, heartbeat_state::clock::now());
        if (!st.ticking) {
          st.ticking = true;
          self->delayed_send(self, st.chief->interval(), tick_atom::value);
        }
      },
      [=](leave_atom) {  // from the agent: the chief left or its connection closed
        if (self->state.chief) self->state.chief->forget(0);
      },
  };
}

// The functions of a worker task: run one at a time, in the order their calls arrived, on a thread
// of their own that the task server owns (a function may run for minutes: never on a scheduler
// thread). The agent queues each call; the thread answers the call's sender in the agent's name.
// The agent itself is an ordinary scheduled actor: CAF 0.17 cannot end an actor system while a
// detached actor is still referenced from anywhere, and a task's agent is referenced from the
// network.
struct function_runner {
  struct call {
    std::uint64_t id = 0;
    std::string function;
    std::string args;
    caf::actor reply_to;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<call> calls;
  bool stopping = false;
  bool finished = false;          // the thread has returned
  std::string running;            // the function running now, for the stop's message
  caf::actor_addr agent;          // the identity its answers carry
  std::thread thread;

  void run(const task_handlers& handlers) {
    for (;;) {
      call c;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stopping || !calls.empty(); });
        if (stopping) break;  // calls still queued are dropped: their chief is gone or going
        c = std::move(calls.front());
        calls.pop_front();
        running = c.function;
      }
      call_reply reply;
      try {
        reply = handlers.call(c.function, c.args);
      } catch (const std::exception& e) {
        reply = call_reply{false, e.what()};
      } catch (...) {
        reply = call_reply{false, "function " + c.function + " threw something that is not a std::exception"};
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        running.clear();
      }
      if (auto self = caf::actor_cast<caf::actor>(agent)) {
        caf::send_as(self, c.reply_to, result_atom::value, c.id, reply.ok, std::move(reply.payload));
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
    wake.notify_all();
  }
};

struct agent_state {
  std::string task;
  std::shared_ptr<shard_store> store;  // the shards' cells, shared with the data connections
  std::shared_ptr<std::atomic<std::uint16_t>> data_port;  // 0 or null: no data port (yet)
  std::string data_secret;
  caf::actor pulse;
  std::shared_ptr<const task_handlers> handlers;
  std::map<std::string, caf::actor> shards;
  std::map<caf::actor_addr, std::string> peers;  // who said hello, by the address they said it from
  caf::actor_addr chief;
  std::shared_ptr<function_runner> runner;  // worker tasks: where calls go
};

void event(agent_state& st, const std::string& line) {
  if (st.handlers->event) st.handlers->event(line);
}

caf::behavior task_agent(caf::stateful_actor<agent_state>* self, std::string task,
                         std::shared_ptr<const task_handlers> handlers, caf::actor pulse,
                         std::shared_ptr<shard_store> store, std::shared_ptr<std::atomic<std::uint16_t>> data_port,
                         std::string data_secret, std::shared_ptr<function_runner> runner) {
  self->state.task = std::move(task);
  self->state.runner = std::move(runner);
  self->state.store = std::move(store);
  self->state.data_port = data_port;
  self->state.data_secret = std::move(data_secret);
  self->state.pulse = std::move(pulse);
  self->state.handlers = std::move(handlers);
  auto forget = [=](const caf::actor_addr& who, const std::string& how) {
    auto& st = self->state;
    auto it = st.peers.find(who);
    if (it == st.peers.end()) return;
    event(st, how + " " + it->second);
    st.peers.erase(it);
    if (who == st.chief) {
      st.chief = caf::actor_addr{};
      self->send(st.pulse, leave_atom::value);
      if (st.handlers->chief_gone) st.handlers->chief_gone();
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    forget(d.source, "lost");
  });
  self->set_exit_handler([=](caf::exit_msg& m) {
    for (auto& s : self->state.shards) self->send_exit(s.second, m.reason);
    self->send_exit(self->state.pulse, m.reason);
    self->quit(m.reason);
  });
  auto shard_of = [=](const std::string& key) -> caf::actor {
    auto it = self->state.shards.find(key);
    return it == self->state.shards.end() ? caf::actor{} : it->second;
  };
  return {
      [=](hello_atom, const std::string& peer, const caf::actor& watch) -> caf::result<std::string, caf::actor> {
        // The peer names an actor that lives as long as its connection to us is used: watching
        // it, rather than the sender of the hello, shows when the peer leaves or is lost.
        auto& st = self->state;
        auto who = watch.address();
        if (who && st.peers.emplace(who, peer.substr(0, 200)).second) {
          self->monitor(who);
          event(st, "connected " + peer.substr(0, 200));
          if (peer.rfind("/job:chief/", 0) == 0) {
            st.chief = who;
            self->send(st.pulse, hello_atom::value);
            if (st.handlers->chief_came) st.handlers->chief_came();
          }
        }
        return {st.task, st.pulse};
      },
      [=](leave_atom) { forget(caf::actor_cast<caf::actor_addr>(self->current_sender()), "left"); },
      [=](leave_atom, const std::string& peer, const std::string& to) -> bool {
        // A chief that leaves before it ever reached this task (it was still starting when the
        // chief tried) says so once, so that a task waiting for it need not wait out its start
        // timeout. A task serving a chief ignores it (that is not its chief), and so does a task
        // that is not the one the chief meant.
        auto& st = self->state;
        if (st.chief || to != st.task || peer.rfind("/job:chief/", 0) != 0) return false;
        event(st, "left " + peer.substr(0, 200) + " (it left before it reached this task)");
        self->send(st.pulse, leave_atom::value);
        if (st.handlers->chief_gone) st.handlers->chief_gone();
        return true;
      },
      [=](table_atom, const std::string& blob) {
        if (self->state.handlers->table) self->state.handlers->table(blob);
      },
      [=](call_atom, std::uint64_t id, std::string& function, std::string& args) {
        auto& st = self->state;
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        if (!st.runner) {
          if (to) self->send(to, result_atom::value, id, false, st.task + " runs no functions (it is not a worker task)");
          return;
        }
        {
          std::lock_guard<std::mutex> lock(st.runner->mutex);
          if (st.runner->stopping) return;
          st.runner->calls.push_back(function_runner::call{id, std::move(function), std::move(args), std::move(to)});
        }
        st.runner->wake.notify_one();
      },
      [=](cancel_atom) -> std::string {
        // The chief raises a function's error: the calls it sent that have not started here are
        // dropped, as TensorFlow cancels closures still queued. Their ids, 8 bytes each
        // (little-endian), tell it which.
        auto& st = self->state;
        std::string ids;
        if (!st.runner) return ids;
        const auto from = self->current_sender();
        std::lock_guard<std::mutex> lock(st.runner->mutex);
        auto& calls = st.runner->calls;
        for (auto it = calls.begin(); it != calls.end();) {
          if (caf::actor_cast<caf::strong_actor_ptr>(it->reply_to) != from) {
            ++it;
            continue;
          }
          for (int b = 0; b < 8; ++b) ids.push_back(static_cast<char>((it->id >> (8 * b)) & 0xff));
          it = calls.erase(it);
        }
        return ids;
      },
      [=](vnew_atom, const std::string& key, std::string& bytes) -> caf::result<bool> {
        auto& st = self->state;
        auto cell = std::make_shared<shard_cell>();
        if (st.handlers->layout) {
          try {
            auto l = st.handlers->layout(bytes);
            if (!l) return runtime_error("variable shard '" + key + "' on " + st.task + ": malformed bytes");
            cell->layout = *l;
          } catch (const std::exception& e) {
            return runtime_error("variable shard '" + key + "' on " + st.task + ": " + e.what());
          }
        }
        cell->value = std::make_shared<std::string>(std::move(bytes));
        if (auto old = shard_of(key)) self->send_exit(old, caf::exit_reason::user_shutdown);
        st.store->put(key, cell);
        st.shards[key] = self->spawn(shard_actor, std::move(cell), st.handlers);
        return true;
      },
      [=](data_atom) -> caf::result<std::string> {
        // The port (2 bytes, little-endian), then the secret.
        auto& st = self->state;
        const std::uint16_t port = st.data_port ? st.data_port->load() : 0;
        if (port == 0) return runtime_error(st.task + " has no data port (it holds no variables)");
        std::string out(2, '\0');
        out[0] = static_cast<char>(port & 0xff);
        out[1] = static_cast<char>(port >> 8);
        return out + st.data_secret;
      },
      [=](vread_atom, const std::string& key) -> caf::result<std::string> {
        auto shard = shard_of(key);
        if (!shard) return runtime_error("no variable shard '" + key + "' on " + self->state.task);
        auto rp = self->make_response_promise();
        rp.delegate(shard, vread_atom::value);
        return rp;
      },
      [=](vupdate_atom, const std::string& key, std::uint8_t op, std::string& delta) -> caf::result<bool> {
        auto shard = shard_of(key);
        if (!shard) return runtime_error("no variable shard '" + key + "' on " + self->state.task);
        auto rp = self->make_response_promise();
        rp.delegate(shard, vupdate_atom::value, op, std::move(delta));
        return rp;
      },
  };
}

}  // namespace

std::shared_ptr<control_credentials> make_credentials(caf::actor_system& system, const std::string& token) {
  if (token.empty()) return nullptr;
  auto c = std::make_shared<control_credentials>(token);
  c->install(system);
  return c;
}

// --- task_server ------------------------------------------------------------------------------

struct task_server::impl {
  std::unique_ptr<transport::bulk_listener> data;  // ps tasks: the shards' data connections
  std::shared_ptr<std::atomic<std::uint16_t>> data_port;  // what the agent hands out; 0 once closing
  caf::actor_system* system = nullptr;
  std::shared_ptr<control_credentials> credentials;
  std::unique_ptr<control_gate> gate;  // the task's listener
  caf::actor agent;
  caf::actor pulse;
  std::shared_ptr<const task_handlers> handlers;
  std::shared_ptr<function_runner> runner;  // worker tasks
  std::uint16_t port = 0;
  bool tls = false;

  // Ends the function thread: a function still running is told to give up its waits (the
  // handlers' cancel) and is waited for, saying so every 30 s.
  void stop_functions() {
    if (!runner) return;
    {
      std::lock_guard<std::mutex> lock(runner->mutex);
      runner->stopping = true;
    }
    runner->wake.notify_all();
    if (handlers->cancel) handlers->cancel();
    std::unique_lock<std::mutex> lock(runner->mutex);
    while (!runner->wake.wait_for(lock, std::chrono::seconds(30), [&] { return runner->finished; })) {
      std::cerr << "troupe: the task's function " + runner->running + " still runs; waiting for it to return\n"
                << std::flush;
    }
    lock.unlock();
    runner->thread.join();
  }
};

task_server::task_server(caf::actor_system& system, std::string task, std::string host, std::uint16_t port,
                         std::shared_ptr<control_credentials> credentials, task_handlers handlers,
                         task_server_options options)
    : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.system = &system;
  s.credentials = std::move(credentials);
  s.tls = s.credentials != nullptr;
  // Functions run on a thread of their own, heartbeats are answered by an actor of their own: a
  // function running long is no silence, and the agent answers its peers meanwhile.
  auto shared = std::make_shared<const task_handlers>(std::move(handlers));
  auto store = std::make_shared<shard_store>();
  auto data_port = std::make_shared<std::atomic<std::uint16_t>>(0);
  std::string secret;
  const bool holds_variables = shared->layout && shared->combine;
  if (holds_variables) {
    // The data port's secret: handed out over the control plane only, so that without a token
    // too only peers that reached the agent can prove themselves there.
    secret.resize(32);
    if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), static_cast<int>(secret.size())) != 1) {
      throw std::runtime_error("Server: " + task + ": no randomness for the data port's secret");
    }
  }
  s.handlers = shared;
  if (shared->call) s.runner = std::make_shared<function_runner>();
  auto pulse = system.spawn(pulse_actor, shared);
  s.pulse = pulse;
  s.data_port = data_port;
  s.agent = system.spawn(task_agent, task, shared, pulse, store, data_port, secret, s.runner);
  if (s.runner) {
    s.runner->agent = s.agent.address();
    s.runner->thread = std::thread([runner = s.runner, shared] { runner->run(*shared); });
  }
  s.gate = std::make_unique<control_gate>(system, s.tls, gate_limits::for_tasks());
  auto published = s.gate->publish(s.agent, port, host);
  if (!published) {
    caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(pulse, caf::exit_reason::user_shutdown);
    s.stop_functions();
    throw std::runtime_error("Server: " + task + " cannot listen on " + address_of(host, port) + ": " +
                             system.render(published.error()));
  }
  s.port = *published;
  if (holds_variables) {
    // Listened on after the agent's own port, so that a free port the system picks here cannot be
    // the one the cluster spec gave this task. Until then the agent says it has no data port.
    try {
      transport::ring_auth auth{s.credentials ? s.credentials->token() : std::string(), secret};
      s.data = std::make_unique<transport::bulk_listener>(
          host, options.data_port, std::move(auth), options.data_timeout, task + "'s data port",
          [store, shared, task](transport::bulk_stream& stream) { serve_shards(stream, *store, *shared, task); });
    } catch (const std::exception& e) {
      caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(pulse, caf::exit_reason::user_shutdown);
      s.stop_functions();
      throw std::runtime_error("Server: " + task + " cannot listen for variables' data on " +
                               (options.data_port == 0 ? host : address_of(host, options.data_port)) + ": " + e.what() +
                               (options.data_port == 0 ? "" : " (the data port: TROUPE_PS_DATA_PORT or --data-port)"));
    }
    *data_port = s.data->port();
    if (shared->event) shared->event("variables' data port " + address_of(host, s.data->port()));
  }
}

task_server::~task_server() {
  auto& s = *impl_;
  // Workers asking for the data port from now on hear that there is none, at once.
  if (s.data_port) *s.data_port = 0;
  s.data.reset();
  s.gate->unpublish(s.agent, s.port);
  // The agent and the pulse end at once (neither runs functions); the function thread ends once
  // its function returns. Both wait here: the handlers reach into the owner of this object, which
  // is destroyed next.
  caf::scoped_actor self{*s.system};
  self->monitor(s.pulse);
  self->send_exit(s.pulse, caf::exit_reason::user_shutdown);
  self->monitor(s.agent);
  self->send_exit(s.agent, caf::exit_reason::user_shutdown);
  bool gone = false;
  bool pulse_gone = false;
  self->receive_while([&] { return !gone || !pulse_gone; })(
      [&](caf::down_msg& d) {
        gone = gone || d.source == s.agent.address();
        pulse_gone = pulse_gone || d.source == s.pulse.address();
      },
      caf::after(std::chrono::seconds(30)) >> [&] {
        std::cerr << "troupe: the task agent did not stop within 30 s" << std::endl;
        gone = true;
        pulse_gone = true;
      });
  s.stop_functions();
}

std::uint16_t task_server::port() const noexcept { return impl_->port; }

// --- the router of requests to ps tasks ------------------------------------------------------

namespace {

// Carries a worker's requests to the ps agents and answers each exactly once: with the reply,
// with the request's timeout, or, as soon as that ps agent goes down, with its loss (a request in
// flight to a dead peer would otherwise wait for its whole timeout). It also reaches the ps
// agents for a worker (reach_atom), so that a task that stops can end every wait of a function
// still running at once (cancel_atom): from then on it answers everything with the reason.
template <class T>
struct type_tag {
  using type = T;
};

struct router_state {
  std::vector<caf::actor> agents;
  std::vector<std::map<std::uint64_t, caf::response_promise>> pending;  // by ps task
  std::vector<std::vector<caf::response_promise>> reaching;  // by ps task: waiting for its reach
  std::uint64_t next = 0;
  std::optional<std::string> cancelled;  // why, once the task stops
};

caf::behavior shard_router(caf::stateful_actor<router_state>* self, std::vector<task_endpoint> ps,
                           std::chrono::milliseconds timeout, std::string self_task, caf::io::middleman_actor mm) {
  self->state.agents.resize(ps.size());
  self->state.pending.resize(ps.size());
  self->state.reaching.resize(ps.size());
  // Answers everything that waits for ps task i's reach.
  auto reached = [=](std::size_t i, caf::error e) {
    auto waiting = std::move(self->state.reaching[i]);
    self->state.reaching[i].clear();
    for (auto& rp : waiting) {
      if (e) {
        rp.deliver(e);
      } else {
        rp.deliver(true);
      }
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    auto& st = self->state;
    for (std::size_t p = 0; p < st.agents.size(); ++p) {
      if (!st.agents[p] || st.agents[p].address() != d.source) continue;
      st.agents[p] = caf::actor{};
      auto lost = runtime_error("ps task " + ps[p].task + " is lost (" + self->system().render(d.reason) + ")");
      for (auto& entry : st.pending[p]) entry.second.deliver(lost);
      st.pending[p].clear();
    }
  });
  // Sends `msg` to ps task p's agent and answers the promise once, with a Reply or an error.
  auto forward = [=](std::int32_t p, caf::message msg, auto reply_tag) -> caf::response_promise {
    using Reply = typename decltype(reply_tag)::type;
    auto& st = self->state;
    auto rp = self->make_response_promise();
    const auto i = static_cast<std::size_t>(p);
    if (st.cancelled) {
      rp.deliver(runtime_error(*st.cancelled));
      return rp;
    }
    if (p < 0 || i >= st.agents.size()) {
      rp.deliver(runtime_error("ps task " + std::to_string(p) + " is not in the cluster"));
      return rp;
    }
    if (!st.agents[i]) {
      rp.deliver(runtime_error("ps task " + ps[i].task + " is not connected (lost, or not reached yet)"));
      return rp;
    }
    const auto token = ++st.next;
    st.pending[i].emplace(token, rp);
    auto take = [=]() -> std::optional<caf::response_promise> {
      auto& pend = self->state.pending[i];
      auto it = pend.find(token);
      if (it == pend.end()) return std::nullopt;  // answered already (its ps task was lost)
      auto out = it->second;
      pend.erase(it);
      return out;
    };
    self->request(st.agents[i], timeout, std::move(msg))
        .then(
            [=](Reply& reply) {
              if (auto promise = take()) promise->deliver(std::move(reply));
            },
            [=](caf::error& e) {
              if (auto promise = take()) promise->deliver(std::move(e));
            });
    return rp;
  };
  return {
      [=](wup_atom, std::int32_t p, const caf::actor& agent) -> bool {
        self->state.agents.at(static_cast<std::size_t>(p)) = agent;
        self->monitor(agent);
        return true;
      },
      [=](reach_atom, std::int32_t p) -> caf::result<bool> {
        // Connects to ps task p and says hello (once, however many ask at a time), as reach()
        // does, but without blocking: a cancel answers the waiting at once.
        auto& st = self->state;
        const auto i = static_cast<std::size_t>(p);
        if (st.cancelled) return runtime_error(*st.cancelled);
        if (p < 0 || i >= st.agents.size()) return runtime_error("ps task " + std::to_string(p) + " is not in the cluster");
        if (st.agents[i]) return true;
        auto rp = self->make_response_promise();
        st.reaching[i].push_back(rp);
        if (st.reaching[i].size() > 1) return rp;
        const auto& t = ps[i];
        self->request(mm, timeout, caf::connect_atom::value, t.host, t.port)
            .then(
                [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
                  if (self->state.cancelled) return;
                  if (!ptr) {
                    reached(i, caf::make_error(caf::sec::no_actor_published_at_port,
                                               "no actor published at " + address_of(t.host, t.port)));
                    return;
                  }
                  auto agent = caf::actor_cast<caf::actor>(std::move(ptr));
                  self->request(agent, timeout, hello_atom::value, self_task, caf::actor_cast<caf::actor>(self))
                      .then(
                          [=](std::string& name, caf::actor& pulse) {
                            if (self->state.cancelled) return;
                            auto wrong = check_hello(t, name, pulse);
                            if (!wrong) {
                              self->state.agents[i] = agent;
                              self->monitor(agent);
                            }
                            reached(i, std::move(wrong));
                          },
                          [=](caf::error& e) {
                            if (!self->state.cancelled) reached(i, std::move(e));
                          });
                },
                [=](caf::error& e) {
                  if (!self->state.cancelled) reached(i, std::move(e));
                });
        return rp;
      },
      [=](cancel_atom, const std::string& why) {
        auto& st = self->state;
        if (st.cancelled) return;
        st.cancelled = why;
        auto e = runtime_error(why);
        for (std::size_t i = 0; i < st.agents.size(); ++i) {
          for (auto& entry : st.pending[i]) entry.second.deliver(e);
          st.pending[i].clear();
          reached(i, e);
        }
      },
      [=](gone_atom, std::int32_t p, const std::string& reason) {
        // Its connection is still open but it stopped answering: what waits on it fails now.
        auto& st = self->state;
        const auto i = static_cast<std::size_t>(p);
        if (p < 0 || i >= st.agents.size()) return;
        st.agents[i] = caf::actor{};
        auto lost = runtime_error("ps task " + ps[i].task + " is lost (" + reason + ")");
        for (auto& entry : st.pending[i]) entry.second.deliver(lost);
        st.pending[i].clear();
      },
      [=](vread_atom, std::int32_t p, const std::string& key) -> caf::result<std::string> {
        return forward(p, caf::make_message(vread_atom::value, key), type_tag<std::string>{});
      },
      [=](data_atom, std::int32_t p) -> caf::result<std::string> {
        return forward(p, caf::make_message(data_atom::value), type_tag<std::string>{});
      },
      [=](vnew_atom, std::int32_t p, const std::string& key, std::string& bytes) -> caf::result<bool> {
        return forward(p, caf::make_message(vnew_atom::value, key, std::move(bytes)), type_tag<bool>{});
      },
      [=](vupdate_atom, std::int32_t p, const std::string& key, std::uint8_t op,
          std::string& delta) -> caf::result<bool> {
        return forward(p, caf::make_message(vupdate_atom::value, key, op, std::move(delta)), type_tag<bool>{});
      },
  };
}

}  // namespace

// --- dispatcher -------------------------------------------------------------------------------

struct dispatcher::impl {
  caf::actor_system* system = nullptr;
  dispatcher_options options;
  std::unique_ptr<control_gate> gate;  // every connection to the tasks
  std::function<void(closure_outcome)> on_done;
  std::function<void(const std::string&, const std::string&)> on_ps_lost;
  std::function<void(const std::string&)> log;
  caf::actor actor;
  caf::actor router;  // the chief's own requests to the ps tasks, failed at once when one is lost
  std::vector<caf::actor> ps;
  std::vector<caf::actor> ps_pulse;  // what answers each ps task's heartbeats
  std::unique_ptr<std::atomic<bool>[]> connected;  // by worker: set by the connector, cleared on loss
  std::atomic<std::uint64_t> retried{0};
  std::atomic<std::uint64_t> lost{0};
  std::atomic<int> up{0};
  std::atomic<std::int64_t> connect_retry_ms{200};
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread connector;

  void say(const std::string& line) {
    if (log) log(line);
  }
};

namespace {

struct closure_record {
  std::string function;
  std::string args;
};

struct dispatch_actor_state {
  std::optional<dispatch_state> rules;
  std::optional<heartbeat_state> worker_beats;
  std::optional<heartbeat_state> ps_beats;
  std::vector<caf::actor> workers;
  std::vector<caf::actor> worker_pulses;
  std::unordered_map<std::uint64_t, closure_record> closures;
  std::string table;
  bool has_table = false;
  bool leaving = false;  // the chief is done: tasks that stop now are no loss
  // TensorFlow's rules after a closure failed (its ClosureQueue): from the failure until the
  // coordinator raises it, a closure whose worker is lost is cancelled, not run again; while the
  // coordinator raises it, everything queued is cancelled and closures in flight finish.
  bool failed = false;
  bool cancelling = false;
  std::chrono::milliseconds heartbeat_interval{500};
  int missed_heartbeats = 6;
};

caf::behavior dispatch_actor(caf::stateful_actor<dispatch_actor_state>* self, std::shared_ptr<dispatcher::impl> d) {
  const int n = static_cast<int>(d->options.workers.size());
  self->state.rules.emplace(n, d->options.window);
  self->state.heartbeat_interval = d->options.heartbeat_interval;
  self->state.missed_heartbeats = d->options.missed_heartbeats;
  self->state.worker_beats.emplace(n, d->options.heartbeat_interval, d->options.missed_heartbeats);
  self->state.ps_beats.emplace(static_cast<int>(d->options.ps.size()), d->options.heartbeat_interval,
                               d->options.missed_heartbeats);
  self->state.workers.assign(static_cast<std::size_t>(n), caf::actor{});
  self->state.worker_pulses.assign(static_cast<std::size_t>(n), caf::actor{});
  const auto silence = [=] {
    return "it missed " + std::to_string(self->state.missed_heartbeats) + " heartbeats of " +
           std::to_string(self->state.heartbeat_interval.count()) + " ms (stopped or hung?)";
  };
  auto cancel = [=](const std::vector<std::uint64_t>& ids) {
    for (auto id : ids) {
      if (self->state.closures.erase(id) == 1) d->on_done(closure_outcome{id, false, {}, {}, true});
    }
  };
  // A lost worker's closures in flight: run again elsewhere, or cancelled after a failure.
  auto lose_worker = [=](int w) {
    auto& st = self->state;
    const bool requeue = !st.failed && !st.cancelling;
    auto back = st.rules->on_worker_lost(w, requeue);
    if (requeue) {
      d->retried += back.size();
    } else {
      cancel(back);
    }
    d->lost = st.rules->workers_lost();
    d->up = st.rules->workers_up();
    return std::to_string(back.size()) +
           (requeue ? " closure(s) in flight go to other workers" : " closure(s) in flight cancelled (a closure failed)");
  };
  auto pump = [=] {
    auto& st = self->state;
    if (st.cancelling) cancel(st.rules->cancel_queued());
    for (auto [w, id] : st.rules->assign()) {
      auto it = st.closures.find(id);
      if (it == st.closures.end()) continue;
      self->send(st.workers[static_cast<std::size_t>(w)], call_atom::value, id, it->second.function,
                 it->second.args);
    }
  };
  auto worker_of = [=](const caf::actor_addr& a) {
    const auto& ws = self->state.workers;
    for (std::size_t w = 0; w < ws.size(); ++w) {
      if (ws[w] && ws[w].address() == a) return static_cast<int>(w);
    }
    return -1;
  };
  self->set_down_handler([=](caf::down_msg& m) {
    auto& st = self->state;
    if (st.leaving) return;
    for (std::size_t p = 0; p < d->ps.size(); ++p) {
      if (d->ps[p].address() == m.source) {
        d->on_ps_lost(d->options.ps[p].task, "its connection closed (" + self->system().render(m.reason) + ")");
        return;
      }
    }
    const int w = worker_of(m.source);
    if (w < 0) return;
    const auto what = lose_worker(w);
    st.workers[static_cast<std::size_t>(w)] = caf::actor{};
    st.worker_pulses[static_cast<std::size_t>(w)] = caf::actor{};
    st.worker_beats->forget(w);
    d->connected[static_cast<std::size_t>(w)] = false;
    d->say("lost " + d->options.workers[static_cast<std::size_t>(w)].task + " (" + self->system().render(m.reason) +
           "); " + what);
    d->wake.notify_all();
    pump();
  });
  auto beat_worker = [=](std::size_t w) {
    auto pulse = self->state.worker_pulses[w];
    if (!pulse) return;
    self->request(pulse, self->state.worker_beats->limit(), beat_atom::value,
                  static_cast<std::int64_t>(self->state.heartbeat_interval.count()),
                  static_cast<std::int32_t>(self->state.missed_heartbeats))
        .then(
            [=](bool) {
              auto& st = self->state;
              if (st.leaving || st.worker_pulses[w] != pulse) return;  // a newer connection
              if (!st.worker_beats->beat(static_cast<int>(w), heartbeat_state::clock::now())) return;
              st.rules->on_worker_up(static_cast<int>(w));
              d->up = st.rules->workers_up();
              d->say(d->options.workers[w].task + " answers again; it takes closures again");
              pump();
            },
            [](caf::error&) {});
  };
  return {
      [=](sched_atom, std::uint64_t id, std::string& function, std::string& args) {
        auto& st = self->state;
        st.closures.emplace(id, closure_record{std::move(function), std::move(args)});
        st.rules->enqueue(id);
        pump();
      },
      [=](wup_atom, std::int32_t w, const caf::actor& agent, const caf::actor& pulse) {
        auto& st = self->state;
        st.workers[static_cast<std::size_t>(w)] = agent;
        st.worker_pulses[static_cast<std::size_t>(w)] = pulse;
        st.worker_beats->watch(w, heartbeat_state::clock::now());
        beat_worker(static_cast<std::size_t>(w));  // says the settings to it at once
        self->monitor(agent);
        if (st.has_table) self->send(agent, table_atom::value, st.table);
        st.rules->on_worker_up(w);
        d->up = st.rules->workers_up();
        pump();
      },
      [=](table_atom, std::string& blob) {
        auto& st = self->state;
        st.table = std::move(blob);
        st.has_table = true;
        for (const auto& w : st.workers) {
          if (w) self->send(w, table_atom::value, st.table);
        }
      },
      [=](result_atom, std::uint64_t id, bool ok, std::string& payload) {
        auto& st = self->state;
        const int w = worker_of(caf::actor_cast<caf::actor_addr>(self->current_sender()));
        if (w < 0 || !st.rules->on_finished(w, id)) return;  // stale: that closure ran elsewhere
        auto it = st.closures.find(id);
        if (it == st.closures.end()) return;
        st.closures.erase(it);
        if (!ok) st.failed = true;
        d->on_done(closure_outcome{id, ok, std::move(payload), d->options.workers[static_cast<std::size_t>(w)].task});
        pump();
      },
      [=](window_atom, std::int32_t window) {
        self->state.rules->set_window(window);
        pump();
      },
      [=](cancel_atom) -> bool {
        auto& st = self->state;
        st.failed = false;  // being raised now: what fails from here on is a new error
        st.cancelling = true;
        pump();
        // Closures handed to a worker that has not started them are queued too (a TensorFlow
        // worker takes one closure at a time): each worker drops them and says which.
        for (std::size_t w = 0; w < st.workers.size(); ++w) {
          auto worker = st.workers[w];
          if (!worker) continue;
          self->request(worker, std::chrono::seconds(10), cancel_atom::value)
              .then(
                  [=](const std::string& ids) {
                    auto& st = self->state;
                    if (st.workers[w] != worker) return;  // lost meanwhile: lose_worker settled them
                    std::vector<std::uint64_t> dropped;
                    for (std::size_t at = 0; at + 8 <= ids.size(); at += 8) {
                      std::uint64_t id = 0;
                      for (int b = 0; b < 8; ++b) id |= std::uint64_t{static_cast<unsigned char>(ids[at + b])} << (8 * b);
                      // Only what that worker holds: a stale or made-up id changes nothing.
                      if (st.rules->on_finished(static_cast<int>(w), id)) dropped.push_back(id);
                    }
                    cancel(dropped);
                    pump();
                  },
                  [](caf::error&) {});  // they run and finish as usual
        }
        return true;
      },
      [=](resume_atom) {
        self->state.cancelling = false;
        pump();
      },
      [=](hbset_atom, std::int64_t interval_ms, std::int32_t missed) {
        // New settings: every peer watched so far starts a fresh limit under them.
        auto& st = self->state;
        st.heartbeat_interval = std::chrono::milliseconds(interval_ms);
        st.missed_heartbeats = missed;
        const auto now = heartbeat_state::clock::now();
        auto renew = [&](std::optional<heartbeat_state>& beats) {
          const int peers = static_cast<int>(beats->peers());
          std::vector<bool> watched;
          // An overdue peer is watched again too, so that it is taken back when it answers.
          for (int p = 0; p < peers; ++p) watched.push_back(beats->watched(p));
          beats.emplace(peers, st.heartbeat_interval, missed);
          for (int p = 0; p < peers; ++p) {
            if (watched[static_cast<std::size_t>(p)]) beats->watch(p, now);
          }
        };
        renew(st.worker_beats);
        renew(st.ps_beats);
      },
      [=](watch_ps_atom) -> bool {
        for (const auto& p : d->ps) self->monitor(p);
        const auto now = heartbeat_state::clock::now();
        for (std::size_t p = 0; p < d->ps.size(); ++p) self->state.ps_beats->watch(static_cast<int>(p), now);
        self->send(self, tick_atom::value);
        return true;
      },
      [=](tick_atom) {
        // Beats every task, then names those silent too long: a worker is lost (its closures go
        // to the others) until it answers again; a ps task fails the coordinator.
        auto& st = self->state;
        if (st.leaving) return;
        const auto interval = static_cast<std::int64_t>(st.heartbeat_interval.count());
        const auto missed = static_cast<std::int32_t>(st.missed_heartbeats);
        const auto wait = st.worker_beats->limit();
        for (std::size_t w = 0; w < st.worker_pulses.size(); ++w) beat_worker(w);
        for (std::size_t p = 0; p < d->ps_pulse.size(); ++p) {
          self->request(d->ps_pulse[p], wait, beat_atom::value, interval, missed)
              .then([=](bool) { self->state.ps_beats->beat(static_cast<int>(p), heartbeat_state::clock::now()); },
                    [](caf::error&) {});
        }
        const auto now = heartbeat_state::clock::now();
        for (int w : st.worker_beats->overdue(now)) {
          const auto what = lose_worker(w);
          d->say("lost " + d->options.workers[static_cast<std::size_t>(w)].task + " (" + silence() + "); " + what +
                 "; it is taken back when it answers again");
        }
        for (int p : st.ps_beats->overdue(now)) {
          const auto& task = d->options.ps[static_cast<std::size_t>(p)].task;
          d->say("lost " + task + " (" + silence() + ")");
          self->send(d->router, gone_atom::value, static_cast<std::int32_t>(p), silence());
          d->on_ps_lost(task, silence());
        }
        pump();
        self->delayed_send(self, st.heartbeat_interval, tick_atom::value);
      },
      [=](leave_atom) -> bool {
        self->state.leaving = true;
        for (const auto& w : self->state.workers) {
          if (w) self->send(w, leave_atom::value);
        }
        for (const auto& p : d->ps) self->send(p, leave_atom::value);
        return true;
      },
  };
}

// One attempt to reach a task and hear its name: its agent and the actor that answers its
// heartbeats, or why not.
struct reached_task {
  caf::actor agent;
  caf::actor pulse;
};

caf::expected<reached_task> reach(caf::actor_system& system, const task_endpoint& t, const std::string& self_task,
                                  const caf::actor& watch, const control_gate& gate, std::chrono::milliseconds wait) {
  auto found = connect(system, gate, t.host, t.port, wait);
  if (!found) return found.error();
  caf::scoped_actor self{system};
  caf::error failed;
  std::string name;
  caf::actor pulse;
  self->request(*found, wait, hello_atom::value, self_task, watch)
      .receive(
          [&](std::string& n, caf::actor& p) {
            name = std::move(n);
            pulse = std::move(p);
          },
          [&](caf::error& e) { failed = std::move(e); });
  if (failed) return failed;
  if (auto wrong = check_hello(t, name, pulse)) return wrong;
  return reached_task{*found, std::move(pulse)};
}

// Says (leave, chief, worker) to each worker the chief never reached, once, as it leaves: such a worker
// may have come up since the last try, and would otherwise wait for a chief until its start
// timeout. Workers that answered no try promptly (a host that drops the connection attempts) are
// skipped, so leaving never waits on them.
void say_goodbye(const std::shared_ptr<dispatcher::impl>& d, const std::vector<bool>& reached,
                 const std::vector<bool>& prompt) {
  for (std::size_t w = 0; w < d->options.workers.size(); ++w) {
    if (reached[w] || !prompt[w]) continue;
    const auto& t = d->options.workers[w];
    auto agent = connect(*d->system, *d->gate, t.host, t.port, std::chrono::seconds(2));
    if (!agent) continue;  // still down: its start timeout ends it
    caf::scoped_actor self{*d->system};
    bool told = false;
    self->request(*agent, std::chrono::seconds(2), leave_atom::value, d->options.task, t.task)
        .receive([&](bool taken) { told = taken; }, [](caf::error&) {});
    if (told) d->say("told " + t.task + " that the chief leaves (it was not reached before)");
  }
}

void run_connector(std::shared_ptr<dispatcher::impl> d) {
  const bool tls = d->options.credentials != nullptr;
  const std::size_t n = d->options.workers.size();
  std::vector<bool> complained(n, false);
  std::vector<bool> reached(n, false);  // said hello at least once
  std::vector<bool> prompt(n, true);    // the last try failed (or succeeded) within a second
  auto stopping = [&] {
    std::lock_guard<std::mutex> lock(d->mutex);
    return d->stopping;
  };
  for (;;) {
    for (std::size_t w = 0; w < n; ++w) {
      if (stopping()) return say_goodbye(d, reached, prompt);
      if (d->connected[w]) continue;
      const auto& t = d->options.workers[w];
      const auto began = std::chrono::steady_clock::now();
      auto agent = reach(*d->system, t, d->options.task, d->actor, *d->gate, std::chrono::seconds(5));
      prompt[w] = std::chrono::steady_clock::now() - began < std::chrono::seconds(1);
      if (agent) {
        d->connected[w] = true;
        reached[w] = true;
        complained[w] = false;
        d->say("connected " + t.task + " at " + address_of(t.host, t.port));
        caf::anon_send(d->actor, wup_atom::value, static_cast<std::int32_t>(w), agent->agent, agent->pulse);
      } else if (!complained[w]) {
        complained[w] = true;
        d->say("cannot reach " + t.task + " at " + address_of(t.host, t.port) + ": " +
               error_text(*d->system, agent.error()) +
               (tls ? " (a task with another TROUPE_CLUSTER_TOKEN is refused the same way)" : "") +
               "; trying again every " + std::to_string(d->connect_retry_ms.load()) + " ms");
      }
    }
    std::unique_lock<std::mutex> lock(d->mutex);
    d->wake.wait_for(lock, std::chrono::milliseconds(d->connect_retry_ms.load()), [&] { return d->stopping; });
    if (d->stopping) {
      lock.unlock();
      return say_goodbye(d, reached, prompt);
    }
  }
}

}  // namespace

dispatcher::dispatcher(caf::actor_system& system, dispatcher_options options,
                       std::function<void(closure_outcome)> on_done,
                       std::function<void(const std::string&, const std::string&)> on_ps_lost,
                       std::function<void(const std::string&)> log)
    : impl_(std::make_shared<impl>()) {
  auto& d = *impl_;
  d.system = &system;
  d.options = std::move(options);
  if (d.options.heartbeat_interval.count() < 1 || d.options.missed_heartbeats < 1) {
    throw std::invalid_argument("ParameterServerStrategy: heartbeat_interval " +
                                std::to_string(d.options.heartbeat_interval.count()) + " ms and missed_heartbeats " +
                                std::to_string(d.options.missed_heartbeats) + " (expected both >= 1)");
  }
  d.on_done = std::move(on_done);
  d.on_ps_lost = std::move(on_ps_lost);
  d.log = std::move(log);
  d.connect_retry_ms = d.options.connect_retry.count();
  d.connected = std::make_unique<std::atomic<bool>[]>(d.options.workers.size());
  for (std::size_t w = 0; w < d.options.workers.size(); ++w) d.connected[w] = false;
  d.gate = std::make_unique<control_gate>(system, d.options.credentials != nullptr, gate_limits::for_tasks());
  // The ps tasks hold the variables: without every one of them there is nothing to train.
  d.actor = system.spawn(dispatch_actor, impl_);
  const auto deadline = std::chrono::steady_clock::now() + d.options.ps_timeout;
  for (const auto& p : d.options.ps) {
    for (;;) {
      // Each try bounded by what is left (at least 500 ms): a ps task that accepts and never
      // answers must not outlast ps_timeout.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto wait = std::clamp(left, std::chrono::milliseconds(500), std::chrono::milliseconds(5000));
      auto agent = reach(system, p, d.options.task, d.actor, *d.gate, wait);
      if (agent) {
        d.ps.push_back(agent->agent);
        d.ps_pulse.push_back(agent->pulse);
        d.say("connected " + p.task + " at " + address_of(p.host, p.port));
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        caf::anon_send_exit(d.actor, caf::exit_reason::user_shutdown);
        throw std::runtime_error("ParameterServerStrategy: cannot reach ps task " + p.task + " at " +
                                 address_of(p.host, p.port) + " within " +
                                 std::to_string(d.options.ps_timeout.count()) +
                                 " ms: " + error_text(system, agent.error()) +
                                 (d.options.credentials ? " (is TROUPE_CLUSTER_TOKEN the same on every task?)" : ""));
      }
      std::this_thread::sleep_for(d.options.connect_retry);
    }
  }
  d.router = system.spawn(shard_router, d.options.ps, d.options.ps_timeout, d.options.task, d.gate->actor());
  {
    caf::scoped_actor self{system};
    self->request(d.actor, std::chrono::seconds(5), watch_ps_atom::value).receive([](bool) {}, [](caf::error&) {});
    for (std::size_t p = 0; p < d.ps.size(); ++p) {
      self->request(d.router, std::chrono::seconds(5), wup_atom::value, static_cast<std::int32_t>(p), d.ps[p])
          .receive([](bool) {}, [](caf::error&) {});
    }
  }
  d.connector = std::thread(run_connector, impl_);
}

dispatcher::~dispatcher() {
  auto& d = *impl_;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.stopping = true;
  }
  d.wake.notify_all();
  if (d.connector.joinable()) d.connector.join();
  {
    caf::scoped_actor self{*d.system};
    self->request(d.actor, std::chrono::seconds(5), leave_atom::value).receive([](bool) {}, [](caf::error&) {});
    self->send_exit(d.actor, caf::exit_reason::user_shutdown);
    self->send_exit(d.router, caf::exit_reason::user_shutdown);
  }
}

void dispatcher::configure(int window, std::chrono::milliseconds connect_retry) {
  if (window < 1) throw std::invalid_argument("dispatcher: window " + std::to_string(window) + " (expected >= 1)");
  impl_->connect_retry_ms = connect_retry.count();
  caf::anon_send(impl_->actor, window_atom::value, static_cast<std::int32_t>(window));
}

void dispatcher::set_heartbeat(std::chrono::milliseconds interval, int missed) {
  if (interval.count() < 1 || missed < 1) {
    throw std::invalid_argument("dispatcher: heartbeat_interval " + std::to_string(interval.count()) +
                                " ms and missed_heartbeats " + std::to_string(missed) + " (expected both >= 1)");
  }
  caf::anon_send(impl_->actor, hbset_atom::value, static_cast<std::int64_t>(interval.count()),
                 static_cast<std::int32_t>(missed));
}

void dispatcher::cancel_queued() {
  caf::scoped_actor self{*impl_->system};
  self->request(impl_->actor, std::chrono::seconds(5), cancel_atom::value).receive([](bool) {}, [](caf::error&) {});
}

void dispatcher::resume() { caf::anon_send(impl_->actor, resume_atom::value); }

void dispatcher::schedule(std::uint64_t id, std::string function, std::string args) {
  caf::anon_send(impl_->actor, sched_atom::value, id, std::move(function), std::move(args));
}

void dispatcher::set_table(std::string blob) { caf::anon_send(impl_->actor, table_atom::value, std::move(blob)); }

namespace {

// Sends one request per shard to the router at once (`make` builds each message), then takes the
// answers in order (`take` gets the i-th reply); once all are in, throws for the first failure.
template <class Reply, class Make, class Take>
void all_shards(dispatcher::impl& d, std::size_t n, std::chrono::milliseconds timeout, const char* what,
                const std::function<const dispatcher::shard_op&(std::size_t)>& shard, Make make, Take take) {
  caf::scoped_actor self{*d.system};
  using handle = decltype(self->request(d.router, timeout, make(std::size_t{0})));
  std::vector<handle> pending;
  pending.reserve(n);
  for (std::size_t i = 0; i < n; ++i) pending.push_back(self->request(d.router, timeout + std::chrono::seconds(5), make(i)));
  std::size_t bad = n;
  std::string failed;
  for (std::size_t i = 0; i < n; ++i) {
    pending[i].receive([&](Reply& r) { take(i, r); },
                       [&](caf::error& e) {
                         if (bad == n) {
                           bad = i;
                           failed = error_text(*d.system, e);
                         }
                       });
  }
  if (bad == n) return;
  const auto& s = shard(bad);
  throw std::runtime_error(std::string("ParameterServerStrategy: cannot ") + what + " variable shard '" + s.key +
                           "' on ps task " + d.options.ps.at(static_cast<std::size_t>(s.ps)).task + ": " + failed);
}

}  // namespace

void dispatcher::create_shards(std::vector<shard_op> shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));  // a ps task of the cluster
  all_shards<bool>(
      d, shards.size(), timeout, "create", [&](std::size_t i) -> const shard_op& { return shards[i]; },
      [&](std::size_t i) {
        return caf::make_message(vnew_atom::value, static_cast<std::int32_t>(shards[i].ps), shards[i].key,
                                 std::move(shards[i].bytes));
      },
      [](std::size_t, bool) {});
}

std::vector<std::string> dispatcher::read_shards(const std::vector<shard_op>& shards, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : shards) d.options.ps.at(static_cast<std::size_t>(s.ps));
  std::vector<std::string> out(shards.size());
  all_shards<std::string>(
      d, shards.size(), timeout, "read", [&](std::size_t i) -> const shard_op& { return shards[i]; },
      [&](std::size_t i) {
        return caf::make_message(vread_atom::value, static_cast<std::int32_t>(shards[i].ps), shards[i].key);
      },
      [&](std::size_t i, std::string& bytes) { out[i] = std::move(bytes); });
  return out;
}

void dispatcher::update_shards(std::vector<shard_op> updates, std::chrono::milliseconds timeout) {
  auto& d = *impl_;
  for (const auto& s : updates) d.options.ps.at(static_cast<std::size_t>(s.ps));
  all_shards<bool>(
      d, updates.size(), timeout, "update", [&](std::size_t i) -> const shard_op& { return updates[i]; },
      [&](std::size_t i) {
        return caf::make_message(vupdate_atom::value, static_cast<std::int32_t>(updates[i].ps), updates[i].key,
                                 updates[i].op, std::move(updates[i].bytes));
      },
      [](std::size_t, bool) {});
}

std::uint64_t dispatcher::retried() const { return impl_->retried; }
std::uint64_t dispatcher::workers_lost() const { return impl_->lost; }
int dispatcher::workers_up() const { return impl_->up; }

// --- shard_client -----------------------------------------------------------------------------

struct shard_client::impl {
  caf::actor_system* system = nullptr;
  std::string task;
  std::vector<task_endpoint> ps;
  std::shared_ptr<control_credentials> credentials;
  std::chrono::milliseconds timeout{0};
  std::mutex mutex;
  std::vector<bool> reached;  // by ps task: the router holds its agent (as far as we know)
  std::unique_ptr<control_gate> gate;  // every connection to the ps tasks
  caf::actor router;  // also what the ps agents watch: it lives as long as this client

  // Per ps task, its data connection (made on first use, dropped after any failure).
  struct data_link {
    std::mutex mutex;
    std::unique_ptr<transport::bulk_stream> stream;
  };
  std::vector<std::unique_ptr<data_link>> links;
  // Guards every change of a link's stream and `cancelled`, so that cancel() can wake a stream
  // whose link mutex a blocked function holds.
  std::mutex streams_mutex;
  std::optional<std::string> cancelled;

  // After a failure on the data connections of `used` (their mutexes held): each is made again next
  // time. The control connection stays: the router knows when its ps task is lost, and says so
  // at once when the data port is asked for again.
  void drop(const std::set<int>& used) {
    std::lock_guard<std::mutex> lock(streams_mutex);
    for (int p : used) links[static_cast<std::size_t>(p)]->stream.reset();
  }

  // Ps task p's data connection, with links[p]'s mutex held.
  transport::bulk_stream& data(int p) {
    auto& link = *links[static_cast<std::size_t>(p)];
    if (link.stream) return *link.stream;
    connect(p);
    const auto& t = ps[static_cast<std::size_t>(p)];
    // Through the router, which answers at once when the ps task is lost meanwhile.
    std::string answer;
    std::string failed;
    caf::scoped_actor self{*system};
    self->request(router, timeout + std::chrono::seconds(5), data_atom::value, static_cast<std::int32_t>(p))
        .receive([&](std::string& a) { answer = std::move(a); },
                 [&](caf::error& e) { failed = error_text(*system, e); });
    if (failed.empty() && answer.size() < 3) failed = "a malformed answer of " + std::to_string(answer.size()) + " bytes";
    if (!failed.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      reached[static_cast<std::size_t>(p)] = false;  // reached again next time
      throw std::runtime_error("ps task " + t.task + " gave no data port: " + failed);
    }
    const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(answer[0]) |
                                                 static_cast<unsigned char>(answer[1]) << 8);
    std::string secret = answer.substr(2);
    transport::ring_auth auth{credentials ? credentials->token() : std::string(), std::move(secret)};
    auto stream = transport::bulk_stream::connect(transport::endpoint{t.host, port}, auth, timeout, "ps task " + t.task);
    std::lock_guard<std::mutex> lock(streams_mutex);
    if (cancelled) throw std::runtime_error(*cancelled);
    link.stream = std::move(stream);
    return *link.stream;
  }

  // Reaches ps task p on first use (and again after it was lost), through the router.
  void connect(int p) {
    const auto i = static_cast<std::size_t>(p);
    if (p < 0 || i >= ps.size()) {
      throw std::out_of_range("variable shard on ps task " + std::to_string(p) + ", but the cluster has " +
                              std::to_string(ps.size()) + " ps task(s)");
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (reached[i]) return;
    }
    std::string failed;
    caf::scoped_actor self{*system};
    // The router bounds the connect and the hello by the timeout each.
    self->request(router, 2 * timeout + std::chrono::seconds(5), reach_atom::value, static_cast<std::int32_t>(p))
        .receive([](bool) {}, [&](caf::error& e) { failed = error_text(*system, e); });
    if (!failed.empty()) {
      throw std::runtime_error(task + " cannot reach ps task " + ps[i].task + " at " +
                               address_of(ps[i].host, ps[i].port) + ": " + failed);
    }
    std::lock_guard<std::mutex> lock(mutex);
    reached[i] = true;
  }

  [[noreturn]] void fail(int p, const std::string& what, const caf::error& e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      reached[static_cast<std::size_t>(p)] = false;  // asks the router again next time
    }
    throw std::runtime_error(what + " on ps task " + ps[static_cast<std::size_t>(p)].task + " failed: " +
                             error_text(*system, e));
  }
};

shard_client::shard_client(caf::actor_system& system, std::string task, std::vector<task_endpoint> ps,
                           std::shared_ptr<control_credentials> credentials, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.system = &system;
  s.task = std::move(task);
  s.ps = std::move(ps);
  s.timeout = timeout;
  s.reached.assign(s.ps.size(), false);
  for (std::size_t p = 0; p < s.ps.size(); ++p) s.links.push_back(std::make_unique<impl::data_link>());
  s.credentials = std::move(credentials);
  s.gate = std::make_unique<control_gate>(system, s.credentials != nullptr, gate_limits::for_tasks());
  s.router = system.spawn(shard_router, s.ps, timeout, s.task, s.gate->actor());
}

shard_client::~shard_client() { caf::anon_send_exit(impl_->router, caf::exit_reason::user_shutdown); }

void shard_client::cancel(const std::string& why) {
  auto& c = *impl_;
  caf::anon_send(c.router, cancel_atom::value, why);
  std::lock_guard<std::mutex> lock(c.streams_mutex);
  if (c.cancelled) return;
  c.cancelled = why;
  for (auto& link : c.links) {
    if (link->stream) link->stream->shutdown();
  }
}

std::string shard_client::read(int ps, const std::string& key) { return std::move(read_many({{ps, key}}).at(0)); }

void shard_client::update(int ps, const std::string& key, std::uint8_t op, std::string delta) {
  std::vector<shard_update> one;
  one.push_back(shard_update{ps, key, op, std::move(delta)});
  update_many(std::move(one));
}

std::vector<std::string> shard_client::read_many(const std::vector<std::pair<int, std::string>>& shards) {
  for (const auto& s : shards) impl_->connect(s.first);
  caf::scoped_actor self{*impl_->system};
  // Every request leaves at once; the answers are taken in order (a blocking receive keeps the
  // others in the mailbox). The router answers within its own timeout; the margin covers the hop.
  const auto wait = impl_->timeout + std::chrono::seconds(5);
  using handle = decltype(self->request(impl_->router, wait, vread_atom::value, std::int32_t{0}, std::string{}));
  std::vector<handle> pending;
  pending.reserve(shards.size());
  for (const auto& s : shards) {
    pending.push_back(self->request(impl_->router, wait, vread_atom::value, static_cast<std::int32_t>(s.first), s.second));
  }
  std::vector<std::string> out(shards.size());
  std::size_t bad = shards.size();
  caf::error failed;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].receive([&](std::string& bytes) { out[i] = std::move(bytes); },
                       [&](caf::error& e) {
                         if (bad == shards.size()) {
                           bad = i;
                           failed = std::move(e);
                         }
                       });
  }
  if (bad != shards.size()) impl_->fail(shards[bad].first, "reading variable shard '" + shards[bad].second + "'", failed);
  return out;
}

void shard_client::update_many(std::vector<shard_update> updates) {
  for (const auto& u : updates) impl_->connect(u.ps);
  caf::scoped_actor self{*impl_->system};
  const auto wait = impl_->timeout + std::chrono::seconds(5);
  using handle = decltype(self->request(impl_->router, wait, vupdate_atom::value, std::int32_t{0}, std::string{},
                                        std::uint8_t{0}, std::string{}));
  std::vector<handle> pending;
  pending.reserve(updates.size());
  for (auto& u : updates) {
    pending.push_back(self->request(impl_->router, wait, vupdate_atom::value, static_cast<std::int32_t>(u.ps), u.key,
                                    u.op, std::move(u.bytes)));
  }
  std::size_t bad = updates.size();
  caf::error failed;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].receive([](bool) {},
                       [&](caf::error& e) {
                         if (bad == updates.size()) {
                           bad = i;
                           failed = std::move(e);
                         }
                       });
  }
  if (bad != updates.size()) impl_->fail(updates[bad].ps, "updating variable shard '" + updates[bad].key + "'", failed);
}

namespace {

// The data links of the ps tasks `used` (ascending), locked in that order for one batch.
std::vector<std::unique_lock<std::mutex>> lock_links(shard_client::impl& c, const std::set<int>& used) {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (int p : used) {
    if (p < 0 || static_cast<std::size_t>(p) >= c.ps.size()) {
      throw std::out_of_range("variable shard on ps task " + std::to_string(p) + ", but the cluster has " +
                              std::to_string(c.ps.size()) + " ps task(s)");
    }
    locks.emplace_back(c.links[static_cast<std::size_t>(p)]->mutex);
  }
  return locks;
}

}  // namespace

namespace {

// One request of a batch on the data connections: what to send, and what its answer carries.
struct data_request {
  int ps = 0;
  transport::bulk_request header;
  const void* data = nullptr;  // all but reads: header.bytes - more_n bytes from here...
  const void* more = nullptr;  // ...then more_n from here
  std::size_t more_n = 0;
  void* into = nullptr;        // reads and gathers: the answer's bytes go here
  std::size_t reply_bytes = 0;
};

data_request request_of(int ps, std::uint8_t kind, std::uint8_t op, std::uint8_t dtype, const std::string& key,
                        std::uint64_t bytes) {
  data_request r;
  r.ps = ps;
  r.header.kind = kind;
  r.header.op = op;
  r.header.dtype = dtype;
  r.header.key = key;
  r.header.bytes = bytes;
  return r;
}

// Sends every request of a batch at once (they are small, or sent from where the data lies), then
// takes the answers in order. Reads and gathers: the first failure ends the batch. Updates and
// scatters: every answer is taken, then the first failure is thrown. Either way the connections
// used are made again next time, and the error names the shard, its ps task and `what` it was.
void data_batch(shard_client::impl& c, const std::vector<data_request>& batch, const char* what) {
  if (batch.empty()) return;
  std::set<int> used;
  for (const auto& r : batch) used.insert(r.ps);
  auto locks = lock_links(c, used);
  const bool fetch = batch.front().header.kind == transport::bulk_request::read ||
                     batch.front().header.kind == transport::bulk_request::gather;
  std::size_t at = 0;
  bool sent = false;
  std::string failed;
  std::size_t failed_at = batch.size();
  try {
    for (; at < batch.size(); ++at) {
      const auto& r = batch[at];
      c.data(r.ps).send_request(r.header, r.data, r.more, r.more_n);
    }
    sent = true;
    for (at = 0; at < batch.size(); ++at) {
      const auto& r = batch[at];
      auto& stream = *c.links[static_cast<std::size_t>(r.ps)]->stream;
      if (fetch) {
        stream.receive_reply(r.reply_bytes);
        stream.receive(r.into, r.reply_bytes);
        continue;
      }
      try {
        stream.receive_reply(0);
      } catch (const std::exception& e) {
        // An error the ps task sent keeps the connection in step: the other answers are taken.
        if (failed_at == batch.size()) {
          failed_at = at;
          failed = e.what();
        }
      }
    }
  } catch (const std::exception& e) {
    failed_at = std::min(at, batch.size() - 1);
    failed = e.what();
  }
  if (failed_at == batch.size()) return;
  c.drop(used);
  const auto& r = batch[failed_at];
  throw std::runtime_error(std::string(fetch && !sent ? "asking for" : what) + " variable shard '" + r.header.key +
                           "' on ps task " + c.ps[static_cast<std::size_t>(r.ps)].task + " failed: " + failed);
}

}  // namespace

void shard_client::read_into(const std::vector<shard_read>& shards) {
  // Each shard's elements are read straight into their place.
  std::vector<data_request> batch;
  for (const auto& s : shards) {
    batch.push_back(request_of(s.ps, transport::bulk_request::read, 0, s.dtype, s.key, s.nbytes));
    batch.back().into = s.into;
    batch.back().reply_bytes = s.nbytes;
  }
  data_batch(*impl_, batch, "reading");
}

void shard_client::update_from(const std::vector<shard_write>& updates) {
  std::vector<data_request> batch;
  for (const auto& u : updates) {
    batch.push_back(request_of(u.ps, transport::bulk_request::update, u.op, u.dtype, u.key, u.nbytes));
    batch.back().data = u.from;
  }
  data_batch(*impl_, batch, "updating");
}

void shard_client::gather_into(const std::vector<shard_gather>& gathers) {
  std::vector<data_request> batch;
  for (const auto& g : gathers) {
    batch.push_back(
        request_of(g.ps, transport::bulk_request::gather, 0, g.dtype, g.key, g.count * sizeof(std::uint64_t)));
    batch.back().data = g.rows;
    batch.back().into = g.into;
    batch.back().reply_bytes = g.count * g.row_bytes;
  }
  data_batch(*impl_, batch, "gathering rows of");
}

void shard_client::scatter_from(const std::vector<shard_scatter>& scatters) {
  std::vector<data_request> batch;
  for (const auto& u : scatters) {
    batch.push_back(request_of(u.ps, transport::bulk_request::scatter, u.op, u.dtype, u.key,
                               u.count * (sizeof(std::uint64_t) + u.row_bytes)));
    batch.back().data = u.rows;  // the indices, then the rows from where they lie
    batch.back().more = u.from;
    batch.back().more_n = u.count * u.row_bytes;
  }
  data_batch(*impl_, batch, "scattering rows into");
}

}  // namespace troupe::actors
