// Restarts by RestartPolicy: a supervised actor whose host was lost is respawned one for one on
// another task of its job (placed as "any"), at most max_restarts times within the policy's
// window; past that its handle's calls are ActorRestartsExhausted. The restarts run one at a time
// on the ActorCluster's restart thread (a restart blocks on a spawn).

#include <chrono>
#include <exception>
#include <stdexcept>

#include "distribute/cluster/actor_cluster_impl.hpp"
#include "troupe/base/quote.hpp"

namespace troupe::distribute {

void ActorCluster::Impl::supervise(std::uint64_t id, const std::shared_ptr<ActorHandle::Impl>& h) {
  std::lock_guard<std::mutex> lock(supervised_mutex);
  supervised[id] = h;
}

std::shared_ptr<ActorHandle::Impl> ActorCluster::Impl::supervised_handle(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(supervised_mutex);
  auto it = supervised.find(id);
  if (it == supervised.end()) return nullptr;
  auto h = it->second.lock();
  supervised.erase(it);
  return h;
}

void ActorCluster::Impl::unsupervise(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(supervised_mutex);
  supervised.erase(id);
}

namespace detail {

void check_restart_policy(const RestartPolicy& policy, const std::string& what) {
  if (policy.max_restarts < 0 || policy.max_restarts > 1000 || policy.window.count() <= 0) {
    throw std::invalid_argument(what + ": RestartPolicy max_restarts " + std::to_string(policy.max_restarts) +
                                " within " + std::to_string(policy.window.count()) +
                                " ms (expected 0..1000 restarts within a window above 0 ms)");
  }
}

namespace {

// Restarts a supervised actor whose host was lost (on the cluster's restart thread).
void restart_actor(const std::shared_ptr<ActorHandle::Impl>& h, const actors::actor_down& d) {
  auto& s = *h->cluster;
  ActorRestart r;
  r.previous_id = d.id;
  r.type = h->type;
  r.from = d.task;
  const std::string who = "actor " + base::quoted(h->type) + " #" + std::to_string(d.id) + " on " + d.task;
  std::string gave_up;
  bool cancelled = false;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    if (h->stopped) {
      // Stopped by its spawner after it went down, before this restart began: none is made.
      cancelled = true;
      gave_up = who + " went down (" + d.cause + ") and was stopped by its spawner before its restart: not restarted";
    }
    while (!h->restart_times.empty() && now - h->restart_times.front() >= h->policy.window) {
      h->restart_times.pop_front();
    }
    if (cancelled) {
      // Nothing counts against the budget.
    } else if (static_cast<int>(h->restart_times.size()) >= h->policy.max_restarts) {
      gave_up = who + " went down (" + d.cause + ") after " + std::to_string(h->restart_times.size()) +
                " restart(s) within " + std::to_string(h->policy.window.count()) +
                " ms, the most its RestartPolicy allows (max_restarts " + std::to_string(h->policy.max_restarts) +
                "): not restarted";
    } else {
      h->restart_times.push_back(now);
    }
    r.restarts = static_cast<int>(h->restart_times.size());
  }
  std::shared_ptr<actors::actor_ref> ref;
  if (gave_up.empty() && s.closed) gave_up = who + ": its ActorCluster is gone";
  if (gave_up.empty()) {
    const std::string what = "restart of " + who;
    std::string tried;
    try {
      auto placed = s.place_any(h->type, h->job, h->args_bytes, what, d.task);
      ref = std::move(placed.ref);
      tried = std::move(placed.tried);
    } catch (const std::exception& e) {
      tried += "\n  " + std::string(e.what());
    }
    if (!ref) gave_up = what + ": no other " + h->job + " task took it:" + (tried.empty() ? " there is none" : tried);
  }
  bool stop_new = false;
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    if (ref) {
      h->adopt(ref);
      ++h->restarts;
      r.id = h->now->id;
      r.task = h->now->task;
      // Stopped by its spawner while this restart ran: the new actor is the one to stop.
      stop_new = h->stopped;
      if (!stop_new) s.supervise(r.id, h);
    } else if (cancelled) {
      h->cancelled = gave_up;
      r.error = gave_up;
    } else {
      h->exhausted = gave_up;
      r.error = gave_up;
    }
    h->restarting = false;
  }
  // Before anyone waiting for the restart can reach the new actor: it is stopped already.
  if (stop_new) s.client->stop(*ref);
  h->changed.notify_all();
  if (ref) s.report(ActorEvent::Kind::restarted, r.id, h->type, r.task, {}, r.previous_id);
  s.log(ref ? "restarted " + who + " as #" + std::to_string(r.id) + " on " + r.task + " (restart " +
                  std::to_string(r.restarts) + " of at most " + std::to_string(h->policy.max_restarts) + " within " +
                  std::to_string(h->policy.window.count()) + " ms)" +
                  (stop_new ? ", then stopped: its spawner stopped it while it restarted" : "")
            : gave_up);
  if (s.options.on_restart) {
    try {
      s.options.on_restart(r);
    } catch (...) {
      // The application's callback must not end the restart thread.
    }
  }
}

}  // namespace

void actor_went_down(const std::shared_ptr<ActorCluster::Impl>& self, actors::actor_down d) {
  self->load.went_down(d.id, d.task, d.host_lost);
  if (!d.host_lost) self->unsupervise(d.id);  // stopped by its spawner: no restart
  if (!self->closed) self->report(ActorEvent::Kind::down, d.id, d.type, d.task, d.cause, 0, d.stopped);
  bool restarting = false;
  if (d.host_lost && !self->closed) {
    if (auto h = self->supervised_handle(d.id)) {
      std::lock_guard<std::mutex> lock(h->mutex);
      if (h->now && h->now->id == d.id && h->exhausted.empty() && !h->stopped) {
        h->restarting = restarting = true;
        self->restarter.post([h, d] { restart_actor(h, d); });
      }
    }
  }
  if (!self->closed && self->options.on_down) {
    self->options.on_down(ActorDown{d.id, d.type, d.task, d.cause, restarting});
  }
}

}  // namespace detail

}  // namespace troupe::distribute
