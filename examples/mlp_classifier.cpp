// A classifier with two hidden layers, trained data-parallel with MirroredStrategy over GPU or CPU
// replicas through Model::fit, with checkpoints every N steps and --resume.
//
// Data: a CSV file (--csv, label column --label-column, features standardised per column), an
// IDX pair (--idx-images/--idx-labels, e.g. MNIST's; pixels divided by 255), or, when neither is
// given, a generated set of Gaussian clusters (nn::make_blobs: several clusters per class, so a
// linear model is not enough).
//
//   mlp_classifier                                       # generated set: every GPU, else 4 CPU replicas
//   mlp_classifier --devices GPU:0,GPU:1                 # (or --gpus 2, or --replicas 8 for CPU replicas)
//   mlp_classifier --csv iris.csv --label-column species --epochs 50 --batch 16   # names -> class ids
//   mlp_classifier --idx-images train-images-idx3-ubyte --idx-labels train-labels-idx1-ubyte
//   mlp_classifier --checkpoint-dir /tmp/mlp --checkpoint-every 50   # then again with --resume
//   mlp_classifier --cached-batches                      # training alone, input cost taken out
//   mlp_classifier --epochs 1000 --dashboard-port 8080   # steer it from http://127.0.0.1:8080/
//   mlp_classifier --trace trace.json --trace-steps 10:110   # a Chrome trace of steps 10..110
//   mlp_classifier --tensorboard-dir logs --validation-split 0.1   # then: tensorboard --logdir logs
//   troupe-launch -n 2 --devices-per-worker 2 -- mlp_classifier --multi-worker   # 2 workers x 2 replicas
//
// A NaN or infinite loss stops training (TerminateOnNaN; exit 1, no checkpoint after it). SIGINT
// or SIGTERM finishes the step, saves a checkpoint when --checkpoint-dir is set and exits 130 or
// 143 saying so; --resume continues from there.
//
// The last line is for scripts (bench/training_bench.sh):
//   result: replicas=4 batch=256 input=pipeline steps=640 samples_per_s=... allreduce_share=... exposed_share=...
//           exposed_peer_wait_share=... accuracy=... loss=... [peak_gpu_mib=..., on GPU replicas]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include <troupe/checkpoint.hpp>
#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;
using troupe::examples::positive;

using namespace troupe;
using namespace troupe::distribute;

namespace {

struct Flags {
  int replicas = 4;
  std::vector<std::string> devices;  // --devices GPU:0,GPU:1 (empty: --gpus, --replicas or every GPU)
  int gpus = 0;
  bool replicas_given = false;  // --replicas was on the command line
  std::string tf32 = "on";
  int epochs = 10;
  std::int64_t batch = 256;
  int hidden = 128;
  float learning_rate = 0.003f;
  std::string optimizer = "adam";
  std::string mixed_precision = "float32";
  std::uint64_t seed = 1;
  // Generated set.
  std::int64_t samples = 16384;
  int features = 32;
  int classes = 4;
  // Files.
  std::string csv;
  std::string label_column = "label";
  std::string delimiter = ",";
  std::string non_finite = "refuse";
  std::string labels = "auto";
  int max_classes = 1000;
  std::string idx_images;
  std::string idx_labels;
  // Checkpoints.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 100;
  int keep = 3;
  bool resume = false;
  double min_accuracy = 0.0;
  bool quiet = false;
  bool cached_batches = false;
  troupe::examples::MonitorFlags monitor;
  // Watching and stopping.
  std::string tensorboard_dir;
  std::int64_t tensorboard_freq = 1;
  double validation_split = 0.0;
  bool no_terminate_on_nan = false;
  int early_stopping_patience = 0;
  bool multi_worker = false;
};

// The command line, with the defaults of Flags.
// " (loss scaling from 2^15)" when compile wrapped the optimizer in a LossScaleOptimizer.
std::string loss_scaling(const nn::Model& model) {
  const auto* lso = dynamic_cast<const nn::LossScaleOptimizer*>(model.optimizer().get());
  if (lso == nullptr) return "";
  return " (loss scaling from 2^" + std::to_string(static_cast<int>(std::log2(lso->initial_scale()))) + ")";
}

void add_options(CLI::App& app, Flags& f) {
  troupe::examples::show_defaults(app);
  auto* replicas = app.add_option("--replicas", f.replicas, "CPU replicas (the default on a machine without GPUs)")
                       ->check(in_range(1, 1024));
  auto* devices = app.add_option("--devices", f.devices,
                                 "the replicas' devices, comma-separated: GPU:0,GPU:1 or CPU:0,CPU:1 (default: every "
                                 "GPU, as MirroredStrategy() takes them, else --replicas CPU replicas)")
                      ->delimiter(',')
                      ->excludes(replicas);
  app.add_option("--tf32", f.tf32,
                 "TensorFloat-32 products on GPUs (config::enable_tensor_float_32_execution; on by default, as in "
                 "TensorFlow)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--gpus", f.gpus, "one replica on each of the first N GPUs")
      ->check(in_range(1, 1024))
      ->excludes(replicas)
      ->excludes(devices);
  app.add_option("--epochs", f.epochs, "epochs")->check(in_range(1, 1000000));
  app.add_option("--batch", f.batch, "global batch, split over the replicas")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 30));
  app.add_option("--hidden", f.hidden, "units of each hidden layer")->check(in_range(1, 1 << 20));
  app.add_option("--lr", f.learning_rate, "learning rate")->check(positive());
  app.add_option("--optimizer", f.optimizer, "optimizer")->check(CLI::IsMember({"adam", "sgd", "momentum"}));
  app.add_option("--mixed-precision", f.mixed_precision,
                 "the layers' dtype policy, Keras's names: compute in float16 or bfloat16, variables in float32")
      ->check(CLI::IsMember({"float32", "mixed_float16", "mixed_bfloat16"}));
  app.add_option("--seed", f.seed, "random seed");
  app.add_option("--samples", f.samples, "generated set: examples")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 30));
  app.add_option("--features", f.features, "generated set: features")->check(in_range(1, 1 << 20));
  app.add_option("--classes", f.classes, "generated set: classes")->check(in_range(2, 1 << 20));
  auto* csv = app.add_option("--csv", f.csv, "a CSV file with a header row");
  app.add_option("--label-column", f.label_column, "the CSV's label column: class ids, or names mapped to ids")
      ->needs(csv);
  app.add_option("--labels", f.labels, "the label column holds numbers, names, or either (auto)")
      ->check(CLI::IsMember({"auto", "numbers", "names"}))
      ->needs(csv);
  // transform, not check: CLI11 keeps a check's changes to the text to itself, and "tab" must
  // arrive as '\t'.
  app.add_option("--delimiter", f.delimiter, "the CSV's field separator: one character, or \"tab\"")
      ->transform(CLI::Validator(
          [](std::string& d) -> std::string {
            if (d == "tab" || d == "\\t") d = "\t";
            return d.size() == 1 ? std::string() : "expected one character or \"tab\", got \"" + d + "\"";
          },
          "CHAR"))
      ->needs(csv);
  app.add_option("--non-finite", f.non_finite, "a NaN/Inf in the CSV: refuse the file, or drop the row with a warning")
      ->check(CLI::IsMember({"refuse", "drop"}))
      ->needs(csv);
  app.add_option("--max-classes", f.max_classes,
                 "the most classes the labels may make (a label of 1000000 would make a million)")
      ->check(in_range(2, 1 << 24));
  auto* images = app.add_option("--idx-images", f.idx_images, "an IDX file of images (e.g. MNIST's)");
  auto* labels = app.add_option("--idx-labels", f.idx_labels, "the IDX file of their labels");
  images->needs(labels)->excludes(csv);
  labels->needs(images);
  auto* dir = app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoints into DIR");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--keep", f.keep, "checkpoints kept")->check(in_range(1, 1000000));
  app.add_flag("--resume", f.resume, "continue from the newest intact checkpoint")->needs(dir);
  app.add_option("--min-accuracy", f.min_accuracy, "exit 1 when the training accuracy ends below A")
      ->check(in_range(0.0, 1.0));
  app.add_flag("--quiet", f.quiet, "print the result line only");
  app.add_option("--tensorboard-dir", f.tensorboard_dir, "write TensorBoard event files into DIR (train/, validation/)");
  app.add_option("--tensorboard-freq", f.tensorboard_freq, "steps between the per-step TensorBoard scalars")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--validation-split", f.validation_split,
                 "hold out this fraction of the examples (the last ones) as validation_data")
      ->check(in_range(0.0, 0.9));
  app.add_flag("--no-terminate-on-nan", f.no_terminate_on_nan,
               "keep training (and checkpointing) when the loss is NaN or infinite, and exit 0");
  app.add_option("--early-stopping-patience", f.early_stopping_patience,
                 "stop when val_loss (loss without a validation split) has not improved for N epochs (0: never)")
      ->check(in_range(0, 1000000));
  app.add_flag("--cached-batches", f.cached_batches,
               "keep the first epoch's global batches in memory and repeat them (tf.data's cache()): the "
               "per-step input cost drops to splitting a batch, for measuring training alone (on GPU "
               "replicas the cache is on the first replica's GPU)");
  troupe::examples::add_monitor_options(app, f.monitor);
  app.add_flag("--multi-worker", f.multi_worker,
               "train as one worker of a MultiWorkerMirroredStrategy (TF_CONFIG says who is who, "
               "TROUPE_DEVICES_PER_WORKER how many replicas each worker runs; --replicas is ignored)");
}

std::vector<std::string> numbered(const char* kind, int n) {
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back(kind + std::to_string(i));
  return devices;
}

// The replicas' devices: --devices, --gpus, --replicas CPU replicas, or (none of them given) every
// GPU when the machine has one, as MirroredStrategy() does in TensorFlow.
std::vector<std::string> replica_devices(const Flags& f) {
  if (!f.devices.empty()) return f.devices;
  if (f.gpus > 0) return numbered("GPU:", f.gpus);
  const int gpus = f.replicas_given ? 0 : Runtime::gpu_count();
  return gpus > 0 ? numbered("GPU:", gpus) : numbered("CPU:", f.replicas);
}

// Each column to mean 0 and standard deviation 1 (a constant column to 0).
Tensor standardise(const Tensor& x) {
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  std::vector<float> v = x.to_vector<float>();
  for (std::int64_t c = 0; c < cols; ++c) {
    double sum = 0, sq = 0;
    for (std::int64_t r = 0; r < rows; ++r) sum += v[static_cast<std::size_t>(r * cols + c)];
    const double mean = rows ? sum / static_cast<double>(rows) : 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double d = v[static_cast<std::size_t>(r * cols + c)] - mean;
      sq += d * d;
    }
    const double sd = rows ? std::sqrt(sq / static_cast<double>(rows)) : 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      float& e = v[static_cast<std::size_t>(r * cols + c)];
      e = sd > 0 ? static_cast<float>((e - mean) / sd) : 0.0f;
    }
  }
  return Tensor::from_vector(v, x.shape());
}

struct LoadedData {
  nn::ClassificationData data;
  int classes = 0;
  std::string description;
  std::vector<std::string> label_names;  ///< class id -> name, when the CSV's labels were names
};

LoadedData load(const Flags& f) {
  LoadedData out;
  if (!f.csv.empty()) {
    data::CsvOptions options;
    options.label_column = f.label_column;
    options.delimiter = f.delimiter[0];
    options.non_finite = f.non_finite == "drop" ? data::NonFinite::drop_row : data::NonFinite::refuse;
    options.labels = f.labels == "names"     ? data::CsvLabels::names
                     : f.labels == "numbers" ? data::CsvLabels::numbers
                                             : data::CsvLabels::automatic;
    data::CsvData csv = data::read_csv(f.csv, options);
    for (const std::string& w : csv.warnings) std::cerr << "mlp_classifier: warning: " << w << "\n";
    out.data = {standardise(csv.features), *csv.labels};
    out.description = f.csv;
    out.label_names = std::move(csv.label_names);
  } else if (!f.idx_images.empty()) {
    Tensor images = data::read_idx(f.idx_images, DType::f32);
    const std::int64_t n = images.rank() > 0 ? images.shape()[0] : 0;
    if (n == 0 || images.num_elements() % n != 0) throw std::invalid_argument(f.idx_images + ": no images");
    images = images.reshape({n, images.num_elements() / n}) / 255.0f;
    out.data = {images, data::read_idx(f.idx_labels, DType::i64)};
    out.description = f.idx_images;
  } else {
    nn::BlobOptions options;
    options.samples = f.samples;
    options.features = f.features;
    options.classes = f.classes;
    out.data = nn::make_blobs(options);
    out.description = "generated Gaussian clusters, 2 per class";
  }
  const auto labels = out.data.labels.to_vector<std::int64_t>();
  if (out.data.features.shape()[0] != static_cast<std::int64_t>(labels.size())) {
    throw std::invalid_argument("the features have " + std::to_string(out.data.features.shape()[0]) +
                                " rows but there are " + std::to_string(labels.size()) + " labels");
  }
  if (labels.empty()) throw std::invalid_argument(out.description + ": no examples");
  const auto [lo, hi] = std::minmax_element(labels.begin(), labels.end());
  if (*lo < 0) throw std::invalid_argument("label " + std::to_string(*lo) + " is negative (expected 0..classes-1)");
  if (*hi >= f.max_classes) {
    throw std::invalid_argument("label " + std::to_string(*hi) + " would make " + std::to_string(*hi + 1) +
                                " classes, more than --max-classes " + std::to_string(f.max_classes) +
                                " (labels are class ids 0..classes-1; raise --max-classes if this is meant)");
  }
  out.classes = static_cast<int>(*hi + 1);
  return out;
}

std::shared_ptr<nn::Optimizer> make_optimizer(const Flags& f) {
  if (f.optimizer == "sgd") return std::make_shared<nn::SGD>(f.learning_rate);
  if (f.optimizer == "momentum") return std::make_shared<nn::SGD>(f.learning_rate, 0.9f);
  return std::make_shared<nn::Adam>(f.learning_rate);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The class names beside the checkpoints (labels.txt: line i+1 names class i), so that a restored
// model's outputs can be read. A resumed run must map the classes as the saved one did.
void save_label_names(const Flags& f, const std::vector<std::string>& names) {
  const std::string path = f.checkpoint_dir + "/labels.txt";
  std::string text;
  for (const std::string& n : names) text += n + "\n";
  if (f.resume) {
    std::ifstream in(path);
    if (in) {
      const std::string saved((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (saved != text) {
        throw std::invalid_argument("--resume: " + path + " maps the classes differently from " + f.csv +
                                    " (the saved model's outputs would mean other classes)");
      }
      return;
    }
  }
  std::filesystem::create_directories(f.checkpoint_dir);
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

// The first rows for training and the last `fraction` of them for validation.
std::pair<nn::ClassificationData, std::optional<nn::ClassificationData>> split(const nn::ClassificationData& all,
                                                                               double fraction) {
  const std::int64_t n = all.features.shape()[0];
  const auto held = static_cast<std::int64_t>(static_cast<double>(n) * fraction);
  if (held == 0) return {all, std::nullopt};
  if (held >= n) throw std::invalid_argument("--validation-split leaves no training examples");
  const std::int64_t cols = all.features.num_elements() / n;
  const std::vector<float> x = all.features.to_vector<float>();
  const std::vector<std::int64_t> y = all.labels.to_vector<std::int64_t>();
  const auto rows = [&](std::int64_t a, std::int64_t b) {
    return nn::ClassificationData{
        Tensor::from_vector(std::vector<float>(x.begin() + a * cols, x.begin() + b * cols), {b - a, cols}),
        Tensor::from_vector(std::vector<std::int64_t>(y.begin() + a, y.begin() + b), {b - a})};
  };
  return {rows(0, n - held), rows(n - held, n)};
}

int run(const Flags& f) {
  const LoadedData loaded = load(f);
  const auto parts = split(loaded.data, f.validation_split);
  const nn::ClassificationData& d = parts.first;
  const std::optional<nn::ClassificationData>& validation = parts.second;
  const std::int64_t n = d.features.shape()[0];
  const int inputs = static_cast<int>(d.features.num_elements() / n);
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, n / f.batch);
  if (!f.quiet) {
    std::cout << "data: " << loaded.description << " (" << n << " examples, " << inputs << " features, "
              << loaded.classes << " classes)\n";
  }
  if (!loaded.label_names.empty()) {
    std::cout << "classes:";
    for (std::size_t i = 0; i < loaded.label_names.size(); ++i) std::cout << " " << i << "=" << loaded.label_names[i];
    std::cout << "\n";
  }
  if (!f.checkpoint_dir.empty() && !loaded.label_names.empty()) save_label_names(f, loaded.label_names);

  config::enable_tensor_float_32_execution(f.tf32 == "on");
  Runtime rt;
  // One process, or one worker of several (TF_CONFIG, TROUPE_DEVICES_PER_WORKER replicas each).
  std::unique_ptr<Strategy> owned_strategy;
  if (f.multi_worker) {
    owned_strategy = std::make_unique<MultiWorkerMirroredStrategy>(rt);
  } else {
    owned_strategy = std::make_unique<MirroredStrategy>(rt, replica_devices(f));
  }
  Strategy& strategy = *owned_strategy;
  auto scope = strategy.scope();
  // The layers take the policy current when they are made (mixed_float16 adds loss scaling).
  nn::mixed_precision::set_global_policy(f.mixed_precision);
  nn::Model model(nn::Sequential({nn::Dense(inputs, f.hidden, nn::Activation::relu, f.seed),
                                  nn::Dense(f.hidden, f.hidden, nn::Activation::relu, f.seed + 1),
                                  nn::Dense(f.hidden, loaded.classes, nn::Activation::none, f.seed + 2)}));
  nn::mixed_precision::set_global_policy("float32");
  model.compile(make_optimizer(f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  if (!f.quiet) {
    std::cout << "model: " << inputs << " -> " << f.hidden << " relu -> " << f.hidden << " relu -> " << loaded.classes
              << ", " << f.optimizer << " lr " << f.learning_rate
              << (f.mixed_precision == "float32" ? std::string() : ", " + f.mixed_precision) << loss_scaling(model)
              << "; " << strategy.num_replicas_in_sync()
              << (strategy.extended().worker_devices().front().is_gpu() ? " GPU" : " CPU")
              << " replicas, global batch " << f.batch << ", " << steps_per_epoch
              << (steps_per_epoch == 1 ? " step" : " steps") << " per epoch\n";
  }

  std::unique_ptr<CheckpointManager> manager;
  std::int64_t initial_step = 0;
  if (!f.checkpoint_dir.empty()) {
    manager = std::make_unique<CheckpointManager>(Checkpoint(model.variables()), f.checkpoint_dir, f.keep);
    if (f.resume) {
      if (auto step = manager->restore_or_initialize()) {
        initial_step = *step;
        // CheckpointManager names its files ckpt-<step>.ckpt; the newest may have been skipped as damaged.
        if (!f.quiet) std::cout << "resumed from " << f.checkpoint_dir << "/ckpt-" << initial_step << ".ckpt at step " << initial_step
                  << "\n";
      } else if (!f.quiet) {
        std::cout << "no checkpoint in " << f.checkpoint_dir << ": starting from scratch\n";
      }
    }
  }

  // One endless shuffled stream of global batches: every repetition is a new order from the
  // seed, so skipping the steps already done continues exactly where a checkpointed run was.
  data::Dataset batches =
      data::Dataset::from_tensor_slices({d.features, d.labels}).shuffle(n, f.seed).repeat().batch(f.batch, true);
  if (f.cached_batches) {
    auto cache = std::make_shared<std::vector<data::Element>>();
    data::Iterator it = batches.make_iterator();
    // On GPU replicas the cache is kept on the first replica's GPU (as a GPU-side benchmark keeps
    // its batches on the device), so that one GPU replica reads it in place instead of copying
    // each batch from the host again.
    const Device& first_device = strategy.extended().worker_devices().front();
    const bool on_gpu = std::all_of(strategy.extended().worker_devices().begin(),
                                    strategy.extended().worker_devices().end(),
                                    [](const Device& device) { return device.is_gpu(); });
    for (std::int64_t i = 0; i < steps_per_epoch; ++i) {
      data::Element e = it.get_next();
      if (on_gpu) {
        for (Tensor& t : e) t = t.with_device(first_device);
      }
      cache->push_back(std::move(e));
    }
    batches = data::Dataset::from_generator_factory(
        [cache] {
          return [cache, i = std::size_t(0)]() mutable -> std::optional<data::Element> {
            return (*cache)[i++ % cache->size()];
          };
        },
        data::infinite_cardinality);
  }
  batches = batches.skip(initial_step);
  nn::FitOptions options;
  options.verbose = f.quiet ? 0 : 1;
  options.initial_step = initial_step;
  if (validation) options.validation_data = data::Dataset::from_tensor_slices({validation->features, validation->labels}).batch(4096);
  auto stop_on_signal = std::make_shared<nn::StopOnSignal>();
  options.callbacks.push_back(stop_on_signal);
  if (!f.no_terminate_on_nan) options.callbacks.push_back(std::make_shared<nn::TerminateOnNaN>());
  if (f.early_stopping_patience > 0) {
    options.callbacks.push_back(
        std::make_shared<nn::EarlyStopping>(validation ? "val_loss" : "loss", 0.0, f.early_stopping_patience, 1));
  }
  if (!f.tensorboard_dir.empty()) {
    options.callbacks.push_back(std::make_shared<nn::TensorBoard>(f.tensorboard_dir, f.tensorboard_freq));
  }
  // Checkpoints every --checkpoint-every steps and when one is requested (a signal), never of a
  // non-finite loss's weights unless --no-terminate-on-nan asked to go on regardless.
  std::int64_t last_saved = initial_step;
  std::string last_file;
  auto saver = std::make_shared<nn::LambdaCallback>();
  const auto save = [&](std::int64_t step, const nn::Logs& logs) {
    const auto loss = logs.find("loss");
    const bool poisoned = loss != logs.end() && !std::isfinite(loss->second);
    if (!manager || step == last_saved || (poisoned && !f.no_terminate_on_nan)) return;
    last_file = manager->save(step);
    last_saved = step;
  };
  saver->batch_end = [&](std::int64_t, nn::Logs& logs) {
    const std::int64_t step = model.control().step();
    if (step % f.checkpoint_every == 0) save(step, logs);
  };
  saver->checkpoint = [&](std::int64_t step, nn::Logs& logs) { save(step, logs); };
  options.callbacks.push_back(saver);
  // The dashboard and traces: the monitor sees every step boundary and may pause or stop there.
  std::unique_ptr<Monitor> monitor;
  if (f.monitor.enabled()) {
    // Its controls go through model.control(); a checkpoint is saved by `saver` above.
    MonitorOptions monitor_options = f.monitor.options(f.batch);
    monitor_options.checkpoints = manager != nullptr;  // without --checkpoint-dir, `saver` saves nothing
    monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), monitor_options);
    options.callbacks.push_back(monitor->callback());
  }
  const std::int64_t total_steps = f.epochs * steps_per_epoch;
  nn::History history;
  const auto exposed_before = model.optimizer()->exposed_all_reduce_time();
  const auto peer_wait_before = model.optimizer()->exposed_peer_wait_time();
  if (initial_step < total_steps) history = model.fit(batches, f.epochs, steps_per_epoch, options);
  const std::int64_t end_step = initial_step + history.steps;
  if (history.non_finite_step != 0 && !f.no_terminate_on_nan) {
    std::cerr << "mlp_classifier: "
              << (history.stop_reason.empty() ? "the loss was not finite at step " + std::to_string(history.non_finite_step)
                                              : history.stop_reason)
              << "; " << (last_saved > initial_step ? "the last checkpoint is of step " + std::to_string(last_saved)
                                            : std::string("no checkpoint was written"))
              << "\n";
    return 1;
  }
  if (manager && last_saved != std::max(initial_step, end_step)) save(std::max(initial_step, end_step), {});
  if (monitor && monitor->stopped()) std::cout << "training stopped from the dashboard after step " << end_step << "\n";
  if (stop_on_signal->received() != 0) {
    std::cerr << "mlp_classifier: " << history.stop_reason << " at step " << history.stopped_at_step << "; "
              << (manager ? "checkpoint " + last_file + " saved (continue with --resume)"
                          : std::string("no --checkpoint-dir: the training done is not saved"))
              << "\n";
    return 128 + stop_on_signal->received();
  }
  if (manager && last_saved != end_step) manager->save(end_step);

  const nn::EvaluateResult train = model.evaluate(data::Dataset::from_tensor_slices({d.features, d.labels}).batch(4096));
  double seconds = 0;
  for (double s : history.seconds) seconds += s;
  const double throughput = median(history.samples_per_second);
  const double share = seconds > 0 ? history.all_reduce_seconds / seconds : 0.0;
  // The part of the all-reduce the backward pass did not hide (bucketed gradients only).
  const double exposed =
      std::chrono::duration<double>(model.optimizer()->exposed_all_reduce_time() - exposed_before).count();
  const double exposed_share = seconds > 0 ? exposed / seconds : 0.0;
  // Of it, the wait for another worker to join a bucket's all-reduce (across workers only).
  const double peer_wait =
      std::chrono::duration<double>(model.optimizer()->exposed_peer_wait_time() - peer_wait_before).count();
  const double peer_wait_share = seconds > 0 ? peer_wait / seconds : 0.0;
  std::cout << std::fixed;
  if (!f.quiet) {
    std::cout << std::setprecision(2) << "training accuracy " << 100 * train.accuracy << "% (" << train.samples
              << " examples), loss " << std::setprecision(6) << train.loss << "\n";
    std::cout << std::setprecision(0) << "throughput " << throughput << " samples/s (median over epochs), all-reduce "
              << std::setprecision(1) << 100 * share << "% of training time (exposed " << 100 * exposed_share
              << "%, of it waiting for another worker " << 100 * peer_wait_share << "%)\n";
  }
  std::cout << std::setprecision(4) << "result: replicas=" << strategy.num_replicas_in_sync() << " batch=" << f.batch
            << " input=" << (f.cached_batches ? "cached" : "pipeline")
            << " steps=" << history.steps << " samples_per_s=" << std::setprecision(0) << throughput
            << " allreduce_share=" << std::setprecision(4) << share << " exposed_share=" << exposed_share
            << " exposed_peer_wait_share=" << peer_wait_share
            << " accuracy=" << train.accuracy
            << " loss=" << train.loss;
  // The most GPU memory tensors held at once on the first replica's GPU.
  const Device& first = strategy.extended().worker_devices().front();
  if (first.is_gpu()) {
    std::cout << " peak_gpu_mib=" << std::setprecision(1)
              << static_cast<double>(config::experimental::get_memory_info(first.to_string()).peak) / (1 << 20);
  }
  std::cout << "\n";
  if (train.accuracy < f.min_accuracy) {
    std::cerr << "mlp_classifier: training accuracy " << train.accuracy << " is below --min-accuracy "
              << f.min_accuracy << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"An MLP classifier on a CSV/IDX or generated set, trained with MirroredStrategy.", "mlp_classifier"};
  add_options(app, flags);
  return troupe::examples::run_main(app, argc, argv, [&] {
    flags.replicas_given = app.count("--replicas") > 0;
    return run(flags);
  });
}
