// Matrix products of GPU tensors (cuBLASLt) against the CPU's: within float32 rounding with
// TensorFloat-32 off, within TF32's rounding with it on, the same bits on every call, and Dense's
// fused bias and ReLU. Part of troupe_gpu_strategy_tests (its main skips with 77 without a GPU).

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

using namespace troupe;

namespace {

const Device gpu0 = Device(Device::Type::gpu, 0);

template <class T>
Tensor uniform(Shape shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<T> v(static_cast<std::size_t>(shape_num_elements(shape)));
  for (auto& x : v) x = static_cast<T>(d(rng));
  return Tensor::from_vector(v, shape);
}

// Restores the TF32 setting a test changed.
struct tf32_setting {
  bool before = config::tensor_float_32_execution_enabled();
  explicit tf32_setting(bool enabled) { config::enable_tensor_float_32_execution(enabled); }
  ~tf32_setting() { config::enable_tensor_float_32_execution(before); }
};

// |gpu - cpu| <= relative * sum_p |op(a)[i,p] op(b)[p,j]| for every element (plus a tiny absolute
// slack for sums that cancel to zero): the bound of a sum of k products in any order.
template <class T>
void expect_close(const Tensor& gpu, const Tensor& cpu, const Tensor& a, const Tensor& b, bool ta, bool tb,
                  double relative, const std::string& what) {
  REQUIRE(gpu.shape() == cpu.shape());
  const std::int64_t m = cpu.shape()[0], n = cpu.shape()[1];
  const std::int64_t k = ta ? a.shape()[0] : a.shape()[1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  int bad = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double magnitude = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = static_cast<double>(pa[ta ? p * m + i : i * k + p]);
        const double y = static_cast<double>(pb[tb ? j * k + p : p * n + j]);
        magnitude += std::fabs(x * y);
      }
      const double g = static_cast<double>(gpu.data<T>()[i * n + j]);
      const double c = static_cast<double>(cpu.data<T>()[i * n + j]);
      if (!(std::fabs(g - c) <= relative * magnitude + 1e-30)) {
        if (++bad <= 3) {
          FAIL_CHECK(what << ": c[" << i << ", " << j << "] is " << g << " on the GPU, " << c << " on the CPU (bound "
                          << relative * magnitude << ")");
        }
      }
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " elements beyond the bound");
}

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<std::size_t>(x.num_elements()) * dtype_size(x.dtype())) ==
             0;
}

struct product_shape {
  std::int64_t m, n, k;
};
const product_shape shapes[] = {{1, 1, 1},    {3, 5, 7},       {64, 33, 17}, {17, 64, 33}, {70, 40, 100},
                                {8, 8, 1000}, {256, 10, 784},  {2, 3, 0},    {0, 3, 4},    {5, 0, 2},
                                {512, 512, 512}};

template <class T>
void check_products(double relative, const char* mode) {
  std::uint32_t seed = 1;
  for (const product_shape& sh : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = uniform<T>(ta ? Shape{sh.k, sh.m} : Shape{sh.m, sh.k}, seed++);
        const Tensor b = uniform<T>(tb ? Shape{sh.n, sh.k} : Shape{sh.k, sh.n}, seed++);
        const std::string what = std::string(mode) + " " + std::string(dtype_name(dtype_v<T>)) + " m=" +
                                 std::to_string(sh.m) + " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                                 (ta ? " a^T" : "") + (tb ? " b^T" : "");
        const Tensor ga = a.to(gpu0);
        const Tensor gb = b.to(gpu0);
        const Tensor on_gpu = nn::matmul(ga, gb, ta, tb);
        CHECK_MESSAGE(on_gpu.device() == gpu0, what);
        const Tensor got = on_gpu.to(Device());
        expect_close<T>(got, nn::matmul(a, b, ta, tb), a, b, ta, tb, relative, what);
        // The same product again: the same algorithm, the same bits.
        CHECK_MESSAGE(same_bits(nn::matmul(ga, gb, ta, tb).to(Device()), got), what << ": a second call differs");
      }
    }
  }
}

}  // namespace

TEST_CASE("GPU matmul (cuBLASLt) with TF32 off: the CPU's products within float32 rounding, every transpose") {
  tf32_setting off(false);
  // k products added in some order: at most about k * eps of the magnitude apart, both sides.
  check_products<float>(2.0 * 1000 * 6e-8, "exact");
  check_products<double>(2.0 * 1000 * 1.2e-16, "exact");
}

TEST_CASE("GPU matmul with TF32 on (TensorFlow's default): within TensorFloat-32's rounding of the CPU's") {
  CHECK(config::tensor_float_32_execution_enabled());  // the default, as in TensorFlow
  tf32_setting on(true);
  // Inputs rounded to 10-bit mantissas (2^-11 each), accumulated in float32.
  check_products<float>(2.5e-3, "tf32");
  // float64 products never use TF32: exact as with it off.
  check_products<double>(2.0 * 1000 * 1.2e-16, "tf32");
}

TEST_CASE("GPU Dense forward: product, bias and ReLU in one launch give the CPU's values") {
  tf32_setting off(false);
  for (auto activation : {nn::Activation::none, nn::Activation::relu}) {
    for (const product_shape& sh : {product_shape{256, 256, 784}, product_shape{7, 10, 3}, product_shape{1, 1, 1},
                                    product_shape{4, 6, 0}}) {
      const Tensor x = uniform<float>({sh.m, sh.k}, 7);
      const Tensor kernel = uniform<float>({sh.k, sh.n}, 8);
      const Tensor bias = uniform<float>({sh.n}, 9);
      const Tensor cpu = nn::dense_forward(x, kernel, bias, activation);
      const Tensor gpu = nn::dense_forward(x.to(gpu0), kernel.to(gpu0), bias.to(gpu0), activation).to(Device());
      REQUIRE(gpu.shape() == cpu.shape());
      for (std::int64_t i = 0; i < cpu.num_elements(); ++i) {
        const double tolerance = 1e-5 * (1.0 + static_cast<double>(sh.k));
        REQUIRE_MESSAGE(std::fabs(gpu.data<float>()[i] - cpu.data<float>()[i]) <= tolerance,
                        activation_name(activation) << " [" << sh.m << ", " << sh.k << "] x [" << sh.k << ", " << sh.n
                                                    << "] element " << i);
        if (activation == nn::Activation::relu) REQUIRE(gpu.data<float>()[i] >= 0.0f);
      }
    }
  }
}

TEST_CASE("GPU products on replicas of one strategy give the same bits on every replica and every step") {
  const int n = Runtime::gpu_count();
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back("GPU:" + std::to_string(i));
  Runtime rt;
  distribute::MirroredStrategy s(rt, devices);
  const Tensor a = uniform<float>({333, 517}, 3);
  const Tensor b = uniform<float>({517, 129}, 4);
  Tensor first;
  for (int step = 0; step < 3; ++step) {
    auto out = s.run([&] {
      const Device& here = distribute::get_replica_context()->device();
      return nn::matmul(a.to(here), b.to(here));
    });
    for (const Tensor& t : s.experimental_local_results(out)) {
      CHECK(t.is_gpu());
      const Tensor host = t.to(Device());
      if (first.num_elements() == 0) first = host;
      CHECK(same_bits(host, first));
    }
  }
}

TEST_CASE("GPU losses run on the device: the CPU's loss and gradient, a bad label named as on the CPU") {
  for (const product_shape& sh : {product_shape{256, 10, 0}, product_shape{3, 1000, 0}, product_shape{1, 1, 0}}) {
    const Tensor logits = uniform<float>({sh.m, sh.n}, 11) * 8.0f;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(sh.m));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7) % sh.n);
    for (DType label_type : {DType::i64, DType::i32}) {
      const Tensor labels = Tensor::from_vector(ids, {sh.m}).cast(label_type);
      const nn::LossAndGradient cpu = nn::sparse_softmax_cross_entropy(logits, labels, 512);
      const nn::LossAndGradient gpu = nn::sparse_softmax_cross_entropy(logits.to(gpu0), labels.to(gpu0), 512);
      CHECK(gpu.loss.device() == gpu0);
      CHECK(gpu.gradient.device() == gpu0);
      CHECK(gpu.loss.to(Device()).item<float>() == doctest::Approx(cpu.loss.item<float>()).epsilon(1e-5));
      const Tensor g = gpu.gradient.to(Device());
      REQUIRE(g.shape() == cpu.gradient.shape());
      for (std::int64_t i = 0; i < g.num_elements(); ++i) {
        REQUIRE(std::fabs(g.data<float>()[i] - cpu.gradient.data<float>()[i]) <= 1e-7);
      }
      const Tensor per_example = nn::sparse_softmax_cross_entropy_per_example(logits.to(gpu0), labels.to(gpu0));
      const Tensor per_example_cpu = nn::sparse_softmax_cross_entropy_per_example(logits, labels);
      for (std::int64_t i = 0; i < sh.m; ++i) {
        CHECK(per_example.to(Device()).data<float>()[i] ==
              doctest::Approx(per_example_cpu.data<float>()[i]).epsilon(1e-5));
      }
    }
  }
  // The same message as the CPU's for a label out of range.
  std::vector<std::int64_t> bad = {0, 1, 7, 2};
  const Tensor logits = uniform<float>({4, 3}, 12);
  std::string on_gpu, on_cpu;
  try {
    nn::sparse_softmax_cross_entropy(logits.to(gpu0), Tensor::from_vector(bad, {4}).to(gpu0));
  } catch (const std::invalid_argument& e) {
    on_gpu = e.what();
  }
  try {
    nn::sparse_softmax_cross_entropy(logits, Tensor::from_vector(bad, {4}));
  } catch (const std::invalid_argument& e) {
    on_cpu = e.what();
  }
  CHECK(on_gpu == "sparse_softmax_cross_entropy: label 7 in row 2 is out of range for 3 classes (expected 0..2)");
  CHECK(on_gpu == on_cpu);
  // An empty batch: a loss of 0.
  const nn::LossAndGradient empty =
      nn::sparse_softmax_cross_entropy(Tensor::zeros({0, 3}, DType::f32, gpu0), Tensor::zeros({0}, DType::i64, gpu0), 8);
  CHECK(empty.loss.to(Device()).item<float>() == 0.0f);
  // Mean squared error.
  const Tensor p = uniform<double>({100, 3}, 13);
  const Tensor t = uniform<double>({100, 3}, 14);
  const nn::LossAndGradient cpu = nn::mean_squared_error(p, t, 200);
  const nn::LossAndGradient gpu = nn::mean_squared_error(p.to(gpu0), t.to(gpu0), 200);
  CHECK(gpu.loss.device() == gpu0);
  CHECK(gpu.loss.to(Device()).item<double>() == doctest::Approx(cpu.loss.item<double>()).epsilon(1e-12));
  const Tensor g = gpu.gradient.to(Device());
  for (std::int64_t i = 0; i < g.num_elements(); ++i) {
    REQUIRE(std::fabs(g.data<double>()[i] - cpu.gradient.data<double>()[i]) <= 1e-15);
  }
}

TEST_CASE("InputOptions::experimental_fetch_to_device: every batch once, in order, on the GPU or on the host") {
  const int n = Runtime::gpu_count();
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back("GPU:" + std::to_string(i));
  Runtime rt;
  distribute::MirroredStrategy s(rt, devices);
  const std::int64_t rows = 64 * n;
  for (bool fetch : {true, false}) {
    distribute::InputOptions options;
    options.experimental_fetch_to_device = fetch;
    auto dist = s.experimental_distribute_dataset(
        data::Dataset::from_tensor_slices({Tensor::range(rows, DType::i64)}).batch(8 * n), options);
    std::vector<std::int64_t> seen;
    for (const auto& element : dist) {
      for (const data::Element& part : s.experimental_local_results(element)) {
        REQUIRE(part.size() == 1);
        CHECK(part[0].is_gpu() == fetch);
        for (std::int64_t v : part[0].to(Device()).to_vector<std::int64_t>()) seen.push_back(v);
      }
    }
    REQUIRE(static_cast<std::int64_t>(seen.size()) == rows);
    for (std::int64_t i = 0; i < rows; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
  }
}

TEST_CASE("one launch updates every GPU variable (multi-tensor apply): the CPU's bits for 30 variables") {
  // 30 variables of many sizes: two groups of the kernel's 24, and an empty one.
  auto train = [](distribute::Strategy& s, int which) {
    auto scope = s.scope();
    std::vector<Variable> vars;
    std::vector<std::pair<std::string, Variable>> named;
    for (int i = 0; i < 30; ++i) {
      const std::int64_t size = i == 7 ? 0 : 1 + (i * 37) % 300;
      vars.emplace_back(uniform<float>({size}, 200 + static_cast<std::uint32_t>(i)), "v" + std::to_string(i));
      named.emplace_back("v" + std::to_string(i), vars.back());
    }
    std::shared_ptr<nn::Optimizer> opt;
    if (which == 0) opt = std::make_shared<nn::SGD>(0.1f);
    if (which == 1) opt = std::make_shared<nn::SGD>(0.05f, 0.9f, true);
    if (which == 2) opt = std::make_shared<nn::Adam>(0.01f);
    opt->build(named);
    for (int step = 0; step < 4; ++step) {
      s.run([&] {
        std::vector<nn::GradientAndVariable> gv;
        for (std::size_t i = 0; i < vars.size(); ++i) {
          gv.push_back({uniform<float>(vars[i].shape(), 500 + static_cast<std::uint32_t>(step * 100 + i)), vars[i]});
        }
        opt->apply_gradients(gv);
      });
    }
    std::vector<Tensor> out;
    for (const Variable& v : vars) out.push_back(s.experimental_local_results(v)[0].to(Device()));
    for (const auto& [name, slot] : opt->variables()) {
      if (name.find("iterations") == std::string::npos) out.push_back(s.experimental_local_results(slot)[0].to(Device()));
    }
    return out;
  };
  Runtime rt;
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    distribute::MirroredStrategy g(rt, {"GPU:0"});
    distribute::MirroredStrategy c(rt, {"CPU:0"});
    const std::vector<Tensor> on_gpu = train(g, which);
    const std::vector<Tensor> on_cpu = train(c, which);
    REQUIRE(on_gpu.size() == on_cpu.size());
    CHECK(on_gpu.size() == (which == 0 ? 30u : which == 1 ? 60u : 90u));
    for (std::size_t i = 0; i < on_gpu.size(); ++i) CHECK_MESSAGE(same_bits(on_gpu[i], on_cpu[i]), "tensor " << i);
  }
}
