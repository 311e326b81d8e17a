#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "troupe/checkpoint.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"

namespace troupe::distribute {

/// Checkpoints of a ParameterServerStrategy's variables with the optimizer state the ps tasks
/// keep beside their shards (the slots of ShardOptimizer momentum, Adam and AdamW, and each
/// shard's update count, Adam's step t), as TensorFlow checkpoints a ShardedVariable and its
/// slots. Construct it on the chief, after the variables exist (restore writes into them).
///
/// troupe::Checkpoint and troupe::CheckpointManager write and read these same checkpoints when
/// the variables they track live on the ps tasks (a model's made in the strategy's scope,
/// model.variables()): that is the usual way. This manager is the checkpoint of every variable
/// of the strategy, those made with create_variable included, under their own names.
///
/// A checkpoint is a directory `<directory>/ckpt-<step>/`:
/// - `shard-<i>-of-<n>.ckpt`: written by ps task i itself, all ps tasks at once, in troupe's
///   checkpoint file format (format/include/troupe/format/checkpoint_file.hpp, XXH64 per
///   tensor): for each shard it holds, the tensor `<key>` (its rows), `<key>/slot_0` and
///   `<key>/slot_1` (as many as its optimizer keeps) and `<key>/state` (int64: the updates
///   applied, the optimizer's code or -1);
/// - `manifest.json`, written by the chief last: the step, the variables (name, dtype, shape,
///   their shards' keys, ps tasks and rows, and the name a Checkpoint that saved them gave each)
///   and each shard file's size and XXH64.
///
/// Atomic as a whole: everything is written into `ckpt-<step>.tmp-<pid>-<n>/`, each file itself
/// atomically (temporary file, fsync, rename), then the manifest, and only then is the directory
/// renamed to `ckpt-<step>` and its parent fsynced. A chief or ps task killed mid-save leaves a
/// temporary directory that no reader takes for a checkpoint (it is removed by the next manager
/// on that directory), and the previous checkpoints stay whole. The directory must be one file
/// system that the chief and every ps task reach at the same path (as a multi-worker Checkpoint's
/// directory is shared between the workers).
///
/// Restore reads the manifest and every shard file (each checked against its size and XXH64,
/// and every tensor against its own), onto the same or another number of ps tasks and
/// partitioning: each variable's rows, slots and step are cut along the current shards
/// (resharding, as TensorFlow restores a ShardedVariable onto another partitioner). A shard made
/// of rows of several saved shards takes the largest step among them. Nothing is written to the
/// ps tasks until every file and variable checked out.
class ShardedCheckpointManager {
 public:
  /// Keeps the last `max_to_keep` (>= 1, else std::invalid_argument) checkpoints in
  /// `directory`, created when missing (a path that is a file, or cannot be created, throws
  /// CheckpointError naming it). Temporary directories of killed saves there are removed, except
  /// those of a process still running on this host.
  ShardedCheckpointManager(ParameterServerStrategy& strategy, std::string directory, int max_to_keep = 5);

  /// Saves every variable with its shards' optimizer state as `ckpt-<step>` (step >= 0),
  /// replacing one of the same step, then deletes the oldest beyond max_to_keep; returns the
  /// checkpoint's directory. Call it between ClusterCoordinator::join() and the next schedule for
  /// a checkpoint of one moment (updates still arriving land in some shards' files and not in
  /// others, as in TensorFlow). A ps task that fails is CheckpointError naming it; the previous
  /// checkpoints stay.
  std::string save(std::int64_t step);
  /// The newest checkpoint directory (with a manifest), if any.
  std::optional<std::string> latest_checkpoint() const;
  /// All checkpoint directories, oldest first.
  std::vector<std::string> checkpoints() const;
  /// Restores every variable of the strategy from the checkpoint directory `path` and returns its
  /// step. A missing or corrupt manifest or shard file, or a variable missing or of another dtype
  /// or shape, throws CheckpointError naming the file or variable, and changes nothing.
  std::int64_t restore(const std::string& path);
  /// Restores the newest checkpoint that reads back intact (a corrupt one is reported on stderr
  /// and skipped) and returns its step; nullopt when there is none. Throws CheckpointError when
  /// checkpoints exist and none is intact, or when an intact one does not match the variables.
  std::optional<std::int64_t> restore_or_initialize();

  const std::string& directory() const noexcept { return directory_; }

 private:
  ParameterServerStrategy* strategy_;
  std::string directory_;
  int max_to_keep_;
};

/// One shard file of a sharded checkpoint, as inspect_sharded_checkpoint found it.
struct ShardFileInfo {
  std::string path;
  std::uint64_t bytes = 0;          ///< as the manifest says
  std::uint64_t xxh64 = 0;          ///< as the manifest says
  std::string problem;              ///< empty: present, of that size and hash, every tensor intact
  std::vector<CheckpointEntry> entries;  ///< its tensors (when readable)
};

/// What a sharded checkpoint directory holds.
struct ShardedCheckpointInfo {
  std::string path;
  std::int64_t step = 0;
  int num_ps = 0;
  std::vector<ShardedVariable> variables;  ///< as the manifest says
  std::vector<ShardFileInfo> files;
  /// Whether every file is present and intact.
  bool intact() const;
};

/// Reads a sharded checkpoint directory without restoring it (for troupe-ckpt): a missing,
/// unreadable or malformed manifest throws CheckpointError naming it; a shard file that is
/// missing, of another size or hash, or holds a tensor failing its checksum is reported in its
/// ShardFileInfo::problem, naming the file.
ShardedCheckpointInfo inspect_sharded_checkpoint(const std::string& path);

/// The variables of a sharded checkpoint, each whole (its shards' rows joined in the manifest's
/// order), with their optimizer's slots joined the same way: what a process outside the cluster
/// loads into its own copy of the model (a SidecarEvaluator, Checkpoint::restore and load_model of
/// variables of this process).
struct ShardedCheckpointValues {
  std::string path;
  std::int64_t step = 0;
  std::map<std::string, Tensor> variables;  ///< by name, of the manifest's dtype and shape
  /// By variable name: the slots the ps tasks' optimizer keeps beside it, by Keras's slot names
  /// ("momentum"; "m" and "v" for Adam and AdamW), of the variable's dtype and shape (zeros in the
  /// rows of a shard it had not updated yet). No entry for a variable no optimizer updated.
  std::map<std::string, std::map<std::string, Tensor>> slots;
  /// The name each variable has in the Checkpoint that saved it ("dense_0/kernel") -> its name
  /// here ("kernel"); empty when a ShardedCheckpointManager saved it.
  std::map<std::string, std::string> checkpoint_names;
};

/// Reads a sharded checkpoint directory's variables (every shard file checked against the
/// manifest's size and XXH64 and its tensors against their own): a missing, damaged or malformed
/// manifest or shard file throws CheckpointError naming it.
ShardedCheckpointValues read_sharded_checkpoint(const std::string& path);

/// The checkpoint directories (`ckpt-<step>` with a manifest.json) in `directory`, oldest first;
/// empty when there are none or the directory does not exist.
std::vector<std::string> sharded_checkpoint_dirs(const std::string& directory);

}  // namespace troupe::distribute
