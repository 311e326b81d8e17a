// nn::Conv2D against oneDNN's convolution on the same shapes, one thread each, side by side in one
// invocation: which of the two a CPU replica should run.
//
//   BM_Conv2D_Troupe_Forward/<batch>/<in>/<filters>: nn::Conv2D's forward (im2col, then one product
//     on Dense's matrix kernels) on [batch, 28, 28, in] images, a 3x3 kernel, same padding, relu.
//   BM_Conv2D_OneDNN_Forward/...: oneDNN's convolution_forward (forward_training, the algorithm
//     oneDNN picks, relu as a post-op) on the same images in the layer's layout (NHWC), the kernel
//     reordered each step into the layout oneDNN asks for (in training it changes every step).
//   BM_Conv2D_Troupe_Backward/...: Conv2D's backward: the kernel's, the bias's and the input's
//     gradients, the relu's mask applied first. A first layer (one input channel: the model's
//     input) asks for no input gradient, on both sides, as a model's backward does not.
//   BM_Conv2D_OneDNN_Backward/...: the same three gradients with oneDNN: eltwise_backward (relu),
//     convolution_backward_weights (kernel and bias) and convolution_backward_data (input) in the
//     layouts oneDNN picks, with the reorders from and back to the layer's layouts (NHWC, HWIO)
//     timed: what a layer holding NHWC tensors would run.
//
// Both forwards' outputs are checked against each other once, outside the timed loop, and so are
// the three gradients. FLOP/s counts 2·kh·kw·in·filters per output position (forward), twice that
// for backward (once for a first layer's). oneDNN runs on one OpenMP thread (OMP_NUM_THREADS=1 unless set), as the layer runs
// on one replica thread.

#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/troupe.hpp"

namespace {

using troupe::Tensor;
namespace nn = troupe::nn;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

constexpr std::int64_t side = 28;

Tensor images(std::int64_t batch, std::int64_t in) {
  return nn::glorot_uniform(batch * side * side * in, 1, 7).reshape({batch, side, side, in});
}

nn::Conv2D layer(std::int64_t in, std::int64_t filters) {
  nn::Conv2D conv(static_cast<int>(filters), 3, 1, nn::Padding::same, nn::Activation::relu, 1);
  conv.build({-1, side, side, in});
  return conv;
}

// Stops the run: the two sides disagree, so neither figure means anything.
void agree(const std::vector<float>& ours, const float* theirs, const std::string& what) {
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const float tolerance = 1e-3f * (1.0f + std::abs(ours[i]));
    if (!(std::abs(ours[i] - theirs[i]) <= tolerance)) {
      std::cerr << "onednn_conv_bench: " << what << " element " << i << ": troupe " << ours[i] << ", oneDNN "
                << theirs[i] << "\n";
      std::exit(1);
    }
  }
}

// One shape's oneDNN setup: the engine, the memory of every operand in the layer's layout and the
// primitives. Built once per benchmark, outside the timed loops.
struct OneDNN {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::memory::dims src_dims, weights_dims, bias_dims, dst_dims;
  dnnl::memory src, weights_hwio, bias, dst;  // user memory, troupe's layouts
  dnnl::memory weights;                       // the kernel in the forward's chosen layout
  dnnl::convolution_forward::primitive_desc forward_pd;
  dnnl::convolution_forward forward;

  OneDNN(const Tensor& x, const nn::Conv2D& conv) {
    const std::int64_t batch = x.shape()[0], in = x.shape()[3], filters = conv.kernel().value().shape()[3];
    src_dims = {batch, in, side, side};
    weights_dims = {filters, in, 3, 3};
    bias_dims = {filters};
    dst_dims = {batch, filters, side, side};
    src = dnnl::memory({src_dims, dt::f32, tag::nhwc}, engine);
    weights_hwio = dnnl::memory({weights_dims, dt::f32, tag::hwio}, engine);
    bias = dnnl::memory({bias_dims, dt::f32, tag::a}, engine);
    dst = dnnl::memory({dst_dims, dt::f32, tag::nhwc}, engine);
    std::memcpy(src.get_data_handle(), x.data<float>(), x.nbytes());
    std::memcpy(weights_hwio.get_data_handle(), conv.kernel().value().data<float>(), conv.kernel().value().nbytes());
    std::memcpy(bias.get_data_handle(), conv.bias().value().data<float>(), conv.bias().value().nbytes());

    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(relu);
    const dnnl::convolution_forward::desc d(
        dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src.get_desc(),
        dnnl::memory::desc(weights_dims, dt::f32, tag::any), bias.get_desc(), dst.get_desc(), {1, 1}, {1, 1}, {1, 1});
    forward_pd = dnnl::convolution_forward::primitive_desc(d, attr, engine);
    forward = dnnl::convolution_forward(forward_pd);
    weights = dnnl::memory(forward_pd.weights_desc(), engine);
    dnnl::reorder(weights_hwio, weights).execute(stream, weights_hwio, weights);
    stream.wait();
  }

  // As in training, where the kernel changes every step: its reorder into the forward's layout is
  // part of the step.
  void run_forward() {
    dnnl::reorder(weights_hwio, weights).execute(stream, weights_hwio, weights);
    forward.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};

void counters(benchmark::State& state, double flop_per_image) {
  const double n = static_cast<double>(state.iterations()) * static_cast<double>(state.range(0));
  state.counters["samples/s"] = benchmark::Counter(n, benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(n * flop_per_image, benchmark::Counter::kIsRate);
}

double forward_flop(benchmark::State& state) { return 2.0 * side * side * 9 * state.range(1) * state.range(2); }

void BM_Conv2D_Troupe_Forward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  OneDNN d(x, conv);
  d.run_forward();
  agree(conv.forward(x).to_vector<float>(), static_cast<const float*>(d.dst.get_data_handle()), "forward");
  for (auto _ : state) benchmark::DoNotOptimize(conv.forward(x));
  counters(state, forward_flop(state));
}

void BM_Conv2D_OneDNN_Forward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  OneDNN d(x, conv);
  for (auto _ : state) d.run_forward();
  counters(state, forward_flop(state));
}

// The backward's setup on top of the forward's: the gradient of the output, the relu's, and the
// three gradients in the layer's layouts. The backward primitives take the layouts oneDNN picks
// (format `any`); the reorders between those and the layer's NHWC run inside the timed step, as a
// layer holding NHWC tensors would have to run them.
struct OneDNNBackward {
  OneDNN& f;
  dnnl::memory diff_dst, diff_pre;  // the output's gradient, then with the relu's mask applied
  dnnl::memory diff_src, diff_weights, diff_weights_hwio, diff_bias;
  dnnl::memory w_src, w_diff_dst, x_diff_dst, x_diff_src, x_weights;  // the primitives' own layouts
  dnnl::eltwise_backward relu_backward;
  dnnl::convolution_backward_weights weights_backward;
  dnnl::convolution_backward_data data_backward;

  bool need_input;  // a first layer's input gradient (the model's input) is never asked for

  OneDNNBackward(OneDNN& forward, const Tensor& grad, bool input_gradient) : f(forward), need_input(input_gradient) {
    diff_dst = dnnl::memory(f.dst.get_desc(), f.engine);
    diff_pre = dnnl::memory(f.dst.get_desc(), f.engine);
    std::memcpy(diff_dst.get_data_handle(), grad.data<float>(), grad.nbytes());
    diff_src = dnnl::memory(f.src.get_desc(), f.engine);
    diff_weights_hwio = dnnl::memory(f.weights_hwio.get_desc(), f.engine);
    diff_bias = dnnl::memory(f.bias.get_desc(), f.engine);

    const dnnl::eltwise_forward::desc relu_d(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu,
                                             f.dst.get_desc(), 0.0f, 0.0f);
    const dnnl::eltwise_forward::primitive_desc relu_pd(relu_d, f.engine);
    // The relu's gradient from its output (the post-op's result): the mask is output > 0.
    const dnnl::eltwise_backward::desc relu_back_d(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, f.dst.get_desc(),
                                                   f.dst.get_desc(), 0.0f, 0.0f);
    relu_backward = dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(relu_back_d, f.engine, relu_pd));

    const dnnl::memory::desc any_src(f.src_dims, dt::f32, tag::any);
    const dnnl::memory::desc any_dst(f.dst_dims, dt::f32, tag::any);
    const dnnl::convolution_backward_weights::desc w_d(
        dnnl::algorithm::convolution_direct, any_src, dnnl::memory::desc(f.weights_dims, dt::f32, tag::any),
        f.bias.get_desc(), any_dst, {1, 1}, {1, 1}, {1, 1});
    const dnnl::convolution_backward_weights::primitive_desc w_pd(w_d, f.engine, f.forward_pd);
    weights_backward = dnnl::convolution_backward_weights(w_pd);
    diff_weights = dnnl::memory(w_pd.diff_weights_desc(), f.engine);
    w_src = dnnl::memory(w_pd.src_desc(), f.engine);
    w_diff_dst = dnnl::memory(w_pd.diff_dst_desc(), f.engine);

    const dnnl::convolution_backward_data::desc x_d(dnnl::algorithm::convolution_direct, any_src,
                                                    dnnl::memory::desc(f.weights_dims, dt::f32, tag::any), any_dst,
                                                    {1, 1}, {1, 1}, {1, 1});
    const dnnl::convolution_backward_data::primitive_desc x_pd(x_d, f.engine, f.forward_pd);
    data_backward = dnnl::convolution_backward_data(x_pd);
    x_diff_dst = dnnl::memory(x_pd.diff_dst_desc(), f.engine);
    x_diff_src = dnnl::memory(x_pd.diff_src_desc(), f.engine);
    x_weights = dnnl::memory(x_pd.weights_desc(), f.engine);
  }

  // Copies between layouts (a plain copy when oneDNN chose the layer's own).
  void move(dnnl::memory& from, dnnl::memory& to) { dnnl::reorder(from, to).execute(f.stream, from, to); }

  void run() {
    relu_backward.execute(f.stream, {{DNNL_ARG_DST, f.dst}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_pre}});
    move(f.src, w_src);
    move(diff_pre, w_diff_dst);
    weights_backward.execute(f.stream, {{DNNL_ARG_SRC, w_src},
                                        {DNNL_ARG_DIFF_DST, w_diff_dst},
                                        {DNNL_ARG_DIFF_WEIGHTS, diff_weights},
                                        {DNNL_ARG_DIFF_BIAS, diff_bias}});
    move(diff_weights, diff_weights_hwio);
    if (need_input) {
      move(diff_pre, x_diff_dst);
      move(f.weights_hwio, x_weights);
      data_backward.execute(f.stream, {{DNNL_ARG_DIFF_DST, x_diff_dst},
                                       {DNNL_ARG_WEIGHTS, x_weights},
                                       {DNNL_ARG_DIFF_SRC, x_diff_src}});
      move(x_diff_src, diff_src);
    }
    f.stream.wait();
  }
};

void BM_Conv2D_Troupe_Backward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  const Tensor out = conv.forward(x);
  const Tensor grad = nn::glorot_uniform(out.num_elements(), 1, 3).reshape(out.shape());
  OneDNN d(x, conv);
  d.run_forward();
  const bool need_input = state.range(1) > 1;
  OneDNNBackward b(d, grad, need_input);
  b.run();
  const nn::LayerGradients g = conv.backward(x, out, grad, nn::CallContext{true}, need_input);
  if (need_input) {
    agree(g.input.to_vector<float>(), static_cast<const float*>(b.diff_src.get_data_handle()), "input gradient");
  }
  agree(g.variables.at(0).to_vector<float>(), static_cast<const float*>(b.diff_weights_hwio.get_data_handle()),
        "kernel gradient");
  agree(g.variables.at(1).to_vector<float>(), static_cast<const float*>(b.diff_bias.get_data_handle()), "bias gradient");
  for (auto _ : state) benchmark::DoNotOptimize(conv.backward(x, out, grad, nn::CallContext{true}, need_input));
  counters(state, (need_input ? 2.0 : 1.0) * forward_flop(state));
}

void BM_Conv2D_OneDNN_Backward(benchmark::State& state) {
  const Tensor x = images(state.range(0), state.range(1));
  const nn::Conv2D conv = layer(state.range(1), state.range(2));
  const Tensor out = conv.forward(x);
  const Tensor grad = nn::glorot_uniform(out.num_elements(), 1, 3).reshape(out.shape());
  OneDNN d(x, conv);
  d.run_forward();
  const bool need_input = state.range(1) > 1;
  OneDNNBackward b(d, grad, need_input);
  for (auto _ : state) b.run();
  counters(state, (need_input ? 2.0 : 1.0) * forward_flop(state));
}

// MNIST-sized, as layers_bench: a first layer (1 -> 32) and a second (32 -> 64), batch 32 per
// replica; and the digits CNN's two layers (1 -> 16 and 16 -> 32).
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({32, 1, 32})->Args({32, 32, 64})->Args({32, 1, 16})->Args({32, 16, 32});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_Conv2D_Troupe_Forward)->Apply(shapes);
BENCHMARK(BM_Conv2D_OneDNN_Forward)->Apply(shapes);
BENCHMARK(BM_Conv2D_Troupe_Backward)->Apply(shapes);
BENCHMARK(BM_Conv2D_OneDNN_Backward)->Apply(shapes);

int main(int argc, char** argv) {
  // One thread on each side: oneDNN's OpenMP before its first parallel region reads it, troupe's
  // products without intra-op row blocks.
  setenv("OMP_NUM_THREADS", "1", 0);
  setenv("TROUPE_INTRA_OP_THREADS", "1", 0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
