#include "launch/ps_restart.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "launch/cluster.hpp"
#include "launch/supervisor.hpp"
#include "launch/supervisor_impl.hpp"

namespace troupe::launch {

namespace {

// The chief's wait when the caller set none: the backoff, a start, and room to spare.
int default_wait_s(double backoff_s) { return 30 + static_cast<int>(std::ceil(backoff_s)); }

}  // namespace

ps_restart::ps_restart(const launch_options& options) : options_(options) {
  const char* wait = std::getenv("TROUPE_PS_RESTART_WAIT_S");
  caller_set_wait_ = wait != nullptr && *wait != '\0';
  // The caller's 0 keeps the chief from waiting: a ps task restarted alone would find no one.
  const bool off = caller_set_wait_ && std::string(wait) == "0";
  enabled_ = options.max_restarts > 0 && options.ps > 0 && !options.elastic && !off;
}

bool ps_restart::is_ps(int rank) const noexcept {
  return options_.ps > 0 && rank >= options_.num_workers - options_.ps && rank < options_.num_workers;
}

void ps_restart::environment(std::vector<std::string>& env) const {
  if (!enabled_ || caller_set_wait_) return;
  env.push_back("TROUPE_PS_RESTART_WAIT_S=" + std::to_string(default_wait_s(options_.restart_backoff_s)));
}

bool ps_restart::takes(const worker& w, const std::string& how, int used, const say_fn& say) {
  if (!enabled_ || !is_ps(w.rank) || used >= options_.max_restarts) return false;
  const double backoff = std::min(options_.restart_backoff_s, max_restart_backoff_s);
  pending_.push_back({w.rank, clock::now() + std::chrono::duration_cast<clock::duration>(
                                                 std::chrono::duration<double>(backoff))});
  say(w.describe() + " " + how + "; restarting it alone on " + w.address + " (restart " + std::to_string(used + 1) +
      " of " + std::to_string(options_.max_restarts) + ") in " + seconds_text(backoff) +
      " s; the other tasks keep running");
  return true;
}

std::vector<int> ps_restart::due(clock::time_point now) {
  std::vector<int> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->at <= now) {
      out.push_back(it->rank);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::optional<clock::time_point> ps_restart::next() const {
  std::optional<clock::time_point> t;
  for (const auto& p : pending_) {
    if (!t || p.at < *t) t = p.at;
  }
  return t;
}

bool ps_restart::pending(int rank) const {
  return std::any_of(pending_.begin(), pending_.end(), [&](const pending_start& p) { return p.rank == rank; });
}

void supervisor::restart_ps(int rank) {
  worker& w = workers_[static_cast<std::size_t>(rank)];
  if (stopping_ || w.running) return;
  for (auto& s : w.streams) close_stream(s);
  std::vector<std::string> env = base_environment();
  env.push_back("TF_CONFIG=" + tf_config_json(addresses_, w.rank, options_.chief, options_.ps));
  if (!start_worker(w, env, command_for(w, env))) {
    begin_stop(SIGTERM);
    return;
  }
  say(w.describe() + " started again");
}

}  // namespace troupe::launch
