#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::nn {

class Model;

/// What Model::fit hands its callbacks (Keras's `logs` dict): "loss" and the compiled metrics
/// ("accuracy", ...), "val_"-prefixed ones at the end of an epoch with validation_data, and at the
/// end of a step also "learning_rate", "samples_per_second", the step's parts in milliseconds
/// ("time/input_ms", "time/compute_ms", "time/all_reduce_ms", "time/step_ms") and this worker's
/// replicas' own losses ("loss/replica_<id>", id in the sync group).
using Logs = std::map<std::string, double>;

/// What fit is running (Keras's `callback.params`).
struct FitParams {
  int epochs = 0;                    ///< the epochs of this fit call
  std::int64_t steps = -1;           ///< steps per epoch; -1: one pass of the data, length unknown
  int verbose = 0;                   ///< FitOptions::verbose
  int worker = 0;                    ///< this worker's rank (0: the chief)
  int workers = 1;                   ///< workers the strategy spans
  std::vector<std::string> metrics;  ///< "loss", then the compiled metrics' names
};

/// Requests to a running Model::fit, taken at the next step boundary. Thread-safe: a callback, a
/// signal handler's flag poller or a server thread may call it at any time. Under
/// MultiWorkerMirroredStrategy fit agrees on the requests of every worker in one collective at
/// each step boundary, so that every worker stops, pauses, resumes, saves and changes its learning
/// rate at the same step (a request on any worker counts for all; the learning rate and pause
/// state of the lowest-ranked worker that asked win). With one worker it is read directly.
class TrainingControl {
 public:
  /// Ends training after the current step (Keras's `model.stop_training = True`); `reason` is
  /// reported in History::stop_reason. The first reason is kept.
  void stop_training(const std::string& reason = "stop_training requested");
  /// Asks every callback's on_checkpoint to save at the next step boundary.
  void request_checkpoint();
  /// Holds training at the next step boundary until resume() or stop_training().
  void pause();
  /// Lets a paused training go on.
  void resume();
  /// Sets the optimizer's learning rate from the next step on (> 0, else std::invalid_argument).
  void set_learning_rate(double learning_rate);

  /// Steps done in all (FitOptions::initial_step included); updated by fit after every step.
  std::int64_t step() const;
  /// The epoch running (0-based).
  int epoch() const;
  /// Whether fit is holding training at a step boundary.
  bool paused() const;
  /// Whether a stop has been requested or agreed.
  bool stop_requested() const;

  /// The requests made since the last take (fit's side).
  struct Requests {
    bool stop = false;
    std::string stop_reason;
    bool checkpoint = false;
    std::optional<bool> pause;  ///< true: pause, false: resume
    std::optional<double> learning_rate;
  };
  /// Hands over the pending requests and clears them (the stop request stays visible to
  /// stop_requested()).
  Requests take();
  /// fit's bookkeeping: the step done, the epoch, the paused state.
  void set_position(std::int64_t step, int epoch);
  void set_paused(bool paused);
  /// Clears every request and the stopped state (fit calls it when it starts).
  void reset();

 private:
  mutable std::mutex mutex_;
  Requests pending_;
  bool stopped_ = false;
  bool paused_ = false;
  std::int64_t step_ = 0;
  int epoch_ = 0;
};

/// Base of the objects Model::fit calls at every boundary of training (tf.keras.callbacks.Callback).
/// Every hook runs on fit's thread, in cross-replica context, in the order of
/// FitOptions::callbacks, on every worker (FitParams::worker tells which). A callback steers
/// training through model().control(): stop, pause, checkpoint, learning rate.
/// `batch` is the step's index in its epoch, `epoch` is 0-based, as in Keras.
class Callback {
 public:
  virtual ~Callback() = default;
  /// Before the first step.
  virtual void on_train_begin(Logs& logs) { (void)logs; }
  /// After the last step (also after a stop, a non-finite loss or an interruption).
  virtual void on_train_end(Logs& logs) { (void)logs; }
  /// Before the first step of an epoch.
  virtual void on_epoch_begin(int epoch, Logs& logs) { (void)epoch, (void)logs; }
  /// After the last step of an epoch, with the epoch's mean loss and metrics (and validation's).
  /// Not called for an epoch that ended on a non-finite loss.
  virtual void on_epoch_end(int epoch, Logs& logs) { (void)epoch, (void)logs; }
  /// Before a step.
  virtual void on_train_batch_begin(std::int64_t batch, Logs& logs) { (void)batch, (void)logs; }
  /// After a step, with its loss and metrics and what it measured.
  virtual void on_train_batch_end(std::int64_t batch, Logs& logs) { (void)batch, (void)logs; }
  /// A checkpoint was requested (TrainingControl::request_checkpoint, a signal) and agreed by
  /// every worker at this step boundary: save one now. Never called once a loss was non-finite.
  virtual void on_checkpoint(std::int64_t step, Logs& logs) { (void)step, (void)logs; }
  /// Training is held at step `step` (agreed by every worker).
  virtual void on_pause(std::int64_t step) { (void)step; }
  /// Training goes on after a pause.
  virtual void on_resume(std::int64_t step) { (void)step; }

  /// The model being fitted (fit sets it before on_train_begin).
  Model& model() const;
  /// What fit is running.
  const FitParams& params() const noexcept { return params_; }
  /// fit's side: attaches the callback to a model and a run.
  void set_model(Model& model, const FitParams& params);

 private:
  Model* model_ = nullptr;
  FitParams params_;
};

/// A callback made of functions (tf.keras.callbacks.LambdaCallback); an empty function is skipped.
class LambdaCallback : public Callback {
 public:
  std::function<void(Logs&)> train_begin, train_end;                  ///< on_train_begin/end
  std::function<void(int, Logs&)> epoch_begin, epoch_end;             ///< on_epoch_begin/end
  std::function<void(std::int64_t, Logs&)> batch_begin, batch_end;    ///< on_train_batch_begin/end
  std::function<void(std::int64_t, Logs&)> checkpoint;                ///< on_checkpoint

  void on_train_begin(Logs& logs) override;
  void on_train_end(Logs& logs) override;
  void on_epoch_begin(int epoch, Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_batch_begin(std::int64_t batch, Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, Logs& logs) override;
  void on_checkpoint(std::int64_t step, Logs& logs) override;
};

}  // namespace troupe::nn
