#pragma once

// A ps task's part of a sharded checkpoint (troupe/distribute/sharded_checkpoint.hpp): its shards
// written in troupe's checkpoint file format, the task_handlers::save of a ps task.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/cluster_task_types.hpp"

namespace troupe::distribute::detail {

/// Writes `shards` to `path` atomically (format::write_checkpoint_file) and reads the file back
/// for its size and XXH64. The directory must exist and be a directory, not a link. An error
/// message naming the path, or nothing.
std::optional<std::string> save_shard_file(const std::string& path, std::int64_t step,
                                           const std::vector<actors::shard_snapshot>& shards, std::uint64_t& file_bytes,
                                           std::uint64_t& file_hash);

}  // namespace troupe::distribute::detail
