// One worker of the SyncBatchNormalization test across processes (run by sync_bn_check.sh with
// TF_CONFIG set, TROUPE_DEVICES_PER_WORKER local replicas each). Every worker builds the same
// global batch; global replica g takes g + 2 of its rows (uneven shares, so that the counts
// matter). A SyncBatchNormalization in the strategy's scope must give, on every replica, the rows
// of BatchNormalization's output and input gradient on the whole global batch, gamma's and beta's
// gradients that sum over the replicas to the global batch's, and the global batch's moving
// statistics. A plain BatchNormalization must hold the mean of the replicas' own updates, the
// same bits on every worker (printed, compared by the script).
// Prints "OK <rank>" and exits 0 when every check holds; "FAIL ..." and exits 1 when one does not;
// "ERROR <message>" and exits 3 when the runtime throws.
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace troupe;
using namespace troupe::distribute;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::cout << "FAIL " << what << std::endl;
    ++failures;
  }
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const auto av = a.cast(DType::f64).to_vector<double>();
  const auto bv = b.cast(DType::f64).to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < av.size(); ++i) worst = std::max(worst, std::abs(av[i] - bv[i]));
  return worst;
}

// Deterministic values in about [-1, 1) plus `offset`, the same in every process.
Tensor values(Shape shape, std::uint64_t seed, double offset) {
  Tensor t = nn::glorot_uniform(shape_num_elements(shape), 1, seed, DType::f64);
  const double scale = std::sqrt((static_cast<double>(shape_num_elements(shape)) + 1.0) / 6.0);
  return (t * scale + offset).reshape(shape).cast(DType::f32);
}

// Writes a layer's variable (the accessors give const handles).
void set(Variable variable, const Tensor& value) { variable.assign(value); }

nn::CallContext training() {
  nn::CallContext ctx;
  ctx.training = true;
  return ctx;
}

std::string hex(const Tensor& t) {
  std::ostringstream out;
  for (float v : t.to_vector<float>()) out << std::hexfloat << v << " ";
  return out.str();
}

}  // namespace

int main() {
  try {
    Runtime rt;
    MultiWorkerMirroredStrategy s(rt);
    const int n = s.num_replicas_in_sync();
    const int rank = s.cluster_resolver()->task_id();
    std::cout << "replicas " << n << " workers " << n / s.num_local_replicas() << std::endl;
    // Global replica g holds rows [first(g), first(g) + g + 2).
    auto first = [](std::int64_t g) { return g * (g + 3) / 2; };
    const std::int64_t rows = first(n);
    const Shape shape{rows, 2, 3};
    const Tensor x = values(shape, 41, 0.4);
    const Tensor dy = values(shape, 42, 0.0);
    const Tensor gamma = Tensor::from_vector<float>({1.25f, -0.75f, 0.5f}, {3});
    const Tensor beta = Tensor::from_vector<float>({0.0f, 0.3f, -0.1f}, {3});

    // The reference: BatchNormalization on the whole global batch, outside the strategy.
    nn::BatchNormalization reference(0.9);
    reference.build({-1, 2, 3});
    set(reference.gamma(), gamma);
    set(reference.beta(), beta);
    const Tensor want_y = reference.forward(x, training());
    const nn::LayerGradients want = reference.backward(x, want_y, dy, training());

    std::optional<nn::SyncBatchNormalization> sync;
    std::optional<nn::BatchNormalization> local;
    {
      auto scope = s.scope();
      sync.emplace(0.9);
      sync->build({-1, 2, 3});
      set(sync->gamma(), gamma);
      set(sync->beta(), beta);
      local.emplace(0.9);
      local->build({-1, 2, 3});
    }
    auto results = s.run([&] {
      auto* ctx = get_replica_context();
      const std::int64_t g = ctx->replica_id_in_sync_group();
      const Tensor xr = x.slice(first(g), first(g) + g + 2);
      const Tensor dyr = dy.slice(first(g), first(g) + g + 2);
      const Tensor y = sync->forward(xr, training());
      const nn::LayerGradients d = sync->backward(xr, y, dyr, training());
      local->forward(xr, training());
      // The optimizer's all-reduce of gamma's and beta's gradients.
      const std::vector<Tensor> summed = ctx->all_reduce(ReduceOp::sum, d.variables);
      return std::vector<Tensor>{Tensor::scalar<std::int64_t>(g), y, d.input, summed[0], summed[1]};
    });
    for (const auto& r : results.values()) {
      const std::int64_t g = r[0].item<std::int64_t>();
      const std::string who = "replica " + std::to_string(g) + ": ";
      expect(max_abs_diff(r[1], want_y.slice(first(g), first(g) + g + 2)) < 1e-5, who + "output differs from BN on the global batch");
      expect(max_abs_diff(r[2], want.input.slice(first(g), first(g) + g + 2)) < 1e-5,
             who + "input gradient differs from BN on the global batch");
      expect(max_abs_diff(r[3], want.variables[0]) < 1e-4, who + "gamma's summed gradient differs");
      expect(max_abs_diff(r[4], want.variables[1]) < 1e-4, who + "beta's summed gradient differs");
    }
    for (const Variable* v : {&sync->moving_mean(), &sync->moving_variance()}) {
      for (const Tensor& c : v->components()) expect(c.equals(v->components().front()), "sync moving statistics differ between replicas");
    }
    expect(max_abs_diff(sync->moving_mean().value(), reference.moving_mean().value()) < 1e-6, "sync moving_mean");
    expect(max_abs_diff(sync->moving_variance().value(), reference.moving_variance().value()) < 1e-6,
           "sync moving_variance");
    // BatchNormalization: the mean over every replica of its own update.
    std::vector<double> mean(3, 0.0);
    for (std::int64_t g = 0; g < n; ++g) {
      const auto part = x.slice(first(g), first(g) + g + 2).to_vector<float>();
      const std::size_t count = part.size() / 3;
      for (std::size_t k = 0; k < 3; ++k) {
        double sum = 0;
        for (std::size_t i = 0; i < count; ++i) sum += part[i * 3 + k];
        mean[k] += 0.1 * sum / static_cast<double>(count) / n;
      }
    }
    const auto got = local->moving_mean().value().to_vector<float>();
    for (std::size_t k = 0; k < 3; ++k) {
      expect(std::abs(got[k] - mean[k]) < 1e-6, "local moving_mean[" + std::to_string(k) + "] is " +
                                                     std::to_string(got[k]) + ", expected " + std::to_string(mean[k]));
    }
    for (const Tensor& c : local->moving_mean().components()) {
      expect(c.equals(local->moving_mean().components().front()), "local moving statistics differ between replicas");
    }
    std::cout << "moving " << hex(local->moving_mean().value()) << hex(sync->moving_variance().value()) << std::endl;
    if (failures > 0) return 1;
    std::cout << "OK " << rank << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cout << "ERROR " << e.what() << std::endl;
    return 3;
  }
}
