#pragma once

// The chief's side of a sharded checkpoint (troupe/distribute/sharded_checkpoint.hpp), shared by
// ShardedCheckpointManager (every variable of a ParameterServerStrategy) and by Checkpoint and
// CheckpointManager (the variables they track, when those live on the ps tasks).

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/distribute/parameter_server_strategy.hpp"

namespace troupe::distribute::detail {

/// `directory` absolute, without "." or ".." components (what the ps tasks are handed).
std::string absolute_checkpoint_directory(const std::string& directory);

/// Creates `directory` when missing (a path that is a file, or cannot be created, throws
/// CheckpointError naming it, with `who` first).
void make_checkpoint_directory(const std::string& directory, const std::string& who);

/// Removes the temporary directories that killed saves left in `directory`
/// ("ckpt-<step>.tmp-<pid>-<n>"), except those of a process still running on this host.
void remove_interrupted_saves(const std::string& directory, const std::string& who);

/// Saves `variables` (the strategy's shards of each, as ParameterServerStrategy::variables()
/// describes them) with their ps tasks' optimizer state as the checkpoint directory `final_dir`
/// (absolute), atomically as a whole: every ps task writes its file into
/// "<parent>/ckpt-<step>.tmp-<pid>-<n>/" at once, the chief writes the manifest last, and the
/// directory is renamed to `final_dir` (replacing one of that name). Returns `final_dir`; a
/// failure is CheckpointError, with `who` first, and leaves nothing behind. `checkpoint_names`
/// (empty, or one per variable): each variable's name in the Checkpoint that saves it, recorded in
/// the manifest, where restore finds it.
std::string save_sharded(ParameterServerStrategy& strategy, const std::string& final_dir, std::int64_t step,
                         const std::vector<ShardedVariable>& variables, const std::string& who,
                         const std::vector<std::string>& checkpoint_names = {});

/// A variable to restore: its current shards, and `alias`, its name in a Checkpoint (empty for a
/// ShardedCheckpointManager's). A checkpoint a Checkpoint saved is searched by that name; any
/// other by the variable's own name, else by `alias`.
struct RestoreTarget {
  ShardedVariable current;
  std::string alias;
};

/// Restores `targets` from the checkpoint directory `dir` (resharded onto their current shards)
/// and returns its step. Every file and variable is checked before anything is written: a problem
/// is CheckpointError naming the file or variable, and changes nothing.
std::int64_t restore_sharded(ParameterServerStrategy& strategy, const std::string& dir,
                             const std::vector<RestoreTarget>& targets);

/// Reads `dir`'s manifest and checks every shard file (size, XXH64, each tensor's checksum):
/// CheckpointError naming the first problem.
void verify_sharded(const std::string& dir);

/// Deletes the oldest checkpoint directories of `directory` beyond `max_to_keep`, never `keep`.
void prune_sharded(const std::string& directory, int max_to_keep, const std::string& keep);

/// Whether `dir` is a directory holding a manifest.json.
bool is_sharded_checkpoint(const std::string& dir);

}  // namespace troupe::distribute::detail
