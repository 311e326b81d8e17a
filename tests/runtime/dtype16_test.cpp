// float16 and bfloat16 tensors: names, casts (bit for bit), arithmetic, sums, checkpoints, tapes.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace {

std::vector<std::uint16_t> bits_of(const Tensor& t) {
  REQUIRE((t.dtype() == DType::f16 || t.dtype() == DType::bf16));
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.num_elements()));
  const Tensor host = t.to(Device());
  if (!out.empty()) std::memcpy(out.data(), host.raw_data(), host.nbytes());
  return out;
}

template <class T>
std::vector<std::uint16_t> cast_bits(const std::vector<T>& values, DType to) {
  return bits_of(Tensor::from_vector(values).cast(to));
}

float f32_of_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("float16 and bfloat16: TensorFlow's names, 2 bytes, and dtype_from_name") {
  CHECK(dtype_name(DType::f16) == "float16");
  CHECK(dtype_name(DType::bf16) == "bfloat16");
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_v<float16_t> == DType::f16);
  CHECK(dtype_v<bfloat16_t> == DType::bf16);
  CHECK(dtype_is_floating(DType::f16));
  CHECK(dtype_is_floating(DType::bf16));
  CHECK_FALSE(dtype_is_floating(DType::i32));
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16}) {
    CHECK(dtype_from_name(dtype_name(d)) == d);
  }
  const std::string m = message_of([] { dtype_from_name("half"); });
  CHECK(contains(m, "dtype_from_name: unknown dtype 'half'"));
  CHECK(contains(m, "\"float16\", \"bfloat16\""));
  const Tensor t = Tensor::zeros({3, 5}, DType::f16);
  CHECK(t.nbytes() == 30);
  CHECK(t.dtype() == DType::f16);
  CHECK(t.to_string() == "[[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]");
  CHECK(contains(message_of([&] { (void)t.to_vector<float>(); }), "to_vector: tensor has dtype float16, asked for float32"));
}

TEST_CASE("cast float32 to float16: nearest even, ties, denormals, overflow to inf, NaN and inf kept") {
  const std::vector<float> in = {
      1.0f, -2.0f, 0.0f, -0.0f, 65504.0f,                    // exact
      1.0f + 0x1p-11f,                                        // tie between 1 and 1+2^-10: even (1)
      1.0f + 3 * 0x1p-11f,                                    // tie between 1+2^-10 and 1+2^-9: even (1+2^-9)
      1.0f + 0x1p-11f + 0x1p-20f,                             // just above the tie: up
      65519.0f, 65520.0f, -1e10f, 1e30f,                      // below the overflow tie, at it, beyond
      0x1p-24f, 0x1p-25f, 3 * 0x1p-26f, 0x1p-14f, 0x1p-30f,   // smallest denormal, tie to 0, above it
      kInf, -kInf, kNaN, 0.1f};
  const std::vector<std::uint16_t> want = {0x3c00, 0xc000, 0x0000, 0x8000, 0x7bff, 0x3c00, 0x3c02, 0x3c01,
                                           0x7bff, 0x7c00, 0xfc00, 0x7c00, 0x0001, 0x0000, 0x0001, 0x0400,
                                           0x0000, 0x7c00, 0xfc00, 0x7e00, 0x2e66};
  CHECK(cast_bits(in, DType::f16) == want);
  // The public type rounds the same way.
  for (std::size_t i = 0; i < in.size(); ++i) CHECK(float16_t(in[i]).bits == want[i]);
}

TEST_CASE("cast float32 to bfloat16: nearest even, ties, overflow to inf, NaN and inf kept") {
  const std::vector<float> in = {1.0f,
                                 1.0f + 0x1p-8f,       // tie: even (1)
                                 1.0f + 3 * 0x1p-8f,   // tie: even (1+2^-6)
                                 1.0f + 0x1p-8f + 0x1p-20f,
                                 std::numeric_limits<float>::max(),  // rounds past the largest bfloat16
                                 -kInf, kNaN, 3.140625f, f32_of_bits(0x00010000u)};
  const std::vector<std::uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80, 0xff80, 0x7fc0, 0x4049, 0x0001};
  CHECK(cast_bits(in, DType::bf16) == want);
}

TEST_CASE("casts into 16 bits round once: float64 and int64 through float32 would round twice") {
  // 1 + 2^-11 + 2^-40 is above the float16 tie at 1 + 2^-11; as a float32 it is the tie itself.
  CHECK(cast_bits(std::vector<double>{1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-11, 65520.0, 1e300, -1e-300},
                  DType::f16) == std::vector<std::uint16_t>{0x3c01, 0x3c00, 0x7c00, 0x7c00, 0x8000});
  // 2^30 + 2^22 + 1 is above the bfloat16 tie between 2^30 and 2^30 + 2^23; as a float32 it is the tie.
  const std::int64_t above_tie = (std::int64_t{1} << 30) + (std::int64_t{1} << 22) + 1;
  CHECK(cast_bits(std::vector<std::int64_t>{above_tie, 257, 259, -(std::int64_t{1} << 62), std::numeric_limits<std::int64_t>::min()},
                  DType::bf16) == std::vector<std::uint16_t>{0x4e81, 0x4380, 0x4382, 0xde80, 0xdf00});
  CHECK(cast_bits(std::vector<std::int32_t>{2049, 2051, 65504, 65520, -70000}, DType::f16) ==
        std::vector<std::uint16_t>{0x6800, 0x6802, 0x7bff, 0x7c00, 0xfc00});
  CHECK(bfloat16_t(above_tie).bits == 0x4e81);
  CHECK(float16_t(1.0 + 0x1p-11 + 0x1p-40).bits == 0x3c01);
}

TEST_CASE("casts out of 16 bits are exact, and every float16 survives a round trip through float32") {
  std::vector<float16_t> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) all[b] = float16_t::from_bits(static_cast<std::uint16_t>(b));
  const Tensor h = Tensor::from_vector(all);
  const std::vector<float> wide = h.cast(DType::f32).to_vector<float>();
  const std::vector<double> wider = h.cast(DType::f64).to_vector<double>();
  const std::vector<std::uint16_t> back = bits_of(h.cast(DType::f32).cast(DType::f16));
  const std::vector<std::uint16_t> back64 = bits_of(h.cast(DType::f64).cast(DType::f16));
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bool is_nan = (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0;
    if (is_nan) {
      CHECK(std::isnan(wide[b]));
      // NaN stays NaN, quieted, sign kept.
      CHECK((back[b] & 0x7e00u) == 0x7e00u);
      CHECK((back[b] & 0x8000u) == (b & 0x8000u));
      continue;
    }
    if (back[b] != b || back64[b] != b || static_cast<double>(wide[b]) != wider[b]) {
      FAIL_CHECK("float16 bits " << b << " came back as " << back[b] << " / " << back64[b]);
    }
  }
  CHECK(bits_of(h.cast(DType::f16)) == bits_of(h));  // a cast to its own dtype copies the bits, NaN payloads too
  CHECK(wide[0x3c00] == 1.0f);
  CHECK(wide[0x7bff] == 65504.0f);
  CHECK(wide[0x0001] == 0x1p-24f);
  CHECK(wide[0x7c00] == kInf);
  CHECK(wide[0xfc00] == -kInf);
  // Into integers: truncated toward zero, as C++ and tf.cast do.
  CHECK(Tensor::from_vector<float>({2.5f, -2.5f, 65504.0f}).cast(DType::f16).cast(DType::i32).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{2, -2, 65504});
  CHECK(Tensor::from_vector<float>({-7.75f}).cast(DType::bf16).cast(DType::i64).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{-7});
  // Between the two 16-bit formats: one rounding.
  CHECK(cast_bits(std::vector<float>{1.0f + 0x1p-10f, 65504.0f}, DType::f16) == std::vector<std::uint16_t>{0x3c01, 0x7bff});
  CHECK(bits_of(Tensor::from_vector<float>({1.0f + 0x1p-10f, 65504.0f}).cast(DType::f16).cast(DType::bf16)) ==
        std::vector<std::uint16_t>{0x3f80, 0x4780});
  CHECK(static_cast<float>(bfloat16_t::from_bits(0x4049)) == 3.140625f);
  CHECK(static_cast<double>(float16_t(0.5f)) == 0.5);
}

TEST_CASE("16-bit tensors: arithmetic in float32 rounded once, fill, range, sums, printing and checkpoints") {
  const Tensor a = Tensor::from_vector<float>({1.0f, 2048.0f, 0.1f}).cast(DType::f16);
  const Tensor b = Tensor::from_vector<float>({0x1p-11f, 1.0f, 0.2f}).cast(DType::f16);
  const Tensor sum = a + b;
  CHECK(sum.dtype() == DType::f16);
  // 1 + 2^-11 ties to 1; 2048 + 1 ties to 2048 (float16's spacing there is 2).
  const std::vector<float> wide = (a.cast(DType::f32) + b.cast(DType::f32)).to_vector<float>();
  CHECK(bits_of(sum) == cast_bits(wide, DType::f16));
  CHECK(bits_of(sum)[0] == 0x3c00);
  CHECK(bits_of(sum)[1] == 0x6800);
  CHECK(bits_of(a * 2) == cast_bits(std::vector<float>{2.0f, 4096.0f, static_cast<float>(float16_t(0.1f)) * 2}, DType::f16));
  CHECK(bits_of(Tensor::full({2}, 0.1, DType::bf16)) == std::vector<std::uint16_t>{0x3dcd, 0x3dcd});
  CHECK(bits_of(Tensor::full({1}, 70000, DType::f16)) == std::vector<std::uint16_t>{0x7c00});
  CHECK(Tensor::range(4, DType::f16).cast(DType::f32).to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK(Tensor::from_vector<float>({0.5f, -1.25f}).cast(DType::bf16).to_string() == "[0.5, -1.25]");
  // reduce_sum of 16-bit values: summed in float32, rounded once (2048 + 1 + 1 = 2050, exact).
  const Tensor column = Tensor::from_vector<float>({2048.0f, 1.0f, 1.0f}, {3, 1}).cast(DType::f16);
  CHECK(reduce_sum(column, 0).cast(DType::f32).to_vector<float>() == std::vector<float>{2050.0f});

  troupe::testing::temp_dir dir;
  Variable h(Tensor::from_vector<float>({1.5f, -0.1f, 65504.0f}).cast(DType::f16), "h");
  Variable g(Tensor::from_vector<float>({3.0f, 1e30f}).cast(DType::bf16), "g");
  const std::string path = Checkpoint({{"h", h}, {"g", g}}).write(dir.file("ckpt"));
  Variable h2(Tensor::zeros({3}, DType::f16), "h");
  Variable g2(Tensor::zeros({2}, DType::bf16), "g");
  Checkpoint({{"h", h2}, {"g", g2}}).restore(path);
  CHECK(h2.value().equals(h.value()));
  CHECK(g2.value().equals(g.value()));
  const auto info = inspect_checkpoint(path);
  REQUIRE(info.entries.size() == 2);
  CHECK(info.entries[0].dtype == DType::bf16);
  CHECK(info.entries[1].dtype == DType::f16);
  // A float16 checkpoint entry does not restore into a float32 variable.
  Variable wrong(Tensor::zeros({3}), "h");
  CHECK(contains(message_of([&] { Checkpoint({{"h", wrong}}).restore(path); }), "float16"));
}

TEST_CASE("16-bit tensors: a GradientTape passes gradients through casts, and float kernels refuse 16 bits by name") {
  Variable v(Tensor::from_vector<float>({1.0f, 3.0f}), "v");
  GradientTape tape;
  const Tensor y = reduce_sum((v.value().cast(DType::f16) * 3).cast(DType::f32), 0);
  const std::vector<Tensor> grads = tape.gradient(y, std::vector<Variable>{v});
  REQUIRE(grads.size() == 1);
  CHECK(grads[0].dtype() == DType::f32);
  CHECK(grads[0].to_vector<float>() == std::vector<float>{3.0f, 3.0f});
  const Tensor h = Tensor::zeros({2, 2}, DType::f16);
  CHECK(contains(message_of([&] { nn::matmul(h, h); }), "matmul: got a float16 tensor"));
  CHECK(contains(message_of([&] { nn::relu(Tensor::zeros({2}, DType::bf16)); }), "bfloat16"));
  CHECK(nn::argmax(Tensor::from_vector<float>({1, 3, 2, 5, 4, 0}, {2, 3}).cast(DType::f16)).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{1, 0});
}

TEST_CASE("16-bit all-reduce over CPU replicas sums in float32 and rounds once") {
  Runtime rt;
  MirroredStrategy strategy(rt, troupe::testing::cpus(3));
  // 2048 + 1 + 1: float16 partial sums would give 2048 (2049 ties to even), float32 gives 2050.
  const auto out = strategy.run([] {
    ReplicaContext& ctx = *get_replica_context();
    const float mine = ctx.replica_id_in_sync_group() == 0 ? 2048.0f : 1.0f;
    return ctx.all_reduce(ReduceOp::sum, Tensor::from_vector<float>({mine, 0.5f}).cast(DType::f16));
  });
  for (const Tensor& t : out.values()) {
    CHECK(t.dtype() == DType::f16);
    CHECK(t.cast(DType::f32).to_vector<float>() == std::vector<float>{2050.0f, 1.5f});
  }
  const Tensor mean = strategy.reduce(ReduceOp::mean, strategy.run([] {
    return Tensor::scalar<float>(static_cast<float>(get_replica_context()->replica_id_in_sync_group())).cast(DType::bf16);
  }), std::nullopt);
  CHECK(mean.cast(DType::f32).item<float>() == 1.0f);
}

}  // namespace TROUPE_TEST_FILE
