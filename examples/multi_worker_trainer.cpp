// The MLP classifier under MultiWorkerMirroredStrategy: run the same program on every worker,
// with TF_CONFIG saying who is who (troupe-launch sets it for local workers):
//
//   troupe-launch -n 2 -- multi_worker_trainer            # 2 workers, 1 CPU replica each
//   troupe-launch -n 2 --devices-per-worker 2 -- multi_worker_trainer --epochs 3
//   troupe-launch -n 2 -- multi_worker_trainer --compression bf16   # gradients cross in 16 bits
//   troupe-launch -n 2 -- multi_worker_trainer --epochs 1000 --dashboard-port 8080 --checkpoint-dir /tmp/mw
//     # the chief serves the dashboard of both workers; pause, stop... act on both at the same step
//
// Every worker reads the same generated set; each global batch is split over all replicas of all
// workers; gradients are all-reduced hierarchically (shared memory, then a TCP ring between the
// workers). Every worker prints the same losses, and the last line:
//   result: workers=2 replicas=2 loss=... accuracy=... weights_digest=HEX
// where weights_digest hashes the bytes of every variable (the model's and the optimizer's), the
// same on every worker of a synchronised run.

#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

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
  auto* dir = app.add_option("--checkpoint-dir", checkpoint_dir,
                             "write checkpoints into DIR (the chief writes them) at the end, on the dashboard's "
                             "request and every --checkpoint-every steps");
  app.add_option("--checkpoint-every", checkpoint_every, "steps between checkpoints (0: none in between)")
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
    model.compile(std::make_shared<nn::Adam>(0.003f), nn::Loss::sparse_categorical_crossentropy());
    std::cout << strategy.cluster_resolver()->task_type() << " " << strategy.cluster_resolver()->task_id() << " of "
              << workers << " workers, " << strategy.num_replicas_in_sync() << " replicas, global batch " << batch
              << ", compression " << compression << "\n";
    auto batches = data::Dataset::from_tensor_slices({d.features, d.labels}).shuffle(blobs.samples, 7).repeat().batch(
        batch, true);
    std::unique_ptr<CheckpointManager> manager;
    if (!checkpoint_dir.empty()) {
      // Every worker takes part in a save; the chief writes the directory.
      manager = std::make_unique<CheckpointManager>(Checkpoint(model.variables()), checkpoint_dir, 3);
    }
    std::int64_t last_saved = 0;
    auto save = [&](std::int64_t step) {
      if (!manager || step == last_saved) return;
      manager->save(step);
      last_saved = step;
    };
    // Every worker watches its steps; the chief serves the dashboard, and a command it takes is
    // applied by all workers after the same step.
    std::unique_ptr<Monitor> monitor;
    nn::FitOptions options;
    if (monitor_flags.enabled()) {
      MonitorOptions monitor_options = monitor_flags.options(batch);
      monitor_options.log = &std::cout;  // every worker says when it paused, resumed, stopped
      monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), monitor_options);
      if (manager) monitor->set_checkpoint_function(save);
      options.on_replica_losses = [&](const std::vector<Tensor>& l) { monitor->record_replica_losses(l); };
    }
    options.on_step_end = [&](std::int64_t step, double loss) {
      if (checkpoint_every > 0 && step % checkpoint_every == 0) save(step);
      if (monitor && monitor->on_step_end(step, loss) == StepDecision::stop) throw TrainingStopped(step);
    };
    nn::History history;
    std::int64_t end_step = epochs * steps_per_epoch;
    double last_loss = 0;
    try {
      history = model.fit(batches, epochs, steps_per_epoch, options);
      last_loss = history.loss.back();
    } catch (const TrainingStopped& stopped) {
      std::cout << stopped.what() << "\n";
      end_step = stopped.step();
    }
    save(end_step);
    const nn::EvaluateResult eval = model.evaluate(d.features, d.labels);
    if (history.loss.empty()) last_loss = eval.loss;
    std::cout << std::setprecision(9) << "result: workers=" << workers
              << " replicas=" << strategy.num_replicas_in_sync() << " steps=" << end_step << " loss=" << last_loss
              << " accuracy=" << eval.accuracy << " weights_digest=" << weights_digest(model.variables()) << "\n";
    return 0;
  });
}
