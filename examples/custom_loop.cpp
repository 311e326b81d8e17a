// The seed's custom training loop on troupe (tf.distribute.MultiWorkerMirroredStrategy's docs):
//
//   @tf.function
//   def train_step(iterator):
//     def step_fn(inputs):
//       features, labels = inputs
//       with tf.GradientTape() as tape:
//         logits = model(features, training=True)
//         loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits)
//       grads = tape.gradient(loss, model.trainable_variables)
//       optimizer.apply_gradients(zip(grads, model.trainable_variables))
//     strategy.run(step_fn, args=(next(iterator),))
//   for _ in range(NUM_STEP):
//     train_step(iterator)
//
// The same model and data as quickstart, with everything explicit: the replica function records
// its forward pass and loss on a GradientTape, takes the gradients from it, all-reduces them with
// MEAN, applies them without further aggregation, and the loss is reduced for printing.
//
// Usage: custom_loop [--replicas N] [--steps S] [--seed K]   (custom_loop --help)

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
  int replicas = 4;
  long long num_steps = 100;
  std::uint64_t seed = 1;
  bool quiet = false;
  CLI::App app{"The seed's custom training loop: run, all_reduce(MEAN) of the gradients, apply.", "custom_loop"};
  troupe::examples::show_defaults(app);
  app.add_option("--replicas", replicas, "CPU replicas")->check(in_range(1, 1024));
  app.add_option("--steps", num_steps, "training steps")->check(in_range(1LL, 1000000000LL));
  app.add_option("--seed", seed, "random seed");
  app.add_flag("--quiet", quiet, "print the result line only");
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime rt;
    MirroredStrategy strategy(rt, cpus(replicas));
    auto scope = strategy.scope();
    nn::Sequential model({nn::Dense(5, 2, nn::Activation::none, seed)});
    nn::SGD optimizer(0.1f);

    std::mt19937_64 engine(seed);
    std::vector<float> x(10);
    for (float& v : x) v = static_cast<float>(engine() >> 40) * 0x1.0p-24f;
    std::vector<std::int64_t> y{static_cast<std::int64_t>(engine() & 1), static_cast<std::int64_t>(engine() & 1)};
    const Tensor features_all = Tensor::from_vector(x, {2, 5});
    const Tensor labels_all = Tensor::from_vector(y, {2, 1});
    const std::int64_t global_batch = strategy.num_replicas_in_sync();
    auto dist_dataset = strategy.distribute_datasets_from_function([&](const InputContext& ctx) {
      return data::Dataset::from_tensor_slices({features_all, labels_all})
          .repeat()
          .batch(ctx.get_per_replica_batch_size(global_batch), true);
    });
    DistributedIterator iterator = dist_dataset.make_iterator();

    auto train_step = [&](DistributedIterator& it) {
      auto step_fn = [&](const data::Element& inputs) {
        const Tensor& features = inputs[0];
        const Tensor& labels = inputs[1];
        GradientTape tape;
        const Tensor logits = model.forward(features);
        const Tensor loss = nn::compute_average_loss(nn::sparse_softmax_cross_entropy_per_example(logits, labels),
                                                     labels.shape()[0]);  // the mean over this replica's batch
        std::vector<Tensor> grads = tape.gradient(loss, model.trainable_variables());
        grads = get_replica_context()->all_reduce(ReduceOp::mean, grads);  // one packed collective
        optimizer.apply_gradients(nn::zip(grads, model.trainable_variables()), std::nullopt);
        return loss;
      };
      PerReplica<Tensor> per_replica_loss = strategy.run(step_fn, it.get_next());
      return strategy.reduce(ReduceOp::mean, per_replica_loss, std::nullopt).item<float>();
    };

    float first = 0, last = 0;
    for (long long step = 1; step <= num_steps; ++step) {
      const float loss = train_step(iterator);
      if (step == 1) first = loss;
      last = loss;
      if (!quiet && (step == 1 || step % 10 == 0 || step == num_steps)) std::cout << "step " << step << ": loss " << loss << "\n";
    }

    // Every replica applied the same update to its own component: they are bit-identical.
    bool identical = true;
    for (const Variable& v : model.trainable_variables()) {
      const std::vector<Tensor> parts = strategy.experimental_local_results(v);
      for (const Tensor& p : parts) identical = identical && p.equals(parts[0]);
    }
    std::cout << "loss " << first << " -> " << last << "; the " << replicas << " replicas' weights are "
              << (identical ? "bit-identical" : "NOT identical") << "\n";
    return identical && last < first ? 0 : 1;
  });
}
