// The MLP classifier under MultiWorkerMirroredStrategy: run the same program on every worker,
// with TF_CONFIG saying who is who (troupe-launch sets it for local workers):
//
//   troupe-launch -n 2 -- multi_worker_trainer            # 2 workers, 1 CPU replica each
//   troupe-launch -n 2 --devices-per-worker 2 -- multi_worker_trainer --epochs 3
//   troupe-launch -n 2 -- multi_worker_trainer --compression bf16   # gradients cross in 16 bits
//   troupe-launch -n 2 -- multi_worker_trainer --communication nccl   # GPU replicas, NCCL between them
//   troupe-launch -n 2 -- multi_worker_trainer --epochs 1000 --dashboard-port 8080 --checkpoint-dir /tmp/mw
//     # the chief serves the dashboard of both workers; pause, stop... act on both at the same step
//   troupe-launch -n 2 --max-restarts 3 -- multi_worker_trainer --checkpoint-dir /tmp/run --tensorboard-dir logs
//   troupe-launch -n 3 --elastic --min 2 -- multi_worker_trainer --elastic   # a lost worker is dropped
//   ... multi_worker_trainer --elastic --record-examples DIR   # each step's example ids, per worker
//   ... multi_worker_trainer --elastic --validation-delay-ms 200   # validation, slowed, at every epoch's end
//
// Only the chief prints the progress. A NaN or infinite loss stops every worker at the same step
// (exit 1, no backup after it). With --checkpoint-dir, the run is backed up (BackupAndRestore) at
// the end of every epoch, or every --checkpoint-every steps, and on the dashboard's request; when
// any worker gets SIGTERM every worker saves at the same step and exits with status 75
// (PreemptionCheckpointHandler); SIGINT on any worker stops every worker after the same step,
// saves, and exits 130. Started again (troupe-launch --max-restarts does it), it resumes from the
// newest backup and ends with the same weights as a run that never stopped. The backup is deleted
// when the run completes. Without --checkpoint-dir, SIGINT and SIGTERM stop every worker after the
// same step and exit 130 or 143, saving nothing.
//
// Every worker reads the same generated set; each global batch is split over all replicas of all
// workers; gradients are all-reduced hierarchically (shared memory, then a TCP ring between the
// workers). Every worker prints the same losses, and the last line:
//   result: workers=2 replicas=2 loss=... accuracy=... weights_digest=HEX
// (with --elastic, membership_changes=N before weights_digest: the workers lost on the way, and
// workers= counts those that finished; a worker asked to leave (SIGUSR2) leaves at a step
// boundary, prints "left: step=N weights_digest=HEX" and exits 0)
// where weights_digest hashes the bytes of every variable (the model's and the optimizer's), the
// same on every worker of a synchronised run. A run started again after a stop resumes at the
// step after it; one started with fewer --epochs than the backup has begun trains nothing, says
// so, keeps the backup and prints no loss.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>

#include <csignal>

#include <troupe/checkpoint.hpp>
#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;
using troupe::examples::positive;

using namespace troupe;
using namespace troupe::distribute;

namespace {

// FNV-1a over the bytes of every variable, in name order. The local replicas' components must be
// bit-identical: a difference is an error, not a digest.
std::string weights_digest(const std::map<std::string, Variable>& variables) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, variable] : variables) {
    const std::vector<Tensor> components = variable.components();
    for (const Tensor& c : components) {
      if (!c.equals(components.front())) {
        throw std::runtime_error("variable " + name + " differs between this worker's replicas");
      }
    }
    const Tensor host = components.front().to(Device());
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

// --record-examples: a layer in front of the model that passes its input through and, in a
// training call, appends to a file the ids (row numbers in the generated set) of the rows this
// replica trains on, with the step and the number of membership changes so far. A line is
// written (and flushed) as the replica computes, so a worker killed mid-step has recorded it:
//   step=S changes=C ids=I,J,...
// A step rolled back by a change runs again with a higher C; the lines of the highest C of a
// step are the rows that went into the weights (tests/programs/examples_exactly_once.py).
class ExampleRecorder : public nn::Layer {
 public:
  struct Shared {
    std::unordered_map<std::string, std::int64_t> ids;  // a row's bytes -> its number
    std::int64_t row_bytes = 0;
    std::mutex mutex;
    std::ofstream out;
    std::atomic<bool> recording{false};
    std::atomic<std::int64_t> step{0};
    std::atomic<int> changes{0};
  };

  ExampleRecorder(const Tensor& features, const std::string& path) : Layer(""), shared_(std::make_shared<Shared>()) {
    const Tensor host = features.to(Device());
    const std::int64_t rows = host.shape()[0];
    shared_->row_bytes = static_cast<std::int64_t>(host.nbytes()) / rows;
    const auto* bytes = static_cast<const char*>(host.raw_data());
    for (std::int64_t r = 0; r < rows; ++r) {
      if (!shared_->ids.emplace(std::string(bytes + r * shared_->row_bytes, shared_->row_bytes), r).second) {
        throw std::invalid_argument("--record-examples: rows of the generated set are equal; ids would be ambiguous");
      }
    }
    shared_->out.open(path, std::ios::app);
    if (!shared_->out) throw std::invalid_argument("--record-examples: cannot write " + path);
  }

  const char* class_name() const override { return "ExampleRecorder"; }
  const char* default_name() const override { return "example_recorder"; }
  Shape input_shape() const override { return {}; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }

  /// Training steps from now on are recorded (fit's, not evaluate's).
  void record(bool on) { shared_->recording = on; }
  /// Before a step: the step it will be and the membership changes so far.
  void set_step(std::int64_t step, int changes) {
    shared_->step = step;
    shared_->changes = changes;
  }

 protected:
  Tensor call(const Tensor& x, const nn::CallContext& ctx) const override {
    if (!ctx.training || !ctx.update_state || !shared_->recording) return x;
    const Tensor host = x.to(Device());
    const auto* bytes = static_cast<const char*>(host.raw_data());
    const std::int64_t rows = host.rank() > 0 ? host.shape()[0] : 0;
    std::ostringstream line;
    line << "step=" << shared_->step << " changes=" << shared_->changes << " ids=";
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto found = shared_->ids.find(std::string(bytes + r * shared_->row_bytes, shared_->row_bytes));
      line << (r == 0 ? "" : ",") << (found == shared_->ids.end() ? -1 : found->second);
    }
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->out << line.str() << std::endl;
    return x;
  }
  nn::LayerGradients gradients(const Tensor&, const Tensor&, const Tensor& grad_output, const nn::CallContext&,
                           bool need_input) const override {
    nn::LayerGradients g;
    if (need_input) g.input = grad_output;
    return g;
  }
  std::string config_json() const override { return "{}"; }

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace

int main(int argc, char** argv) {
  int epochs = 3;
  std::int64_t batch = 256;
  std::string compression = "none";
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  troupe::examples::MonitorFlags monitor_flags;
  std::string tensorboard_dir;
  bool no_terminate_on_nan = false;
  float learning_rate = 0.003f;
  int step_delay_ms = 0;
  bool quiet = false;
  std::string implementation = "auto";
  bool elastic = false;
  std::string record_examples;
  int validation_delay_ms = -1;
  CLI::App app{"The MLP classifier under MultiWorkerMirroredStrategy (TF_CONFIG says who is who).",
               "multi_worker_trainer"};
  troupe::examples::show_defaults(app);
  app.add_option("--epochs", epochs, "epochs")->check(in_range(1, 1000000));
  app.add_option("--batch", batch, "global batch, split over every replica of every worker")
      ->check(in_range(std::int64_t{1}, std::int64_t{8192}));  // the generated set has 8192 examples
  app.add_option("--compression", compression,
                 "how gradients cross workers: none (float32), fp16 or bf16 (CommunicationOptions::compression; "
                 "every worker must pass the same)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--communication", implementation,
                 "how replicas meet across workers (CommunicationOptions::implementation): auto or ring (CPU "
                 "replicas and troupe's TCP ring), or nccl (a replica on each GPU, NCCL across them and the workers)")
      ->check(CLI::IsMember({"auto", "ring", "nccl"}));
  app.add_option("--lr", learning_rate, "Adam's learning rate")->check(positive());
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "back the run up in DIR and resume from it (every worker must see the same directory)")
      ->type_name("DIR");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "with --checkpoint-dir: save every STEPS steps (0: at the end of every epoch)")
      ->type_name("STEPS")
      ->check(in_range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--step-delay-ms", step_delay_ms, "sleep this long after every step (to watch or interrupt a run)")
      ->check(in_range(0, 60000));
  app.add_option("--tensorboard-dir", tensorboard_dir,
                 "write TensorBoard event files into DIR (the chief's; worker i's under DIR/worker_i)");
  app.add_flag("--no-terminate-on-nan", no_terminate_on_nan, "keep training (and backing up) when the loss is NaN or infinite, and exit 0");
  troupe::examples::add_monitor_options(app, monitor_flags);
  app.add_flag("--elastic", elastic,
               "elastic membership (MultiWorkerOptions::elastic; TROUPE_MIN_WORKERS and TROUPE_COMMIT_EVERY_STEPS "
               "apply): a lost worker is dropped and the others go on from their last in-memory commit; the result "
               "line gains membership_changes=N");
  app.add_option("--record-examples", record_examples,
                 "append the ids of the rows each training step of this worker takes to DIR/worker-TASK-PID.txt "
                 "(step=S changes=C ids=..., written as the step computes; to check that DATA sharding gives "
                 "every example of an epoch once across membership changes)")
      ->type_name("DIR");
  app.add_option("--validation-delay-ms", validation_delay_ms,
                 "validate on 512 rows of the set at the end of every epoch (FitOptions::validation_data, 4 batches), "
                 "holding each batch this long: a window to interrupt a run inside an epoch's end (each worker prints "
                 "'validation N begins' as its Nth validation starts)")
      ->type_name("MS")
      ->default_str("none")
      ->check(in_range(0, 60000));
  app.add_flag("--quiet", quiet, "print the result line only");
  return troupe::examples::run_main(app, argc, argv, [&] {
    if (checkpoint_every > 0 && checkpoint_dir.empty()) {
      throw std::invalid_argument("--checkpoint-every " + std::to_string(checkpoint_every) +
                                  " needs --checkpoint-dir DIR (where to save)");
    }
    // The directory is checked now, before the cluster forms and any training.
    std::unique_ptr<nn::BackupAndRestore> backup;
    if (!checkpoint_dir.empty()) {
      nn::BackupOptions backup_options;
      backup_options.save_freq = checkpoint_every;
      backup_options.save_before_preemption = true;
      backup = std::make_unique<nn::BackupAndRestore>(checkpoint_dir, backup_options);
    }
    Runtime rt;
    CommunicationOptions communication;
    communication.compression = compression == "fp16"   ? Compression::fp16
                                : compression == "bf16" ? Compression::bf16
                                                        : Compression::none;
    communication.implementation = implementation == "nccl"   ? CommunicationImplementation::nccl
                                   : implementation == "ring" ? CommunicationImplementation::ring
                                                              : CommunicationImplementation::automatic;
    MultiWorkerOptions settings = MultiWorkerOptions::from_environment();
    settings.elastic = settings.elastic || elastic;
    MultiWorkerMirroredStrategy strategy(rt, communication, nullptr, settings);
    const int workers = strategy.num_replicas_in_sync() / strategy.num_local_replicas();
    nn::BlobOptions blobs;
    blobs.samples = 8192;
    const nn::ClassificationData d = nn::make_blobs(blobs);
    const int inputs = static_cast<int>(d.features.shape()[1]);
    const std::int64_t steps_per_epoch = blobs.samples / batch;

    auto scope = strategy.scope();
    std::optional<ExampleRecorder> recorder;
    nn::Sequential layers;
    if (!record_examples.empty()) {
      recorder.emplace(d.features, record_examples + "/worker-" + std::to_string(strategy.cluster_resolver()->task_id()) +
                                       "-" + std::to_string(::getpid()) + ".txt");
      layers.add(*recorder);  // a copy sharing the recorder's state
    }
    layers.add(nn::Dense(inputs, 64, nn::Activation::relu, 1));
    layers.add(nn::Dense(64, 64, nn::Activation::relu, 2));
    layers.add(nn::Dense(64, blobs.classes, nn::Activation::none, 3));
    nn::Model model(std::move(layers));
    model.compile(std::make_shared<nn::Adam>(learning_rate), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    if (!quiet) {
      std::cout << strategy.cluster_resolver()->task_type() << " " << strategy.cluster_resolver()->task_id() << " of "
                << workers << " workers (pid " << ::getpid() << "), " << strategy.num_replicas_in_sync()
                << " replicas, global batch " << batch << ", compression " << compression
                << std::endl;  // flushed: a supervisor reads the pid
    }
    auto batches = data::Dataset::from_tensor_slices({d.features, d.labels}).shuffle(blobs.samples, 7).repeat().batch(
        batch, true);
    nn::FitOptions options;
    options.verbose = quiet ? 0 : 1;
    if (backup) {
      options.backup_and_restore = backup.get();
      if (auto latest = backup->latest_backup(); latest && !quiet) {
        std::cout << "resuming from " << std::filesystem::path(*latest).filename().string() << "\n";
      }
    }
    // With a backup, SIGTERM is a preemption (the backup's handler saves and exits 75).
    auto stop_on_signal = std::make_shared<nn::StopOnSignal>(backup ? std::vector<int>{SIGINT} : std::vector<int>{});
    options.callbacks.push_back(stop_on_signal);
    if (!no_terminate_on_nan) options.callbacks.push_back(std::make_shared<nn::TerminateOnNaN>());
    if (!tensorboard_dir.empty()) options.callbacks.push_back(std::make_shared<nn::TensorBoard>(tensorboard_dir, 1));
    // A checkpoint requested at a step boundary (model.control(), the dashboard) is a backup of
    // that step; saving is a collective: every worker calls it at the same step.
    auto saver = std::make_shared<nn::LambdaCallback>();
    saver->checkpoint = [&](std::int64_t, nn::Logs&) {
      if (backup) backup->save_now();
    };
    options.callbacks.push_back(saver);
    // Every worker watches its steps; the chief serves the dashboard. Its controls are requests to
    // model.control(), which fit agrees on in every step's own reduction: all workers apply them
    // after the same step, and a checkpoint is saved by `saver` above.
    std::unique_ptr<Monitor> monitor;
    if (monitor_flags.enabled()) {
      MonitorOptions monitor_options = monitor_flags.options(batch);
      monitor_options.log = &std::cout;  // every worker says when it paused, resumed, stopped
      monitor_options.checkpoints = backup != nullptr;  // without --checkpoint-dir, `saver` saves nothing
      monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), monitor_options);
      options.callbacks.push_back(monitor->callback());
    }
    if (step_delay_ms > 0) {
      options.on_step_end = [&](std::int64_t, double) {
        std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
      };
    }
    if (validation_delay_ms >= 0) {
      // Every worker reads the 4 global batches (DATA sharding); a third component numbers them, so
      // that batch 0 says a validation begins (one cut short and begun again included).
      std::vector<std::int64_t> batch_of(512);
      for (std::size_t i = 0; i < batch_of.size(); ++i) batch_of[i] = static_cast<std::int64_t>(i / 128);
      auto begun = std::make_shared<std::atomic<int>>(0);
      options.validation_data =
          data::Dataset::from_tensor_slices({d.features.slice(0, 512), d.labels.slice(0, 512),
                                             Tensor::from_vector(batch_of, {512})})
              .batch(128)
              .map([begun, validation_delay_ms](const data::Element& e) {
                if (e[2].to_vector<std::int64_t>().front() == 0) {
                  std::cout << "validation " << begun->fetch_add(1) + 1 << " begins" << std::endl;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(validation_delay_ms));
                return data::Element{e[0], e[1]};
              });
    }
    if (recorder) {
      auto tag = std::make_shared<nn::LambdaCallback>();
      tag->batch_begin = [&](std::int64_t, nn::Logs&) {
        recorder->set_step(model.control().step() + 1, strategy.membership_changes());
      };
      options.callbacks.push_back(tag);
      recorder->record(true);
    }
    const nn::History history = model.fit(batches, epochs, steps_per_epoch, options);
    if (recorder) recorder->record(false);
    if (history.non_finite_step != 0 && !no_terminate_on_nan) {
      std::cerr << "multi_worker_trainer: "
                << (history.stop_reason.empty() ? "the loss was not finite at step " + std::to_string(history.non_finite_step)
                                                : history.stop_reason)
                << "\n";
      return 1;
    }
    if (history.left_cluster) {
      // Asked to leave (SIGUSR2: troupe-launch's host discovery removed it): the others train on.
      std::cout << "left: step=" << history.stopped_at_step << " weights_digest=" << weights_digest(model.variables())
                << "\n";
      return 0;
    }
    const bool dashboard_stop = monitor && monitor->stopped();
    // A stop requested by another worker (its signal) stops this one at the same step too.
    if (dashboard_stop || stop_on_signal->received() != 0 || !history.stop_reason.empty()) {
      // Every worker stopped after the same step, and fit has backed that step up already.
      const std::string saved =
          backup ? "backed up in " + checkpoint_dir + "/ckpt-" + std::to_string(history.stopped_at_step) +
                       ".ckpt (run again to continue)"
                 : std::string("no --checkpoint-dir: the training done is not saved");
      if (dashboard_stop) {
        std::cout << "training stopped from the dashboard after step " << history.stopped_at_step << "; " << saved << "\n";
      } else {
        std::cerr << "multi_worker_trainer: " << history.stop_reason << " at step " << history.stopped_at_step << "; "
                  << saved << "\n";
        std::cout << "stopped: step=" << history.stopped_at_step
                  << " weights_digest=" << weights_digest(model.variables()) << "\n";
        return 128 + (stop_on_signal->received() != 0 ? stop_on_signal->received() : SIGINT);
      }
    }
    const nn::EvaluateResult eval = model.evaluate(d.features, d.labels);
    // A run resumed after its last epoch trained no step here (fit said so): no loss to report.
    // Under --elastic the workers and replicas are those that finished (a lost worker was dropped).
    std::cout << std::setprecision(9) << "result: workers="
              << strategy.num_replicas_in_sync() / strategy.num_local_replicas()
              << " replicas=" << strategy.num_replicas_in_sync() << " steps=" << model.control().step();
    if (!history.loss.empty()) std::cout << " loss=" << history.loss.back();
    std::cout << " accuracy=" << eval.accuracy;
    if (settings.elastic) std::cout << " membership_changes=" << strategy.membership_changes();
    std::cout << " weights_digest=" << weights_digest(model.variables()) << "\n";
    return 0;
  });
}
