// The MLP classifier under MultiWorkerMirroredStrategy: run the same program on every worker,
// with TF_CONFIG saying who is who (troupe-launch sets it for local workers):
//
//   troupe-launch -n 2 -- multi_worker_trainer            # 2 workers, 1 CPU replica each
//   troupe-launch -n 2 --devices-per-worker 2 -- multi_worker_trainer --epochs 3
//   troupe-launch -n 2 -- multi_worker_trainer --compression bf16   # gradients cross in 16 bits
//   troupe-launch -n 2 -- multi_worker_trainer --epochs 1000 --dashboard-port 8080 --checkpoint-dir /tmp/mw
//     # the chief serves the dashboard of both workers; pause, stop... act on both at the same step
//   troupe-launch -n 2 -- multi_worker_trainer --checkpoint-dir /tmp/mw --tensorboard-dir logs --epochs 1000
//
// Only the chief prints the progress. A NaN or infinite loss stops every worker at the same step
// (exit 1, no checkpoint after it). SIGINT or SIGTERM on any worker stops every worker after the
// same step; with --checkpoint-dir a checkpoint of that step is saved, and each exits 130 or 143
// saying so (--resume continues from it).
//
// Every worker reads the same generated set; each global batch is split over all replicas of all
// workers; gradients are all-reduced hierarchically (shared memory, then a TCP ring between the
// workers). Every worker prints the same losses, and the last line:
//   result: workers=2 replicas=2 loss=... accuracy=... weights_digest=HEX
// where weights_digest hashes the bytes of every variable (the model's and the optimizer's), the
// same on every worker of a synchronised run.

#include <cmath>
#include <iomanip>
#include <memory>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include <csignal>

#include <troupe/checkpoint.hpp>
#include <troupe/troupe.hpp>

#include "example_cli.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  int epochs = 3;
  std::int64_t batch = 256;
  std::string compression = "none";
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  troupe::examples::MonitorFlags monitor_flags;
  std::string tensorboard_dir;
  bool resume = false;
  bool no_terminate_on_nan = false;
  float learning_rate = 0.003f;
  CLI::App app{"The MLP classifier under MultiWorkerMirroredStrategy (TF_CONFIG says who is who).",
               "multi_worker_trainer"};
  troupe::examples::show_defaults(app);
  app.add_option("--epochs", epochs, "epochs")->check(CLI::Range(1, 1000000));
  app.add_option("--batch", batch, "global batch, split over every replica of every worker")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{8192}));  // the generated set has 8192 examples
  app.add_option("--compression", compression,
                 "how gradients cross workers: none (float32), fp16 or bf16 (CommunicationOptions::compression; "
                 "every worker must pass the same)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--lr", learning_rate, "Adam's learning rate")->check(CLI::PositiveNumber);
  auto* dir = app.add_option("--checkpoint-dir", checkpoint_dir,
                             "write a checkpoint into DIR at every epoch's end and on SIGINT/SIGTERM (every worker "
                             "must see the chief's DIR to --resume)");
  app.add_flag("--resume", resume, "continue from the newest intact checkpoint")->needs(dir);
  app.add_option("--tensorboard-dir", tensorboard_dir,
                 "write TensorBoard event files into DIR (the chief's; worker i's under DIR/worker_i)");
  app.add_flag("--no-terminate-on-nan", no_terminate_on_nan, "keep training (and checkpointing) when the loss is NaN or infinite, and exit 0");
  app.add_option("--checkpoint-every", checkpoint_every, "steps between checkpoints (0: at every epoch's end only)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->needs(dir);
  troupe::examples::add_monitor_options(app, monitor_flags);
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime rt;
    CommunicationOptions communication;
    communication.compression = compression == "fp16"   ? Compression::fp16
                                : compression == "bf16" ? Compression::bf16
                                                        : Compression::none;
    MultiWorkerMirroredStrategy strategy(rt, communication);
    const int workers = strategy.num_replicas_in_sync() / strategy.num_local_replicas();
    nn::BlobOptions blobs;
    blobs.samples = 8192;
    const nn::ClassificationData d = nn::make_blobs(blobs);
    const int inputs = static_cast<int>(d.features.shape()[1]);
    const std::int64_t steps_per_epoch = blobs.samples / batch;

    auto scope = strategy.scope();
    nn::Model model(nn::Sequential({nn::Dense(inputs, 64, nn::Activation::relu, 1),
                                    nn::Dense(64, 64, nn::Activation::relu, 2),
                                    nn::Dense(64, blobs.classes, nn::Activation::none, 3)}));
    model.compile(std::make_shared<nn::Adam>(learning_rate), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
    std::cout << strategy.cluster_resolver()->task_type() << " " << strategy.cluster_resolver()->task_id() << " of "
              << workers << " workers, " << strategy.num_replicas_in_sync() << " replicas, global batch " << batch
              << ", compression " << compression << "\n";
    std::unique_ptr<CheckpointManager> manager;
    std::int64_t initial_step = 0;
    if (!checkpoint_dir.empty()) {
      manager = std::make_unique<CheckpointManager>(Checkpoint(model.variables()), checkpoint_dir, 3);
      if (resume) {
        if (auto step = manager->restore_or_initialize()) initial_step = *step;
        std::cout << "starting at step " << initial_step << "\n";
      }
    }
    auto batches = data::Dataset::from_tensor_slices({d.features, d.labels})
                       .shuffle(blobs.samples, 7)
                       .repeat()
                       .batch(batch, true)
                       .skip(initial_step);
    nn::FitOptions options;
    options.initial_step = initial_step;
    auto stop_on_signal = std::make_shared<nn::StopOnSignal>();
    options.callbacks.push_back(stop_on_signal);
    if (!no_terminate_on_nan) options.callbacks.push_back(std::make_shared<nn::TerminateOnNaN>());
    if (!tensorboard_dir.empty()) options.callbacks.push_back(std::make_shared<nn::TensorBoard>(tensorboard_dir, 1));
    // Checkpoints at every epoch's end, every --checkpoint-every steps and when one is requested,
    // never of a non-finite loss's weights. Saving is a collective: every worker calls it at the
    // same step.
    std::int64_t last_saved = initial_step;
    const auto save = [&](std::int64_t step, const nn::Logs& logs) {
      const auto loss = logs.find("loss");
      const bool poisoned = loss != logs.end() && !std::isfinite(loss->second);
      if (!manager || step == last_saved || (poisoned && !no_terminate_on_nan)) return;
      manager->save(step);
      last_saved = step;
    };
    auto saver = std::make_shared<nn::LambdaCallback>();
    saver->epoch_end = [&](int, nn::Logs& logs) { save(model.control().step(), logs); };
    saver->checkpoint = [&](std::int64_t step, nn::Logs& logs) { save(step, logs); };
    saver->batch_end = [&](std::int64_t, nn::Logs& logs) {
      if (checkpoint_every > 0 && model.control().step() % checkpoint_every == 0) save(model.control().step(), logs);
    };
    options.callbacks.push_back(saver);
    // Every worker watches its steps; the chief serves the dashboard, and a command it takes is
    // applied by all workers after the same step (the monitor agrees on it across workers).
    std::unique_ptr<Monitor> monitor;
    if (monitor_flags.enabled()) {
      MonitorOptions monitor_options = monitor_flags.options(batch);
      monitor_options.log = &std::cout;  // every worker says when it paused, resumed, stopped
      monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), monitor_options);
      if (manager) monitor->set_checkpoint_function([&](std::int64_t step) { save(step, {}); });
      options.on_replica_losses = [&](const std::vector<Tensor>& l) { monitor->record_replica_losses(l); };
      options.on_step_end = [&](std::int64_t step, double loss) {
        if (monitor->on_step_end(step, loss) == StepDecision::stop) model.control().stop_training("stopped from the dashboard");
      };
    }
    nn::History history;
    if (initial_step < epochs * steps_per_epoch) history = model.fit(batches, epochs, steps_per_epoch, options);
    if (history.non_finite_step != 0 && !no_terminate_on_nan) {
      std::cerr << "multi_worker_trainer: "
                << (history.stop_reason.empty() ? "the loss was not finite at step " + std::to_string(history.non_finite_step)
                                                : history.stop_reason)
                << "\n";
      return 1;
    }
    const bool dashboard_stop = monitor && monitor->stopped();
    std::int64_t end_step = std::max(initial_step, initial_step + history.steps);
    if (dashboard_stop) {
      // A clean stop: every worker saves the same step, then reports as at the end.
      end_step = history.stopped_at_step;
      std::cout << "training stopped from the dashboard after step " << end_step << "\n";
      save(end_step, {});
    } else if (stop_on_signal->received() != 0 || !history.stop_reason.empty()) {
      std::cerr << "multi_worker_trainer: " << history.stop_reason << " at step " << history.stopped_at_step << "; "
                << (manager ? "checkpoint " + checkpoint_dir + "/ckpt-" + std::to_string(last_saved) +
                                  ".ckpt saved (continue with --resume)"
                            : std::string("no --checkpoint-dir: the training done is not saved"))
                << "\n";
      const int signal = stop_on_signal->received() != 0 ? stop_on_signal->received() : SIGINT;
      std::cout << "stopped: step=" << history.stopped_at_step << " weights_digest=" << weights_digest(model.variables())
                << "\n";
      return 128 + signal;
    } else {
      save(end_step, {});
    }
    const nn::EvaluateResult eval = model.evaluate(d.features, d.labels);
    const double last_loss = history.loss.empty() ? eval.loss : history.loss.back();
    std::cout << std::setprecision(9) << "result: workers=" << workers
              << " replicas=" << strategy.num_replicas_in_sync() << " steps=" << end_step << " loss=" << last_loss
              << " accuracy=" << eval.accuracy << " weights_digest=" << weights_digest(model.variables()) << "\n";
    return 0;
  });
}
