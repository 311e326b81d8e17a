// The seed's Keras quickstart on troupe (tf.distribute.MultiWorkerMirroredStrategy's docs, run
// here with MirroredStrategy over CPU replicas):
//
//   with strategy.scope():
//     model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(5,))])
//     optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
//   def dataset_fn(ctx):
//     x = np.random.random((2, 5)).astype(np.float32)
//     y = np.random.randint(2, size=(2, 1))
//     dataset = tf.data.Dataset.from_tensor_slices((x, y))
//     return dataset.repeat().batch(1, drop_remainder=True)
//   dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
//   model.compile(); model.fit(dist_dataset)
//
// Usage: quickstart [--replicas N] [--epochs E] [--steps S] [--seed K]   (quickstart --help)
// Prints one line per epoch and exits 0 when the loss fell.

#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;

using namespace troupe;
using namespace troupe::distribute;

namespace {

std::vector<std::string> cpus(int n) {
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}

}  // namespace

int main(int argc, char** argv) {
  int replicas = 4, epochs = 5;
  long long steps = 20;
  std::uint64_t seed = 1;
  bool quiet = false;
  CLI::App app{"The seed's Keras quickstart: Dense(2), SGD(0.1), fit, over CPU replicas.", "quickstart"};
  troupe::examples::show_defaults(app);
  app.add_option("--replicas", replicas, "CPU replicas")->check(in_range(1, 1024));
  app.add_option("--epochs", epochs, "epochs")->check(in_range(1, 1000000));
  app.add_option("--steps", steps, "steps per epoch")->check(in_range(1LL, 1000000000LL));
  app.add_option("--seed", seed, "random seed");
  app.add_flag("--quiet", quiet, "print the result line only");
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime rt;
    MirroredStrategy strategy(rt, cpus(replicas));
    if (!quiet) std::cout << "MirroredStrategy over " << strategy.num_replicas_in_sync() << " CPU replicas\n";
    auto scope = strategy.scope();
    nn::Model model(nn::Sequential({nn::Dense(5, 2, nn::Activation::none, seed)}));
    model.compile(std::make_shared<nn::SGD>(0.1f), nn::Loss::sparse_categorical_crossentropy());

    // x = np.random.random((2, 5)); y = np.random.randint(2, size=(2, 1)), from a fixed seed.
    std::mt19937_64 engine(seed);
    std::vector<float> x(10);
    for (float& v : x) v = static_cast<float>(engine() >> 40) * 0x1.0p-24f;
    std::vector<std::int64_t> y{static_cast<std::int64_t>(engine() & 1), static_cast<std::int64_t>(engine() & 1)};
    const Tensor features = Tensor::from_vector(x, {2, 5});
    const Tensor labels = Tensor::from_vector(y, {2, 1});

    // batch(1) per replica: a global batch of one example per replica.
    const std::int64_t global_batch = strategy.num_replicas_in_sync();
    auto dist_dataset = strategy.distribute_datasets_from_function([&](const InputContext& ctx) {
      return data::Dataset::from_tensor_slices({features, labels})
          .repeat()
          .batch(ctx.get_per_replica_batch_size(global_batch), true);
    });
    nn::FitOptions options;
    options.verbose = quiet ? 0 : 1;
    const nn::History history = model.fit(dist_dataset, epochs, steps, options);

    const bool fell = history.loss.back() < history.loss.front();
    std::cout << "loss " << history.loss.front() << " -> " << history.loss.back() << (fell ? " (falls)" : " (did not fall)")
              << "\n";
    return fell ? 0 : 1;
  });
}
