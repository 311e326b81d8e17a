#include "troupe/tensor.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "axis.hpp"
#include "troupe/base/quote.hpp"
#include "elements.hpp"
#include "gpu/gpu.hpp"
#include "storage.hpp"
#include "tape.hpp"
#include "troupe/kernels/half_kernels.hpp"

namespace troupe {

std::string_view dtype_name(DType dtype) { return base::scalar_name(detail::to_scalar_type(dtype)); }

std::size_t dtype_size(DType dtype) { return base::scalar_size(detail::to_scalar_type(dtype)); }

DType dtype_from_name(std::string_view name) {
  constexpr DType all[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16};
  std::string names;
  for (DType d : all) {
    if (dtype_name(d) == name) return d;
    names += (names.empty() ? "\"" : ", \"") + std::string(dtype_name(d)) + "\"";
  }
  throw std::invalid_argument("dtype_from_name: unknown dtype " + base::quoted(name) + " (expected one of " + names +
                              ")");
}

std::string shape_to_string(const Shape& shape) { return base::shape_string(shape); }

std::int64_t shape_num_elements(const Shape& shape) {
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("shape " + shape_to_string(shape) + " has a negative dimension");
    empty = empty || d == 0;
  }
  if (empty) return 0;  // [0, 2^40, 2^40] is a valid empty shape
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw std::invalid_argument("shape " + shape_to_string(shape) +
                                  " has too many elements (its product overflows 64 bits; at most " +
                                  std::to_string(std::numeric_limits<std::int64_t>::max()) + ")");
    }
  }
  return n;
}

namespace {

bool is_16bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// Calls f(T{}) with T the C++ type of `dtype`, for the types with C++ arithmetic; the 16-bit
// types compute in float32 and never get here (their callers convert first).
template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::f16:
    case DType::bf16: break;
  }
  throw std::logic_error(std::string("tensor kernel: no arithmetic on ") + std::string(dtype_name(dtype)) +
                         " elements here (they are computed in float32)");
}

// As dispatch, over every element type (for conversions and printing).
template <class F>
decltype(auto) dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f16: return f(float16_t{});
    case DType::bf16: return f(bfloat16_t{});
    default: return dispatch(dtype, std::forward<F>(f));
  }
}

template <class T>
constexpr bool is_half_v = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;

// One element converted as Tensor::cast converts: C++'s conversions, and the 16-bit types
// through float32 (exact) on the way out and rounded once to nearest even on the way in.
template <class To, class From>
To convert(From v) {
  if constexpr (is_half_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (is_half_v<To>) {
    return To(v);
  } else {
    return static_cast<To>(v);
  }
}

template <class T>
void append_value(std::string& out, T v) {
  if constexpr (is_half_v<T>) {
    append_value(out, static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) {
      out += "nan";
      return;
    }
    if (std::isinf(v)) {
      out += v > 0 ? "inf" : "-inf";
      return;
    }
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    std::string_view s(buf, static_cast<std::size_t>(res.ptr - buf));
    out += s;
    if (s.find_first_of(".e") == std::string_view::npos) out += ".0";
  } else {
    out += std::to_string(v);
  }
}

template <class T>
void append_nested(std::string& out, const T* data, const Shape& shape, std::size_t dim, std::int64_t& pos) {
  if (dim == shape.size()) {
    append_value(out, data[pos++]);
    return;
  }
  out += '[';
  for (std::int64_t i = 0; i < shape[dim]; ++i) {
    if (i) out += ", ";
    append_nested(out, data, shape, dim + 1, pos);
  }
  out += ']';
}

using binop = detail::gpu::binary_op;

// Where a device keeps its elements: -1 for the host (every CPU device), else the GPU's index.
int memory_of(const Device& d) { return d.is_gpu() ? d.index() : -1; }

// Operands of one operation must share memory: a CPU tensor and a GPU tensor, or tensors on two
// GPUs, are an error naming both devices.
void check_same_memory(const char* op, const Device& a, const Device& b) {
  if (memory_of(a) != memory_of(b)) {
    throw std::invalid_argument(std::string(op) + ": operands are on " + a.to_string() + " and " + b.to_string() +
                                " (move one with to() first)");
  }
}

const char* binop_name(binop op) {
  switch (op) {
    case binop::add: return "operator+";
    case binop::sub: return "operator-";
    case binop::mul: return "operator*";
    case binop::div: return "operator/";
  }
  return "?";
}

template <class T>
T apply(binop op, T a, T b) {
  switch (op) {
    case binop::add: return a + b;
    case binop::sub: return a - b;
    case binop::mul: return a * b;
    case binop::div:
      if constexpr (std::is_integral_v<T>) {
        if (b == 0) throw std::invalid_argument("operator/: integer division by zero");
      }
      return a / b;
  }
  return a;
}

template <class T>
void apply_loop(binop op, const T* a, const T* b, T* out, std::int64_t n) {
  switch (op) {
    case binop::add: for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i]; return;
    case binop::sub: for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i]; return;
    case binop::mul: for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i]; return;
    case binop::div: for (std::int64_t i = 0; i < n; ++i) out[i] = apply(op, a[i], b[i]); return;
  }
}

Tensor binary(binop op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    throw std::invalid_argument(std::string(binop_name(op)) + ": operands differ: " + std::string(dtype_name(a.dtype())) +
                                " " + shape_to_string(a.shape()) + " and " + std::string(dtype_name(b.dtype())) + " " +
                                shape_to_string(b.shape()) + " (elementwise operations need one shape and dtype)");
  }
  check_same_memory(binop_name(op), a.device(), b.device());
  if (is_16bit(a.dtype())) return binary(op, a.cast(DType::f32), b.cast(DType::f32)).cast(a.dtype());
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.is_gpu()) {
    detail::gpu::binary(a.device().index(), op, a.raw_data(), b.raw_data(), out.raw_mutable_data(), a.num_elements(),
                        detail::to_scalar_type(a.dtype()));
    return out;
  }
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_loop<T>(op, a.data<T>(), b.data<T>(), out.mutable_data<T>(), a.num_elements());
  });
  return out;
}

template <class T>
T scalar_as(const Scalar& s, const char* op) {
  if constexpr (std::is_floating_point_v<T>) {
    return s.is_floating ? static_cast<T>(s.f) : static_cast<T>(s.i);
  } else {
    if (!s.is_floating) {
      if (s.i < std::numeric_limits<T>::min() || s.i > std::numeric_limits<T>::max()) {
        throw std::invalid_argument(std::string(op) + ": scalar " + std::to_string(s.i) + " does not fit in " +
                                    std::string(dtype_name(dtype_v<T>)));
      }
      return static_cast<T>(s.i);
    }
    if (!(std::trunc(s.f) == s.f) || s.f < static_cast<double>(std::numeric_limits<T>::min()) ||
        s.f > static_cast<double>(std::numeric_limits<T>::max())) {
      std::ostringstream m;
      m << op << ": scalar " << s.f << " cannot be converted to " << dtype_name(dtype_v<T>) << " without loss";
      throw std::invalid_argument(m.str());
    }
    return static_cast<T>(s.f);
  }
}

Tensor binary_scalar(binop op, const Tensor& a, const Scalar& s, bool scalar_first) {
  if (is_16bit(a.dtype())) return binary_scalar(op, a.cast(DType::f32), s, scalar_first).cast(a.dtype());
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.is_gpu()) {
    dispatch(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T v = scalar_as<T>(s, binop_name(op));
      const double f = std::is_floating_point_v<T> ? static_cast<double>(v) : 0.0;
      const std::int64_t i = std::is_floating_point_v<T> ? 0 : static_cast<std::int64_t>(v);
      if constexpr (std::is_integral_v<T>) {
        if (op == binop::div && !scalar_first && v == 0) throw std::invalid_argument("operator/: integer division by zero");
      }
      detail::gpu::binary_scalar(a.device().index(), op, a.raw_data(), f, i, scalar_first, out.raw_mutable_data(),
                                 a.num_elements(), detail::to_scalar_type(a.dtype()));
    });
    return out;
  }
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = scalar_as<T>(s, binop_name(op));
    const T* in = a.data<T>();
    T* o = out.mutable_data<T>();
    const std::int64_t n = a.num_elements();
    if (scalar_first) {
      for (std::int64_t i = 0; i < n; ++i) o[i] = apply(op, v, in[i]);
    } else if (op == binop::div && std::is_integral_v<T>) {
      for (std::int64_t i = 0; i < n; ++i) o[i] = apply(op, in[i], v);
    } else {
      switch (op) {
        case binop::add: for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] + v; break;
        case binop::sub: for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] - v; break;
        case binop::mul: for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] * v; break;
        case binop::div: for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] / v; break;
      }
    }
  });
  return out;
}

}  // namespace

namespace detail {

int checked_axis(const char* op, int axis, int rank) {
  if (rank == 0 || axis < -rank || axis >= rank) {
    throw std::invalid_argument(std::string(op) + ": axis " + std::to_string(axis) + " out of range for rank-" +
                                std::to_string(rank) + " tensor (expected " +
                                (rank == 0 ? std::string("a tensor of rank >= 1") : "0.." + std::to_string(rank - 1)) +
                                ")");
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace detail

Tensor::Tensor() : Tensor(detail::allocate_storage(0), Shape{0}, DType::f32, Device{}) {}

Tensor::Tensor(std::shared_ptr<detail::Storage> storage, Shape shape, DType dtype, Device device,
               std::size_t offset)
    : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype),
      num_elements_(shape_num_elements(shape_)), device_(std::move(device)), offset_(offset) {}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const std::int64_t n = shape_num_elements(shape);
  std::size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(n), dtype_size(dtype), &nbytes) ||
      nbytes > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max())) {
    throw std::invalid_argument("Tensor of shape " + shape_to_string(shape) + " and dtype " +
                                std::string(dtype_name(dtype)) + ": " + std::to_string(n) +
                                " elements need more bytes than an address space holds");
  }
  if (device.is_gpu() && !detail::gpu::built_with_cuda()) {
    throw std::invalid_argument("Tensor on " + device.to_string() +
                                ": this build of troupe has no GPU support (it was built without CUDA)");
  }
  std::shared_ptr<detail::Storage> storage;
  try {
    storage = detail::allocate_storage(nbytes, device);
  } catch (const std::bad_alloc&) {
    // Still a std::bad_alloc, but one that names the tensor and its size.
    throw detail::named_bad_alloc("Tensor of shape " + shape_to_string(shape) + " and dtype " +
                              std::string(dtype_name(dtype)) + " on " + device.to_string() + ": cannot allocate " +
                              std::to_string(nbytes) + " bytes (out of memory; a smaller model or batch needs less)");
  }
  return Tensor(std::move(storage), std::move(shape), dtype, std::move(device));
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, std::move(device));
  if (t.is_gpu()) {
    detail::gpu::zero(t.device().index(), t.raw_mutable_data(), t.nbytes());
  } else if (t.nbytes() > 0) {
    std::memset(t.raw_mutable_data(), 0, t.nbytes());
  }
  return t;
}

Tensor Tensor::full(Shape shape, Scalar value, DType dtype, Device device) {
  if (is_16bit(dtype)) {
    // The value rounded once to the format, from the double or integer it was given.
    Tensor t = empty(std::move(shape), dtype);
    std::uint16_t bits = 0;
    if (dtype == DType::f16) {
      bits = (value.is_floating ? float16_t(value.f) : float16_t(value.i)).bits;
    } else {
      bits = (value.is_floating ? bfloat16_t(value.f) : bfloat16_t(value.i)).bits;
    }
    auto* p = static_cast<std::uint16_t*>(t.raw_mutable_data());
    for (std::int64_t i = 0; i < t.num_elements(); ++i) p[i] = bits;
    return device.is_gpu() ? t.to(device) : t;
  }
  if (device.is_gpu()) {
    // A fill kernel takes its value as a double: exact for every float and int32, and for int64
    // up to 2^53; beyond that the tensor is made on the host and copied.
    const bool exact = dispatch(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T v = scalar_as<T>(value, "full");
      return static_cast<T>(static_cast<double>(v)) == v || std::is_floating_point_v<T>;
    });
    if (!exact) return full(std::move(shape), value, dtype).to(device);
    Tensor t = empty(std::move(shape), dtype, std::move(device));
    const double v = dispatch(dtype, [&](auto tag) {
      using T = decltype(tag);
      return static_cast<double>(scalar_as<T>(value, "full"));
    });
    detail::gpu::fill(t.device().index(), t.raw_mutable_data(), t.num_elements(), detail::to_scalar_type(dtype), v);
    return t;
  }
  Tensor t = empty(std::move(shape), dtype, std::move(device));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = scalar_as<T>(value, "full");
    T* p = t.mutable_data<T>();
    for (std::int64_t i = 0; i < t.num_elements(); ++i) p[i] = v;
  });
  return t;
}

Tensor Tensor::range(std::int64_t n, DType dtype) {
  if (n < 0) throw std::invalid_argument("range: n must be >= 0, got " + std::to_string(n));
  Tensor t = empty(Shape{n}, dtype);
  dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.mutable_data<T>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = convert<T>(i);
  });
  return t;
}

Tensor Tensor::from_bytes(const void* data, std::size_t nbytes, DType dtype, Shape shape) {
  const std::int64_t n = shape_num_elements(shape);
  std::size_t want = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(n), dtype_size(dtype), &want) || want != nbytes) {
    throw std::invalid_argument("from_vector: " + std::to_string(nbytes / dtype_size(dtype)) +
                                " values do not fill shape " + shape_to_string(shape) + " (" + std::to_string(n) +
                                " elements)");
  }
  Tensor t = empty(std::move(shape), dtype);
  if (nbytes > 0) std::memcpy(t.raw_mutable_data(), data, nbytes);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  int inferred = -1;
  std::int64_t known = 1;
  bool overflow = false;
  bool zero = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw std::invalid_argument("reshape: bad dimension " + std::to_string(shape[i]) + " in " + shape_to_string(shape));
    } else {
      zero = zero || shape[i] == 0;
      overflow = __builtin_mul_overflow(known, shape[i], &known) || overflow;
    }
  }
  if (zero) {
    known = 0;
  } else if (overflow) {
    throw std::invalid_argument("reshape: shape " + shape_to_string(shape) +
                                " has too many elements (its product overflows 64 bits)");
  }
  if (inferred >= 0) {
    if (known == 0 || num_elements_ % known != 0) {
      throw std::invalid_argument("reshape: cannot infer the -1 in " + shape_to_string(shape) + " for " +
                                  std::to_string(num_elements_) + " elements");
    }
    shape[static_cast<std::size_t>(inferred)] = num_elements_ / known;
  } else if (known != num_elements_) {
    throw std::invalid_argument("reshape: cannot reshape a tensor of shape " + shape_to_string(shape_) + " (" +
                                std::to_string(num_elements_) + " elements) into shape " + shape_to_string(shape) +
                                " (" + std::to_string(known) + " elements)");
  }
  Tensor out(storage_, std::move(shape), dtype_, device_, offset_);
  if (detail::recording({this})) {
    detail::record(out, {*this}, [from = shape_](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(from)}; });
  }
  return out;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (shape_.empty()) throw std::out_of_range("slice: a scalar has no rows");
  if (begin < 0 || begin > end || end > shape_[0]) {
    throw std::out_of_range("slice: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") out of range for a tensor of shape " + shape_to_string(shape_));
  }
  Shape shape = shape_;
  shape[0] = end - begin;
  const std::size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<std::size_t>(shape_[0]);
  return Tensor(storage_, std::move(shape), dtype_, device_, offset_ + static_cast<std::size_t>(begin) * row_bytes);
}

Tensor Tensor::with_device(Device device) const {
  if (memory_of(device) == memory_of(device_)) return Tensor(storage_, shape_, dtype_, std::move(device), offset_);
  Tensor out = empty(shape_, dtype_, std::move(device));
  detail::gpu::copy(out.raw_mutable_data(), memory_of(out.device_), raw_data(), memory_of(device_), nbytes());
  return out;
}

Tensor Tensor::cast(DType dtype) const {
  Tensor out = cast_elements(dtype);
  // A cast between floating types passes gradients back, cast to the source's dtype (as
  // TensorFlow's Cast does: a float16 computation's gradient reaches a float32 variable).
  if (dtype_is_floating(dtype) && dtype_is_floating(dtype_) && detail::recording({this})) {
    detail::record(out, {*this}, [from = dtype_](const Tensor& g) -> std::vector<Tensor> { return {g.cast(from)}; });
  }
  return out;
}

Tensor Tensor::cast_elements(DType dtype) const {
  Tensor out = empty(shape_, dtype, device_);
  if (is_gpu()) {
    detail::gpu::cast(device_.index(), raw_data(), detail::to_scalar_type(dtype_), out.raw_mutable_data(),
                      detail::to_scalar_type(dtype), num_elements_);
    return out;
  }
  if (dtype == dtype_) {  // a copy: the bits as they are (a 16-bit NaN keeps its payload)
    if (nbytes() > 0) std::memcpy(out.raw_mutable_data(), raw_data(), nbytes());
    return out;
  }
  if (dtype_ == DType::f32 && is_16bit(dtype)) {  // the common case, eight at a time
    kernels::compress_range(data<float>(), static_cast<std::uint16_t*>(out.raw_mutable_data()), num_elements_,
                            detail::to_scalar_type(dtype));
    return out;
  }
  if (is_16bit(dtype_) && dtype == DType::f32) {
    kernels::decompress_range(static_cast<const std::uint16_t*>(raw_data()), out.mutable_data<float>(), num_elements_,
                              detail::to_scalar_type(dtype_));
    return out;
  }
  dispatch_all(dtype_, [&](auto from_tag) {
    using From = decltype(from_tag);
    dispatch_all(dtype, [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* in = data<From>();
      To* o = out.mutable_data<To>();
      for (std::int64_t i = 0; i < num_elements_; ++i) o[i] = convert<To>(in[i]);
    });
  });
  return out;
}

const void* Tensor::raw_data() const noexcept {
  return storage_ && storage_->data ? static_cast<const char*>(storage_->data) + offset_ : nullptr;
}
void* Tensor::raw_mutable_data() noexcept {
  return storage_ && storage_->data ? static_cast<char*>(storage_->data) + offset_ : nullptr;
}

void Tensor::check_dtype(DType expected, const char* op) const {
  if (expected != dtype_) {
    throw std::invalid_argument(std::string(op) + ": tensor has dtype " + std::string(dtype_name(dtype_)) +
                                ", asked for " + std::string(dtype_name(expected)));
  }
}

void Tensor::check_host(const char* op) const {
  if (is_gpu()) {
    throw std::invalid_argument(std::string(op) + ": the tensor is on " + device_.to_string() +
                                "; its elements are in GPU memory (copy it to the host with to(Device()) first, "
                                "or read it with to_vector/item)");
  }
}

void Tensor::copy_to_host(void* host) const {
  if (nbytes() == 0) return;
  if (is_gpu()) {
    detail::gpu::copy(host, -1, raw_data(), device_.index(), nbytes());
  } else {
    std::memcpy(host, raw_data(), nbytes());
  }
}

void Tensor::check_single_element(const char* op) const {
  if (num_elements_ != 1) {
    throw std::invalid_argument(std::string(op) + ": needs exactly one element, tensor of shape " +
                                shape_to_string(shape_) + " has " + std::to_string(num_elements_));
  }
}

std::string Tensor::to_string() const {
  if (is_gpu()) return to(Device()).to_string();
  std::string out;
  dispatch_all(dtype_, [&](auto tag) {
    using T = decltype(tag);
    std::int64_t pos = 0;
    append_nested(out, static_cast<const T*>(raw_data()), shape_, 0, pos);
  });
  return out;
}

bool Tensor::equals(const Tensor& other) const {
  if (is_gpu() || other.is_gpu()) {
    if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
    return to(Device()).equals(other.to(Device()));
  }
  return dtype_ == other.dtype_ && shape_ == other.shape_ &&
         (nbytes() == 0 || std::memcmp(raw_data(), other.raw_data(), nbytes()) == 0);
}

namespace {

// The elementwise operations as a GradientTape records them (see tape.hpp).
Tensor taped_binary(binop op, const Tensor& a, const Tensor& b) {
  Tensor out = binary(op, a, b);
  if (!detail::recording({&a, &b})) return out;
  const Tensor pa = detail::untaped(a);
  const Tensor pb = detail::untaped(b);
  detail::record(out, {a, b}, [op, pa, pb](const Tensor& g) -> std::vector<Tensor> {
    switch (op) {
      case binop::add: return {g, g};
      case binop::sub: return {g, -g};
      case binop::mul: return {g * pb, g * pa};
      case binop::div: return {g / pb, -(g * pa) / (pb * pb)};
    }
    return {};
  });
  return out;
}

Tensor taped_scalar(binop op, const Tensor& a, const Scalar& s, bool scalar_first) {
  Tensor out = binary_scalar(op, a, s, scalar_first);
  if (!detail::recording({&a})) return out;
  const Tensor pa = detail::untaped(a);
  detail::record(out, {a}, [op, pa, s, scalar_first](const Tensor& g) -> std::vector<Tensor> {
    switch (op) {
      case binop::add: return {g};
      case binop::sub: return {scalar_first ? binary_scalar(binop::sub, g, Scalar(0), true) : g};
      case binop::mul: return {binary_scalar(binop::mul, g, s, false)};
      case binop::div:
        // a / s: g / s; s / a: -g·s / a².
        if (!scalar_first) return {binary_scalar(binop::div, g, s, false)};
        return {binary_scalar(binop::sub, binary_scalar(binop::mul, g, s, false) / (pa * pa), Scalar(0), true)};
    }
    return {};
  });
  return out;
}

}  // namespace

Tensor operator+(const Tensor& a, const Tensor& b) { return taped_binary(binop::add, a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return taped_binary(binop::sub, a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return taped_binary(binop::mul, a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return taped_binary(binop::div, a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return taped_scalar(binop::add, a, b, false); }
Tensor operator-(const Tensor& a, Scalar b) { return taped_scalar(binop::sub, a, b, false); }
Tensor operator*(const Tensor& a, Scalar b) { return taped_scalar(binop::mul, a, b, false); }
Tensor operator/(const Tensor& a, Scalar b) { return taped_scalar(binop::div, a, b, false); }
Tensor operator+(Scalar a, const Tensor& b) { return taped_scalar(binop::add, b, a, true); }
Tensor operator-(Scalar a, const Tensor& b) { return taped_scalar(binop::sub, b, a, true); }
Tensor operator*(Scalar a, const Tensor& b) { return taped_scalar(binop::mul, b, a, true); }
Tensor operator/(Scalar a, const Tensor& b) { return taped_scalar(binop::div, b, a, true); }
Tensor operator-(const Tensor& a) { return taped_scalar(binop::sub, a, Scalar(0), true); }

Tensor stack(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw std::invalid_argument("stack: needs at least one tensor");
  const Tensor& first = parts[0];
  Shape shape = first.shape();
  shape.insert(shape.begin(), static_cast<std::int64_t>(parts.size()));
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  auto* o = static_cast<char*>(out.raw_mutable_data());
  const int memory = memory_of(first.device());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    check_same_memory("stack", first.device(), p.device());
    base::check_agree("stack", detail::sent("part 0", first, "is"), detail::sent("part " + std::to_string(i), p, "is"),
                      -1, "; stacked tensors need one shape and dtype");
    if (memory >= 0) {
      detail::gpu::copy(o, memory, p.raw_data(), memory, p.nbytes());
    } else if (p.nbytes() > 0) {
      std::memcpy(o, p.raw_data(), p.nbytes());
    }
    o += p.nbytes();
  }
  return out;
}

Tensor concat(const std::vector<Tensor>& parts, int axis) {
  if (parts.empty()) throw std::invalid_argument("concat: needs at least one tensor");
  const Tensor& first = parts[0];
  const int ax = detail::checked_axis("concat", axis, first.rank());
  Shape shape = first.shape();
  std::int64_t along = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    base::check_agree("concat", detail::sent("part 0", first, "is"), detail::sent("part " + std::to_string(i), p, "is"),
                      ax, "; only dimension " + std::to_string(ax) + " may differ");
    check_same_memory("concat", first.device(), p.device());
    along += p.shape()[static_cast<std::size_t>(ax)];
  }
  shape[static_cast<std::size_t>(ax)] = along;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  std::int64_t outer = 1;
  for (int d = 0; d < ax; ++d) outer *= shape[static_cast<std::size_t>(d)];
  std::size_t inner = dtype_size(first.dtype());
  for (std::size_t d = static_cast<std::size_t>(ax) + 1; d < shape.size(); ++d) inner *= static_cast<std::size_t>(shape[d]);
  auto* o = static_cast<char*>(out.raw_mutable_data());
  if (first.is_gpu()) {
    // One strided copy per part: `outer` rows of the part's bytes into the output's rows.
    std::size_t column = 0;
    const std::size_t out_row = static_cast<std::size_t>(along) * inner;
    for (const Tensor& p : parts) {
      const std::size_t bytes = static_cast<std::size_t>(p.shape()[static_cast<std::size_t>(ax)]) * inner;
      detail::gpu::copy_rows(first.device().index(), o + column, out_row, p.raw_data(), bytes, bytes,
                             static_cast<std::size_t>(outer));
      column += bytes;
    }
    return out;
  }
  for (std::int64_t i = 0; i < outer; ++i) {
    for (const Tensor& p : parts) {
      const std::size_t bytes = static_cast<std::size_t>(p.shape()[static_cast<std::size_t>(ax)]) * inner;
      if (bytes == 0) continue;
      std::memcpy(o, static_cast<const char*>(p.raw_data()) + static_cast<std::size_t>(i) * bytes, bytes);
      o += bytes;
    }
  }
  return out;
}

namespace {
Tensor reduce_sum_untaped(const Tensor& t, int axis);
}  // namespace

Tensor reduce_sum(const Tensor& t, int axis) {
  Tensor out = reduce_sum_untaped(t, axis);
  if (detail::recording({&t})) {
    const int ax = detail::checked_axis("reduce_sum", axis, t.rank());
    detail::record(out, {t}, [ax, shape = t.shape(), dtype = t.dtype()](const Tensor& g) -> std::vector<Tensor> {
      // The gradient of every summed element is the gradient of its sum: g repeated along the axis.
      Shape kept = shape;
      const std::int64_t along = kept[static_cast<std::size_t>(ax)];
      if (along == 0) return {Tensor::zeros(shape, dtype, g.device())};
      kept[static_cast<std::size_t>(ax)] = 1;
      return {concat(std::vector<Tensor>(static_cast<std::size_t>(along), g.reshape(kept)), ax)};
    });
  }
  return out;
}

namespace {
Tensor reduce_sum_untaped(const Tensor& t, int axis) {
  // 16-bit elements are summed in float32 and rounded once.
  if (is_16bit(t.dtype())) return reduce_sum_untaped(t.cast(DType::f32), axis).cast(t.dtype());
  const int ax = detail::checked_axis("reduce_sum", axis, t.rank());
  Shape shape = t.shape();
  const std::int64_t along = shape[static_cast<std::size_t>(ax)];
  shape.erase(shape.begin() + ax);
  std::int64_t outer = 1;
  for (int d = 0; d < ax; ++d) outer *= t.shape()[static_cast<std::size_t>(d)];
  std::int64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(ax) + 1; d < t.shape().size(); ++d) inner *= t.shape()[d];
  if (t.is_gpu()) {
    Tensor out = Tensor::empty(shape, t.dtype(), t.device());
    detail::gpu::reduce_axis(t.device().index(), t.raw_data(), out.raw_mutable_data(), outer, along, inner,
                             detail::to_scalar_type(t.dtype()));
    return out;
  }
  Tensor out = Tensor::zeros(shape, t.dtype(), t.device());
  dispatch(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.data<T>();
    T* o = out.mutable_data<T>();
    for (std::int64_t i = 0; i < outer; ++i) {
      for (std::int64_t a = 0; a < along; ++a) {
        const T* row = in + (i * along + a) * inner;
        T* dst = o + i * inner;
        for (std::int64_t k = 0; k < inner; ++k) dst[k] += row[k];
      }
    }
  });
  return out;
}

}  // namespace

}  // namespace troupe
