// The convolution layer's cost on this CPU, against the direct loop it replaces, and the
// attention layer's.
//
//   BM_Conv2D_Forward/<batch>/<in>/<filters>: nn::Conv2D's forward (im2col, then one product on
//     Dense's matrix kernels) on [batch, 28, 28, in] images, a 3x3 kernel, same padding, relu.
//   BM_Conv2D_Backward/<batch>/<in>/<filters>: its backward (the kernel's, the bias's and the
//     input's gradients) on the same shapes.
//   BM_Conv2D_Direct/<batch>/<in>/<filters>: the same forward as six nested loops (the plain
//     algorithm, compiled with this file's -O3), the baseline im2col + GEMM has to beat.
//
// FLOP/s counts 2·kh·kw·in·filters per output position (forward), twice that for backward (the
// kernel's and the input's products); samples/s counts images. The forward's result is checked
// against the direct loop once, outside the timed loop.
//
//   BM_MultiHeadAttention_Forward/<batch>/<sequence>/<dim>/<heads>: nn::MultiHeadAttention's
//     causal self-attention on [batch, sequence, dim], key_dim dim / heads.
//   BM_MultiHeadAttention_Backward/...: its backward (which recomputes the attention first).
// FLOP/s counts the four projections (2·dim·dim per position each) and the two products of each
// head (2·sequence·key_dim per position each, the masked half included) for forward; backward
// counts twice forward's work plus the forward it recomputes.

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "troupe/troupe.hpp"

namespace {

using troupe::Tensor;
namespace nn = troupe::nn;

constexpr std::int64_t side = 28;

Tensor images(std::int64_t batch, std::int64_t in) {
  return nn::glorot_uniform(batch * side * side * in, 1, 7).reshape({batch, side, side, in});
}

nn::Conv2D layer(std::int64_t in, std::int64_t filters) {
  nn::Conv2D conv(static_cast<int>(filters), 3, 1, nn::Padding::same, nn::Activation::relu, 1);
  conv.build({-1, side, side, in});
  return conv;
}

// relu(conv(x, kernel) + bias), same padding, by definition.
Tensor direct(const Tensor& x, const Tensor& kernel, const Tensor& bias) {
  const std::int64_t batch = x.shape()[0], in = x.shape()[3], filters = kernel.shape()[3];
  Tensor out = Tensor::empty({batch, side, side, filters}, troupe::DType::f32);
  const float* px = x.data<float>();
  const float* pk = kernel.data<float>();
  const float* pb = bias.data<float>();
  float* po = out.mutable_data<float>();
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t y = 0; y < side; ++y) {
      for (std::int64_t xx = 0; xx < side; ++xx) {
        float* o = po + ((n * side + y) * side + xx) * filters;
        for (std::int64_t f = 0; f < filters; ++f) o[f] = pb[f];
        for (std::int64_t ky = 0; ky < 3; ++ky) {
          const std::int64_t iy = y + ky - 1;
          if (iy < 0 || iy >= side) continue;
          for (std::int64_t kx = 0; kx < 3; ++kx) {
            const std::int64_t ix = xx + kx - 1;
            if (ix < 0 || ix >= side) continue;
            const float* src = px + ((n * side + iy) * side + ix) * in;
            const float* k = pk + (ky * 3 + kx) * in * filters;
            for (std::int64_t c = 0; c < in; ++c) {
              for (std::int64_t f = 0; f < filters; ++f) o[f] += src[c] * k[c * filters + f];
            }
          }
        }
        for (std::int64_t f = 0; f < filters; ++f) o[f] = o[f] > 0 ? o[f] : 0.0f;
      }
    }
  }
  return out;
}

void counters(benchmark::State& state, double flop_per_image) {
  const double n = static_cast<double>(state.iterations()) * static_cast<double>(state.range(0));
  state.counters["samples/s"] = benchmark::Counter(n, benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(n * flop_per_image, benchmark::Counter::kIsRate);
}

double forward_flop(benchmark::State& state) { return 2.0 * side * side * 9 * state.range(1) * state.range(2); }

void BM_Conv2D_Forward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  const Tensor expected = direct(x, conv.kernel().value(), conv.bias().value());
  const Tensor got = conv.forward(x);
  const auto e = expected.to_vector<float>();
  const auto g = got.to_vector<float>();
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (std::abs(e[i] - g[i]) > 1e-4f * (1.0f + std::abs(e[i]))) {
      std::cerr << "layers_bench: Conv2D's output " << i << " is " << g[i] << ", the direct loop's " << e[i] << "\n";
      std::exit(1);
    }
  }
  for (auto _ : state) benchmark::DoNotOptimize(conv.forward(x));
  counters(state, forward_flop(state));
}

void BM_Conv2D_Backward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  const Tensor out = conv.forward(x);
  const Tensor grad = nn::glorot_uniform(out.num_elements(), 1, 3).reshape(out.shape());
  for (auto _ : state) benchmark::DoNotOptimize(conv.backward(x, out, grad, nn::CallContext{true}));
  counters(state, 2.0 * forward_flop(state));
}

void BM_Conv2D_Direct(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  const Tensor kernel = conv.kernel().value();
  const Tensor bias = conv.bias().value();
  for (auto _ : state) benchmark::DoNotOptimize(direct(x, kernel, bias));
  counters(state, forward_flop(state));
}

// MNIST-sized: a first layer (1 -> 32) and a second (32 -> 64), batch 32 per replica.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({32, 1, 32})->Args({32, 32, 64})->Unit(benchmark::kMillisecond)->UseRealTime();
}

double attention_flop(benchmark::State& state) {
  const double length = static_cast<double>(state.range(1)), dim = static_cast<double>(state.range(2));
  return length * (4 * 2 * dim * dim + 2 * 2 * length * dim);  // per sequence
}

void attention_counters(benchmark::State& state, double flop_per_sequence) {
  const double n = static_cast<double>(state.iterations()) * static_cast<double>(state.range(0));
  state.counters["sequences/s"] = benchmark::Counter(n, benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(n * flop_per_sequence, benchmark::Counter::kIsRate);
}

nn::MultiHeadAttention attention(benchmark::State& state) {
  const auto dim = state.range(2), heads = state.range(3);
  nn::MultiHeadAttention mha(static_cast<int>(heads), static_cast<int>(dim / heads), true, 1);
  mha.build({-1, state.range(1), dim});
  return mha;
}

Tensor sequences(benchmark::State& state) {
  const auto n = state.range(0) * state.range(1) * state.range(2);
  return nn::glorot_uniform(n, 1, 5).reshape({state.range(0), state.range(1), state.range(2)}) *
         static_cast<float>(std::sqrt(static_cast<double>(n)));
}

void BM_MultiHeadAttention_Forward(benchmark::State& state) {
  const nn::MultiHeadAttention mha = attention(state);
  const Tensor x = sequences(state);
  for (auto _ : state) benchmark::DoNotOptimize(mha.forward(x));
  attention_counters(state, attention_flop(state));
}

void BM_MultiHeadAttention_Backward(benchmark::State& state) {
  const nn::MultiHeadAttention mha = attention(state);
  const Tensor x = sequences(state);
  const Tensor out = mha.forward(x);
  const Tensor grad = nn::glorot_uniform(out.num_elements(), 1, 3).reshape(out.shape());
  for (auto _ : state) benchmark::DoNotOptimize(mha.backward(x, out, grad, nn::CallContext{true}));
  attention_counters(state, 3.0 * attention_flop(state));
}

// A small character model's layer: batch 16 per replica of 64 characters, 128 wide, 4 heads.
void attention_shapes(benchmark::internal::Benchmark* b) {
  b->Args({16, 64, 128, 4})->Args({16, 128, 128, 4})->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_MultiHeadAttention_Forward)->Apply(attention_shapes);
BENCHMARK(BM_MultiHeadAttention_Backward)->Apply(attention_shapes);
BENCHMARK(BM_Conv2D_Forward)->Apply(shapes);
BENCHMARK(BM_Conv2D_Backward)->Apply(shapes);
BENCHMARK(BM_Conv2D_Direct)->Apply(shapes);
BENCHMARK_MAIN();
