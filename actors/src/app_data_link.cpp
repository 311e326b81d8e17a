#include "app_data_link.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "protocol.hpp"

namespace troupe::actors {

// The back-pressure on one actor's one-way messages, over either path (app_actors.hpp); a data
// link opens it as the acknowledgements arrive.
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

void data_link::start() {
  reader = std::thread([this] { read_loop(); });
  writer = std::thread([this] { write_loop(); });
}

void data_link::stop_and_join() {
  stopping = true;
  stream->shutdown();
  {
    std::lock_guard<std::mutex> lock(queue_mutex);
    queued.notify_all();
  }
  if (reader.joinable()) reader.join();
  if (writer.joinable()) writer.join();
}

void data_link::join(std::uint64_t id, std::uint64_t number, const std::shared_ptr<send_window>& window) {
  std::lock_guard<std::mutex> lock(state_mutex);
  members.push_back(id);
  windows[number] = window;
}

std::optional<std::string> data_link::failed() {
  if (!dead) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_mutex);
  return death;
}

bool data_link::track(std::uint64_t token, std::int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(state_mutex);
  if (dead) return false;
  inflight[token] = flight{std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(timeout_ms, 0)),
                           timeout_ms};
  return true;
}

bool data_link::untrack(std::uint64_t token) {
  std::lock_guard<std::mutex> lock(state_mutex);
  return inflight.erase(token) > 0;
}

void data_link::write_now(data_wire::out_record r) {
  std::lock_guard<std::mutex> lock(write_mutex);
  std::vector<data_wire::out_record> batch;
  {
    std::lock_guard<std::mutex> q(queue_mutex);
    batch.swap(queue);
  }
  batch.push_back(std::move(r));
  write(batch);
}

void data_link::enqueue(data_wire::out_record r) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mutex);
    queue.push_back(std::move(r));
    wake = !writing;
  }
  if (wake) queued.notify_one();
}

void data_link::write(const std::vector<data_wire::out_record>& batch) {
  if (dead || batch.empty()) return;
  try {
    data_wire::write_records(*stream, batch);
  } catch (const std::exception& e) {
    if (!stopping) fail(e.what());  // "sending to the actor data port of TASK failed: ..."
  }
}

void data_link::write_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_mutex);
      queued.wait(lock, [&] { return !queue.empty() || stopping; });
      if (stopping) return;
      writing = true;
    }
    // Woken by the first message of a burst: the ones right behind it join its frame.
    std::this_thread::yield();
    {
      std::lock_guard<std::mutex> lock(write_mutex);
      std::vector<data_wire::out_record> batch;
      {
        std::lock_guard<std::mutex> q(queue_mutex);
        batch.swap(queue);
      }
      write(batch);
    }
    std::lock_guard<std::mutex> lock(queue_mutex);
    writing = false;
  }
}

void data_link::expire() {
  std::vector<std::pair<std::uint64_t, std::int64_t>> due;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    for (auto it = inflight.begin(); it != inflight.end();) {
      if (it->second.timeout_ms >= 0 && it->second.deadline <= now) {
        due.emplace_back(it->first, it->second.timeout_ms);
        it = inflight.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [token, ms] : due) {
    if (auto f = pending->take(token)) {
      f(actor_reply{actor_reply::status::timed_out, "no answer within " + std::to_string(ms) + " ms"});
    }
  }
}

void data_link::read_loop() {
  std::vector<data_wire::in_record> records;
  std::vector<char> scratch;
  auto next_scan = std::chrono::steady_clock::now();
  try {
    while (!stopping) {
      const bool any = stream->wait_message(20);
      if (stopping) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_scan) {
        expire();
        next_scan = now + std::chrono::milliseconds(20);
      }
      if (!any) continue;
      if (!data_wire::read_frame(*stream, false, records, scratch)) {
        if (!stopping) {
          fail("the data connection to " + task + " closed (its process died, or the network failed)");
        }
        return;
      }
      for (auto& r : records) {
        if (r.kind == data_wire::ack) {
          std::shared_ptr<send_window> w;
          {
            std::lock_guard<std::mutex> lock(state_mutex);
            auto it = windows.find(r.actor);
            if (it != windows.end()) w = it->second.lock();
          }
          if (w) w->acknowledged(r.number);
          continue;
        }
        if (!untrack(r.number)) continue;  // timed out already, or not one of its requests
        auto f = pending->take(r.number);
        if (!f) continue;
        const auto what = r.status == data_wire::ok       ? actor_reply::status::ok
                          : r.status == data_wire::failed ? actor_reply::status::failed
                                                          : actor_reply::status::down;
        f(actor_reply{what, std::move(r.payload)});
      }
    }
  } catch (const std::exception& e) {
    if (!stopping) fail("the data connection to " + task + " failed: " + e.what());
  }
}

void data_link::fail(const std::string& why) {
  std::map<std::uint64_t, flight> left;
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    if (dead) return;
    death = why;
    dead = true;
    left.swap(inflight);
    ids = members;
  }
  stream->shutdown();
  for (auto& [token, f] : left) {
    if (auto done = pending->take(token)) done(actor_reply{actor_reply::status::down, why});
  }
  caf::anon_send(supervisor, alost_atom::value, task, why, std::move(ids), false);
}

}  // namespace troupe::actors
