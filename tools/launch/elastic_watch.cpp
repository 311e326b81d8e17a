#include "launch/elastic_watch.hpp"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cstdlib>

#include "launch/cluster.hpp"
#include "launch/supervisor.hpp"
#include "troupe/base/parse_number.hpp"

namespace troupe::launch {

void elastic_watch::note_stop(worker& w) {
  siginfo_t info{};
  info.si_pid = 0;
  if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WSTOPPED | WCONTINUED | WNOHANG) != 0 || info.si_pid == 0) {
    return;
  }
  if (info.si_code == CLD_STOPPED || info.si_code == CLD_TRAPPED) {
    if (!w.stopped_since) w.stopped_since = clock::now();
  } else if (info.si_code == CLD_CONTINUED) {
    w.stopped_since.reset();
  }
}

clock::duration elastic_watch::stall_limit() {
  auto setting = [](const char* name, long long fallback, long long min, long long max) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    const std::optional<long long> v = base::parse_int(text);
    return v && *v >= min && *v <= max ? *v : fallback;
  };
  const long long interval_ms = setting("TROUPE_HEARTBEAT_MS", 500, 10, 600000);
  const long long missed = setting("TROUPE_MISSED_HEARTBEATS", 6, 1, 1000);
  return std::chrono::milliseconds(interval_ms * (missed + 1));
}

void elastic_watch::check_stalls(std::vector<worker>& workers, clock::time_point now, const say_fn& say) const {
  if (!options_.elastic) return;
  for (auto& w : workers) {
    if (!w.running || !w.stopped_since || now - *w.stopped_since < stall_limit()) continue;
    const double s = std::chrono::duration<double>(now - *w.stopped_since).count();
    say(w.describe() + " has been stopped for " + seconds_text(s) +
        " s, past the heartbeat limit (TROUPE_HEARTBEAT_MS x (TROUPE_MISSED_HEARTBEATS + 1)); --elastic: killing it "
        "(SIGKILL) as lost");
    w.stopped_since.reset();
    ::kill(-w.pid, SIGKILL);
  }
}

std::optional<clock::time_point> elastic_watch::next_stall_check(const std::vector<worker>& workers) const {
  std::optional<clock::time_point> next;
  if (!options_.elastic) return next;
  for (const auto& w : workers) {
    if (!w.running || !w.stopped_since) continue;
    const auto at = *w.stopped_since + stall_limit();
    if (!next || at < *next) next = at;
  }
  return next;
}

bool elastic_watch::goes_on(const worker& w, int status, const std::string& how, int running,
                            const say_fn& say) const {
  // A worker that died (a signal: killed, crashed) is dropped by the others, which go on while at
  // least --min of them run (no new member is started in its place unless --max-restarts says
  // so). One that exited with a status said itself that it failed, and rank 0 holds the cluster's
  // membership: either way the run fails, as without --elastic.
  if (!options_.elastic || w.rank == 0 || !WIFSIGNALED(status) || running < options_.min_workers.value_or(1)) {
    return false;
  }
  say(w.describe() + " " + how + "; --elastic: the " + std::to_string(running) +
      (running == 1 ? " other goes" : " others go") + " on without it");
  return true;
}

std::optional<std::vector<std::string>> elastic_watch::replacement_env(const worker& w, std::vector<std::string> base,
                                                                       const std::vector<std::string>& addresses,
                                                                       const say_fn& say) {
  if (replacements_ >= options_.max_restarts) return std::nullopt;
  ++replacements_;
  replaced_.insert(w.rank);
  base.push_back("TROUPE_JOIN=1");
  base.push_back("TF_CONFIG=" + tf_config_json(addresses, w.rank, options_.chief, options_.ps));
  say("starting a replacement for worker " + std::to_string(w.rank) + " (" + std::to_string(replacements_) + " of " +
      std::to_string(options_.max_restarts) + "); it joins the running cluster");
  return base;
}

bool elastic_watch::late(const worker& w, int status, bool chief_finished, const say_fn& say) const {
  if (!chief_finished || !replacement(w.rank) || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) return false;
  const std::string how = WIFSIGNALED(status) ? "was killed by " + signal_name(WTERMSIG(status))
                                              : "exited with status " + std::to_string(WEXITSTATUS(status));
  say(w.describe() + ", a replacement, " + how +
      " after the chief finished the training (it came too late to join, or ended after it); not a failure");
  return true;
}

}  // namespace troupe::launch
