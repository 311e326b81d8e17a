// A character-level decoder-only transformer trained data-parallel with MirroredStrategy through
// Model::fit, printing text sampled from the model as it trains.
//
// The model: TokenAndPositionEmbedding, then --blocks pre-norm blocks (Residual of
// LayerNormalization and causal MultiHeadAttention; Residual of LayerNormalization, Dense, GELU,
// Dense), LayerNormalization and a Dense layer to the characters' logits. It learns to predict
// every next character of windows of --length characters of the text.
//
//   text_transformer                                    # GPL-3 text Debian ships, 2 CPU replicas
//   text_transformer --text book.txt --epochs 10 --replicas 4
//   text_transformer --tensorboard-dir logs              # scalars, and the samples in the Text tab
//   text_transformer --dashboard-port 8080              # the samples on the page; pause, resume,
//                                                       # learning rate and temperature from it
//
// The last line is for scripts: result: replicas=... steps=... loss=... unigram=... samples_per_s=...
// The exit status is 1 when the final loss is not below the unigram model's (the characters'
// entropy), which the default run reaches; a run stopped from the dashboard exits 0.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
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
  std::string text = "/usr/share/common-licenses/GPL-3";
  int replicas = 2;
  int epochs = 3;
  std::int64_t steps_per_epoch = 100;
  std::int64_t batch = 32;
  int length = 64;
  int dim = 64;
  int blocks = 2;
  int heads = 4;
  float learning_rate = 0.003f;
  std::int64_t sample_every = 100;
  int sample_length = 160;
  double temperature = 0.8;
  std::uint64_t seed = 1;
  std::string tensorboard_dir;
  troupe::examples::MonitorFlags monitor;
};

void add_options(CLI::App& app, Flags& f) {
  troupe::examples::show_defaults(app);
  app.add_option("--text", f.text, "the text file to learn (any bytes; each distinct byte is a character)");
  app.add_option("--replicas", f.replicas, "CPU replicas")->check(in_range(1, 64));
  app.add_option("--epochs", f.epochs, "epochs")->check(in_range(1, 1000000));
  app.add_option("--steps-per-epoch", f.steps_per_epoch, "steps per epoch")->check(in_range<std::int64_t>(1, 1000000000));
  app.add_option("--batch", f.batch, "global batch: windows per step over all replicas")
      ->check(in_range<std::int64_t>(1, 1 << 20));
  app.add_option("--length", f.length, "characters per window (the model's context)")->check(in_range(2, 4096));
  app.add_option("--dim", f.dim, "the model's width")->check(in_range(4, 4096));
  app.add_option("--blocks", f.blocks, "transformer blocks")->check(in_range(1, 64));
  app.add_option("--heads", f.heads, "attention heads (--dim must be a multiple)")->check(in_range(1, 64));
  app.add_option("--learning-rate", f.learning_rate, "Adam's learning rate")->check(positive());
  app.add_option("--sample-every", f.sample_every, "print sampled text every N steps (0: only at the end)")
      ->check(in_range<std::int64_t>(0, 1000000000));
  app.add_option("--sample-length", f.sample_length, "characters per sample")->check(in_range(1, 100000));
  app.add_option("--temperature", f.temperature, "sampling temperature")->check(positive());
  app.add_option("--seed", f.seed, "seed of the weights, the shuffle and the sampling");
  app.add_option("--tensorboard-dir", f.tensorboard_dir,
                 "write TensorBoard event files into DIR: the scalars of every step, and the samples as text");
  troupe::examples::add_monitor_options(app, f.monitor);
}

// The characters of a text as ids 0..n-1 in byte order.
struct Vocabulary {
  std::vector<unsigned char> chars;
  std::vector<int> id_of = std::vector<int>(256, -1);
  explicit Vocabulary(const std::string& text) {
    for (unsigned char c : text) id_of[c] = 0;
    for (int c = 0; c < 256; ++c) {
      if (id_of[static_cast<std::size_t>(c)] == 0) {
        id_of[static_cast<std::size_t>(c)] = static_cast<int>(chars.size());
        chars.push_back(static_cast<unsigned char>(c));
      }
    }
  }
  int size() const { return static_cast<int>(chars.size()); }
};

// The unigram model's loss: the entropy of the characters' frequencies, in nats.
double unigram_entropy(const std::string& text) {
  std::vector<double> count(256, 0.0);
  for (unsigned char c : text) count[c] += 1;
  double h = 0;
  for (double n : count) {
    if (n > 0) h -= n / static_cast<double>(text.size()) * std::log(n / static_cast<double>(text.size()));
  }
  return h;
}

// Text sampled from the model, one character at a time, from the prompt's last `length` characters.
class Sampler {
 public:
  Sampler(const nn::Sequential& layers, const Vocabulary& vocabulary, int length, std::uint64_t seed)
      : layers_(layers), vocabulary_(vocabulary), length_(length), engine_(seed) {}

  std::string sample(const std::string& prompt, int count, double temperature) {
    std::vector<std::int32_t> window;
    for (unsigned char c : prompt) window.push_back(vocabulary_.id_of[c]);
    std::string out;
    for (int i = 0; i < count; ++i) {
      if (static_cast<int>(window.size()) > length_) window.erase(window.begin(), window.end() - length_);
      const std::int64_t n = static_cast<std::int64_t>(window.size());
      const Tensor logits = layers_.forward(Tensor::from_vector(window, {1, n}));
      const std::vector<float> all = logits.to_vector<float>();
      const int v = vocabulary_.size();
      std::vector<double> p(static_cast<std::size_t>(v));
      double max = -INFINITY;
      for (int k = 0; k < v; ++k) max = std::max(max, static_cast<double>(all[static_cast<std::size_t>((n - 1) * v + k)]));
      for (int k = 0; k < v; ++k) {
        p[static_cast<std::size_t>(k)] =
            std::exp((static_cast<double>(all[static_cast<std::size_t>((n - 1) * v + k)]) - max) / temperature);
      }
      std::discrete_distribution<int> pick(p.begin(), p.end());
      const int next = pick(engine_);
      window.push_back(next);
      out.push_back(static_cast<char>(vocabulary_.chars[static_cast<std::size_t>(next)]));
    }
    return out;
  }

 private:
  const nn::Sequential& layers_;
  const Vocabulary& vocabulary_;
  int length_;
  std::mt19937_64 engine_;
};

// The sampling temperature: the dashboard's "temperature" control when there is a dashboard.
double temperature(const Monitor* monitor, const Flags& f) {
  return monitor != nullptr ? monitor->control("temperature") : f.temperature;
}

// Prints a sample every `every` steps, shows it on the dashboard (its "sample" text) and writes it
// to TensorBoard's Text tab.
class SampleText : public nn::Callback {
 public:
  SampleText(Sampler& sampler, std::string prompt, const Flags& f, Monitor* monitor, nn::TensorBoard* tensorboard)
      : sampler_(sampler), prompt_(std::move(prompt)), f_(f), monitor_(monitor), tensorboard_(tensorboard) {}
  void on_train_batch_end(std::int64_t, nn::Logs&) override {
    const std::int64_t step = model().control().step();
    if (f_.sample_every > 0 && step % f_.sample_every == 0) {
      const double t = temperature(monitor_, f_);
      const std::string text = sampler_.sample(prompt_, f_.sample_length, t);
      std::cout << "--- sampled at step " << step << " (temperature " << t << "):\n" << text << "\n---" << std::endl;
      if (monitor_ != nullptr) {
        std::ostringstream shown;
        shown << "temperature " << t << ":\n" << prompt_ << text;
        monitor_->publish_text("sample", step, shown.str());
      }
      if (tensorboard_ != nullptr) {
        // TensorBoard renders text as Markdown: indented four spaces, the sample is shown as it is.
        std::ostringstream block;
        block << "temperature " << t << ":\n\n    ";
        for (char c : prompt_ + text) block << (c == '\n' ? std::string("\n    ") : std::string(1, c));
        tensorboard_->add_text("sample", step, block.str());
      }
    }
  }

 private:
  Sampler& sampler_;
  std::string prompt_;
  const Flags& f_;
  Monitor* monitor_;
  nn::TensorBoard* tensorboard_;
};

int run(const Flags& f) {
  std::ifstream in(f.text, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read --text " + f.text);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(text.size()) < f.length + 2) {
    throw std::runtime_error("--text " + f.text + " has " + std::to_string(text.size()) +
                             " bytes (expected more than --length + 1 = " + std::to_string(f.length + 1) + ")");
  }
  if (f.dim % f.heads != 0) {
    throw std::runtime_error("--dim " + std::to_string(f.dim) + " is not a multiple of --heads " + std::to_string(f.heads));
  }
  const Vocabulary vocabulary(text);
  const int v = vocabulary.size();
  // Windows starting every length / 2 characters, each with the characters that follow.
  const std::int64_t stride = std::max(1, f.length / 2);
  std::vector<std::int32_t> xs, ys;
  for (std::int64_t start = 0; start + f.length + 1 <= static_cast<std::int64_t>(text.size()); start += stride) {
    for (std::int64_t t = 0; t < f.length; ++t) {
      xs.push_back(vocabulary.id_of[static_cast<unsigned char>(text[static_cast<std::size_t>(start + t)])]);
      ys.push_back(vocabulary.id_of[static_cast<unsigned char>(text[static_cast<std::size_t>(start + t + 1)])]);
    }
  }
  const std::int64_t windows = static_cast<std::int64_t>(xs.size()) / f.length;
  const Tensor x = Tensor::from_vector(xs, {windows, f.length});
  const Tensor y = Tensor::from_vector(ys, {windows, f.length});
  const double unigram = unigram_entropy(text);
  std::cout << f.text << ": " << text.size() << " characters, " << v << " distinct, " << windows << " windows of "
            << f.length << "; unigram entropy " << std::setprecision(4) << unigram << " nats\n";

  Runtime rt;
  std::vector<std::string> devices;
  for (int r = 0; r < f.replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
  MirroredStrategy strategy(rt, devices);
  auto scope = strategy.scope();
  nn::Sequential layers;
  std::uint64_t seed = f.seed * 1000;
  layers.add(nn::TokenAndPositionEmbedding(v, f.length, f.dim, seed++));
  for (int b = 0; b < f.blocks; ++b) {
    layers.add(nn::Residual({nn::LayerNormalization(), nn::MultiHeadAttention(f.heads, f.dim / f.heads, true, seed)},
                            "attention_" + std::to_string(b)));
    seed += 4;
    layers.add(nn::Residual({nn::LayerNormalization(), nn::Dense(f.dim, 4 * f.dim, nn::Activation::none, seed),
                             nn::ActivationLayer("gelu"), nn::Dense(4 * f.dim, f.dim, nn::Activation::none, seed + 1)},
                            "feed_forward_" + std::to_string(b)));
    seed += 2;
  }
  layers.add(nn::LayerNormalization());
  layers.add(nn::Dense(f.dim, v, nn::Activation::none, seed));
  layers.build({-1, f.length});
  nn::Model model(layers);
  model.compile(std::make_shared<nn::Adam>(f.learning_rate), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  model.summary();

  Sampler sampler(layers, vocabulary, f.length, f.seed);
  const std::string prompt = text.substr(0, static_cast<std::size_t>(f.length / 2));
  nn::FitOptions options;
  options.verbose = 2;
  std::unique_ptr<Monitor> monitor;
  if (f.monitor.enabled()) {
    monitor = std::make_unique<Monitor>(strategy, model.optimizer().get(), f.monitor.options(f.batch));
    MonitorControl t;
    t.name = "temperature";
    t.value = f.temperature;
    t.min = std::min(0.01, f.temperature);
    t.max = std::max(100.0, f.temperature);
    t.help = "the sampling temperature: lower picks likelier characters";
    monitor->add_control(t);
  }
  // Sampled before the monitor's callback, so that a temperature set at step N's boundary is
  // used from step N + 1 on, as the monitor says.
  std::shared_ptr<nn::TensorBoard> tensorboard;
  if (!f.tensorboard_dir.empty()) {
    tensorboard = std::make_shared<nn::TensorBoard>(f.tensorboard_dir, 1);
    options.callbacks.push_back(tensorboard);
  }
  options.callbacks.push_back(std::make_shared<SampleText>(sampler, prompt, f, monitor.get(), tensorboard.get()));
  if (monitor) options.callbacks.push_back(monitor->callback());
  const auto batches =
      data::Dataset::from_tensor_slices({x, y}).shuffle(windows, f.seed).repeat().batch(f.batch, /*drop_remainder=*/true);
  const nn::History history = model.fit(batches, f.epochs, f.steps_per_epoch, options);
  const nn::EvaluateResult result = model.evaluate(x, y);
  const double t = temperature(monitor.get(), f);
  std::cout << "--- sampled at the end (temperature " << t << "):\n" << sampler.sample(prompt, f.sample_length, t)
            << "\n---\n";
  double seconds = 0;
  for (double s : history.seconds) seconds += s;
  std::cout << std::setprecision(4) << "result: replicas=" << strategy.num_replicas_in_sync() << " steps=" << history.steps
            << " loss=" << result.loss << " accuracy=" << result.accuracy << " unigram=" << unigram
            << " samples_per_s=" << std::setprecision(0) << std::fixed
            << (seconds > 0 ? static_cast<double>(history.samples) / seconds : 0.0) << "\n";
  if (monitor && monitor->stopped()) {
    std::cout << "stopped from the dashboard after step " << history.stopped_at_step
              << ": the loss is not held to the unigram model's\n";
    return 0;
  }
  if (!(result.loss < unigram)) {
    std::cerr << "text_transformer: the loss " << result.loss << " is not below the unigram model's " << unigram << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"A character-level transformer on a text file, trained with MirroredStrategy.", "text_transformer"};
  add_options(app, flags);
  return troupe::examples::run_main(app, argc, argv, [&] { return run(flags); });
}
