#pragma once

// The spawner's side of an actor data connection (app_actors.hpp, steps 5 to 8): the requests in
// flight of one spawner, and its connection to one task's actor data port (app_data_link.cpp also
// holds send_window, the one-way messages' back-pressure it opens). Internal to actors/.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app_data_wire.hpp"
#include "caf/all.hpp"
#include "troupe/actors/app_actors.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace troupe::actors {

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
  // A token for add_as, when the callback must know its token.
  std::uint64_t reserve() {
    std::lock_guard<std::mutex> lock(mutex);
    return next++;
  }
  void add_as(std::uint64_t token, std::uint64_t actor, std::function<void(actor_reply)> f) {
    std::lock_guard<std::mutex> lock(mutex);
    done.emplace(token, entry{actor, std::move(f)});
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

// The spawner's data connection to one task's actor data port: requests, one-way messages and
// stops of its actors there, and their replies. Many threads write (one at a time, under the
// write mutex: a synchronous request from its caller's thread with what queued before it, the
// rest queued for the writer thread, which sends what gathered in one frame); the reader thread
// completes each request where it is kept (pending_table) and keeps the asynchronous ones'
// deadlines.
struct data_link {
  std::string task;
  std::uint16_t port = 0;
  std::unique_ptr<transport::bulk_stream> stream;
  std::shared_ptr<pending_table> pending;
  caf::actor supervisor;

  std::mutex write_mutex;
  std::mutex queue_mutex;
  std::condition_variable queued;
  std::vector<data_wire::out_record> queue;
  bool writing = false;

  struct flight {
    std::chrono::steady_clock::time_point deadline;
    std::int64_t timeout_ms = -1;  // -1: its caller keeps the deadline (a synchronous request)
  };
  std::mutex state_mutex;
  std::map<std::uint64_t, flight> inflight;                      // by token
  std::map<std::uint64_t, std::weak_ptr<send_window>> windows;   // by the actor's number on the host
  std::vector<std::uint64_t> members;                            // the spawner's ids of its actors
  std::string death;                                             // why it failed
  std::atomic<bool> dead{false};
  std::atomic<bool> stopping{false};
  std::thread reader;
  std::thread writer;

  void start();
  // Ends both threads (the spawner ends); the requests left are the caller's to end.
  void stop_and_join();
  void join(std::uint64_t id, std::uint64_t number, const std::shared_ptr<send_window>& window);
  std::optional<std::string> failed();
  // A request on its way: false when the connection failed already.
  bool track(std::uint64_t token, std::int64_t timeout_ms);
  bool untrack(std::uint64_t token);
  // The caller's thread writes what queued before, then `r`.
  void write_now(data_wire::out_record r);
  void enqueue(data_wire::out_record r);
  // With the write mutex held.
  void write(const std::vector<data_wire::out_record>& batch);
  void write_loop();
  // The asynchronous requests past their deadline end as timed out.
  void expire();
  void read_loop();
  // The connection is lost: its requests in flight end as down, and its actors are reported down
  // (and stopped, should they still run) by the supervisor.
  void fail(const std::string& why);
};

}  // namespace troupe::actors
