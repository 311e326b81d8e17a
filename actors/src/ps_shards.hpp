#pragma once

// A ps task's variable shards (troupe/actors/cluster_tasks.hpp, steps 5 and 5a): each a cell
// shared by its actor (the control plane's reads and updates) and the task's data connections.
// Internal to actors/.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "troupe/actors/task_server.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace troupe::actors {

// A shard: its bytes (the runtime's encoding of the tensor), shared by its actor (the control
// plane's reads and updates) and the ps task's data connections. A read takes a reference to the
// bytes under the shared lock and sends them after releasing it, so that a reader that stalls
// (a stopped worker) never holds up the updates. An update, whole in hand, is applied under the
// exclusive lock, in place when no read holds the bytes, else to a copy that then replaces them
// (copy on write): a read sees the shard before or after an update, never in between.
struct shard_cell {
  std::shared_mutex mutex;
  std::shared_ptr<std::string> value = std::make_shared<std::string>();
  shard_layout layout;
  // An optimizer's slots (each the size of the elements), made as zeros by the shard's first
  // optimizer update, the kind that made them (another kind later is refused) and the updates
  // applied so far. Changed under the exclusive lock only.
  std::vector<std::string> slots;
  std::optional<shard_optimizer> slot_kind;
  std::int64_t applied = 0;

  // The bytes to change, with the exclusive lock held: no new reference can be taken meanwhile,
  // so a count of one means no read holds them.
  std::string& writable() {
    if (value.use_count() > 1) value = std::make_shared<std::string>(*value);
    return *value;
  }
};

// What a ps task's shards were asked for since it started, for the chief's dashboard: updates
// applied (an optimizer update, an assignment or addition, a scatter), the bytes of the requests
// received and of the reads sent.
struct shard_traffic {
  std::atomic<std::uint64_t> updates{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> bytes_out{0};
};

// The ps task's shards by key, for its data connections.
struct shard_store {
  shard_traffic traffic;
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<shard_cell>> cells;
  std::shared_ptr<shard_cell> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cells.find(key);
    return it == cells.end() ? nullptr : it->second;
  }
  void put(const std::string& key, std::shared_ptr<shard_cell> cell) {
    std::lock_guard<std::mutex> lock(mutex);
    cells[key] = std::move(cell);
  }
};

struct shard_state {
  std::shared_ptr<shard_cell> cell;
};

/// The actor of one shard: (vread) -> bytes, (vupdate, op, bytes) -> bool, an update's op byte
/// checked before anything is applied.
caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, std::shared_ptr<shard_cell> cell,
                          std::shared_ptr<const task_handlers> handlers);

/// Serves one proven data connection of a ps task until the peer closes it (5a of the walkthrough).
void serve_shards(transport::bulk_stream& s, shard_store& store, const task_handlers& h, const std::string& task);

}  // namespace troupe::actors
