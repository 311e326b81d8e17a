#include "troupe/nn/pooling.hpp"

#include <limits>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/eigen_maps.hpp"
#include "nn/layer_checks.hpp"

namespace troupe::nn {

namespace {

struct PoolGeometry {
  std::int64_t batch, height, width, channels;
  std::int64_t ph, pw, sh, sw;
  detail::Window rows, cols;
};

// Visits every window: f(n, oy, ox, y0, y1, x0, x1) with the window's rows [y0, y1) and columns
// [x0, x1) clipped to the image.
template <class F>
void each_window(const PoolGeometry& g, F&& f) {
  for (std::int64_t n = 0; n < g.batch; ++n) {
    for (std::int64_t oy = 0; oy < g.rows.out; ++oy) {
      const std::int64_t top = oy * g.sh - g.rows.pad_before;
      const std::int64_t y0 = std::max<std::int64_t>(top, 0), y1 = std::min(top + g.ph, g.height);
      for (std::int64_t ox = 0; ox < g.cols.out; ++ox) {
        const std::int64_t left = ox * g.sw - g.cols.pad_before;
        const std::int64_t x0 = std::max<std::int64_t>(left, 0), x1 = std::min(left + g.pw, g.width);
        f(n, oy, ox, y0, y1, x0, x1);
      }
    }
  }
}

}  // namespace

Pooling2D::Pooling2D(const char* kind, Size2 pool_size, std::optional<Size2> strides, Padding padding,
                     std::string name)
    : Layer(std::move(name)),
      pool_size_(detail::positive(kind, pool_size, "pool_size")),
      strides_(detail::positive(kind, strides.value_or(pool_size), "strides")),
      padding_(padding) {}

Shape Pooling2D::output_shape(const Shape& input_shape) const {
  detail::check_input_shape(who(), input_shape, {-1, -1, -1, -1}, "[batch, height, width, channels]");
  const detail::Window rows = detail::window(input_shape[1], pool_size_.height, strides_.height, padding_);
  const detail::Window cols = detail::window(input_shape[2], pool_size_.width, strides_.width, padding_);
  if (rows.out == 0 || cols.out == 0) {
    throw std::invalid_argument(who() + ": input of shape " + shape_to_string(input_shape) + " is smaller than the " +
                                std::to_string(pool_size_.height) + "x" + std::to_string(pool_size_.width) +
                                " window (expected height and width at least the window's with valid padding)");
  }
  return {input_shape[0], rows.out, cols.out, input_shape[3]};
}

void Pooling2D::check_input(const Tensor& x) const {
  detail::check_float_input(who(), x);
  output_shape(x.shape());
}

Tensor Pooling2D::call(const Tensor& x_in, const CallContext&) const {
  check_input(x_in);
  const Tensor x = detail::on_host(x_in);
  const PoolGeometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], pool_size_.height, pool_size_.width,
                   strides_.height, strides_.width,
                   detail::window(x.shape()[1], pool_size_.height, strides_.height, padding_),
                   detail::window(x.shape()[2], pool_size_.width, strides_.width, padding_)};
  Tensor out = Tensor::empty(output_shape(x.shape()), x.dtype());
  const bool max = is_max();
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* o = out.mutable_data<T>();
    const std::int64_t c = g.channels;
    each_window(g, [&](std::int64_t n, std::int64_t oy, std::int64_t ox, std::int64_t y0, std::int64_t y1,
                       std::int64_t x0, std::int64_t x1) {
      T* dst = o + ((n * g.rows.out + oy) * g.cols.out + ox) * c;
      for (std::int64_t k = 0; k < c; ++k) dst[k] = max ? -std::numeric_limits<T>::infinity() : T(0);
      for (std::int64_t y = y0; y < y1; ++y) {
        for (std::int64_t xx = x0; xx < x1; ++xx) {
          const T* src = in + ((n * g.height + y) * g.width + xx) * c;
          for (std::int64_t k = 0; k < c; ++k) dst[k] = max ? (src[k] > dst[k] ? src[k] : dst[k]) : dst[k] + src[k];
        }
      }
      if (!max) {
        const T count = static_cast<T>((y1 - y0) * (x1 - x0));
        for (std::int64_t k = 0; k < c; ++k) dst[k] /= count;
      }
    });
  });
  return detail::like_device(out, x_in);
}

LayerGradients Pooling2D::gradients(const Tensor& x_in, const Tensor& output, const Tensor& grad_output,
                                    const CallContext&, bool need_input) const {
  check_input(x_in);
  detail::check_grad_output(who(), grad_output, output);
  const Shape expected = output_shape(x_in.shape());
  if (output.shape() != expected) {
    throw std::invalid_argument(who() + ": output of shape " + shape_to_string(output.shape()) + " for input " +
                                shape_to_string(x_in.shape()) + " (expected " + shape_to_string(expected) +
                                ", what forward gives)");
  }
  LayerGradients out;
  if (!need_input) return out;
  const Tensor x = detail::on_host(x_in);
  const Tensor y = detail::on_host(output);
  const Tensor gy = detail::on_host(grad_output);
  const PoolGeometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], pool_size_.height, pool_size_.width,
                   strides_.height, strides_.width,
                   detail::window(x.shape()[1], pool_size_.height, strides_.height, padding_),
                   detail::window(x.shape()[2], pool_size_.width, strides_.width, padding_)};
  Tensor dx = Tensor::zeros(x.shape(), x.dtype());
  const bool max = is_max();
  eigen::dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    const T* yo = y.data<T>();
    const T* gi = gy.data<T>();
    T* d = dx.mutable_data<T>();
    const std::int64_t c = g.channels;
    each_window(g, [&](std::int64_t n, std::int64_t oy, std::int64_t ox, std::int64_t y0, std::int64_t y1,
                       std::int64_t x0, std::int64_t x1) {
      const std::int64_t at = ((n * g.rows.out + oy) * g.cols.out + ox) * c;
      for (std::int64_t k = 0; k < c; ++k) {
        if (max) {
          // The first input of the window equal to its maximum takes the gradient.
          bool done = false;
          for (std::int64_t yy = y0; yy < y1 && !done; ++yy) {
            for (std::int64_t xx = x0; xx < x1 && !done; ++xx) {
              const std::int64_t i = ((n * g.height + yy) * g.width + xx) * c + k;
              if (in[i] == yo[at + k]) {
                d[i] += gi[at + k];
                done = true;
              }
            }
          }
        } else {
          const T share = gi[at + k] / static_cast<T>((y1 - y0) * (x1 - x0));
          for (std::int64_t yy = y0; yy < y1; ++yy) {
            for (std::int64_t xx = x0; xx < x1; ++xx) d[((n * g.height + yy) * g.width + xx) * c + k] += share;
          }
        }
      }
    });
  });
  out.input = detail::like_device(dx, x_in);
  return out;
}

std::string Pooling2D::config_json() const {
  return nlohmann::json{{"pool_size", {pool_size_.height, pool_size_.width}},
                        {"strides", {strides_.height, strides_.width}},
                        {"padding", padding_name(padding_)}}
      .dump();
}

}  // namespace troupe::nn
