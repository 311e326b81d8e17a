#pragma once

// What a worker task gives the functions it runs: the variables (through its connections to the
// ps tasks, from the layout its chief sent) and its per-worker iterators. Internal to runtime/.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "distribute/cluster/remote_wire.hpp"
#include "troupe/actors/cluster_tasks.hpp"
#include "troupe/data/dataset.hpp"
#include "troupe/distribute/remote_function.hpp"

namespace troupe::distribute::detail {

struct WorkerServices {
  caf::actor_system* system = nullptr;
  std::string task;
  const FunctionRegistry* functions = nullptr;
  std::shared_ptr<actors::control_credentials> credentials;
  std::chrono::milliseconds peer_timeout{60000};

  std::mutex mutex;
  VariableTable table;
  std::shared_ptr<actors::shard_client> shards;     // for table.ps
  std::map<std::uint64_t, data::Iterator> iterators;  // by id, made on first use
  bool stopping = false;  // the task stops: no new connections, every wait on the ps tasks ends

  /// Takes a new layout from the chief (a malformed one is refused with the reason).
  void set_table(const std::string& blob);
  /// The variable and the client that reaches its shards; std::invalid_argument for a name the
  /// table lacks.
  std::pair<ShardedVariable, std::shared_ptr<actors::shard_client>> variable(const std::string& name);
  /// Per-worker iterator `id`, made from its dataset function on first use.
  data::Iterator& iterator(std::uint64_t id, const std::string& dataset_function);
  /// The task stops: a function still running gives up its waits on the ps tasks (it throws).
  void cancel();
};

}  // namespace troupe::distribute::detail
