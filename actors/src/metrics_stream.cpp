#include "troupe/actors/metrics_stream.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>

#include <pthread.h>

#include <nlohmann/json.hpp>

#include "caf/all.hpp"

// Local messages only: the stream never leaves this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<troupe::actors::step_event>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::actors::metrics_stream::subscriber>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::actors::metrics_stream::listening>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::actors::step_ring>)

namespace troupe::actors {
namespace {

using publish_atom = caf::atom_constant<caf::atom("mpublish")>;
using flush_atom = caf::atom_constant<caf::atom("mflush")>;
using mtick_atom = caf::atom_constant<caf::atom("mtick")>;
using subscribe_atom = caf::atom_constant<caf::atom("msub")>;
using unsubscribe_atom = caf::atom_constant<caf::atom("munsub")>;
using history_atom = caf::atom_constant<caf::atom("mhistory")>;
using close_atom = caf::atom_constant<caf::atom("mclose")>;

using batch_ptr = std::shared_ptr<const std::vector<step_event>>;

// One event of a published batch, without copying it.
struct event_ref {
  batch_ptr batch;
  std::size_t index;
  const step_event& get() const { return (*batch)[index]; }
};
using subscriber_ptr = std::shared_ptr<metrics_stream::subscriber>;
using listening_ptr = std::shared_ptr<metrics_stream::listening>;

struct subscription {
  subscriber_ptr push;
  listening_ptr listening;  // null: always
};

using json = nlohmann::ordered_json;

// A number as JSON: non-finite values (a diverging loss) become null, which JSON can carry.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json event_json(const step_event& e) {
  json replica_loss = json::array();
  for (double l : e.replica_loss) replica_loss.push_back(number(l));
  json workers = json::array();
  for (const worker_metrics& w : e.workers) {
    workers.push_back({{"worker", w.worker},
                       {"step", w.step},
                       {"input_ms", number(w.input_ms)},
                       {"compute_ms", number(w.compute_ms)},
                       {"all_reduce_ms", number(w.all_reduce_ms)},
                       {"other_ms", number(w.other_ms)},
                       {"all_reduce_bytes", w.all_reduce_bytes},
                       {"collectives", w.collectives},
                       {"samples_per_s", number(w.samples_per_s)},
                       {"heartbeat_age_ms", number(w.heartbeat_age_ms)},
                       {"paused", w.paused}});
  }
  json out = {{"step", e.step},
              {"time_s", number(e.time_s)},
              {"loss", number(e.loss)},
              {"learning_rate", number(e.learning_rate)},
              {"samples_per_s", number(e.samples_per_s)},
              {"paused", e.paused},
              {"replica_loss", std::move(replica_loss)},
              {"workers", std::move(workers)}};
  if (e.metric_names && !e.metrics.empty()) {
    json metrics = json::object();
    for (std::size_t i = 0; i < e.metrics.size() && i < e.metric_names->size(); ++i) {
      metrics[(*e.metric_names)[i]] = number(e.metrics[i]);
    }
    out["metrics"] = std::move(metrics);
  }
  return out;
}

struct stream_state {
  std::unique_ptr<metrics_history> history;
  std::shared_ptr<step_ring> ring;
  std::vector<event_ref> pending;
  std::uint64_t pending_stride = 1;
  std::uint64_t pending_offered = 0;
  std::map<int, subscription> subscribers;
  static const char* name;

  bool anyone_listening() const {
    for (const auto& [id, sub] : subscribers) {
      if (!sub.listening || (*sub.listening)()) return true;
    }
    return false;
  }

  void take(const batch_ptr& batch) {
    const bool listened = anyone_listening();
    for (std::size_t i = 0; i < batch->size(); ++i) {
      history->add((*batch)[i]);
      if (!listened) continue;
      // Between two pushes at most max_pending events wait: beyond that, every other one.
      if (pending_offered++ % pending_stride != 0) continue;
      pending.push_back({batch, i});
      if (pending.size() >= metrics_stream::max_pending) {
        std::size_t k = 0;
        for (std::size_t j = 0; j < pending.size(); j += 2) pending[k++] = pending[j];
        pending.resize(k);
        pending_stride *= 2;
      }
    }
  }

  // The steps the training thread left in the ring since the last drain: into the history,
  // and as one batch for the subscribers when someone listens.
  void drain() {
    if (ring->size() == 0) return;
    if (!anyone_listening()) {
      ring->drain([&](const step_event& e) { history->add(e); });
      return;
    }
    auto batch = std::make_shared<std::vector<step_event>>();
    batch->reserve(ring->size());
    ring->drain([&](const step_event& e) { batch->push_back(e); });
    take(batch);
  }

  void push() {
    if (pending.empty()) return;
    if (!anyone_listening()) {  // no JSON for nobody
      pending.clear();
      pending_stride = 1;
      pending_offered = 0;
      return;
    }
    json events = json::array();
    for (const event_ref& ref : pending) events.push_back(event_json(ref.get()));
    const std::string text = events.dump();
    pending.clear();
    pending_stride = 1;
    pending_offered = 0;
    for (auto& [id, sub] : subscribers) {
      try {
        if (!sub.listening || (*sub.listening)()) (*sub.push)(text);
      } catch (...) {
        // A subscriber's failure is its own; the stream and the other subscribers go on.
      }
    }
  }
};
const char* stream_state::name = "troupe.metrics_stream";

caf::behavior stream_actor(caf::stateful_actor<stream_state>* self, std::size_t capacity,
                           std::chrono::milliseconds interval, std::shared_ptr<step_ring> ring) {
  // Named, so that a profile tells the stream's time from training's (this runs on its thread).
  pthread_setname_np(pthread_self(), "troupe-metrics");
  self->state.history = std::make_unique<metrics_history>(capacity);
  self->state.ring = std::move(ring);
  // The stream's own clock: every interval it drains the ring and pushes what is new. The
  // training thread never sends it anything per step. The first tick is one interval away, like
  // every other (the ring is empty at the start).
  self->delayed_send(self, interval, mtick_atom::value);
  return {
      [=](mtick_atom) {
        self->state.drain();
        self->state.push();
        self->delayed_send(self, interval, mtick_atom::value);
      },
      [=](publish_atom, const batch_ptr& batch) { self->state.take(batch); },
      [=](flush_atom) {
        self->state.drain();
        self->state.push();
      },
      [=](subscribe_atom, int id, const subscriber_ptr& sub, const listening_ptr& listening) -> bool {
        self->state.subscribers[id] = subscription{sub, listening};
        return true;
      },
      [=](unsubscribe_atom, int id) -> bool {
        self->state.subscribers.erase(id);
        return true;
      },
      [=](close_atom) -> bool {
        self->state.subscribers.clear();
        self->quit();
        return true;
      },
      [=](history_atom) -> std::string {
        self->state.drain();
        return self->state.history->to_json();
      },
  };
}

}  // namespace

std::string to_json(const step_event& e) { return event_json(e).dump(); }

metrics_history::metrics_history(std::size_t capacity) : capacity_(capacity < 2 ? 2 : capacity) {}

void metrics_history::add(const step_event& e) {
  if (offered_++ % stride_ != 0) return;
  if (spare_.empty()) {
    events_.push_back(e);
  } else {
    // A dropped event's vectors take the copy: no allocation once the history has filled.
    events_.push_back(std::move(spare_.back()));
    spare_.pop_back();
    events_.back() = e;
  }
  if (events_.size() < capacity_) return;
  // Full: keep every other event, and from now on every other offered one of the new stride.
  std::deque<step_event> kept;
  for (std::size_t i = 0; i < events_.size(); ++i) {
    if (i % 2 == 0) {
      kept.push_back(std::move(events_[i]));
    } else {
      spare_.push_back(std::move(events_[i]));
    }
  }
  events_ = std::move(kept);
  // The kept events were offered at 0, s, 2s, ...: those left are at 0, 2s, 4s, ..., and the next
  // one kept is the next offered at a multiple of 2s.
  stride_ *= 2;
}

std::string metrics_history::to_json() const {
  json events = json::array();
  for (const step_event& e : events_) events.push_back(event_json(e));
  return json{{"stride", stride_}, {"events", std::move(events)}}.dump();
}

step_ring::step_ring(std::size_t slots, std::size_t replicas, std::size_t workers) {
  std::size_t n = 2;
  while (n < slots) n *= 2;
  slots_.resize(n);
  for (step_event& e : slots_) {
    e.replica_loss.resize(replicas);
    e.workers.resize(workers);
    e.metrics.reserve(step_event::reserved_metrics);
  }
  mask_ = n - 1;
}

bool step_ring::push(const step_event& e) {
  const std::uint64_t h = head_.load(std::memory_order_relaxed);
  if (h - tail_.load(std::memory_order_acquire) >= slots_.size()) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // The slot's vectors keep their storage: an event of the ring's sizes is copied, not allocated.
  slots_[static_cast<std::size_t>(h) & mask_] = e;
  head_.store(h + 1, std::memory_order_release);
  return true;
}

std::size_t step_ring::drain(const std::function<void(const step_event&)>& f) {
  const std::uint64_t t = tail_.load(std::memory_order_relaxed);
  const std::uint64_t h = head_.load(std::memory_order_acquire);
  for (std::uint64_t i = t; i < h; ++i) f(slots_[static_cast<std::size_t>(i) & mask_]);
  tail_.store(h, std::memory_order_release);
  return static_cast<std::size_t>(h - t);
}

std::size_t step_ring::size() const noexcept {
  return static_cast<std::size_t>(head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_acquire));
}

namespace {

// Room for several seconds of sub-millisecond steps between two drains, within about 4 MiB.
std::size_t ring_slots(std::size_t replicas, std::size_t workers) {
  const std::size_t bytes = sizeof(step_event) + replicas * sizeof(double) + workers * sizeof(worker_metrics);
  return std::clamp<std::size_t>((std::size_t{4} << 20) / bytes, 256, 8192);
}

}  // namespace

struct metrics_stream::impl {
  caf::actor_system& system;
  std::shared_ptr<step_ring> ring;
  caf::actor actor;
  std::atomic<int> next_id{1};
  impl(caf::actor_system& sys, std::size_t capacity, std::chrono::milliseconds interval, std::size_t replicas,
       std::size_t workers)
      : system(sys),
        ring(std::make_shared<step_ring>(ring_slots(replicas, workers), replicas, workers)),
        // Detached: the stream sleeps on its own thread between its ticks. On the shared scheduler
        // every message would set its workers polling for the next one, which a training loop on
        // a few cores feels.
        actor(sys.spawn<caf::detached>(stream_actor, capacity, interval, ring)) {}
};

metrics_stream::metrics_stream(caf::actor_system& system, std::size_t capacity, std::chrono::milliseconds push_interval,
                               std::size_t replicas, std::size_t workers)
    : impl_(std::make_unique<impl>(system, capacity, push_interval, replicas, workers)) {}

bool metrics_stream::push(const step_event& e) { return impl_->ring->push(e); }

void metrics_stream::flush_now() { caf::anon_send(impl_->actor, flush_atom::value); }

std::uint64_t metrics_stream::dropped() const noexcept { return impl_->ring->dropped(); }

metrics_stream::~metrics_stream() {
  caf::scoped_actor self{impl_->system};
  // The actor drops its subscribers before it quits: none is called after this returns.
  self->request(impl_->actor, std::chrono::seconds(10), close_atom::value)
      .receive([](bool) {}, [&](caf::error&) { caf::anon_send_exit(impl_->actor, caf::exit_reason::user_shutdown); });
}

void metrics_stream::publish(std::vector<step_event> events) {
  if (events.empty()) return;
  caf::anon_send(impl_->actor, publish_atom::value,
                 batch_ptr(std::make_shared<const std::vector<step_event>>(std::move(events))));
}

int metrics_stream::subscribe(subscriber s, listening is_listening) {
  const int id = impl_->next_id++;
  caf::scoped_actor self{impl_->system};
  self->request(impl_->actor, std::chrono::seconds(10), subscribe_atom::value, id,
                std::make_shared<subscriber>(std::move(s)),
                is_listening ? std::make_shared<listening>(std::move(is_listening)) : listening_ptr())
      .receive([](bool) {}, [](caf::error&) {});
  return id;
}

void metrics_stream::unsubscribe(int id) {
  caf::scoped_actor self{impl_->system};
  self->request(impl_->actor, std::chrono::seconds(10), unsubscribe_atom::value, id)
      .receive([](bool) {}, [](caf::error&) {});
}

std::string metrics_stream::history_json(std::chrono::milliseconds timeout) {
  std::string out;
  caf::scoped_actor self{impl_->system};
  self->request(impl_->actor, timeout, history_atom::value)
      .receive([&](std::string& json) { out = std::move(json); }, [](caf::error&) {});
  return out;
}

}  // namespace troupe::actors
