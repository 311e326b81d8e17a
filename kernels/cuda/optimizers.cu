// The optimizers' updates on GPU tensors, one tensor or many per launch (a multi-tensor apply).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.hpp"
#include "launch.cuh"

namespace troupe::kernels::cuda {
using namespace detail;  // NOLINT(google-build-using-namespace): the launch helpers of this folder

namespace {

template <class T>
struct sgd_fn {
  const T* w;
  const T* g;
  T* out_w;
  T lr;
  __device__ void operator()(std::int64_t i) const { out_w[i] = w[i] - lr * g[i]; }
};

template <class T>
struct sgd_momentum_fn {
  const T* w;
  const T* g;
  const T* vel;
  T* out_w;
  T* out_vel;
  T lr;
  T m;
  bool nesterov;
  __device__ void operator()(std::int64_t i) const {
    const T gi = g[i];
    const T next_vel = m * vel[i] - lr * gi;
    out_vel[i] = next_vel;
    out_w[i] = nesterov ? w[i] + (m * next_vel - lr * gi) : w[i] + next_vel;
  }
};

template <class T>
struct adam_fn {
  const T* w;
  const T* g;
  const T* m;
  const T* v;
  T* out_w;
  T* out_m;
  T* out_v;
  T lr_t;
  T b1;
  T one_minus_b1;
  T b2;
  T one_minus_b2;
  T eps;
  __device__ void operator()(std::int64_t i) const {
    const T gi = g[i];
    const T next_m = b1 * m[i] + one_minus_b1 * gi;
    // one_minus_b2 * (g * g): g squared first, as the CPU's Adam (Eigen's g.square()) rounds it.
    const T next_v = b2 * v[i] + one_minus_b2 * (gi * gi);
    out_m[i] = next_m;
    out_v[i] = next_v;
    out_w[i] = w[i] - lr_t * next_m / (sqrt_of(next_v) + eps);
  }
};

// Several tensors in one launch: the functors of up to multi_group tensors travel in the kernel's
// parameters; element i of the concatenation belongs to the first tensor whose end exceeds i.
constexpr int multi_group = 24;

template <class F>
struct multi_args {
  F fn[multi_group];
  std::int64_t end[multi_group];
  int n;
};

template <class F>
__global__ void multi_kernel(multi_args<F> a) {
  const std::int64_t total = a.end[a.n - 1];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    int t = 0;
    while (i >= a.end[t]) ++t;
    a.fn[t](t == 0 ? i : i - a.end[t - 1]);
  }
}

template <class F, class Make>
int launch_multi(const update_tensor* tensors, int n, Make&& make, void* stream) {
  multi_args<F> args{};
  std::int64_t total = 0;
  auto flush = [&]() -> int {
    if (args.n == 0) return 0;
    multi_kernel<<<blocks_for(total), threads_per_block, 0, static_cast<cudaStream_t>(stream)>>>(args);
    const int rc = launched();
    args = multi_args<F>{};
    total = 0;
    return rc;
  };
  for (int k = 0; k < n; ++k) {
    if (tensors[k].count <= 0) continue;
    args.fn[args.n] = make(tensors[k]);
    total += tensors[k].count;
    args.end[args.n] = total;
    if (++args.n == multi_group) {
      if (const int rc = flush(); rc != 0) return rc;
    }
  }
  return flush();
}

}  // namespace

int launch_sgd(const void* w, const void* g, void* out_w, std::int64_t count, scalar_type type, double lr,
               void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    const sgd_fn<T> f{static_cast<const T*>(w), static_cast<const T*>(g), static_cast<T*>(out_w),
                      static_cast<T>(lr)};
    return launch_elementwise(count, f, stream);
  });
}

int launch_sgd_momentum(const void* w, const void* g, const void* vel, void* out_w, void* out_vel, std::int64_t count,
                        scalar_type type, double lr, double momentum, bool nesterov, void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(count,
                              sgd_momentum_fn<T>{static_cast<const T*>(w), static_cast<const T*>(g),
                                                 static_cast<const T*>(vel), static_cast<T*>(out_w),
                                                 static_cast<T*>(out_vel), static_cast<T>(lr),
                                                 static_cast<T>(momentum), nesterov},
                              stream);
  });
}

int launch_adam(const void* w, const void* g, const void* m, const void* v, void* out_w, void* out_m, void* out_v,
                std::int64_t count, scalar_type type, double lr_t, double b1, double one_minus_b1, double b2,
                double one_minus_b2, double eps, void* stream) {
  if (count <= 0) return 0;
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    return launch_elementwise(
        count,
        adam_fn<T>{static_cast<const T*>(w), static_cast<const T*>(g), static_cast<const T*>(m),
                   static_cast<const T*>(v), static_cast<T*>(out_w), static_cast<T*>(out_m), static_cast<T*>(out_v),
                   static_cast<T>(lr_t), static_cast<T>(b1), static_cast<T>(one_minus_b1), static_cast<T>(b2),
                   static_cast<T>(one_minus_b2), static_cast<T>(eps)},
        stream);
  });
}

int launch_multi_update(update_kind kind, const update_tensor* tensors, int n, scalar_type type,
                        const update_coefficients& c, void* stream) {
  if (n < 0 || (n > 0 && tensors == nullptr)) return invalid();
  return with_float_type(type, [&](auto value) {
    using T = decltype(value);
    switch (kind) {
      case update_kind::sgd:
        return launch_multi<sgd_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return sgd_fn<T>{static_cast<const T*>(u.w), static_cast<const T*>(u.g), static_cast<T*>(u.out_w),
                               static_cast<T>(c.lr)};
            },
            stream);
      case update_kind::momentum:
        return launch_multi<sgd_momentum_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return sgd_momentum_fn<T>{static_cast<const T*>(u.w),  static_cast<const T*>(u.g),
                                        static_cast<const T*>(u.m),  static_cast<T*>(u.out_w),
                                        static_cast<T*>(u.out_m),    static_cast<T>(c.lr),
                                        static_cast<T>(c.momentum), c.nesterov};
            },
            stream);
      case update_kind::adam:
        return launch_multi<adam_fn<T>>(
            tensors, n,
            [&](const update_tensor& u) {
              return adam_fn<T>{static_cast<const T*>(u.w),        static_cast<const T*>(u.g),
                                static_cast<const T*>(u.m),        static_cast<const T*>(u.v),
                                static_cast<T*>(u.out_w),          static_cast<T*>(u.out_m),
                                static_cast<T*>(u.out_v),          static_cast<T>(c.lr),
                                static_cast<T>(c.b1),              static_cast<T>(c.one_minus_b1),
                                static_cast<T>(c.b2),              static_cast<T>(c.one_minus_b2),
                                static_cast<T>(c.eps)};
            },
            stream);
    }
    return invalid();
  });
}

}  // namespace troupe::kernels::cuda
