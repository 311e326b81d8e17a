// The optimizer and nn kernels of kernels/cuda/kernels.hpp (SGD, momentum, Adam, bias and
// activation, ReLU, softmax, argmax, the step table) against host loops that compute the same
// formulas in the same order, for float and double, and their refusal of the other types. Run by
// kernels_test.cpp's main; see its top for how the comparisons are made.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_suite.hpp"

namespace troupe::testing::kernel_checks {
namespace {

template <class T>
void test_sgd(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<T> w = t.random<T>(n, -1, 1);
    const std::vector<T> g = t.random<T>(n, -1, 1);
    const std::vector<T> vel = t.random<T>(n, -1, 1);
    auto dw = t.upload(w);
    auto dg = t.upload(g);
    auto dvel = t.upload(vel);
    for (double lr_d : {0.01, 0.1, 1e-3}) {
      const std::string what = cat({"sgd ", type_name<T>(), " n=", std::to_string(n), " lr=", show(lr_d)});
      const T lr = static_cast<T>(lr_d);
      std::vector<T> want(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) want[i] = w[i] - rounded(lr * g[i]);
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_sgd(dw->get(), dg->get(), out->get(), n, type_of<T>(), lr_d, t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
    struct setting {
      double lr, momentum;
      bool nesterov;
    };
    for (const setting& c : {setting{0.01, 0.9, false}, setting{0.01, 0.9, true}, setting{0.1, 0.0, false},
                             setting{0.05, 0.5, true}}) {
      const std::string what = cat({"sgd_momentum ", type_name<T>(), " n=", std::to_string(n), " lr=", show(c.lr),
                                    " momentum=", show(c.momentum), c.nesterov ? " nesterov" : ""});
      const T lr = static_cast<T>(c.lr);
      const T m = static_cast<T>(c.momentum);
      std::vector<T> want_w(w.size());
      std::vector<T> want_vel(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        want_vel[i] = rounded(m * vel[i]) - rounded(lr * g[i]);
        want_w[i] = c.nesterov ? w[i] + (rounded(m * want_vel[i]) - rounded(lr * g[i])) : w[i] + want_vel[i];
      }
      auto out_w = t.garbage<T>(n);
      auto out_vel = t.garbage<T>(n);
      if (t.launched(kernels::launch_sgd_momentum(dw->get(), dg->get(), dvel->get(), out_w->get(), out_vel->get(), n,
                                                  type_of<T>(), c.lr, c.momentum, c.nesterov, t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out_w, n), want_w, what + " w");
        t.expect_equal(t.download<T>(*out_vel, n), want_vel, what + " velocity");
      }
    }
  }
}

template <class T>
void test_adam(suite& t) {
  for (std::int64_t n : sizes) {
    const std::vector<T> w = t.random<T>(n, -1, 1);
    const std::vector<T> g = t.random<T>(n, -1, 1);
    const std::vector<T> m = t.random<T>(n, -1, 1);
    const std::vector<T> v = t.random<T>(n, 0, 1);
    auto dw = t.upload(w);
    auto dg = t.upload(g);
    auto dm = t.upload(m);
    auto dv = t.upload(v);
    // The coefficients as the CPU's Adam derives them, for steps 1 and 7.
    for (double step : {1.0, 7.0}) {
      const double lr = 0.001, b1 = 0.9, b2 = 0.999, eps = 1e-7;
      const double lr_t = lr * std::sqrt(1.0 - std::pow(b2, step)) / (1.0 - std::pow(b1, step));
      const std::string what = cat({"adam ", type_name<T>(), " n=", std::to_string(n), " step=", show(step)});
      const T c_lr = static_cast<T>(lr_t), c_b1 = static_cast<T>(b1), c_omb1 = static_cast<T>(1.0 - b1),
              c_b2 = static_cast<T>(b2), c_omb2 = static_cast<T>(1.0 - b2), c_eps = static_cast<T>(eps);
      std::vector<T> want_w(w.size()), want_m(w.size()), want_v(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        want_m[i] = rounded(c_b1 * m[i]) + rounded(c_omb1 * g[i]);
        // g squared first, then scaled: the CPU's Adam (Eigen's g.square()) rounds in that order.
        want_v[i] = rounded(c_b2 * v[i]) + rounded(c_omb2 * rounded(g[i] * g[i]));
        want_w[i] = w[i] - rounded(c_lr * want_m[i]) / (std::sqrt(want_v[i]) + c_eps);
      }
      auto out_w = t.garbage<T>(n);
      auto out_m = t.garbage<T>(n);
      auto out_v = t.garbage<T>(n);
      if (t.launched(kernels::launch_adam(dw->get(), dg->get(), dm->get(), dv->get(), out_w->get(), out_m->get(),
                                          out_v->get(), n, type_of<T>(), lr_t, b1, 1.0 - b1, b2, 1.0 - b2, eps, t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out_w, n), want_w, what + " w");
        t.expect_equal(t.download<T>(*out_m, n), want_m, what + " m");
        t.expect_equal(t.download<T>(*out_v, n), want_v, what + " v");
      }
    }
  }
}

template <class T>
void test_bias_activation(suite& t) {
  struct shape {
    std::int64_t rows, cols;
  };
  for (const shape& sh : {shape{0, 5}, shape{3, 0}, shape{1, 1}, shape{7, 13}, shape{1001, 33}, shape{1024, 1024}}) {
    const std::vector<T> x = t.random<T>(sh.rows * sh.cols, -1, 1);
    const std::vector<T> bias = t.random<T>(sh.cols, -1, 1);
    auto dx = t.upload(x);
    auto dbias = t.upload(bias);
    for (bool relu : {false, true}) {
      const std::string what = cat({"bias_activation ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                    std::to_string(sh.cols), "]", relu ? " relu" : ""});
      std::vector<T> want(x.size());
      for (std::int64_t r = 0; r < sh.rows; ++r) {
        for (std::int64_t c = 0; c < sh.cols; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * sh.cols + c);
          const T y = x[i] + bias[static_cast<std::size_t>(c)];
          want[i] = relu && y < T(0) ? T(0) : y;
        }
      }
      auto out = t.garbage<T>(sh.rows * sh.cols);
      if (t.launched(kernels::launch_bias_activation(dx->get(), dbias->get(), out->get(), sh.rows, sh.cols, relu,
                                                     type_of<T>(), t.s()),
                     what)) {
        t.expect_equal(t.download<T>(*out, sh.rows * sh.cols), want, what);
      }
    }
  }
}

template <class T>
void test_relu(suite& t) {
  for (std::int64_t n : sizes) {
    // Zeros of both signs: relu keeps x when it is not below 0, relu_grad passes grad only above 0.
    std::vector<T> x = t.random<T>(n, -1, 1);
    t.sprinkle(x, 0.05, T(0));
    t.sprinkle(x, 0.05, -T(0));
    const std::vector<T> grad = t.random<T>(n, -1, 1);
    auto dx = t.upload(x);
    auto dgrad = t.upload(grad);
    {
      const std::string what = cat({"relu ", type_name<T>(), " n=", std::to_string(n)});
      std::vector<T> want(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] < T(0) ? T(0) : x[i];
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_relu(dx->get(), out->get(), n, type_of<T>(), t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
    {
      const std::string what = cat({"relu_grad ", type_name<T>(), " n=", std::to_string(n)});
      std::vector<T> want(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] > T(0) ? grad[i] : T(0);
      auto out = t.garbage<T>(n);
      if (t.launched(kernels::launch_relu_grad(dgrad->get(), dx->get(), out->get(), n, type_of<T>(), t.s()), what)) {
        t.expect_equal(t.download<T>(*out, n), want, what);
      }
    }
  }
}

struct matrix_shape {
  std::int64_t rows, cols;
};
// 5000 rows: more than the grid's 4096 blocks, so a block takes a second row.
const matrix_shape row_shapes[] = {{0, 4}, {4, 0}, {1, 1}, {3, 7}, {64, 1001}, {1000, 10}, {2, 4096}, {5000, 3}};

template <class T>
void test_softmax(suite& t) {
  // The reference in double from the same x - max as the kernel's. The kernel's exp is within 2
  // ulp, and its tree sum of at most 16 + 8 roundings stays well inside the tolerance.
  const double rel = std::is_same_v<T, float> ? 1e-6 : 1e-12;
  for (const matrix_shape& sh : row_shapes) {
    const std::string what = cat({"softmax ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                  std::to_string(sh.cols), "]"});
    const std::vector<T> x = t.random<T>(sh.rows * sh.cols, -5, 5);
    std::vector<double> want(x.size());
    for (std::int64_t r = 0; r < sh.rows && sh.cols > 0; ++r) {
      const T* row = x.data() + r * sh.cols;
      double* out = want.data() + r * sh.cols;
      T max = row[0];
      for (std::int64_t c = 1; c < sh.cols; ++c) max = row[c] > max ? row[c] : max;
      double sum = 0;
      for (std::int64_t c = 0; c < sh.cols; ++c) {
        out[c] = std::exp(static_cast<double>(static_cast<T>(row[c] - max)));
        sum += out[c];
      }
      for (std::int64_t c = 0; c < sh.cols; ++c) out[c] /= sum;
    }
    auto dx = t.upload(x);
    auto out = t.garbage<T>(sh.rows * sh.cols);
    if (t.launched(kernels::launch_softmax(dx->get(), out->get(), sh.rows, sh.cols, type_of<T>(), t.s()), what)) {
      t.expect_close(t.download<T>(*out, sh.rows * sh.cols), want, rel, what);
    }
  }
}

template <class T>
void test_argmax(suite& t) {
  for (bool ties : {false, true}) {
    for (const matrix_shape& sh : row_shapes) {
      if (sh.cols == 0 && sh.rows > 0) continue;  // no answer to give (the CPU's argmax refuses it)
      const std::string what = cat({"argmax ", type_name<T>(), " [", std::to_string(sh.rows), ", ",
                                    std::to_string(sh.cols), "]", ties ? " with ties" : ""});
      // With ties, the values are the integers -1..4, so most rows hold their maximum several times.
      std::vector<T> x = t.random<T>(sh.rows * sh.cols, -5, 5);
      if (ties) {
        for (T& v : x) v = std::floor(v / 2) + 2;
      }
      std::vector<std::int64_t> want(static_cast<std::size_t>(sh.rows));
      for (std::int64_t r = 0; r < sh.rows; ++r) {
        const T* row = x.data() + r * sh.cols;
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < sh.cols; ++c) {
          if (row[c] > row[best]) best = c;
        }
        want[static_cast<std::size_t>(r)] = best;
      }
      auto dx = t.upload(x);
      auto out = t.garbage<std::int64_t>(sh.rows);
      if (t.launched(kernels::launch_argmax(dx->get(), out->as<std::int64_t>(), sh.rows, sh.cols, type_of<T>(), t.s()),
                     what)) {
        t.expect_equal(t.download<std::int64_t>(*out, sh.rows), want, what);
      }
    }
  }
}

// A step's table: the loss (of type T) added at 0 and, scaled, at loss_at; the rows whose prediction
// equals their label (int32 or int64, some out of range) added at 1; the other entries kept.
template <class T, class L>
void test_step_table(suite& t) {
  for (std::int64_t rows : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{4096}, std::int64_t{5001}}) {
    for (bool with_hits : {false, true}) {
      for (std::int64_t loss_at : {std::int64_t{-1}, std::int64_t{4}}) {
        const std::string what = cat({"step_table loss ", type_name<T>(), " labels ", type_name<L>(), " rows ",
                                      std::to_string(rows), with_hits ? " with hits" : "", " loss_at ",
                                      std::to_string(loss_at)});
        std::vector<double> table = t.random<double>(6, -3, 3);
        const std::vector<T> loss = t.random<T>(1, 0, 5);
        std::vector<std::int64_t> predicted(static_cast<std::size_t>(rows));
        std::vector<L> labels(static_cast<std::size_t>(rows));
        std::int64_t hits = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          predicted[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(t.rng()() % 10);
          // Mostly classes 0..9; every 13th label is out of range and never predicted.
          labels[static_cast<std::size_t>(r)] =
              r % 13 == 5 ? static_cast<L>(-1) : static_cast<L>(r % 3 == 0 ? predicted[static_cast<std::size_t>(r)] : t.rng()() % 10);
          hits += predicted[static_cast<std::size_t>(r)] == static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)]) ? 1 : 0;
        }
        const double scale = 4096.0 / 7.0;
        std::vector<double> want = table;
        want[0] += static_cast<double>(loss[0]);
        if (loss_at >= 0) want[static_cast<std::size_t>(loss_at)] += static_cast<double>(loss[0]) * scale;
        if (with_hits) want[1] += static_cast<double>(hits);
        auto dtable = t.upload(table);
        auto dloss = t.upload(loss);
        auto dpredicted = t.upload(predicted);
        auto dlabels = t.upload(labels);
        if (t.launched(kernels::launch_step_table(dtable->as<double>(), 6, dloss->get(), type_of<T>(), loss_at, scale,
                                                  with_hits ? dpredicted->as<std::int64_t>() : nullptr, dlabels->get(),
                                                  type_of<L>(), rows, t.s()),
                       what)) {
          t.expect_equal(t.download<double>(*dtable, 6), want, what);
        }
      }
    }
  }
  // Refused without a launch: a loss_at past the table, hits without a place for them, float labels.
  auto buf = t.garbage<double>(8);
  void* p = buf->get();
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 4, p, type_of<T>(), 4, 1.0, nullptr, p, type_of<L>(), 1, t.s()),
              invalid, "step_table refuses loss_at past the table");
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 1, p, type_of<T>(), -1, 1.0, buf->as<std::int64_t>(), p,
                                         type_of<L>(), 1, t.s()),
              invalid, "step_table refuses hits in a table of one");
  t.expect_rc(kernels::launch_step_table(buf->as<double>(), 4, p, type_of<T>(), -1, 1.0, nullptr, p, scalar_type::f32, 1,
                                         t.s()),
              invalid, "step_table refuses float labels");
}

}  // namespace

// The optimizer and nn kernels take f32 and f64 only; the others are refused without a launch.
template <class T>
void test_refused_types(suite& t) {
  auto buf = t.garbage<double>(64);
  void* p = buf->get();
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  const scalar_type type = type_of<T>();
  const std::string suffix = cat({" refuses ", type_name<T>()});
  t.expect_rc(kernels::launch_sgd(p, p, p, 8, type, 0.1, t.s()), invalid, "sgd" + suffix);
  t.expect_rc(kernels::launch_sgd_momentum(p, p, p, p, p, 8, type, 0.1, 0.9, true, t.s()), invalid,
              "sgd_momentum" + suffix);
  t.expect_rc(kernels::launch_adam(p, p, p, p, p, p, p, 8, type, 0.1, 0.9, 0.1, 0.999, 0.001, 1e-7, t.s()), invalid,
              "adam" + suffix);
  t.expect_rc(kernels::launch_bias_activation(p, p, p, 2, 4, true, type, t.s()), invalid, "bias_activation" + suffix);
  t.expect_rc(kernels::launch_relu(p, p, 8, type, t.s()), invalid, "relu" + suffix);
  t.expect_rc(kernels::launch_relu_grad(p, p, p, 8, type, t.s()), invalid, "relu_grad" + suffix);
  t.expect_rc(kernels::launch_softmax(p, p, 2, 4, type, t.s()), invalid, "softmax" + suffix);
  t.expect_rc(kernels::launch_argmax(p, static_cast<std::int64_t*>(p), 2, 4, type, t.s()), invalid,
              "argmax" + suffix);
}

template <class T>
void test_float_type(suite& t) {
  test_sgd<T>(t);
  test_adam<T>(t);
  test_bias_activation<T>(t);
  test_relu<T>(t);
  test_softmax<T>(t);
  test_argmax<T>(t);
  test_step_table<T, std::int32_t>(t);
  test_step_table<T, std::int64_t>(t);
}

// main (kernels_test.cpp) runs these.
template void test_float_type<float>(suite&);
template void test_float_type<double>(suite&);
template void test_refused_types<std::int32_t>(suite&);
template void test_refused_types<std::int64_t>(suite&);

}  // namespace troupe::testing::kernel_checks
