#pragma once

// What the chief's other parts (sharded checkpoints) reach of a ParameterServerStrategy.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/dispatcher.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"

namespace troupe::distribute::detail {

struct PsAccess {
  /// The chief's dispatcher: its requests to the ps tasks.
  static actors::dispatcher& dispatcher(ParameterServerStrategy& s);
  /// ServerOptions::peer_timeout: the bound of each request.
  static std::chrono::milliseconds timeout(ParameterServerStrategy& s);
  /// Calls `hook` with each function's result that arrives from now on, and the index of the
  /// worker that ran it (the cluster's worker order, as the dispatcher's board counts them), on
  /// the dispatcher's thread before the RemoteValue is ready; an empty function stops it.
  static void on_result(ParameterServerStrategy& s, std::function<void(int, const std::vector<Tensor>&)> hook);

  // A lost ps task restarted alone (ClusterCoordinatorOptions::ps_restart_wait), for Model::fit.
  /// The ps restart wait the coordinator was configured with (0: a lost ps task ends the training).
  static std::chrono::milliseconds ps_restart_wait(ParameterServerStrategy& s);
  /// Ps tasks lost (and awaited) so far.
  static std::uint64_t ps_losses(ParameterServerStrategy& s);
  /// After a function failed: waits up to `settle` for the chief to hear of a ps loss beyond the
  /// `seen` first ones (a worker may report it first); nullopt when none came. Then waits until
  /// every lost ps task is reached again, and returns those reached since the last call (their
  /// shards are gone), or throws troupe::Error naming a ps task lost for good.
  static std::optional<std::vector<int>> await_ps_restart(ParameterServerStrategy& s, std::uint64_t seen,
                                                          std::chrono::milliseconds settle);
  /// Makes every variable shard placed on ps tasks `ps` again there (zeros, to be restored).
  static void remake_shards(ParameterServerStrategy& s, const std::vector<int>& ps);
  /// The directory of the last CheckpointManager of ps variables (or ShardedCheckpointManager)
  /// made on the strategy ("" when none).
  static void set_checkpoint_directory(ParameterServerStrategy& s, const std::string& directory);
  static std::string checkpoint_directory(ParameterServerStrategy& s);
  /// The strategy's log (ServerOptions::log, else stderr with "troupe: ").
  static void log(ParameterServerStrategy& s, const std::string& line);
};

}  // namespace troupe::distribute::detail
