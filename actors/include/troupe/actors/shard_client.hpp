#pragma once

// A worker's side of the ps tasks (cluster_tasks.hpp has the walkthrough: steps 5 and 5a).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/cluster_task_types.hpp"

namespace troupe::actors {

/// A worker's connections to the ps tasks, made on first use, for functions that read and update
/// variables. Thread-safe. read, update, read_many and update_many carry encoded shards through
/// CAF (the control plane); read_into and update_from carry raw elements over the ps tasks' data
/// connections (5a), which is what FunctionContext uses.
class shard_client {
 public:
  shard_client(caf::actor_system& system, std::string task, std::vector<task_endpoint> ps,
               std::shared_ptr<control_credentials> credentials, std::chrono::milliseconds timeout);
  ~shard_client();
  /// A shard's bytes; throws std::runtime_error naming the ps task.
  std::string read(int ps, const std::string& key);
  /// Applies an update; throws std::runtime_error naming the ps task.
  void update(int ps, const std::string& key, update_op op, std::string delta);
  /// Reads several shards (ps task, key) with every request in flight at once; the bytes in order.
  std::vector<std::string> read_many(const std::vector<std::pair<int, std::string>>& shards);
  /// One update of update_many.
  struct shard_update {
    int ps = 0;
    std::string key;
    update_op op = update_op::assign;
    std::string bytes;
  };
  /// Applies several updates with every request in flight at once; waits for all of them, then
  /// throws for the first that failed.
  void update_many(std::vector<shard_update> updates);

  /// One shard of read_into: its elements' bytes go to `into` (`nbytes` of `dtype`, what the
  /// variable's registered shape and dtype say; a ps task that answers otherwise is an error).
  struct shard_read {
    int ps = 0;
    std::string key;
    void* into = nullptr;
    std::size_t nbytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Reads shards' raw elements over the ps tasks' data connections, straight into place; throws
  /// std::runtime_error naming the ps task (its connection is made again next time).
  void read_into(const std::vector<shard_read>& shards);
  /// One update of update_from: `nbytes` raw elements of `dtype` at `from`, applied with `op`.
  struct shard_write {
    int ps = 0;
    std::string key;
    update_op op = update_op::assign;
    const void* from = nullptr;
    std::size_t nbytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Applies updates over the data connections, sent from where they lie; waits for every one,
  /// then throws for the first that failed, naming its ps task.
  void update_from(const std::vector<shard_write>& updates);

  /// One shard of gather_into: rows `rows[0..count)` of the shard (local row indices), each
  /// `row_bytes` of `dtype`, go one after another to `into`.
  struct shard_gather {
    int ps = 0;
    std::string key;
    const std::uint64_t* rows = nullptr;
    std::size_t count = 0;
    void* into = nullptr;
    std::size_t row_bytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Reads some rows of shards over the data connections, every request in flight at once; throws
  /// std::runtime_error naming the ps task (a row the shard lacks included).
  void gather_into(const std::vector<shard_gather>& gathers);
  /// One shard of scatter_from: `count` rows of `row_bytes` at `from`, applied with `op` to the
  /// shard's rows `rows[0..count)`.
  struct shard_scatter {
    int ps = 0;
    std::string key;
    update_op op = update_op::assign;
    const std::uint64_t* rows = nullptr;
    std::size_t count = 0;
    const void* from = nullptr;
    std::size_t row_bytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Changes some rows of shards over the data connections; waits for every one, then throws for
  /// the first that failed, naming its ps task.
  void scatter_from(const std::vector<shard_scatter>& scatters);

  /// One shard of apply_from: an optimizer update that the shard's ps task applies with its own
  /// slots. `params` points at apply_params_bytes of encoded parameters (encode_apply_params);
  /// then either `nbytes` of gradient for the whole shard (count 0), or gradients of `count` rows
  /// (`rows`, local row indices) of `row_bytes` each, `nbytes` = count * row_bytes.
  struct shard_apply {
    int ps = 0;
    std::string key;
    shard_optimizer kind = shard_optimizer::sgd;
    const unsigned char* params = nullptr;
    const std::uint64_t* rows = nullptr;
    std::size_t count = 0;
    const void* from = nullptr;
    std::size_t nbytes = 0;
    std::uint8_t dtype = 0;
  };
  /// Sends optimizer updates over the data connections, every one in flight at once; waits for
  /// every one, then throws for the first that failed, naming its ps task.
  void apply_from(const std::vector<shard_apply>& applies);

  /// Ends every wait of this client now and from now on (its task stops): what waits, and what
  /// asks later, throws std::runtime_error with `why`. Thread-safe.
  void cancel(const std::string& why);

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::actors
