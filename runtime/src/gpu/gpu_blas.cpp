// Matrix products of GPU tensors through cuBLASLt (see gpu.hpp: gemm).
//
// Row-major products are computed as their column-major transposes: a row-major [r, c] array is
// a column-major [c, r] one, so C = op(A) op(B) (row-major) is C^T = op(B)^T op(A)^T, which is
// cuBLASLt's D = op'(B_stored) op'(A_stored) with the same transposes and no copy.
//
// Determinism: the algorithm is chosen once per GPU model, shape and math mode, and every thread
// (every replica) then uses that same algorithm with the same workspace size. Only reduction
// schemes that add in a fixed order are allowed (no split-K atomics), so a product gives the same
// bits on every replica and every run, as cuBLAS promises for a fixed algorithm on one
// architecture.
//
// cuBLASLt is loaded on the first GPU product (dlopen), not linked: the library is over 500 MB
// and loading it costs every process about 0.2 s and 200 MB of memory, which CPU-only runs of a
// CUDA build should not pay. Only its types come from the header.

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "gpu.hpp"

namespace troupe::detail::gpu {
namespace {

namespace gpu = troupe::detail::gpu;

constexpr int max_devices = 64;
// cuBLASLt's advice for Hopper is 32 MiB; one workspace per thread and GPU (each thread has its
// own stream, so workspaces are never shared between concurrent products).
constexpr std::size_t workspace_bytes = std::size_t{32} << 20;

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
}

// The cuBLASLt functions troupe calls, resolved from the library loaded at first use.
struct lt_api {
#define TROUPE_LT_FUNCTIONS(X)                                                                                  \
  X(cublasLtCreate)                                                                                             \
  X(cublasLtDestroy)                                                                                            \
  X(cublasLtGetStatusName)                                                                                      \
  X(cublasLtGetStatusString)                                                                                    \
  X(cublasLtMatmul)                                                                                             \
  X(cublasLtMatmulAlgoGetHeuristic)                                                                             \
  X(cublasLtMatmulDescCreate)                                                                                   \
  X(cublasLtMatmulDescDestroy)                                                                                  \
  X(cublasLtMatmulDescSetAttribute)                                                                             \
  X(cublasLtMatmulPreferenceCreate)                                                                             \
  X(cublasLtMatmulPreferenceDestroy)                                                                            \
  X(cublasLtMatmulPreferenceSetAttribute)                                                                       \
  X(cublasLtMatrixLayoutCreate)                                                                                 \
  X(cublasLtMatrixLayoutDestroy)
#define TROUPE_LT_POINTER(name) decltype(&::name) name = nullptr;
  TROUPE_LT_FUNCTIONS(TROUPE_LT_POINTER)
#undef TROUPE_LT_POINTER
};

#define TROUPE_LT_STRING2(x) #x
#define TROUPE_LT_STRING(x) TROUPE_LT_STRING2(x)
constexpr const char* lt_library = "libcublasLt.so." TROUPE_LT_STRING(CUBLAS_VER_MAJOR);

const lt_api& lt() {
  static std::once_flag once;
  static lt_api api;
  static std::string failure;
  std::call_once(once, [] {
    void* library = dlopen(lt_library, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      failure = std::string("GPU matrix products need cuBLASLt, and ") + lt_library + " could not be loaded (" +
                (why != nullptr ? why : "unknown reason") +
                "): install the CUDA toolkit's cuBLAS, or add the lib folder of PyTorch's nvidia-cublas package to "
                "LD_LIBRARY_PATH";
      return;
    }
#define TROUPE_LT_RESOLVE(name)                                                             \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name));                  \
  if (api.name == nullptr && failure.empty()) {                                            \
    failure = std::string(lt_library) + " has no " #name ": it is older than troupe needs"; \
  }
    TROUPE_LT_FUNCTIONS(TROUPE_LT_RESOLVE)
#undef TROUPE_LT_RESOLVE
  });
  if (!failure.empty()) throw std::runtime_error(failure);
  return api;
}

void check_blas(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLASLt ") + what + ": " + lt().cublasLtGetStatusName(rc) + " (" +
                             lt().cublasLtGetStatusString(rc) + ")");
  }
}

// The shape and mode of one product; with the GPU model, the key of its algorithm.
struct product_key {
  int major, minor, sms;
  std::int64_t m, n, k;
  bool ta, tb;
  int type;
  bool tf32;
  int epilogue;
  int align_a, align_b, align_c;  // the operands' address alignment, in bytes (at most 256)
  auto tie() const {
    return std::tie(major, minor, sms, m, n, k, ta, tb, type, tf32, epilogue, align_a, align_b, align_c);
  }
  bool operator<(const product_key& o) const { return tie() < o.tie(); }
};

// Descriptors of one product shape, made once per thread.
struct plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr;   // B as stored
  cublasLtMatrixLayout_t second = nullptr;  // A as stored
  cublasLtMatrixLayout_t out = nullptr;     // C^T, column-major [n, m]
  cublasLtMatmulAlgo_t algo{};

  plan() = default;
  plan(const plan&) = delete;
  plan& operator=(const plan&) = delete;
  ~plan() {
    if (out != nullptr) lt().cublasLtMatrixLayoutDestroy(out);
    if (second != nullptr) lt().cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) lt().cublasLtMatrixLayoutDestroy(first);
    if (op != nullptr) lt().cublasLtMatmulDescDestroy(op);
  }
};

struct device_model {
  int major = 0, minor = 0, sms = 0;
};

device_model model_of(int device) {
  static std::once_flag once[max_devices];
  static device_model models[max_devices];
  std::call_once(once[device], [device] {
    check_cuda(cudaDeviceGetAttribute(&models[device].major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&models[device].minor, cudaDevAttrComputeCapabilityMinor, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&models[device].sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
  });
  return models[device];
}

// The algorithm of each product, shared by every thread: the first to ask chooses.
struct algorithms {
  std::mutex mutex;
  std::map<product_key, cublasLtMatmulAlgo_t> chosen;
};

algorithms& shared_algorithms() {
  static auto* a = new algorithms;  // never destroyed: products may run during static destruction
  return *a;
}

// One thread's cuBLASLt handle, workspace and plans per GPU.
struct blas_thread {
  cublasLtHandle_t handle[max_devices] = {};
  void* workspace[max_devices] = {};
  std::map<product_key, plan> plans[max_devices];
  std::set<product_key> unfused[max_devices];  // products whose epilogue found no algorithm

  ~blas_thread() {
    for (int d = 0; d < max_devices; ++d) {
      if (handle[d] == nullptr) continue;
      cudaSetDevice(d);
      plans[d].clear();
      if (workspace[d] != nullptr) cudaFree(workspace[d]);  // waits for the work that used it
      lt().cublasLtDestroy(handle[d]);
    }
  }

  void ready(int device) {
    if (handle[device] != nullptr) return;
    check_blas(lt().cublasLtCreate(&handle[device]), "create");
    check_cuda(cudaMalloc(&workspace[device], workspace_bytes), "cudaMalloc (cuBLASLt workspace)");
  }
};

blas_thread& blas() {
  thread_local blas_thread b;
  return b;
}

cudaDataType_t data_type(base::scalar_type type) {
  switch (type) {
    case base::scalar_type::f32: return CUDA_R_32F;
    case base::scalar_type::f64: return CUDA_R_64F;
    default: break;
  }
  throw std::invalid_argument(std::string("matmul on a GPU: element type ") + base::scalar_name(type) +
                              " is not supported (expected float32 or float64)");
}

cublasComputeType_t compute_type(base::scalar_type type, bool tf32) {
  if (type == base::scalar_type::f64) return CUBLAS_COMPUTE_64F;
  return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void make_plan(plan& p, const product_key& key, cublasLtHandle_t handle, int device) {
  const base::scalar_type type = static_cast<base::scalar_type>(key.type);
  const cudaDataType_t dt = data_type(type);
  check_blas(lt().cublasLtMatmulDescCreate(&p.op, compute_type(type, key.tf32), dt), "matmul descriptor");
  const cublasOperation_t first_op = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t second_op = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_blas(lt().cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)),
             "transpose attribute");
  check_blas(lt().cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)),
             "transpose attribute");
  const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
  check_blas(lt().cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
             "epilogue attribute");
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    check_blas(lt().cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof(dt)),
               "bias type attribute");
  }
  // Stored B: row-major [k, n] (or [n, k] transposed) is column-major [n, k] (or [k, n]).
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  const std::int64_t first_rows = key.tb ? key.k : key.n;
  const std::int64_t first_cols = key.tb ? key.n : key.k;
  const std::int64_t second_rows = key.ta ? key.m : key.k;
  const std::int64_t second_cols = key.ta ? key.k : key.m;
  check_blas(lt().cublasLtMatrixLayoutCreate(&p.first, dt, u(first_rows), u(first_cols), first_rows), "layout");
  check_blas(lt().cublasLtMatrixLayoutCreate(&p.second, dt, u(second_rows), u(second_cols), second_rows), "layout");
  check_blas(lt().cublasLtMatrixLayoutCreate(&p.out, dt, u(key.n), u(key.m), key.n), "layout");

  algorithms& shared = shared_algorithms();
  std::lock_guard<std::mutex> lock(shared.mutex);
  auto found = shared.chosen.find(key);
  if (found != shared.chosen.end()) {
    p.algo = found->second;
    return;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check_blas(lt().cublasLtMatmulPreferenceCreate(&pref), "preference");
  const std::uint64_t workspace = workspace_bytes;
  // Fixed-order reductions only: split-K parts are added in the workspace or the output, in order.
  const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  // cuBLASLt assumes 256-byte aligned operands unless told: a view into a tensor may be less.
  const std::uint32_t align_first = static_cast<std::uint32_t>(key.align_b);
  const std::uint32_t align_second = static_cast<std::uint32_t>(key.align_a);
  const std::uint32_t align_out = static_cast<std::uint32_t>(key.align_c);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> attributes[] = {
      {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace},
      {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_out},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_out},
  };
  cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
  for (const auto& [attribute, value] : attributes) {
    const std::size_t size = attribute == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? sizeof(workspace)
                                                                                   : sizeof(std::uint32_t);
    if (rc == CUBLAS_STATUS_SUCCESS) rc = lt().cublasLtMatmulPreferenceSetAttribute(pref, attribute, value, size);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  if (rc == CUBLAS_STATUS_SUCCESS) {
    rc = lt().cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.first, p.second, p.out, p.out, pref, 1, &result,
                                        &found_count);
  }
  lt().cublasLtMatmulPreferenceDestroy(pref);
  check_blas(rc, "algorithm choice");
  if (found_count == 0) {
    throw std::runtime_error("cuBLASLt has no algorithm for a " + std::string(base::scalar_name(type)) +
                             " product [" + std::to_string(key.m) + ", " + std::to_string(key.k) + "] x [" +
                             std::to_string(key.k) + ", " + std::to_string(key.n) + "] on GPU:" +
                             std::to_string(device));
  }
  p.algo = result.algo;
  shared.chosen.emplace(key, p.algo);
}

// The largest power of two (at most 256) that divides the address.
int alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  int align = 256;
  while (align > 1 && address % static_cast<std::uintptr_t>(align) != 0) align /= 2;
  return align;
}

}  // namespace

void gemm(int device, const void* a, const void* b, void* c, std::int64_t m, std::int64_t n, std::int64_t k,
          bool transpose_a, bool transpose_b, base::scalar_type type, const void* bias, bool relu, bool tf32) {
  cudaStream_t st = static_cast<cudaStream_t>(stream(device));  // sets the device
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // cuBLASLt wants k > 0; an empty sum is zero, then the epilogue.
    zero(device, c, static_cast<std::size_t>(m * n) * base::scalar_size(type));
    if (bias != nullptr) bias_activation(device, c, bias, c, m, n, relu, type);
    return;
  }
  if (type != base::scalar_type::f32) tf32 = false;
  auto unfused = [&] {
    // The product, then the bias and activation by their own kernel.
    gemm(device, a, b, c, m, n, k, transpose_a, transpose_b, type, nullptr, false, tf32);
    if (bias != nullptr) {
      bias_activation(device, c, bias, c, m, n, relu, type);
    } else if (relu) {
      gpu::relu(device, c, c, m * n, type);
    }
  };
  // The epilogue is fused for float32 with an aligned bias (it reads the bias in vectors); float64
  // products, used for gradient checks, add it separately.
  if ((bias != nullptr || relu) &&
      (bias == nullptr || type != base::scalar_type::f32 || alignment(bias) < 16)) {
    unfused();
    return;
  }
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias != nullptr) epilogue = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  else if (relu) epilogue = CUBLASLT_EPILOGUE_RELU;
  const device_model model = model_of(device);
  const product_key key{model.major, model.minor, model.sms,  m, n, k, transpose_a, transpose_b,
                        static_cast<int>(type), tf32, static_cast<int>(epilogue), alignment(a), alignment(b),
                        alignment(c)};
  blas_thread& t = blas();
  t.ready(device);
  if (t.unfused[device].count(key) != 0) {
    unfused();
    return;
  }
  auto found = t.plans[device].find(key);
  if (found == t.plans[device].end()) {
    found = t.plans[device].try_emplace(key).first;
    try {
      make_plan(found->second, key, t.handle[device], device);
    } catch (const std::runtime_error&) {
      t.plans[device].erase(found);
      if (epilogue == CUBLASLT_EPILOGUE_DEFAULT) throw;
      // No algorithm with this epilogue for this shape: the product alone, from now on.
      t.unfused[device].insert(key);
      unfused();
      return;
    }
  }
  plan& p = found->second;
  if (bias != nullptr) {
    check_blas(lt().cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
               "bias attribute");
  }
  const double one64 = 1.0, zero64 = 0.0;
  const float one32 = 1.0f, zero32 = 0.0f;
  const bool wide = type == base::scalar_type::f64;
  const void* alpha = wide ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* beta = wide ? static_cast<const void*>(&zero64) : static_cast<const void*>(&zero32);
  check_blas(lt().cublasLtMatmul(t.handle[device], p.op, alpha, b, p.first, a, p.second, beta, c, p.out, c, p.out, &p.algo,
                            t.workspace[device], workspace_bytes, st),
             "matmul");
  finish_work(device, "cuBLASLt matmul");
}

}  // namespace troupe::detail::gpu
