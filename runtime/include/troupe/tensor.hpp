#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/dtype.hpp"

namespace troupe {

/// Dimensions of a tensor, outermost first.
using Shape = std::vector<std::int64_t>;

/// "[4, 2]"; "[]" for a scalar.
std::string shape_to_string(const Shape& shape);

/// Number of elements of a shape; a negative dimension throws std::invalid_argument.
std::int64_t shape_num_elements(const Shape& shape);

namespace detail {
struct Storage;
struct TapeNode;
struct TapeAccess;
}

/// A scalar operand of an elementwise operation, converted to the tensor's dtype.
struct Scalar {
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T v) : is_floating(std::is_floating_point_v<T>),  // NOLINT: implicit on purpose
                f(static_cast<double>(v)),
        i(std::is_floating_point_v<T> ? 0 : static_cast<std::int64_t>(v)) {}
  bool is_floating;
  double f;
  std::int64_t i;
};

/// A dense, row-major tensor on one device. Storage is refcounted and shared: copying a Tensor,
/// reshaping it or passing it to a replica never copies its bytes. Tensors are values: every
/// operation returns a new tensor and never changes the storage of its operands.
///
/// A tensor on a GPU ("GPU:0") keeps its elements in that GPU's memory; its operations run as
/// CUDA kernels on the calling thread's stream for that GPU (each replica has its own), and a
/// result is on the device of its operands (operands on different devices are an error naming
/// both). Reading the elements on the host (to_vector, item, to_string, equals) copies them back
/// and waits for the work pending on them; data() and mutable_data() give host memory only and
/// throw for a GPU tensor. to() moves a tensor between the host and a GPU.
class Tensor {
 public:
  /// An empty f32 tensor of shape [0].
  Tensor();

  /// A tensor holding `values` in `shape`; the element count must match (std::invalid_argument).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape) {
    return from_bytes(values.data(), values.size() * sizeof(T), dtype_v<T>, std::move(shape));
  }
  /// A rank-1 tensor holding `values`.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<std::int64_t>(values.size())});
  }
  /// A rank-0 tensor.
  template <class T>
  static Tensor scalar(T value) {
    return from_bytes(&value, sizeof(T), dtype_v<T>, Shape{});
  }
  /// A tensor of zeros.
  static Tensor zeros(Shape shape, DType dtype = DType::f32, Device device = {});
  /// A tensor filled with one value, converted to `dtype`.
  static Tensor full(Shape shape, Scalar value, DType dtype = DType::f32, Device device = {});
  /// 0..n-1, shape [n].
  static Tensor range(std::int64_t n, DType dtype = DType::i64);
  /// A tensor whose bytes are not initialised: for kernels that write every element.
  static Tensor empty(Shape shape, DType dtype, Device device = {});
  /// Copies `nbytes` bytes, which must be exactly the size of `shape` in `dtype`.
  static Tensor from_bytes(const void* data, std::size_t nbytes, DType dtype, Shape shape);

  /// The same storage seen with another shape; a different element count throws
  /// std::invalid_argument. One dimension may be -1 and is then inferred.
  Tensor reshape(Shape shape) const;
  /// Rows [begin, end) along axis 0, sharing this tensor's storage (no copy). Needs rank >= 1 and
  /// 0 <= begin <= end <= shape()[0] (std::out_of_range otherwise).
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  /// This tensor on `device`: the same storage relabelled when both devices share memory (CPU
  /// devices all share the host's), else a copy into the device's memory (host <-> GPU through
  /// pinned staging buffers, GPU <-> GPU directly).
  Tensor with_device(Device device) const;
  /// with_device(device): the name PyTorch users look for.
  Tensor to(const Device& device) const { return with_device(device); }
  /// True when the elements live in a GPU's memory.
  bool is_gpu() const noexcept { return device_.is_gpu(); }
  /// A copy converted to `dtype` (tf.cast): C++'s conversions (float to integer truncates toward
  /// zero); into float16 and bfloat16 rounded once to nearest, ties to even, NaN and infinities
  /// kept, a magnitude past the format's largest finite value becomes infinite. A GradientTape
  /// passes gradients back through a cast between floating dtypes.
  Tensor cast(DType dtype) const;

  const Shape& shape() const noexcept { return shape_; }
  DType dtype() const noexcept { return dtype_; }
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  std::int64_t num_elements() const noexcept { return num_elements_; }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(num_elements_) * dtype_size(dtype_); }
  const Device& device() const noexcept { return device_; }

  /// The elements in host memory; T must match dtype() (std::invalid_argument otherwise), and the
  /// tensor must not be on a GPU (std::invalid_argument: copy it with to(Device()) first).
  template <class T>
  const T* data() const {
    check_dtype(dtype_v<T>, "data");
    check_host("data");
    return static_cast<const T*>(raw_data());
  }
  /// Writable elements. Writing changes every tensor sharing this storage: use it only on a
  /// tensor you just created (Tensor::empty) and have not shared yet.
  template <class T>
  T* mutable_data() {
    check_dtype(dtype_v<T>, "mutable_data");
    check_host("mutable_data");
    return static_cast<T*>(raw_mutable_data());
  }
  /// The first element's address: in host memory, or in the GPU's memory for a GPU tensor.
  const void* raw_data() const noexcept;
  void* raw_mutable_data() noexcept;

  /// The elements as a vector; T must match dtype() (std::invalid_argument otherwise). A GPU
  /// tensor is copied back to the host.
  template <class T>
  std::vector<T> to_vector() const {
    check_dtype(dtype_v<T>, "to_vector");
    std::vector<T> out(static_cast<std::size_t>(num_elements_));
    copy_to_host(out.data());
    return out;
  }
  /// The only element; std::invalid_argument unless num_elements() == 1 and T matches dtype().
  template <class T>
  T item() const {
    check_single_element("item");
    check_dtype(dtype_v<T>, "item");
    T value{};
    copy_to_host(&value);
    return value;
  }
  /// Nested lists, as NumPy prints them: "[[1, 2], [3, 4]]"; floats keep a decimal point ("6.0").
  std::string to_string() const;

  /// True when both tensors have the same dtype, shape and bytes.
  bool equals(const Tensor& other) const;
  /// A reference that keeps this tensor's bytes alive (for code that hands raw pointers to
  /// another thread).
  std::shared_ptr<const void> storage_handle() const noexcept { return storage_; }
  /// True when both share one storage (no copy was made between them).
  bool shares_storage_with(const Tensor& other) const noexcept { return storage_ == other.storage_; }

 private:
  Tensor(std::shared_ptr<detail::Storage> storage, Shape shape, DType dtype, Device device,
         std::size_t offset = 0);
  Tensor cast_elements(DType dtype) const;
  void check_dtype(DType expected, const char* op) const;
  void check_single_element(const char* op) const;
  void check_host(const char* op) const;
  /// Copies nbytes() bytes to `host`, from wherever the elements live.
  void copy_to_host(void* host) const;

  std::shared_ptr<detail::Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::int64_t num_elements_ = 0;
  Device device_;
  std::size_t offset_ = 0;  // bytes into storage_ where this tensor's elements start
  // The GradientTape operation that made this tensor, null when none recorded it.
  std::shared_ptr<detail::TapeNode> tape_node_;
  friend struct detail::TapeAccess;
};

/// Elementwise arithmetic between tensors of one shape and dtype (a mismatch throws
/// std::invalid_argument naming both), or between a tensor and a scalar converted to its dtype.
/// Integer division truncates toward zero; an integer division by zero throws.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);

/// Stacks tensors of one shape and dtype along a new axis 0: n tensors of shape S give [n] + S.
Tensor stack(const std::vector<Tensor>& parts);
/// Concatenates tensors along `axis`; every other dimension and the dtype must agree.
Tensor concat(const std::vector<Tensor>& parts, int axis);
/// Sums along `axis`, removing it.
Tensor reduce_sum(const Tensor& t, int axis);

}  // namespace troupe
