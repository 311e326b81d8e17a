#include "troupe/actors/input_pipeline.hpp"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>

#include "caf/all.hpp"
#include "protocol.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::actors {
namespace {

using want_atom = caf::atom_constant<caf::atom("want")>;    // depth 0: produce one item
using space_atom = caf::atom_constant<caf::atom("space")>;  // the full buffer has room again

}  // namespace

// (A named namespace, not the anonymous one: input_pipeline::impl holds one.)
namespace input_detail {

// The items ready for the consumer. The actor fills it, the consumer takes from it directly:
// a batch never waits in a mailbox, and taking one that is ready costs no message at all.
// Messages only wake the actor when the consumer made room or wants an item produced.
struct ready_buffer {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<input_pipeline::item> items;
  std::atomic<std::size_t> count{0};  // items.size(), readable without the lock for spinning
  bool ended = false;
  std::exception_ptr error;
  std::atomic<bool> done{false};  // ended or error, readable without the lock
};

}  // namespace input_detail

namespace {

using input_detail::ready_buffer;

void pipeline_actor(caf::blocking_actor* self, std::function<input_pipeline::item()> produce, std::size_t depth,
                    std::shared_ptr<ready_buffer> buf, std::chrono::microseconds spin) {
  pthread_setname_np(pthread_self(), "troupe-input");
  bool running = true;
  std::size_t wanted = 0;  // items asked for by a consumer (depth 0)
  caf::behavior bhvr{
      [&](want_atom) { ++wanted; },
      [&](space_atom) {},
      [&](stop_atom) { running = false; },
      [&](caf::exit_msg&) { running = false; },
  };
  const int pause_spins = transport::pause_spins_for(2);
  while (running) {
    const bool finished = buf->done.load(std::memory_order_acquire);
    const bool room = depth > 0 ? buf->count.load(std::memory_order_acquire) < depth : wanted > 0;
    if (finished || !room) {
      // Nothing to do until the consumer takes an item, wants one, or we are stopped.
      transport::spin_until([self] { return !self->mailbox().empty(); }, spin, pause_spins);
      self->receive(bhvr);
      continue;
    }
    while (running && !self->mailbox().empty()) self->receive(bhvr);
    if (!running) break;
    input_pipeline::item x;
    std::exception_ptr error;
    try {
      x = produce();
    } catch (...) {
      error = std::current_exception();
    }
    if (wanted > 0) --wanted;
    {
      std::lock_guard<std::mutex> lock(buf->mutex);
      if (error) {
        buf->error = error;
      } else if (x) {
        buf->items.push_back(std::move(x));
        buf->count.store(buf->items.size(), std::memory_order_release);
      } else {
        buf->ended = true;
      }
      if (buf->error || buf->ended) buf->done.store(true, std::memory_order_release);
    }
    buf->changed.notify_all();
  }
}

}  // namespace

struct input_pipeline::impl {
  impl(caf::actor_system& sys, std::function<item()> produce, std::size_t depth_, std::chrono::microseconds spin_budget)
      : self(sys), spin(spin_budget), depth(depth_), buf(std::make_shared<input_detail::ready_buffer>()) {
    actor = sys.spawn<caf::detached>(pipeline_actor, std::move(produce), depth, buf, spin);
    self->monitor(actor);
  }
  caf::scoped_actor self;  // watches the actor's lifetime
  std::chrono::microseconds spin;
  std::size_t depth;
  std::shared_ptr<ready_buffer> buf;
  caf::actor actor;
};

input_pipeline::input_pipeline(caf::actor_system& system, std::function<item()> produce, std::size_t depth,
                               std::chrono::microseconds spin)
    : impl_(std::make_unique<impl>(system, std::move(produce), depth, spin)) {}

input_pipeline::~input_pipeline() {
  auto& s = *impl_;
  s.self->send(s.actor, stop_atom::value);
  bool down = false;
  while (!down) {
    s.self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(60)) >> [&] { down = true; });
  }
}

input_pipeline::item input_pipeline::next() {
  auto& s = *impl_;
  ready_buffer& buf = *s.buf;
  const auto start = std::chrono::steady_clock::now();
  if (s.depth == 0 && buf.count.load(std::memory_order_acquire) == 0 && !buf.done.load(std::memory_order_acquire)) {
    s.self->send(s.actor, want_atom::value);
  }
  transport::spin_until(
      [&] { return buf.count.load(std::memory_order_acquire) > 0 || buf.done.load(std::memory_order_acquire); },
      s.spin, transport::pause_spins_for(2));
  item x;
  bool made_room = false;
  {
    std::unique_lock<std::mutex> lock(buf.mutex);
    buf.changed.wait(lock, [&] { return !buf.items.empty() || buf.ended || buf.error; });
    if (!buf.items.empty()) {
      made_room = buf.items.size() == s.depth;
      x = std::move(buf.items.front());
      buf.items.pop_front();
      buf.count.store(buf.items.size(), std::memory_order_release);
    } else if (buf.error) {
      waited_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
      std::rethrow_exception(buf.error);
    }
  }
  // The actor sleeps while the buffer is full; it has room again.
  if (made_room) s.self->send(s.actor, space_atom::value);
  waited_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  return x;
}

}  // namespace troupe::actors
