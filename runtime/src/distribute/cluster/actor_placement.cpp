#include "distribute/cluster/actor_placement.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>

#include "distribute/cluster/actor_cluster_impl.hpp"
#include "distribute/cluster/cluster_net.hpp"
#include "troupe/base/parse_number.hpp"

namespace troupe::distribute {

namespace detail {

std::optional<task_ref> parse_task(const std::string& task) {
  std::string job, index;
  const std::string prefix = "/job:";
  if (task.rfind(prefix, 0) == 0) {
    const auto slash = task.find('/', prefix.size());
    const std::string mid = "/replica:0/task:";
    if (slash == std::string::npos || task.compare(slash, mid.size(), mid) != 0) return std::nullopt;
    job = task.substr(prefix.size(), slash - prefix.size());
    index = task.substr(slash + mid.size());
  } else {
    const auto colon = task.find(':');
    if (colon == std::string::npos) return std::nullopt;
    job = task.substr(0, colon);
    index = task.substr(colon + 1);
  }
  const auto n = base::parse_int(index);
  if (job.empty() || !n || *n < 0 || *n > 1'000'000) return std::nullopt;
  return task_ref{job, static_cast<int>(*n)};
}

std::optional<std::string> any_job(const std::string& task) {
  if (task == "any") return std::string("worker");
  if (task.rfind("any:", 0) == 0) return task.substr(4);
  return std::nullopt;
}

std::string tasks_of(const ClusterSpec& cluster) {
  std::string out;
  for (const auto& job : cluster.jobs()) {
    for (int i = 0; i < cluster.num_tasks(job); ++i) out += (out.empty() ? "" : ", ") + job + ":" + std::to_string(i);
  }
  return out.empty() ? "none" : out;
}

void actor_load::spawned(std::uint64_t id, const std::string& task) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_[id] = task;
  lost_.erase(task);
}

void actor_load::went_down(std::uint64_t id, const std::string& task, bool host_lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(id);
  if (host_lost) lost_.insert(task);
}

void actor_load::unreachable(const std::string& task) {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.insert(task);
}

std::vector<int> actor_load::of(const ClusterSpec& cluster, const std::string& job) const {
  std::vector<int> out(static_cast<std::size_t>(std::max(0, cluster.num_tasks(job))), 0);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, t] : live_) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (t == task_name(job, static_cast<int>(i))) ++out[i];
    }
  }
  return out;
}

std::vector<int> actor_load::order(const ClusterSpec& cluster, const std::string& job, const std::string& own,
                                   const std::string& exclude) const {
  const auto load = of(cluster, job);
  std::vector<std::tuple<bool, int, int>> order;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < load.size(); ++i) {
      const std::string name = task_name(job, static_cast<int>(i));
      if (name == own || name == exclude) continue;
      order.emplace_back(lost_.count(name) > 0, load[i], static_cast<int>(i));
    }
  }
  std::sort(order.begin(), order.end());
  std::vector<int> out;
  for (const auto& o : order) out.push_back(std::get<2>(o));
  return out;
}

}  // namespace detail

ActorCluster::Impl::placed ActorCluster::Impl::place_any(const std::string& type, const std::string& job,
                                                         const std::string& args_bytes, const std::string& what,
                                                         const std::string& exclude,
                                                         std::chrono::milliseconds wait_listening) {
  const auto deadline = std::chrono::steady_clock::now() + wait_listening;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    placed out;
    for (int index : placement_order(job, exclude)) {
      bool reached = true;
      try {
        out.ref = spawn_remote(type, job, index, args_bytes, what, &reached);
        return out;
      } catch (const Error& e) {
        out.tried += "\n  " + std::string(e.what());
        // The host answered (the type, its factory): another task would refuse it the same way.
        if (reached) {
          out.refused = e.what();
          return out;
        }
      }
    }
    if (closed || std::chrono::steady_clock::now() + pause > deadline) return out;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace troupe::distribute
