#include "troupe/actors/metrics_stream.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>

#include "caf/all.hpp"

// Local messages only: the stream never leaves this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<troupe::actors::step_event>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::actors::metrics_stream::subscriber>)

namespace troupe::actors {
namespace {

using publish_atom = caf::atom_constant<caf::atom("mpublish")>;
using flush_atom = caf::atom_constant<caf::atom("mflush")>;
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

// A number as JSON: non-finite values (a diverging loss) become null, which JSON can carry.
void put(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%.9g", v);
  out.append(buf, static_cast<std::size_t>(n));
}

void put(std::string& out, std::int64_t v) { out += std::to_string(v); }

void put_field(std::string& out, const char* name, double v) {
  out += '"';
  out += name;
  out += "\":";
  put(out, v);
}

struct stream_state {
  std::unique_ptr<metrics_history> history;
  std::vector<event_ref> pending;
  std::uint64_t pending_stride = 1;
  std::uint64_t pending_offered = 0;
  std::map<int, subscriber_ptr> subscribers;
  bool flush_scheduled = false;
  static const char* name;
};
const char* stream_state::name = "troupe.metrics_stream";

caf::behavior stream_actor(caf::stateful_actor<stream_state>* self, std::size_t capacity,
                           std::chrono::milliseconds interval) {
  self->state.history = std::make_unique<metrics_history>(capacity);
  return {
      [=](publish_atom, const batch_ptr& batch) {
        auto& s = self->state;
        for (std::size_t i = 0; i < batch->size(); ++i) {
          s.history->add((*batch)[i]);
          if (s.subscribers.empty()) continue;
          // Between two pushes at most max_pending events wait: beyond that, every other one.
          if (s.pending_offered++ % s.pending_stride != 0) continue;
          s.pending.push_back({batch, i});
          if (s.pending.size() >= metrics_stream::max_pending) {
            std::size_t k = 0;
            for (std::size_t j = 0; j < s.pending.size(); j += 2) s.pending[k++] = s.pending[j];
            s.pending.resize(k);
            s.pending_stride *= 2;
          }
        }
        if (s.subscribers.empty()) return;
        if (!s.flush_scheduled) {
          s.flush_scheduled = true;
          self->delayed_send(self, interval, flush_atom::value);
        }
      },
      [=](flush_atom) {
        auto& s = self->state;
        s.flush_scheduled = false;
        if (s.pending.empty()) return;
        std::string json = "[";
        for (std::size_t i = 0; i < s.pending.size(); ++i) {
          if (i) json += ',';
          json += to_json(s.pending[i].get());
        }
        json += ']';
        s.pending.clear();
        s.pending_stride = 1;
        s.pending_offered = 0;
        for (auto& [id, sub] : s.subscribers) {
          try {
            (*sub)(json);
          } catch (...) {
            // A subscriber's failure is its own; the stream and the other subscribers go on.
          }
        }
      },
      [=](subscribe_atom, int id, const subscriber_ptr& sub) -> bool {
        self->state.subscribers[id] = sub;
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
      [=](history_atom) -> std::string { return self->state.history->to_json(); },
  };
}

}  // namespace

std::string to_json(const step_event& e) {
  std::string out;
  out.reserve(256 + 24 * e.replica_loss.size() + 200 * e.workers.size());
  out += "{\"step\":";
  put(out, e.step);
  out += ',';
  put_field(out, "time_s", e.time_s);
  out += ',';
  put_field(out, "loss", e.loss);
  out += ',';
  put_field(out, "learning_rate", e.learning_rate);
  out += ',';
  put_field(out, "samples_per_s", e.samples_per_s);
  out += e.paused ? ",\"paused\":true" : ",\"paused\":false";
  out += ",\"replica_loss\":[";
  for (std::size_t i = 0; i < e.replica_loss.size(); ++i) {
    if (i) out += ',';
    put(out, e.replica_loss[i]);
  }
  out += "],\"workers\":[";
  for (std::size_t i = 0; i < e.workers.size(); ++i) {
    const worker_metrics& w = e.workers[i];
    if (i) out += ',';
    out += "{\"worker\":";
    put(out, std::int64_t{w.worker});
    out += ",\"step\":";
    put(out, w.step);
    out += ',';
    put_field(out, "input_ms", w.input_ms);
    out += ',';
    put_field(out, "compute_ms", w.compute_ms);
    out += ',';
    put_field(out, "all_reduce_ms", w.all_reduce_ms);
    out += ',';
    put_field(out, "other_ms", w.other_ms);
    out += ",\"all_reduce_bytes\":";
    put(out, static_cast<std::int64_t>(w.all_reduce_bytes));
    out += ",\"collectives\":";
    put(out, std::int64_t{w.collectives});
    out += ',';
    put_field(out, "samples_per_s", w.samples_per_s);
    out += ',';
    put_field(out, "heartbeat_age_ms", w.heartbeat_age_ms);
    out += w.paused ? ",\"paused\":true}" : ",\"paused\":false}";
  }
  out += "]}";
  return out;
}

metrics_history::metrics_history(std::size_t capacity) : capacity_(capacity < 2 ? 2 : capacity) {}

void metrics_history::add(const step_event& e) {
  if (offered_++ % stride_ != 0) return;
  events_.push_back(e);
  if (events_.size() < capacity_) return;
  // Full: keep every other event, and from now on every other offered one of the new stride.
  std::deque<step_event> kept;
  for (std::size_t i = 0; i < events_.size(); i += 2) kept.push_back(std::move(events_[i]));
  events_ = std::move(kept);
  // The kept events were offered at 0, s, 2s, ...: those left are at 0, 2s, 4s, ..., and the next
  // one kept is the next offered at a multiple of 2s.
  stride_ *= 2;
}

std::string metrics_history::to_json() const {
  std::string out = "{\"stride\":" + std::to_string(stride_) + ",\"events\":[";
  bool first = true;
  for (const step_event& e : events_) {
    if (!first) out += ',';
    first = false;
    out += actors::to_json(e);
  }
  out += "]}";
  return out;
}

struct metrics_stream::impl {
  caf::actor_system& system;
  caf::actor actor;
  std::atomic<int> next_id{1};
  impl(caf::actor_system& sys, std::size_t capacity, std::chrono::milliseconds interval)
      // Detached: the stream sleeps on its own thread between messages. On the shared scheduler
      // every message would set its workers polling for the next one, which a training loop on
      // a few cores feels.
      : system(sys), actor(sys.spawn<caf::detached>(stream_actor, capacity, interval)) {}
};

metrics_stream::metrics_stream(caf::actor_system& system, std::size_t capacity, std::chrono::milliseconds push_interval)
    : impl_(std::make_unique<impl>(system, capacity, push_interval)) {}

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

int metrics_stream::subscribe(subscriber s) {
  const int id = impl_->next_id++;
  caf::scoped_actor self{impl_->system};
  self->request(impl_->actor, std::chrono::seconds(10), subscribe_atom::value, id,
                std::make_shared<subscriber>(std::move(s)))
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
