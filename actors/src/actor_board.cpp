#include "troupe/actors/actor_board.hpp"

#include <algorithm>

namespace troupe::actors {
namespace {

double ms_from_to(actor_board::clock::time_point from, actor_board::clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

actor_board::entry& actor_board::find_or_add(std::uint64_t id, clock::time_point now) {
  auto it = actors_.find(id);
  if (it != actors_.end()) return it->second;
  entry& e = actors_[id];
  e.row.id = id;
  e.since = now;
  e.order = next_order_++;
  return e;
}

// Beyond max_rows the oldest down row goes (else the oldest row): a long search that respawns
// often keeps its live actors on the page.
void actor_board::trim() {
  while (actors_.size() > max_rows) {
    auto victim = actors_.end();
    for (auto it = actors_.begin(); it != actors_.end(); ++it) {
      const bool better = victim == actors_.end() || (it->second.row.down && !victim->second.row.down) ||
                          (it->second.row.down == victim->second.row.down && it->second.order < victim->second.order);
      if (better) victim = it;
    }
    const std::string label = victim->second.row.label;
    if (!label.empty()) {
      label_holder_.erase(label);
      history_.erase(label);
    }
    actors_.erase(victim);
  }
}

void actor_board::spawned(std::uint64_t id, const std::string& type, const std::string& task, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  entry& e = find_or_add(id, now);
  e.row.type = type;
  e.row.task = task;
  e.row.down = false;
  e.row.stopped = false;
  e.row.cause.clear();
  e.since = now;
  ++spawned_;
  trim();
}

void actor_board::restarted(std::uint64_t previous, std::uint64_t id, const std::string& task,
                            clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = actors_.find(previous);
  if (it == actors_.end()) return;
  if (id != previous) {
    // The new actor takes the old one's row (a row it may have gained meanwhile goes).
    entry moved = std::move(it->second);
    actors_.erase(it);
    moved.row.id = id;
    if (!moved.row.label.empty()) label_holder_[moved.row.label] = id;
    it = actors_.insert_or_assign(id, std::move(moved)).first;
  }
  entry& e = it->second;
  e.row.task = task;
  e.row.down = false;
  e.row.stopped = false;
  e.row.cause.clear();
  e.since = now;
  e.replied = false;
  ++e.row.restarts;
  ++restarts_;
}

void actor_board::replied(std::uint64_t id, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = actors_.find(id);
  if (it == actors_.end()) return;
  it->second.last_reply = now;
  it->second.replied = true;
}

void actor_board::went_down(std::uint64_t id, const std::string& cause, clock::time_point, bool stopped) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = actors_.find(id);
  if (it == actors_.end() || it->second.row.down) return;
  it->second.row.down = true;
  it->second.row.stopped = stopped;
  it->second.row.cause = cause;
  ++(stopped ? stopped_ : down_);
}

void actor_board::describe(std::uint64_t id, const std::string& label, std::int64_t step,
                           std::vector<std::pair<std::string, double>> values, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (values.size() > max_values) values.resize(max_values);
  entry* e = &find_or_add(id, now);
  if (e->row.label != label) {
    if (!e->row.label.empty()) {
      auto held = label_holder_.find(e->row.label);
      if (held != label_holder_.end() && held->second == id) label_holder_.erase(held);
    }
    if (!label.empty()) {
      auto held = label_holder_.find(label);
      if (held != label_holder_.end() && held->second != id) {
        // A new actor in an old one's role: it takes the old row's place and counts a restart.
        auto old = actors_.find(held->second);
        if (old != actors_.end()) {
          e->row.restarts += old->second.row.restarts + 1;
          e->order = old->second.order;
          actors_.erase(old);
          e = &actors_.at(id);
        } else {
          ++e->row.restarts;
        }
        ++restarts_;
      }
      label_holder_[label] = id;
    }
    e->row.label = label;
  }
  e->row.step = step;
  e->row.values = values;
  if (label.empty()) return;
  auto& points = history_[label];
  if (!points.empty() && points.back().step == step) {
    points.back().values = std::move(values);
  } else {
    points.push_back({step, std::move(values)});
    if (points.size() > max_history) points.pop_front();
  }
}

actor_board_view actor_board::snapshot(clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  actor_board_view v;
  std::vector<const entry*> ordered;
  ordered.reserve(actors_.size());
  for (const auto& [id, e] : actors_) ordered.push_back(&e);
  std::sort(ordered.begin(), ordered.end(), [](const entry* a, const entry* b) { return a->order < b->order; });
  for (const entry* e : ordered) {
    actor_row row = e->row;
    row.age_ms = ms_from_to(e->since, now);
    row.last_reply_age_ms = e->replied ? ms_from_to(e->last_reply, now) : -1;
    if (!row.label.empty()) {
      auto h = history_.find(row.label);
      if (h != history_.end()) v.history.emplace_back(row.label, std::vector<actor_values_point>(h->second.begin(), h->second.end()));
    }
    v.rows.push_back(std::move(row));
  }
  v.spawned = spawned_;
  v.down = down_;
  v.stopped = stopped_;
  v.restarts = restarts_;
  return v;
}

}  // namespace troupe::actors
