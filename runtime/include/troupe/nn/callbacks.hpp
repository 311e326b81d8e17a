#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/nn/callback.hpp"
#include "troupe/tensor.hpp"

namespace troupe::nn {

/// Stops training when a monitored quantity has stopped improving
/// (tf.keras.callbacks.EarlyStopping, same names and semantics). At each epoch end: an epoch
/// improves when `monitor` beats the best so far by more than `min_delta` (in the direction of
/// `mode`); after `patience` epochs without one (and once at least one epoch is past), training
/// stops. Every worker sees the same logs, so every worker stops at the same epoch.
class EarlyStopping : public Callback {
 public:
  /// mode: "auto" (max for a name containing "acc", else min), "min" or "max"; anything else,
  /// min_delta < 0 or patience < 0 is std::invalid_argument. baseline: training stops if the
  /// monitored value does not beat it within `patience` epochs. restore_best_weights: at the stop,
  /// the model's variables get the values of the best epoch. start_from_epoch: epochs to wait
  /// before watching (a warm-up).
  explicit EarlyStopping(std::string monitor = "val_loss", double min_delta = 0, int patience = 0, int verbose = 0,
                         std::string mode = "auto", std::optional<double> baseline = std::nullopt,
                         bool restore_best_weights = false, int start_from_epoch = 0);

  void on_train_begin(Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(Logs& logs) override;

  /// The epoch (0-based) at which it stopped training; 0 when it did not.
  int stopped_epoch() const noexcept { return stopped_epoch_; }
  /// The best epoch (0-based) and its value.
  int best_epoch() const noexcept { return best_epoch_; }
  double best() const noexcept { return best_; }

 private:
  bool is_improvement(double value, double reference) const;

  std::string monitor_;
  double min_delta_;
  int patience_;
  int verbose_;
  bool maximize_;
  std::optional<double> baseline_;
  bool restore_best_weights_;
  int start_from_epoch_;
  int wait_ = 0;
  int stopped_epoch_ = 0;
  int best_epoch_ = 0;
  double best_ = 0;
  std::vector<Tensor> best_weights_;
};

/// Saves the model's variables (tf.keras.callbacks.ModelCheckpoint) with troupe::Checkpoint.
/// `filepath` is the path prefix (".ckpt" is added), formatted like Keras's: "{epoch}" (1-based),
/// "{step}", "{batch}" and any key of the logs ("{val_loss:.4f}", "{epoch:03d}"). It saves at the
/// end of every epoch (save_freq 0, Keras's "epoch") or every save_freq steps, and when a
/// checkpoint is requested (on_checkpoint). save_best_only: only when `monitor` improved on the
/// best value so far (mode as in EarlyStopping). A log whose loss or monitored value is NaN or
/// infinite is never saved. Under MultiWorkerMirroredStrategy saving is a collective that every
/// worker runs (the chief writes the file, see Checkpoint).
class ModelCheckpoint : public Callback {
 public:
  /// An empty filepath, a bad mode or save_freq < 0 is std::invalid_argument.
  explicit ModelCheckpoint(std::string filepath, std::string monitor = "val_loss", int verbose = 0,
                           bool save_best_only = false, bool save_weights_only = false, std::string mode = "auto",
                           std::int64_t save_freq = 0, std::optional<double> initial_value_threshold = std::nullopt);

  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, Logs& logs) override;
  void on_checkpoint(std::int64_t step, Logs& logs) override;

  /// The files written, in order.
  const std::vector<std::string>& saved() const noexcept { return saved_; }

 private:
  void save(int epoch, std::int64_t batch, const Logs& logs, bool requested);

  std::string filepath_;
  std::string monitor_;
  int verbose_;
  bool save_best_only_;
  bool save_weights_only_;
  bool maximize_;
  std::int64_t save_freq_;
  std::optional<double> best_;
  std::vector<std::string> saved_;
  std::int64_t last_step_ = -1;
  std::string last_prefix_;
};

/// Stops training at the first step whose loss is NaN or infinite
/// (tf.keras.callbacks.TerminateOnNaN), printing on stderr the step it happened at. fit then
/// writes no checkpoint: on_epoch_end and on_checkpoint are not called after it.
class TerminateOnNaN : public Callback {
 public:
  void on_train_batch_end(std::int64_t batch, Logs& logs) override;
};

/// Sets the optimizer's learning rate at the start of every epoch to schedule(epoch, current
/// learning rate) (tf.keras.callbacks.LearningRateScheduler); the epoch logs get "learning_rate".
class LearningRateScheduler : public Callback {
 public:
  /// A schedule that returns a rate <= 0 or not finite is std::invalid_argument naming the epoch.
  explicit LearningRateScheduler(std::function<double(int epoch, double learning_rate)> schedule, int verbose = 0);

  void on_epoch_begin(int epoch, Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

 private:
  std::function<double(int, double)> schedule_;
  int verbose_;
};

/// Ends training cleanly on SIGINT or SIGTERM: the step running finishes, a checkpoint is
/// requested (the ModelCheckpoint callbacks save it) and training stops, on every worker at the
/// same step; a paused training stops too. stop_reason says "interrupted by SIGINT";
/// History::stopped_at_step the step. Its handlers are installed by on_train_begin, with a thread
/// that looks for a caught signal every 10 ms, and the previous handlers are restored by
/// on_train_end (or its destructor); a second signal of the same kind while training winds down
/// gets the default action (a second Ctrl-C ends the process). Signal handlers belong to the
/// process: use one StopOnSignal per fit.
class StopOnSignal : public Callback {
 public:
  /// The signals to catch (SIGINT and SIGTERM by default).
  explicit StopOnSignal(std::vector<int> signals = {});
  ~StopOnSignal() override;
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  void on_train_begin(Logs& logs) override;
  void on_train_end(Logs& logs) override;

  /// The signal that stopped training (0: none).
  int received() const noexcept;
  /// "SIGINT", "SIGTERM" or "signal N".
  static std::string signal_name(int signal);

 private:
  void restore();

  std::vector<int> signals_;
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

/// Writes TensorBoard event files (tf.keras.callbacks.TensorBoard): `log_dir`/train and
/// `log_dir`/validation, each an "events.out.tfevents.<time>.<host>.<pid>.v2" file that
/// TensorBoard reads. Every update_freq steps (0: only at epoch ends, Keras's "epoch") it writes
/// the step's logs as scalars at the global step: "loss", the metrics, "learning_rate",
/// "samples_per_second", "time/input_ms", "time/compute_ms", "time/all_reduce_ms",
/// "time/step_ms", "loss/replica_<id>"; at each epoch end "epoch_loss", "epoch_<metric>" and
/// "epoch_learning_rate" in train/ and the validation's "epoch_loss", "epoch_<metric>" in
/// validation/, at the epoch. Under MultiWorkerMirroredStrategy worker i > 0 writes under
/// `log_dir`/worker_<i>/, so every replica's loss is kept.
class TensorBoard : public Callback {
 public:
  /// An empty log_dir or update_freq < 0 is std::invalid_argument.
  explicit TensorBoard(std::string log_dir = "logs", std::int64_t update_freq = 0);
  ~TensorBoard() override;
  TensorBoard(const TensorBoard&) = delete;
  TensorBoard& operator=(const TensorBoard&) = delete;

  void on_train_begin(Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(Logs& logs) override;

  /// Writes a text at `step` into the train event file now (tf.summary.text: TensorBoard's Text
  /// tab shows it, as Markdown), e.g. from another callback's on_train_batch_end. Between
  /// on_train_begin and the end of fit; before, std::logic_error. An empty tag is
  /// std::invalid_argument.
  void add_text(const std::string& tag, std::int64_t step, const std::string& text);

  /// The event files written (train, then validation once it exists).
  std::vector<std::string> files() const;

 private:
  struct Writers;
  std::string log_dir_;
  std::int64_t update_freq_;
  std::unique_ptr<Writers> writers_;
};

/// How a ProgbarLogger prints.
struct ProgbarOptions {
  /// 1: on a terminal Keras's bar, redrawn in place (the step, the bar, the ETA, ms/step and the
  /// running means of the loss and metrics) and ended as it ran, and elsewhere one line per
  /// epoch; 2: one line per epoch ("Epoch 2/5: 40 steps, loss 0.1234, accuracy 0.9500, 51234
  /// samples/s, 0.52 s, 13ms/step").
  int verbose = 1;
  /// Where it prints; nullptr: std::cout.
  std::ostream* out = nullptr;
  /// Whether `out` is a terminal (the bar is redrawn in place); unset: std::cout on a terminal.
  std::optional<bool> terminal;
  /// The terminal's columns, which a redrawn line never reaches; 0: asked at every epoch (the
  /// terminal's own width for std::cout on a terminal, else COLUMNS, else 80). < 0 is
  /// std::invalid_argument.
  int width = 0;
};

/// Keras's progress bar (tf.keras.callbacks.ProgbarLogger). Model::fit adds one, on the worker
/// that prints, when FitOptions::verbose > 0. On a terminal each epoch prints "Epoch 2/5", then
/// one line redrawn in place, "12/32 [=========>....................] - ETA: 3s - 12ms/step -
/// loss: 0.1234", which fits the width (the bar narrows from 30 columns to 10, then the last
/// values are left out), and ends the epoch in the same format: the bar where the epoch ended,
/// its time, ms/step, the epoch's loss and metrics and their "val_" values.
class ProgbarLogger : public Callback {
 public:
  explicit ProgbarLogger(ProgbarOptions options = {});

  void on_epoch_begin(int epoch, Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  /// An epoch cut short by a non-finite loss (no on_epoch_end) still ends its line on a terminal.
  void on_train_end(Logs& logs) override;

  /// The columns of the terminal: for std::cout on a terminal (`standard_output`) its own width
  /// (ioctl TIOCGWINSZ), else COLUMNS when it holds a positive number, else 80.
  static int terminal_columns(bool standard_output);

 private:
  std::string bar_line(std::int64_t done, std::int64_t total, std::vector<std::string> items, bool keep_all) const;
  void finish_bar(const Logs& logs);
  void epoch_line(int epoch, const Logs& logs);

  std::ostream* out_;
  bool terminal_;
  bool standard_output_;
  int fixed_width_;
  int width_ = 80;
  int epoch_ = 0;
  std::int64_t steps_ = 0;     // steps of this epoch run by this fit
  std::int64_t position_ = 0;  // the epoch's steps done (a resumed epoch starts inside)
  std::map<std::string, double> sums_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace troupe::nn
