#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace troupe::nn {

class Model;

/// What Model::fit hands its callbacks (Keras's `logs` dict): "loss" and the compiled metrics
/// ("accuracy", ...), "val_"-prefixed ones at the end of an epoch with validation_data, and at the
/// end of a step also "learning_rate", "samples_per_second", the step's parts in milliseconds
/// ("time/input_ms", "time/compute_ms", "time/all_reduce_ms", "time/step_ms") and the replicas'
/// own losses ("loss/replica_<id>", id in the sync group: this worker's replicas, and under
/// MultiWorkerMirroredStrategy every worker's). Under MultiWorkerMirroredStrategy a step's logs
/// also hold every worker's parts of the step before ("worker_<w>/time/input_ms",
/// "worker_<w>/time/compute_ms", "worker_<w>/time/all_reduce_ms", "worker_<w>/time/step_ms", from
/// the second step on): both ride in the step's own reduction, no collective of their own.
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

/// Requests to a running Model::fit, applied at a step boundary. Thread-safe: a callback, a
/// server thread or a signal's poller may call it at any time.
///
/// Two kinds, because under MultiWorkerMirroredStrategy every worker must stop, pause, resume,
/// save and change its learning rate at the same step:
/// - stop_training() from a callback hook (fit's thread) is Keras's `model.stop_training = True`:
///   it acts at the boundary of the step just done, on this worker. Every worker runs the same
///   callbacks on the same logs (the loss and metrics are reduced over the cluster), so a
///   decision made from the logs (TerminateOnNaN, EarlyStopping) is made by every worker alike.
/// - Every other request (request_stop, request_checkpoint, pause, resume, set_learning_rate, and
///   stop_training from another thread) may come from one worker only: it is agreed by every
///   worker, carried by the reduction every step already makes (no collective of its own), and
///   applied at the boundary of the first step whose reduction starts after it; while training is
///   paused a small collective every 20 ms carries them. A request anywhere counts for all; for
///   the learning rate and the pause state the lowest-ranked worker that asked wins. With one
///   worker they apply at the next boundary.
class TrainingControl {
 public:
  /// Ends training (see the class comment); `reason` becomes History::stop_reason (the first
  /// reason is kept).
  void stop_training(const std::string& reason = "stop_training requested");
  /// Ends training after a step agreed by every worker, with a checkpoint only if one is also
  /// requested.
  void request_stop(const std::string& reason);
  /// Asks every callback's on_checkpoint to save at the next agreed step boundary.
  void request_checkpoint();
  /// Holds training at the next agreed step boundary until resume() or a stop.
  void pause();
  /// Lets a paused training go on.
  void resume();
  /// Sets the optimizer's learning rate from the next agreed step boundary on (> 0, else
  /// std::invalid_argument).
  void set_learning_rate(double learning_rate);

  /// Steps done in all (FitOptions::initial_step included); updated by fit after every step.
  std::int64_t step() const;
  /// The epoch running (0-based).
  int epoch() const;
  /// Whether fit is holding training at a step boundary.
  bool paused() const;
  /// Whether a stop has been requested.
  bool stop_requested() const;
  /// Whether fit stopped at a step boundary for a stop whose reason was `reason`, requested on
  /// any worker (under MultiWorkerMirroredStrategy the reason travels as a 31-bit code with the
  /// request, so every worker can tell why the cluster stopped).
  bool stopped_for(const std::string& reason) const;

  /// The agreed requests made since the last take (fit's side).
  struct Requests {
    bool stop = false;
    std::string stop_reason;
    bool checkpoint = false;
    std::optional<bool> pause;  ///< true: pause, false: resume
    std::optional<double> learning_rate;
  };
  /// fit's side: hands over the pending agreed requests and clears them.
  Requests take();
  /// fit's side: the reason of a stop_training made on fit's thread, once.
  std::optional<std::string> take_immediate_stop();
  /// fit's side: the step done, the epoch.
  void set_position(std::int64_t step, int epoch);
  /// fit's side: the paused state.
  void set_paused(bool paused);
  /// fit's side: the code of the stop reason fit applied (reason_code).
  void set_stopped_for(std::uint32_t code);
  /// The code a stop reason travels as between workers (in [0, 2^31)).
  static std::uint32_t reason_code(const std::string& reason);
  /// fit's side: clears every request and state, and makes the calling thread fit's.
  void reset();

 private:
  mutable std::mutex mutex_;
  Requests pending_;
  std::optional<std::string> immediate_stop_;
  std::thread::id fit_thread_;
  bool stopped_ = false;
  bool paused_ = false;
  std::optional<std::uint32_t> stopped_for_;
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
  /// Not called for an epoch that TerminateOnNaN (a non-finite loss) stopped.
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
  /// A learning rate requested through TrainingControl::set_learning_rate was set at this step
  /// boundary (agreed by every worker): it applies from step `step + 1` on.
  virtual void on_learning_rate(std::int64_t step, double learning_rate) { (void)step, (void)learning_rate; }

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
