#pragma once
// BackupAndRestore (tf.keras.callbacks.BackupAndRestore): a training run that is interrupted,
// once or many times, and started again, ends with the same bits as a run that never stopped.
// It saves what decides the next step: the model's and the optimizer's variables (slots and
// iteration count included), where training stands (step, epoch, the steps done in that epoch),
// how many elements the input iterator has handed out, and any random engines the loop draws
// from. Restoring re-creates the iterator and takes that many elements again (datasets are
// deterministic: the same seed gives the same order), as TensorFlow restores an iterator.
//
// Model::fit uses it through FitOptions::backup_and_restore. A custom loop uses it in a few lines:
//
//   nn::BackupOptions every_10;
//   every_10.save_freq = 10;
//   nn::BackupAndRestore backup("/tmp/backup", every_10);
//   backup.track(model.variables());
//   backup.track_rng("noise", engine);                  // a std::mt19937_64 the step draws from
//   nn::TrainingPosition at = backup.restore();         // in the strategy's scope; zeros when new
//   auto it = dist.make_iterator();
//   nn::BackupAndRestore::skip(it, at.iterator_position);
//   for (std::int64_t step = at.step; step < steps; ++step) {
//     strategy.run(step_fn, it.get_next());
//     backup.on_step_end({step + 1, 0, step + 1, step + 1, 0});
//   }
//   backup.on_train_end();                              // deletes the backup (delete_checkpoint)

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "troupe/checkpoint.hpp"
#include "troupe/variable.hpp"

namespace troupe::distribute {
class DistributedDataset;
class DistributedIterator;
class PreemptionCheckpointHandler;
class Strategy;
}  // namespace troupe::distribute

namespace troupe::nn {

/// Where a training run stands: what BackupAndRestore keeps beside the variables.
struct TrainingPosition {
  std::int64_t step = 0;               ///< steps done in all
  std::int64_t epoch = 0;              ///< the epoch in progress, from 0
  std::int64_t step_in_epoch = 0;      ///< steps of that epoch done
  std::int64_t iterator_position = 0;  ///< elements taken from the current input iterator
  /// Iterators made over the dataset before the current one: a shuffle draws a new order for
  /// each pass, so a resumed run begins (and drops) as many passes before it takes up the
  /// current one (replay_passes).
  std::int64_t input_passes = 0;
};

/// When BackupAndRestore saves.
struct BackupOptions {
  /// Save every save_freq steps; 0: at the end of every epoch (TensorFlow's save_freq="epoch").
  std::int64_t save_freq = 0;
  /// Delete the backup when training completes, so that the next run starts afresh (as in
  /// TensorFlow); false keeps it.
  bool delete_checkpoint = true;
  /// Backups kept in the directory (the newest are kept; a damaged one falls back to the older).
  int max_to_keep = 2;
  /// Under MultiWorkerMirroredStrategy, also save at once when any worker is told to stop
  /// (SIGTERM), every worker at the same step, and exit with distribute::restart_exit_code: a
  /// PreemptionCheckpointHandler does it (TensorFlow's save_before_preemption).
  bool save_before_preemption = false;
};

/// Backs up a training run into a directory and restores it (see the top of this header).
/// Construct it on every worker with the same options; restore, save and the on_* calls are
/// collective under MultiWorkerMirroredStrategy, like Checkpoint's.
class BackupAndRestore {
 public:
  /// Checks the directory at once (created when missing; a file, or one that cannot be written,
  /// throws CheckpointError) and removes what interrupted saves left there. save_freq < 0 or
  /// max_to_keep < 1 throws std::invalid_argument.
  explicit BackupAndRestore(std::string backup_dir, BackupOptions options = {});
  /// Stops watching for SIGTERM (save_before_preemption); the backup stays.
  ~BackupAndRestore();
  BackupAndRestore(const BackupAndRestore&) = delete;
  BackupAndRestore& operator=(const BackupAndRestore&) = delete;

  /// Adds variables to back up (Model::variables(): weights, optimizer slots, iteration count).
  /// Before restore; a name already tracked throws std::invalid_argument.
  void track(const std::map<std::string, Variable>& variables);
  void track(const std::string& name, Variable variable);
  /// Backs up a random engine's state, restored into `engine` (which must outlive this object).
  void track_rng(const std::string& name, std::mt19937_64& engine);

  /// Restores the newest backup, in cross-replica context of the strategy the variables belong
  /// to (it becomes this object's strategy), and returns where it stood; all zeros when there is
  /// none. Call it once, before training.
  TrainingPosition restore();
  /// Saves now, at `at`.
  void save(const TrainingPosition& at);
  /// Saves now, at the position of the last on_step_end or on_epoch_end (or restore): for a
  /// save asked for from outside the loop, such as a FitOptions::on_step_end callback (fit
  /// tells the backup its position before it calls on_step_end).
  void save_now();
  /// After every step: saves when at.step is a multiple of save_freq (save_freq > 0), or when a
  /// worker was told to stop (save_before_preemption; then the process exits).
  void on_step_end(const TrainingPosition& at);
  /// After every epoch (at: the position at which the next epoch starts): saves when save_freq
  /// is 0.
  void on_epoch_end(const TrainingPosition& at);
  /// Training completed: deletes the backup unless delete_checkpoint is false.
  void on_train_end();

  /// Takes `n` elements from `iterator` (where restore() said the iterator stood); fewer when
  /// it ends first. Returns how many it took.
  static std::int64_t skip(distribute::DistributedIterator& iterator, std::int64_t n);
  /// Begins `n` passes over `dataset` and drops them (one element each, which starts the pass),
  /// so that the next iterator made is the one restore() said was current.
  static void replay_passes(const distribute::DistributedDataset& dataset, std::int64_t n);

  /// The directory given at construction.
  const std::string& backup_dir() const noexcept { return dir_; }
  /// The options given at construction.
  const BackupOptions& options() const noexcept { return options_; }
  /// The newest backup file, if any.
  std::optional<std::string> latest_backup() const { return manager_.latest_checkpoint(); }

 private:
  void prepare();
  void write(const TrainingPosition& at);

  std::string dir_;
  BackupOptions options_;
  CheckpointManager manager_;
  std::map<std::string, std::mt19937_64*> engines_;
  std::optional<Variable> position_;
  std::map<std::string, Variable> engine_states_;
  distribute::Strategy* strategy_ = nullptr;
  std::unique_ptr<distribute::PreemptionCheckpointHandler> preemption_;
  TrainingPosition last_;  // the position a preemption save records
  bool restored_ = false;
};

}  // namespace troupe::nn
