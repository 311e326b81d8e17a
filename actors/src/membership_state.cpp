#include "troupe/actors/membership_state.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "troupe/actors/rendezvous.hpp"

namespace troupe::actors {

int membership_change::new_rank(int old_rank) const {
  for (std::size_t i = 0; i < survivors.size(); ++i) {
    if (survivors[i] == old_rank) return static_cast<int>(i);
  }
  return -1;
}

membership_state::membership_state(std::vector<std::string> tasks, int min_workers, int max_workers,
                                   std::uint64_t generation, int changes)
    : tasks_(std::move(tasks)),
      min_workers_(min_workers),
      max_workers_(max_workers),
      generation_(generation),
      changes_(changes) {
  const int n = static_cast<int>(tasks_.size());
  if (n == 0) throw std::invalid_argument("membership_state: the cluster has no workers");
  if (min_workers_ < 1 || min_workers_ > n) {
    throw std::invalid_argument("membership_state: min_workers is " + std::to_string(min_workers_) + " (expected 1.." +
                                std::to_string(n) + ", the cluster's size)");
  }
  if (max_workers_ == 0) max_workers_ = n;
  if (max_workers_ < n) {
    throw std::invalid_argument("membership_state: max_workers is " + std::to_string(max_workers_) +
                                " but the cluster has " + std::to_string(n) + " workers (expected 0, or " +
                                std::to_string(n) + " and more)");
  }
  lost_.assign(tasks_.size(), false);
  reasons_.assign(tasks_.size(), std::string());
}

int membership_state::live_after_losses() const {
  return static_cast<int>(std::count(lost_.begin(), lost_.end(), false));
}

void membership_state::fail(std::string why) {
  phase_ = phase::failed;
  pending_.reset();
  fallback_ = "elastic membership falls back to the restart path: " + std::move(why);
}

bool membership_state::lose(int rank, const std::string& reason) {
  if (phase_ == phase::failed) return false;
  if (rank < 0 || static_cast<std::size_t>(rank) >= tasks_.size()) return false;
  const auto r = static_cast<std::size_t>(rank);
  if (lost_[r]) return false;
  const std::string& who = tasks_[r];
  if (phase_ == phase::changing) {
    // A survivor of the decided change: the ring it was to join cannot form.
    lost_[r] = true;
    fail(who + " was lost while the cluster changed to generation " + std::to_string(pending_->generation) + " (" +
         reason + ")");
    return true;
  }
  lost_[r] = true;
  reasons_[r] = reason;
  if (rank == 0) {
    fail("the chief " + who + " was lost (" + reason + "); it holds the cluster's membership");
    return true;
  }
  if (live_after_losses() < min_workers_) {
    std::string gone;
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      if (!lost_[i]) continue;
      if (!gone.empty()) gone += ", ";
      gone += tasks_[i];
    }
    fail(std::to_string(live_after_losses()) + " worker(s) would be left, fewer than min_workers (" +
         std::to_string(min_workers_) + "); lost: " + gone + " (" + reason + ")");
    return true;
  }
  phase_ = phase::losing;
  return true;
}

std::optional<membership_change> membership_state::decide() {
  if (phase_ != phase::losing) return std::nullopt;
  return begin_change_without(lost_);
}

membership_change membership_state::begin_change_without(const std::vector<bool>& gone) {
  membership_change change;
  change.generation = generation_ + 1;
  for (std::size_t i = 0; i < tasks_.size(); ++i) {
    if (gone[i]) {
      change.left.push_back(tasks_[i]);
    } else {
      change.survivors.push_back(static_cast<int>(i));
      change.tasks.push_back(tasks_[i]);
    }
  }
  pending_ = change;
  phase_ = phase::changing;
  return change;
}

std::optional<std::string> membership_state::check_join(const std::string& task) const {
  if (phase_ == phase::failed) return "the cluster fell back to the restart path (" + fallback_ + ")";
  if (phase_ != phase::stable) return std::string("the cluster is changing its membership; ask again");
  if (static_cast<int>(tasks_.size()) >= max_workers_) {
    return "the cluster has " + std::to_string(tasks_.size()) + " workers, max_workers (" +
           std::to_string(max_workers_) + ")";
  }
  if (std::find(tasks_.begin(), tasks_.end(), task) != tasks_.end()) return task + " is a member already";
  return std::nullopt;
}

std::optional<membership_change> membership_state::admit(const std::vector<std::string>& joiners) {
  if (phase_ != phase::stable || joiners.empty()) return std::nullopt;
  if (static_cast<int>(tasks_.size() + joiners.size()) > max_workers_) return std::nullopt;
  for (std::size_t i = 0; i < joiners.size(); ++i) {
    if (check_join(joiners[i])) return std::nullopt;
    if (std::find(joiners.begin(), joiners.begin() + static_cast<std::ptrdiff_t>(i), joiners[i]) !=
        joiners.begin() + static_cast<std::ptrdiff_t>(i)) {
      return std::nullopt;
    }
  }
  membership_change change;
  change.generation = generation_ + 1;
  for (std::size_t i = 0; i < tasks_.size(); ++i) change.survivors.push_back(static_cast<int>(i));
  change.tasks = tasks_;
  for (const std::string& t : joiners) change.tasks.push_back(t);
  change.joined = joiners;
  pending_ = change;
  phase_ = phase::changing;
  return change;
}

std::optional<membership_change> membership_state::leave(const std::vector<int>& ranks,
                                                         std::vector<std::string>& refused) {
  if (phase_ != phase::stable) {
    if (!ranks.empty()) refused.push_back("the cluster is changing its membership");
    return std::nullopt;
  }
  std::vector<int> asked = ranks;
  std::sort(asked.begin(), asked.end());
  std::vector<bool> leaving(tasks_.size(), false);
  int staying = static_cast<int>(tasks_.size());
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const int r = asked[i];
    if (r < 0 || static_cast<std::size_t>(r) >= tasks_.size()) {
      refused.push_back("rank " + std::to_string(r) + " is not in the cluster of " + std::to_string(tasks_.size()) +
                        " workers");
      continue;
    }
    const std::string& who = tasks_[static_cast<std::size_t>(r)];
    if (i > 0 && asked[i - 1] == r) continue;  // named twice: once counts
    if (r == 0) {
      refused.push_back(who + " is the chief, which holds the cluster's membership");
      continue;
    }
    if (staying - 1 < min_workers_) {
      refused.push_back(who + " would leave " + std::to_string(staying - 1) + " worker(s), fewer than min_workers (" +
                        std::to_string(min_workers_) + ")");
      continue;
    }
    leaving[static_cast<std::size_t>(r)] = true;
    --staying;
  }
  if (staying == static_cast<int>(tasks_.size())) return std::nullopt;
  return begin_change_without(leaving);
}

bool membership_state::complete(std::uint64_t generation) {
  if (phase_ != phase::changing || !pending_ || pending_->generation != generation) return false;
  generation_ = pending_->generation;
  tasks_ = pending_->tasks;
  lost_.assign(tasks_.size(), false);
  reasons_.assign(tasks_.size(), std::string());
  pending_.reset();
  phase_ = phase::stable;
  ++changes_;
  return true;
}

void membership_state::abort(const std::string& why) {
  if (phase_ == phase::failed) return;
  fail(pending_ ? "the change to generation " + std::to_string(pending_->generation) + " failed: " + why : why);
}

std::optional<std::int64_t> common_commit(const std::vector<std::vector<std::int64_t>>& held) {
  if (held.empty()) return std::nullopt;
  std::optional<std::int64_t> best;
  for (std::int64_t step : held.front()) {
    const bool everywhere = std::all_of(held.begin() + 1, held.end(), [step](const std::vector<std::int64_t>& h) {
      return std::find(h.begin(), h.end(), step) != h.end();
    });
    if (everywhere && (!best || step > *best)) best = step;
  }
  return best;
}

bool is_loss_verdict(const std::string& task, const std::string& reason) {
  auto starts = [&](const std::string& what) { return reason.compare(0, what.size(), what) == 0; };
  return !task.empty() && (starts(task + "'s connection to the chief closed") || starts(task + " sent no heartbeat for "));
}

std::string generation_incarnation(const std::string& incarnation, std::uint64_t generation) {
  if (generation == 0) return incarnation;
  return hmac_sha256_hex(incarnation, "troupe ring generation " + std::to_string(generation)).substr(0, 32);
}

}  // namespace troupe::actors
