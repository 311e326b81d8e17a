#include <doctest/doctest.h>

#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;

// docs/training.md holds out part of one make_blobs draw as validation data. This is why: a
// held-out slice of one draw scores as the training set does, while a draw with another seed has
// other cluster centres, so a model trained on the first is near chance on it.
TEST_CASE("make_blobs: a held-out slice of one draw scores like training, another seed's draw is another problem") {
  Runtime rt;
  MirroredStrategy strategy(rt, {"CPU:0", "CPU:1"});
  auto scope = strategy.scope();
  nn::BlobOptions blobs;
  blobs.samples = 4096;
  blobs.features = 8;
  blobs.classes = 3;
  const nn::ClassificationData set = nn::make_blobs(blobs);
  const data::Dataset examples = data::Dataset::from_tensor_slices({set.features, set.labels});
  const data::Dataset validation = examples.take(1024);
  const data::Dataset train = examples.skip(1024);

  nn::Model model(nn::Sequential({nn::Dense(8, 32, nn::Activation::relu, 1), nn::Dense(32, 3, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  nn::FitOptions options;
  options.verbose = 0;
  model.fit(train.shuffle(4096, 1).batch(64), 5, -1, options);

  const double trained = model.evaluate(train.batch(256)).accuracy;
  const double held_out = model.evaluate(validation.batch(256)).accuracy;
  blobs.seed = 2;
  const nn::ClassificationData other = nn::make_blobs(blobs);
  const double other_seed = model.evaluate(other.features, other.labels).accuracy;
  CAPTURE(trained);
  CAPTURE(held_out);
  CAPTURE(other_seed);
  CHECK(trained > 0.7);  // the clusters overlap: no model separates them fully
  CHECK(std::abs(held_out - trained) < 0.07);
  CHECK(other_seed < held_out - 0.25);  // near chance (1/3): other centres
  CHECK(other_seed < 0.45);
}

}  // namespace TROUPE_TEST_FILE
