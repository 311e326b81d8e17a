// A convolutional network on real handwritten digits, trained data-parallel with MirroredStrategy
// (CPU or GPU replicas) or as one worker of a MultiWorkerMirroredStrategy, through Model::fit.
//
// Data: scikit-learn's bundled 8x8 digits (1,797 images, 16 grey levels; tools/install-deps.sh
// puts them at /opt/troupe-data/digits.csv), a held-out fraction (--test-fraction) kept for the
// test; or MNIST's IDX files when --mnist names their folder (train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; the t10k pair is the
// test set).
//
//   digits_cnn                                             # 4 CPU replicas (every GPU where there is one)
//   digits_cnn --devices CPU:0,CPU:1 --epochs 40 --min-accuracy 0.97
//   digits_cnn --mnist ~/mnist --epochs 3 --batch 128
//   digits_cnn --checkpoint-dir /tmp/digits                # backed up every epoch; run again to resume
//   digits_cnn --tensorboard-dir logs --dashboard-port 8080 --save /tmp/digits-model
//   troupe-launch -n 2 -- digits_cnn --multi-worker        # 2 workers, 1 CPU replica each
//
// Model: Conv2D(16, 3x3, same, relu) -> MaxPooling2D(2) -> Conv2D(32, 3x3, same, relu) ->
// MaxPooling2D(2) -> Flatten -> Dropout(0.25) -> Dense(10), Adam, sparse categorical cross-entropy.
//
// The last line is for scripts (tests/programs/digits_cnn_check.sh, bench/):
//   result: workers=1 replicas=4 batch=64 epochs=30 samples_per_s=... test_accuracy=... test_loss=... test_samples=...
//           predict_accuracy=... predictions_digest=HEX
// (Model::evaluate's accuracy and loss, and the accuracy and a digest of Model::predict's outputs,
// the same on every worker).
// and --min-accuracy A makes the exit status 1 when the test accuracy ends below A.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;
using troupe::examples::positive;

using namespace troupe;
using namespace troupe::distribute;

namespace {

struct Flags {
  int replicas = 4;
  std::vector<std::string> devices;
  bool replicas_given = false;
  bool multi_worker = false;
  int epochs = 30;
  std::int64_t batch = 64;
  float learning_rate = 0.003f;
  std::uint64_t seed = 1;
  double dropout = 0.25;
  std::string digits = "/opt/troupe-data/digits.csv";
  std::string mnist;
  double test_fraction = 0.2;
  double min_accuracy = 0.0;
  std::string checkpoint_dir;
  std::string save;
  std::string tensorboard_dir;
  bool quiet = false;
  troupe::examples::MonitorFlags monitor;
};

void add_options(CLI::App& app, Flags& f) {
  troupe::examples::show_defaults(app);
  auto* replicas = app.add_option("--replicas", f.replicas, "CPU replicas (the default on a machine without GPUs)")
                       ->check(in_range(1, 1024));
  app.add_option("--devices", f.devices, "the replicas' devices, comma-separated: CPU:0,CPU:1 or GPU:0,GPU:1")
      ->delimiter(',')
      ->excludes(replicas);
  app.add_flag("--multi-worker", f.multi_worker,
               "train as one worker of a MultiWorkerMirroredStrategy (TF_CONFIG says who is who, "
               "TROUPE_DEVICES_PER_WORKER how many replicas each worker runs; troupe-launch sets both)");
  app.add_option("--epochs", f.epochs, "epochs")->check(in_range(1, 1000000));
  app.add_option("--batch", f.batch, "global batch, split over every replica")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--lr", f.learning_rate, "Adam's learning rate")->check(positive());
  app.add_option("--seed", f.seed, "seed of the weights, the test split, the shuffles and Dropout");
  app.add_option("--dropout", f.dropout, "Dropout's rate before the last layer (0: none)")->check(in_range(0.0, 0.9));
  auto* mnist = app.add_option("--mnist", f.mnist, "a folder with MNIST's four IDX files: train on them instead");
  app.add_option("--digits", f.digits, "scikit-learn's digits.csv (64 pixels 0..16 and the label per line)")
      ->excludes(mnist);
  app.add_option("--test-fraction", f.test_fraction, "the digits held out for the test (MNIST has its own)")
      ->check(in_range(0.05, 0.9));
  app.add_option("--min-accuracy", f.min_accuracy, "exit 1 when the test accuracy ends below A")
      ->check(in_range(0.0, 1.0));
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "back the run up into DIR every epoch (BackupAndRestore); a run started again resumes there");
  app.add_option("--save", f.save, "save the trained model into DIR (Model::save; nn::load_model reads it back)");
  app.add_option("--tensorboard-dir", f.tensorboard_dir, "write TensorBoard event files into DIR");
  app.add_flag("--quiet", f.quiet, "print the result line only");
  troupe::examples::add_monitor_options(app, f.monitor);
}

struct Images {
  Tensor x;  // [n, height, width, 1], float32 in [0, 1]
  Tensor y;  // [n], int64 0..9
};

// scikit-learn's digits.csv: per line 64 pixels (0..16, row-major 8x8) and the label.
Images read_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::invalid_argument("cannot read the digits at " + path +
                                " (tools/install-deps.sh fetches them there; or give --digits FILE or --mnist DIR)");
  }
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<double> values;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = line.find(',', start);
      const std::string field = line.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::optional<double> v = base::parse_double(field);
      if (!v) {
        throw std::invalid_argument(path + " line " + std::to_string(number) + ": \"" + field + "\" is not a number");
      }
      values.push_back(*v);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (values.size() != 65) {
      throw std::invalid_argument(path + " line " + std::to_string(number) + ": " + std::to_string(values.size()) +
                                  " values (expected 65: 64 pixels and the label)");
    }
    for (int p = 0; p < 64; ++p) {
      if (!(values[p] >= 0 && values[p] <= 16)) {
        throw std::invalid_argument(path + " line " + std::to_string(number) + ": pixel " + std::to_string(p) +
                                    " is " + std::to_string(values[p]) + " (expected 0..16)");
      }
      pixels.push_back(static_cast<float>(values[p] / 16.0));
    }
    const double label = values[64];
    if (label != std::floor(label) || label < 0 || label > 9) {
      throw std::invalid_argument(path + " line " + std::to_string(number) + ": label " + std::to_string(label) +
                                  " (expected a digit 0..9)");
    }
    labels.push_back(static_cast<std::int64_t>(label));
  }
  const auto n = static_cast<std::int64_t>(labels.size());
  if (n == 0) throw std::invalid_argument(path + ": no digits");
  return {Tensor::from_vector(pixels, {n, 8, 8, 1}), Tensor::from_vector(labels, {n})};
}

// One IDX pair of MNIST's: images [n, rows, cols] of bytes, labels [n] of digits.
Images read_mnist_pair(const std::filesystem::path& images_path, const std::filesystem::path& labels_path) {
  for (const auto& p : {images_path, labels_path}) {
    if (!std::filesystem::is_regular_file(p)) {
      throw std::invalid_argument("--mnist: " + p.string() +
                                  " is missing (expected train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                                  "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, unpacked)");
    }
  }
  Tensor images = data::read_idx(images_path.string(), DType::f32);
  Tensor labels = data::read_idx(labels_path.string(), DType::i64);
  if (images.rank() != 3 || images.shape()[0] == 0) {
    throw std::invalid_argument(images_path.string() + ": images of shape " + shape_to_string(images.shape()) +
                                " (expected [count, rows, columns] with at least one image)");
  }
  if (labels.rank() != 1 || labels.shape()[0] != images.shape()[0]) {
    throw std::invalid_argument(labels_path.string() + ": labels of shape " + shape_to_string(labels.shape()) + " for " +
                                std::to_string(images.shape()[0]) + " images in " + images_path.string() +
                                " (expected one label per image)");
  }
  const auto y = labels.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] < 0 || y[i] > 9) {
      throw std::invalid_argument(labels_path.string() + ": label " + std::to_string(i) + " is " +
                                  std::to_string(y[i]) + " (expected a digit 0..9)");
    }
  }
  const Shape s = images.shape();
  return {(images / 255.0f).reshape({s[0], s[1], s[2], 1}), labels};
}

// Rows `order[a..b)` of `all`.
Images rows(const Images& all, const std::vector<std::int64_t>& order, std::size_t a, std::size_t b) {
  const Shape s = all.x.shape();
  const std::int64_t size = s[1] * s[2] * s[3];
  const auto x = all.x.to_vector<float>();
  const auto y = all.y.to_vector<std::int64_t>();
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  for (std::size_t i = a; i < b; ++i) {
    const std::int64_t r = order[i];
    xs.insert(xs.end(), x.begin() + r * size, x.begin() + (r + 1) * size);
    ys.push_back(y[static_cast<std::size_t>(r)]);
  }
  const auto n = static_cast<std::int64_t>(b - a);
  return {Tensor::from_vector(xs, {n, s[1], s[2], s[3]}), Tensor::from_vector(ys, {n})};
}

// (train, test): MNIST's own pair, or the digits shuffled by the seed with the last fraction held out.
std::pair<Images, Images> load(const Flags& f, std::string& description) {
  if (!f.mnist.empty()) {
    const std::filesystem::path dir(f.mnist);
    description = "MNIST at " + f.mnist;
    return {read_mnist_pair(dir / "train-images-idx3-ubyte", dir / "train-labels-idx1-ubyte"),
            read_mnist_pair(dir / "t10k-images-idx3-ubyte", dir / "t10k-labels-idx1-ubyte")};
  }
  const Images all = read_digits(f.digits);
  description = "scikit-learn's digits at " + f.digits;
  const auto n = static_cast<std::size_t>(all.y.shape()[0]);
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 random(f.seed);
  // Fisher-Yates by hand: std::shuffle's order is the library's choice, this one is the same everywhere.
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[random() % i]);
  const auto test = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(n) * f.test_fraction));
  if (test >= n) throw std::invalid_argument("--test-fraction leaves no training examples");
  return {rows(all, order, 0, n - test), rows(all, order, n - test, n)};
}

std::vector<std::string> replica_devices(const Flags& f) {
  if (!f.devices.empty()) return f.devices;
  const int gpus = f.replicas_given ? 0 : Runtime::gpu_count();
  std::vector<std::string> out;
  for (int i = 0; i < (gpus > 0 ? gpus : f.replicas); ++i) out.push_back((gpus > 0 ? "GPU:" : "CPU:") + std::to_string(i));
  return out;
}

int run(const Flags& f) {
  std::string description;
  const auto [train, test] = load(f, description);
  const Shape image = train.x.shape();
  const std::int64_t n = image[0];
  if (f.batch > n) {
    throw std::invalid_argument("--batch " + std::to_string(f.batch) + " is larger than the " + std::to_string(n) +
                                " training examples");
  }
  const std::int64_t steps_per_epoch = n / f.batch;

  Runtime rt;
  std::unique_ptr<Strategy> owned;
  if (f.multi_worker) {
    owned = std::make_unique<MultiWorkerMirroredStrategy>(rt);
  } else {
    owned = std::make_unique<MirroredStrategy>(rt, replica_devices(f));
  }
  Strategy& strategy = *owned;
  const int workers = strategy.num_replicas_in_sync() / strategy.num_local_replicas();
  auto scope = strategy.scope();

  // Same-padded convolutions keep the size; each valid 2x2 pooling halves it (rounding down).
  const int height = static_cast<int>(image[1]) / 4, width = static_cast<int>(image[2]) / 4;
  if (height < 1 || width < 1) {
    throw std::invalid_argument(description + ": images of " + std::to_string(image[1]) + "x" +
                                std::to_string(image[2]) + " pixels (expected at least 4x4)");
  }
  nn::Sequential layers;
  layers.add(nn::Conv2D(16, 3, 1, nn::Padding::same, nn::Activation::relu, f.seed));
  layers.add(nn::MaxPooling2D(2));
  layers.add(nn::Conv2D(32, 3, 1, nn::Padding::same, nn::Activation::relu, f.seed + 1));
  layers.add(nn::MaxPooling2D(2));
  layers.add(nn::Flatten());
  if (f.dropout > 0) layers.add(nn::Dropout(f.dropout, f.seed + 2));
  layers.add(nn::Dense(height * width * 32, 10, nn::Activation::none, f.seed + 3));
  nn::Model model(std::move(layers));
  model.build({-1, image[1], image[2], 1});
  model.compile(std::make_shared<nn::Adam>(f.learning_rate), nn::Loss::sparse_categorical_crossentropy(),
                {"accuracy"});
  const bool chief = strategy.cluster_resolver() == nullptr || strategy.cluster_resolver()->task_id() == 0;
  const bool talk = !f.quiet && chief;
  if (talk) {
    std::cout << "data: " << description << ": " << n << " training and " << test.y.shape()[0] << " test images of "
              << image[1] << "x" << image[2] << "\n";
    std::cout << workers << (workers == 1 ? " worker, " : " workers, ") << strategy.num_replicas_in_sync()
              << " replicas, global batch " << f.batch << ", " << steps_per_epoch << " steps per epoch\n";
    model.summary();
  }

  // An endless stream of global batches, a new order every pass (from the seed): a resumed run
  // skips the steps done and continues with the same batches.
  const data::Dataset batches =
      data::Dataset::from_tensor_slices({train.x, train.y}).shuffle(n, f.seed).repeat().batch(f.batch, true);
  nn::FitOptions options;
  options.verbose = talk ? 1 : 0;
  std::unique_ptr<nn::BackupAndRestore> backup;
  if (!f.checkpoint_dir.empty()) {
    backup = std::make_unique<nn::BackupAndRestore>(f.checkpoint_dir);
    options.backup_and_restore = backup.get();
  }
  options.callbacks.push_back(std::make_shared<nn::StopOnSignal>());
  options.callbacks.push_back(std::make_shared<nn::TerminateOnNaN>());
  if (!f.tensorboard_dir.empty()) options.callbacks.push_back(std::make_shared<nn::TensorBoard>(f.tensorboard_dir, 1));
  auto saver = std::make_shared<nn::LambdaCallback>();
  saver->checkpoint = [&](std::int64_t, nn::Logs&) {
    if (backup) backup->save_now();
  };
  options.callbacks.push_back(saver);
  std::unique_ptr<Monitor> monitor;
  if (f.monitor.enabled()) {
    MonitorOptions monitor_options = f.monitor.options(f.batch);
    monitor_options.checkpoints = backup != nullptr;
    monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), monitor_options);
    options.callbacks.push_back(monitor->callback());
  }
  const nn::History history = model.fit(batches, f.epochs, steps_per_epoch, options);
  if (!history.stop_reason.empty()) {
    std::cerr << "digits_cnn: " << history.stop_reason << " after step " << history.stopped_at_step << "\n";
    return 1;
  }

  const nn::EvaluateResult result =
      model.evaluate(data::Dataset::from_tensor_slices({test.x, test.y}).batch(512));
  // predict's outputs for the whole test set (every worker gets them all): their accuracy, which
  // must be evaluate's, and a digest of their bytes, which is every worker's.
  const Tensor logits = model.predict(test.x);
  const auto scores = logits.to_vector<float>();
  const auto truth = test.y.to_vector<std::int64_t>();
  std::int64_t hits = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    const auto row = scores.begin() + static_cast<std::ptrdiff_t>(i * 10);
    hits += std::max_element(row, row + 10) - row == truth[i];
  }
  std::uint64_t digest = 14695981039346656037ull;  // FNV-1a
  const auto* bytes = static_cast<const unsigned char*>(logits.raw_data());
  for (std::size_t i = 0; i < logits.nbytes(); ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
  if (!f.save.empty()) {
    model.save(f.save);
    if (talk) std::cout << "saved the model into " << f.save << "\n";
  }
  std::vector<double> rates = history.samples_per_second;
  std::sort(rates.begin(), rates.end());
  const double median = rates.empty() ? 0.0 : rates[rates.size() / 2];
  if (talk) {
    std::cout << std::fixed << std::setprecision(2) << "test accuracy " << 100 * result.accuracy << "% ("
              << result.samples << " images), loss " << std::setprecision(4) << result.loss << "\n";
  }
  std::cout << std::fixed << "result: workers=" << workers << " replicas=" << strategy.num_replicas_in_sync()
            << " batch=" << f.batch << " epochs=" << f.epochs << " samples_per_s=" << std::setprecision(0) << median
            << std::setprecision(4) << " test_accuracy=" << result.accuracy << " test_loss=" << result.loss
            << " test_samples=" << result.samples
            << " predict_accuracy=" << static_cast<double>(hits) / static_cast<double>(truth.size())
            << " predictions_digest=" << std::hex << digest << std::dec << "\n";
  if (result.accuracy < f.min_accuracy) {
    std::cerr << "digits_cnn: test accuracy " << result.accuracy << " is below --min-accuracy " << f.min_accuracy << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"A CNN on real handwritten digits (scikit-learn's 8x8 digits, or MNIST), trained with "
               "MirroredStrategy or MultiWorkerMirroredStrategy.",
               "digits_cnn"};
  add_options(app, flags);
  return troupe::examples::run_main(app, argc, argv, [&] {
    flags.replicas_given = app.count("--replicas") > 0;
    return run(flags);
  });
}
