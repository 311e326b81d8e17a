#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "troupe/errors.hpp"
#include "troupe/variable.hpp"

namespace troupe {

/// A checkpoint file that cannot be used: missing, truncated, corrupted (a checksum mismatch), or
/// not matching the variables it is restored into. what() names the file and the problem.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// Saves and restores a set of named variables (and a step counter). The file is a Cap'n Proto
/// message with a checksum per tensor, written atomically: a temporary file, fsync, rename, so a
/// crash never leaves a half-written checkpoint under the real name and nothing is overwritten
/// in place. Each variable is saved as its value in cross-replica context (the primary
/// component; on_read variables aggregated) and restored into every component (an on_read SUM
/// variable gets value / replicas in each, as TensorFlow does, so that it sums back).
///
/// Save and restore from cross-replica context (inside or outside the strategy's scope), never
/// inside Strategy::run (std::logic_error). The file format is described in
/// format/include/troupe/format/checkpoint_file.hpp.
///
/// Under MultiWorkerMirroredStrategy, save and restore are collectives (call them on every
/// worker, in the strategy's scope or outside any scope, where the variables' strategy is
/// followed): on_read values are aggregated over all workers, the chief
/// writes the real path, and every other worker writes a temporary file beside it
/// ("<prefix>.worker-<i>.tmp.ckpt") and removes it; restore reads the chief's file, so the
/// directory must be shared (or copied) between the workers.
///
/// Under ParameterServerStrategy, a Checkpoint of variables made in its scope (a model's and its
/// optimizer's, model.variables()) is a sharded checkpoint, as TensorFlow checkpoints a
/// ShardedVariable and its slots: a directory rather than a file (save("/tmp/run/model") writes
/// "/tmp/run/model-1/"; write(prefix) the directory `prefix`), in which every ps task writes its
/// own shards with the optimizer slots and steps it keeps beside them, all ps tasks at once, and
/// the chief writes the manifest last; the directory appears under its name only once whole (a
/// crash mid-save leaves the previous checkpoints as they were). restore takes that directory back
/// onto the same or another number of ps tasks (resharded), each variable found by its name in
/// the Checkpoint that saved it. The layout, and what the chief and the ps tasks must share, are
/// troupe/distribute/sharded_checkpoint.hpp's. Every variable of such a Checkpoint must then live
/// on the ps tasks of that one strategy (std::invalid_argument naming the one that does not). A
/// checkpoint file restored into ps variables whose shards keep optimizer slots is refused
/// (std::invalid_argument): it holds values only. A sharded checkpoint restored into variables of
/// this process (a copy of the model outside the cluster) gives each its value, its shards
/// joined, and an optimizer's slot ("<optimizer>/<slot>/<variable>", Optimizer::variables())
/// the slot the ps tasks kept beside that variable (zeros where none was made yet); a variable or
/// slot the checkpoint lacks is a CheckpointError naming it.
class Checkpoint {
 public:
  explicit Checkpoint(std::map<std::string, Variable> variables);
  /// Adds more variables (an optimizer's slots); a name already present throws.
  void add(const std::string& name, Variable variable);
  void add(const std::map<std::string, Variable>& variables);

  /// The step saved with the variables.
  std::int64_t step() const noexcept { return step_; }
  void set_step(std::int64_t step) noexcept { step_ = step; }

  /// Saves a numbered checkpoint, as tf.train.Checkpoint.save does: writes
  /// `file_prefix` + "-N.ckpt" atomically, N counting this object's saves from 1 (continuing past
  /// the highest N already on disk for that prefix, so a later run never overwrites an earlier
  /// one's file), and returns the file written, e.g. save("/tmp/run/model") is
  /// "/tmp/run/model-1.ckpt", then "/tmp/run/model-2.ckpt". restore takes that path back, and
  /// latest_checkpoint("/tmp/run") finds it.
  std::string save(const std::string& file_prefix);
  /// Writes `file_prefix` + ".ckpt" atomically, without a number (tf.train.Checkpoint.write), and
  /// returns the file written.
  std::string write(const std::string& file_prefix);
  /// Restores every variable from `save_path`: a file save or write returned, or the same path
  /// without ".ckpt" (TensorFlow's form, "/tmp/run/model-1"). The file must hold each variable
  /// with the same dtype and shape. A problem throws CheckpointError naming the file (for a
  /// prefix given to save, it names the file save wrote), and no variable is changed.
  void restore(const std::string& save_path);
  /// The number of the last save (0 before the first).
  std::int64_t save_counter() const noexcept { return save_counter_; }

  const std::map<std::string, Variable>& variables() const noexcept { return variables_; }

 private:
  std::map<std::string, Variable> variables_;
  std::int64_t step_ = 0;
  std::int64_t save_counter_ = 0;
};

/// Keeps the last `max_to_keep` checkpoints of a Checkpoint in `directory` (ckpt-<step>.ckpt),
/// ordered by step. Only names of exactly that form count: the temporary file of an interrupted
/// save never shadows a good checkpoint.
///
/// A Checkpoint of variables on the ps tasks of a ParameterServerStrategy keeps sharded
/// checkpoints instead, the directories `ckpt-<step>/` (Checkpoint's comment; the layout is
/// troupe/distribute/sharded_checkpoint.hpp's, which troupe-ckpt lists and checks and a
/// nn::SidecarEvaluator reads): save writes every shard from its own ps task in parallel with the
/// chief's manifest, atomically as a whole; restore_or_initialize restores the newest intact one
/// onto the current ps tasks, resharded; the temporary directories of killed saves
/// ("ckpt-<step>.tmp-<pid>-<n>/") are removed like the files. Such a manager is also where
/// Model::fit restores every shard from after a lost ps task came back.
class CheckpointManager {
 public:
  /// `max_to_keep` >= 1 (std::invalid_argument otherwise). The directory is checked now, before
  /// any training: created when missing, and a path that is a file, or a directory this process
  /// cannot create or write, throws CheckpointError naming it. Temporary files that killed saves
  /// of this manager left there ("ckpt-<step>.ckpt.tmp-<pid>-<n>", a worker's
  /// "ckpt-<step>.worker-<rank>.tmp.ckpt") are removed, except those of a process still running.
  CheckpointManager(Checkpoint checkpoint, std::string directory, int max_to_keep);
  /// Saves the checkpoint for `step` (>= 0), then deletes the oldest beyond max_to_keep (never
  /// the file just written); returns the file.
  std::string save(std::int64_t step);
  /// The newest checkpoint file in the directory, if any.
  std::optional<std::string> latest_checkpoint() const;
  /// All checkpoint files, oldest first.
  std::vector<std::string> checkpoints() const;
  /// Restores the newest checkpoint that reads back intact (a corrupt one is reported on stderr
  /// by name and skipped) and returns its step; nullopt when there is none, leaving the
  /// variables as initialised. Throws CheckpointError when checkpoints exist but none reads back
  /// intact (they are listed with their problems), or when an intact one does not match the
  /// variables (a different model: older files would not match either).
  std::optional<std::int64_t> restore_or_initialize();

  Checkpoint& checkpoint() noexcept { return checkpoint_; }

 private:
  bool sharded() const;  ///< whether the checkpoint's variables live on ps tasks

  Checkpoint checkpoint_;
  std::string directory_;
  int max_to_keep_;
};

/// One tensor of a checkpoint file, as inspect_checkpoint reports it.
struct CheckpointEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t nbytes = 0;
  bool checksum_ok = false;  ///< its bytes match the checksum stored with them
  Tensor value;              ///< the tensor itself (host), when inspect_checkpoint read values
};

/// What a checkpoint file holds.
struct CheckpointInfo {
  std::string path;
  std::int64_t step = 0;
  std::uint64_t file_bytes = 0;
  std::vector<CheckpointEntry> entries;  ///< in file order
};

/// Reads `path` without restoring anything (for inspection tools): the same checks as restore,
/// except that a tensor failing its checksum is reported in its entry rather than thrown. Other
/// problems (missing, truncated, corrupt header, malformed) throw CheckpointError naming the file.
/// With `read_values`, each entry's value holds a copy of the tensor.
CheckpointInfo inspect_checkpoint(const std::string& path, bool read_values = false);

/// The checkpoint files CheckpointManager keeps in `directory` (ckpt-<step>.ckpt), oldest first;
/// empty when there are none or the directory does not exist.
std::vector<std::string> checkpoint_files(const std::string& directory);

/// The checkpoint last written in `directory` (tf.train.latest_checkpoint): of the files named
/// <prefix>-<N>.ckpt there (what Checkpoint::save and CheckpointManager write), the one written
/// last (by modification time; of two written within the same tick, the higher N). nullopt when
/// there is none or the directory does not exist.
std::optional<std::string> latest_checkpoint(const std::string& directory);

}  // namespace troupe
