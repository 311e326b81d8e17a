#include "task_agent.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <utility>

#include "app_host.hpp"
#include "caf/io/all.hpp"
#include "protocol.hpp"
#include "task_common.hpp"
#include "troupe/base/quote.hpp"

namespace troupe::actors {

caf::behavior pulse_actor(caf::stateful_actor<pulse_state>* self, std::shared_ptr<const task_handlers> handlers) {
  return {
      [=](beat_atom, std::int64_t interval_ms, std::int32_t missed) -> bool {
        auto& st = self->state;
        const auto now = heartbeat_state::clock::now();
        // Settings from the network: out of the policy's ranges, refused (the chief checked its own).
        const liveness_policy said{std::chrono::milliseconds(interval_ms), missed};
        if (said.problem("the chief")) return false;
        if (!st.chief || !st.chief->watched(0) || st.chief->policy() != said) {
          st.chief.emplace(1, said);
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
        if (!st.chief) st.chief.emplace(1, liveness_policy{});
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

void function_runner::run(const task_handlers& handlers) {
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

namespace {

void event(agent_state& st, const std::string& line) {
  if (st.handlers->event) st.handlers->event(line);
}

// Logs a refusal of the current message's sender: `line` names what was refused, followed by the
// address the sender connected from (when it is another process) and how many such refusals there
// were. `n` counts them; a flood is logged at powers of two only, so that the log stays bounded.
void log_refusal(caf::stateful_actor<agent_state>* self, std::uint64_t n, const std::string& line) {
  auto& st = self->state;
  if ((n & (n - 1)) != 0) return;
  const auto sender = self->current_sender();
  const std::string count = " (" + std::to_string(n) + " refused so far)";
  if (!sender || sender->node() == self->node()) {
    event(st, line + count);
    return;
  }
  auto handlers = st.handlers;
  self->request(self->system().middleman().actor_handle(), std::chrono::seconds(1), caf::get_atom::value,
                sender->node())
      .then(
          [=](const caf::node_id&, const std::string& host, std::uint16_t port) {
            if (!handlers->event) return;
            handlers->event(line + " [connected from " + host + ":" + std::to_string(port) + "]" + count);
          },
          [=](caf::error&) {
            if (handlers->event) handlers->event(line + count);
          });
}

// A checkpoint message from anyone but the chief (the peer that said hello as /job:chief/): it
// would write or overwrite files of the ps task's host, or its variables. Refused, with a line in
// the task's log naming the sender as it said hello (or that it did not) and the address it
// connected from. `what` is "save" or "restore".
caf::error refuse_checkpoint(caf::stateful_actor<agent_state>* self, const std::string& what) {
  auto& st = self->state;
  const std::string why = st.task + " " + what + "s checkpoints for its chief only";
  const auto n = ++st.refused;
  if ((n & (n - 1)) != 0) return runtime_error(why);
  const auto sender = self->current_sender();
  const auto said = st.peers.find(caf::actor_cast<caf::actor_addr>(sender));
  const std::string who = said != st.peers.end() ? base::quoted(said->second)
                          : sender                ? std::string("an actor that did not say hello")
                                                  : std::string("an anonymous sender");
  log_refusal(self, n, "refused a checkpoint " + what + " from " + who + ", which is not its chief");
  return runtime_error(why);
}

// The chief's role (checkpoint saves and restores, the task's end when it leaves) belongs to the
// first process that said hello as /job:chief/ for as long as it is connected: every token holder
// can say it is the chief, but only one process at a time is. A chief's hello from any other
// process meanwhile is refused, named to its sender and logged with its address.
std::optional<caf::error> refuse_second_chief(caf::stateful_actor<agent_state>* self, const std::string& peer) {
  auto& st = self->state;
  if (!st.chief || peer.rfind("/job:chief/", 0) != 0) return std::nullopt;
  const auto sender = self->current_sender();
  if (sender && sender->node() == st.chief.node()) return std::nullopt;  // the chief's own process
  const auto held = st.peers.find(st.chief);
  const std::string chief = held != st.peers.end() ? base::quoted(held->second) : std::string("its chief");
  log_refusal(self, ++st.chiefs_refused,
              "refused a hello as " + base::quoted(peer.substr(0, 200)) + " from another process: " + chief +
                  " holds the chief's role while it is connected");
  return runtime_error(st.task + " already serves " + chief +
                       " from another process; a second chief is refused while the first is connected");
}

}  // namespace

caf::behavior task_agent(caf::stateful_actor<agent_state>* self, std::string task,
                         std::shared_ptr<const task_handlers> handlers, caf::actor pulse,
                         std::shared_ptr<shard_store> store, std::shared_ptr<std::atomic<std::uint16_t>> data_port,
                         std::string data_secret, std::shared_ptr<function_runner> runner,
                         std::shared_ptr<app_data_host> app_data) {
  self->state.task = std::move(task);
  self->state.app_data = std::move(app_data);
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
    auto& st = self->state;
    if (auto it = st.spawned_for.find(d.source); it != st.spawned_for.end()) {  // a hosted actor ended
      auto list = st.hosted.find(it->second);
      if (list != st.hosted.end()) {
        auto& v = list->second;
        v.erase(std::remove_if(v.begin(), v.end(), [&](const caf::actor& a) { return a.address() == d.source; }),
                v.end());
      }
      st.spawned_for.erase(it);
      if (st.app_data) st.app_data->remove(d.source);
      return;
    }
    if (auto it = st.hosted.find(d.source); it != st.hosted.end()) {  // a spawner left or was lost
      for (auto& a : it->second) self->send_exit(a, caf::exit_reason::user_shutdown);
      const std::string who = st.spawners[d.source];
      if (!it->second.empty()) {
        event(st, "the actor spawner " + base::quoted(who) + " is gone: stopping its " +
                      std::to_string(it->second.size()) + " actor(s)");
      }
      st.hosted.erase(it);
      st.spawners.erase(d.source);
      // A chief that only spawned actors here is this task's chief as much as a coordinator's
      // dispatcher: a task serving until its chief leaves ends with it.
      if (who.rfind("/job:chief/", 0) == 0 && !st.chief && st.handlers->chief_gone) st.handlers->chief_gone();
    }
    forget(d.source, "lost");
  });
  self->set_exit_handler([=](caf::exit_msg& m) {
    for (auto& s : self->state.shards) self->send_exit(s.second, m.reason);
    for (auto& h : self->state.hosted) {
      for (auto& a : h.second) self->send_exit(a, m.reason);
    }
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
        if (auto refused = refuse_second_chief(self, peer)) return std::move(*refused);
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
      [=](ckptsave_atom, const std::string& directory, const std::string& file,
          std::int64_t step) -> caf::result<std::uint64_t, std::uint64_t> {
        // A sharded checkpoint's part: only from the chief that said hello over the gated
        // control plane, and only a shard file inside a save in progress.
        auto& st = self->state;
        if (!st.chief || caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.chief) {
          return refuse_checkpoint(self, "save");
        }
        if (!st.handlers->save) return runtime_error(st.task + " holds no variables to save (it is not a ps task)");
        if (auto bad = check_shard_checkpoint_target(directory, file)) return runtime_error(st.task + ": " + *bad);
        std::vector<shard_snapshot> shards;
        {
          std::lock_guard<std::mutex> lock(st.store->mutex);
          for (const auto& [key, cell] : st.store->cells) {
            shard_snapshot snap;
            snap.key = key;
            std::shared_lock<std::shared_mutex> cell_lock(cell->mutex);
            snap.layout = cell->layout;
            snap.value = cell->value;  // shared: an update after this copies (copy on write)
            snap.slots = cell->slots;
            snap.kind = cell->slot_kind;
            snap.applied = cell->applied;
            shards.push_back(std::move(snap));
          }
        }
        std::uint64_t bytes = 0, hash = 0;
        if (auto failed = st.handlers->save(directory + "/" + file, step, shards, bytes, hash)) {
          return runtime_error(st.task + ": " + *failed);
        }
        event(st, "saved " + std::to_string(shards.size()) + " variable shard(s) to " + directory + "/" + file);
        return {bytes, hash};
      },
      [=](ckptload_atom, const std::string& key, const std::string& elements, const std::string& slots,
          std::int64_t applied, std::uint8_t kind) -> caf::result<bool> {
        // A restored shard: its elements, its optimizer's slots and step, each length checked
        // against the shard as it was created.
        auto& st = self->state;
        if (!st.chief || caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.chief) {
          return refuse_checkpoint(self, "restore");
        }
        const std::string what = "variable shard '" + key.substr(0, 64) + "' on " + st.task;
        auto cell = st.store->find(key);
        if (!cell) return runtime_error("no " + what);
        std::optional<shard_optimizer> k;
        if (kind != 0xff) {
          if (kind > static_cast<std::uint8_t>(shard_optimizer::adamw)) {
            return runtime_error(what + ": optimizer " + std::to_string(kind) + " is unknown (expected 0..3, or 255)");
          }
          k = static_cast<shard_optimizer>(kind);
        }
        std::unique_lock<std::shared_mutex> lock(cell->mutex);
        const std::size_t n = cell->layout.nbytes;
        const std::size_t nslots = k ? static_cast<std::size_t>(slot_count(*k)) : 0;
        if (elements.size() != n || slots.size() != nslots * n || applied < 0 || (!k && applied != 0)) {
          return runtime_error(what + " holds " + std::to_string(n) + " bytes; the restore brings " +
                               std::to_string(elements.size()) + " bytes of elements, " + std::to_string(slots.size()) +
                               " of slots (expected " + std::to_string(nslots) + " x " + std::to_string(n) +
                               ") and step " + std::to_string(applied));
        }
        std::memcpy(cell->writable().data() + cell->layout.offset, elements.data(), n);
        cell->slots.clear();
        for (std::size_t i = 0; i < nslots; ++i) cell->slots.push_back(slots.substr(i * n, n));
        cell->slot_kind = k;
        cell->applied = applied;
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
      [=](pstats_atom) -> caf::result<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t> {
        // What the chief's dashboard shows of this task: its shards, the bytes they hold with
        // their optimizer slots, and what they were asked for since it started.
        auto& st = self->state;
        std::int64_t shards = 0, held = 0;
        {
          std::lock_guard<std::mutex> lock(st.store->mutex);
          for (const auto& entry : st.store->cells) {
            shard_cell& cell = *entry.second;
            std::shared_lock<std::shared_mutex> cell_lock(cell.mutex);
            ++shards;
            held += static_cast<std::int64_t>(cell.layout.nbytes);
            for (const auto& slot : cell.slots) held += static_cast<std::int64_t>(slot.size());
          }
        }
        const shard_traffic& t = st.store->traffic;
        return {shards, held, static_cast<std::int64_t>(t.updates.load()), static_cast<std::int64_t>(t.bytes_in.load()),
                static_cast<std::int64_t>(t.bytes_out.load())};
      },
      [=](aspawn_atom, const std::string& spawner, const caf::actor& watch, const std::string& type,
          const std::string& args) -> caf::result<caf::actor, std::string> {
        // An application actor for a spawner that proved the token (the gate let it in): the
        // type is looked up by name in the task's registry, nothing else.
        auto& st = self->state;
        const std::string who = spawner.substr(0, 200);
        const std::string what = "actor type " + base::quoted(type) + " on " + st.task;
        if (!st.handlers->spawn_actor) return runtime_error(what + ": this task hosts no actors");
        if (!watch) return runtime_error(what + ": the spawner named no actor to watch");
        actor_made made;
        try {
          made = st.handlers->spawn_actor(type, args);
        } catch (const std::exception& e) {
          made.error = what + ": " + e.what();
        }
        if (!made.receive) return runtime_error(made.error.empty() ? what + ": not made" : made.error);
        auto a = spawn_hosted(self->system(), type.substr(0, 64), std::move(made.receive));
        self->monitor(a);
        const auto w = watch.address();
        auto& list = st.hosted[w];
        if (st.spawners.emplace(w, who).second) {
          self->monitor(w);
          if (who.rfind("/job:chief/", 0) == 0 && st.handlers->chief_came) st.handlers->chief_came();
        }
        list.push_back(a);
        st.spawned_for[a.address()] = w;
        event(st, "spawned actor " + base::quoted(type) + " for " + base::quoted(who));
        // How the spawner reaches it over the actor data port (empty: the control plane only).
        std::string data = st.app_data ? st.app_data->add(a) : std::string();
        return {a, std::move(data)};
      },
      [=](aping_atom) -> bool { return true; },
      [=](vread_atom, const std::string& key) -> caf::result<std::string> {
        auto shard = shard_of(key);
        if (!shard) return runtime_error("no variable shard '" + key + "' on " + self->state.task);
        if (auto cell = self->state.store->find(key)) {
          std::shared_lock<std::shared_mutex> lock(cell->mutex);
          self->state.store->traffic.bytes_out += cell->value->size();
        }
        auto rp = self->make_response_promise();
        rp.delegate(shard, vread_atom::value);
        return rp;
      },
      [=](vslots_atom, const std::string& key) -> caf::result<std::int32_t> {
        auto cell = self->state.store->find(key);
        if (!cell) return runtime_error("no variable shard '" + key.substr(0, 64) + "' on " + self->state.task);
        std::shared_lock<std::shared_mutex> lock(cell->mutex);
        return static_cast<std::int32_t>(cell->slots.size());
      },
      [=](vupdate_atom, const std::string& key, std::uint8_t op, std::string& delta) -> caf::result<bool> {
        auto shard = shard_of(key);
        if (!shard) return runtime_error("no variable shard '" + key + "' on " + self->state.task);
        self->state.store->traffic.bytes_in += delta.size();
        ++self->state.store->traffic.updates;
        auto rp = self->make_response_promise();
        rp.delegate(shard, vupdate_atom::value, op, std::move(delta));
        return rp;
      },
  };
}

}  // namespace troupe::actors
