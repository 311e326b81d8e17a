#include "distribute/cluster/remote_wire.hpp"

#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>

namespace troupe::distribute::detail {
namespace {

constexpr std::uint32_t max_count = 1u << 20;   // values in one message
constexpr std::uint32_t max_text = 4096;        // a name
constexpr std::uint8_t max_rank = 32;

class writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void text(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    out_ += s;
  }
  void bytes(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  void tensor(const Tensor& t) {
    put(static_cast<std::uint8_t>(t.dtype()));
    put(static_cast<std::uint8_t>(t.rank()));
    for (auto d : t.shape()) put(static_cast<std::int64_t>(d));
    put(static_cast<std::uint64_t>(t.nbytes()));
    if (t.is_gpu()) {
      throw std::invalid_argument("a tensor on " + t.device().to_string() +
                                  " cannot cross to another task; copy it to the CPU first");
    }
    bytes(t.raw_data(), t.nbytes());
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class reader {
 public:
  reader(const std::string& in, const char* what) : in_(in), what_(what) {}
  [[noreturn]] void bad(const std::string& why) const {
    throw std::invalid_argument(std::string(what_) + ": malformed message at byte " + std::to_string(pos_) + " of " +
                                std::to_string(in_.size()) + ": " + why);
  }
  template <class T>
  T get() {
    T v;
    if (in_.size() - pos_ < sizeof v) bad("it ends early");
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::uint32_t count(std::uint32_t max, const char* of) {
    auto n = get<std::uint32_t>();
    if (n > max) bad(std::string(of) + " count " + std::to_string(n) + " is above " + std::to_string(max));
    return n;
  }
  std::string text() {
    auto n = count(max_text, "text length");
    if (in_.size() - pos_ < n) bad("a text of " + std::to_string(n) + " bytes runs past the end");
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  DType dtype() {
    auto d = get<std::uint8_t>();
    if (d > static_cast<std::uint8_t>(DType::bf16)) bad("dtype " + std::to_string(d) + " is unknown");
    return static_cast<DType>(d);
  }
  Shape shape() {
    auto rank = get<std::uint8_t>();
    if (rank > max_rank) bad("rank " + std::to_string(rank) + " is above " + std::to_string(max_rank));
    Shape s(rank);
    for (auto& d : s) {
      d = get<std::int64_t>();
      if (d < 0) bad("dimension " + std::to_string(d) + " is negative");
    }
    return s;
  }
  std::uint64_t elements(const Shape& s) {
    std::uint64_t n = 1;
    for (auto d : s) {
      const auto u = static_cast<std::uint64_t>(d);
      if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / 16 / u) bad("the shape's size overflows");
      n *= u;
    }
    return n;
  }
  Tensor tensor() {
    const DType dtype = this->dtype();
    Shape shape = this->shape();
    const auto nbytes = get<std::uint64_t>();
    const auto expected = elements(shape) * dtype_size(dtype);
    if (nbytes != expected) {
      bad(std::to_string(nbytes) + " bytes for a " + std::string(dtype_name(dtype)) + " tensor of " +
          std::to_string(elements(shape)) + " elements (expected " + std::to_string(expected) + ")");
    }
    if (in_.size() - pos_ < nbytes) bad("a tensor of " + std::to_string(nbytes) + " bytes runs past the end");
    Tensor t = Tensor::from_bytes(in_.data() + pos_, static_cast<std::size_t>(nbytes), dtype, std::move(shape));
    pos_ += static_cast<std::size_t>(nbytes);
    return t;
  }
  // A tensor's header, checked, and where its bytes are, without copying them.
  struct view {
    DType dtype;
    Shape shape;
    std::size_t offset;
    std::size_t nbytes;
  };
  view tensor_view() {
    view v{dtype(), shape(), 0, 0};
    const auto nbytes = get<std::uint64_t>();
    const auto expected = elements(v.shape) * dtype_size(v.dtype);
    if (nbytes != expected) bad(std::to_string(nbytes) + " bytes for a tensor of that shape (expected " + std::to_string(expected) + ")");
    if (in_.size() - pos_ < nbytes) bad("a tensor of " + std::to_string(nbytes) + " bytes runs past the end");
    v.offset = pos_;
    v.nbytes = static_cast<std::size_t>(nbytes);
    pos_ += v.nbytes;
    return v;
  }
  void magic(std::uint32_t m) {
    if (get<std::uint32_t>() != m) bad("it does not start with this message kind's mark");
  }
  void end() const {
    if (pos_ != in_.size()) bad(std::to_string(in_.size() - pos_) + " bytes are left over");
  }

 private:
  const std::string& in_;
  const char* what_;
  std::size_t pos_ = 0;
};

constexpr std::uint32_t args_magic = 0x31475241;    // "ARG1"
constexpr std::uint32_t tensors_magic = 0x31534e54;  // "TNS1"
constexpr std::uint32_t tensor_magic = 0x3152534e;  // "NSR1"
constexpr std::uint32_t table_magic = 0x31425456;   // "VTB1"

}  // namespace

std::string encode_arguments(const std::vector<FunctionContext::Argument>& args) {
  writer w;
  w.put(args_magic);
  w.put(static_cast<std::uint32_t>(args.size()));
  for (const auto& a : args) {
    w.put(static_cast<std::uint8_t>(a.iterator != 0 ? 1 : 0));
    if (a.iterator != 0) {
      w.put(a.iterator);
      w.text(a.dataset_function);
    } else {
      w.tensor(a.tensor);
    }
  }
  return w.take();
}

std::vector<FunctionContext::Argument> decode_arguments(const std::string& bytes) {
  reader r(bytes, "function arguments");
  r.magic(args_magic);
  const auto n = r.count(max_count, "argument");
  std::vector<FunctionContext::Argument> out(n);
  for (auto& a : out) {
    const auto kind = r.get<std::uint8_t>();
    if (kind == 1) {
      a.iterator = r.get<std::uint64_t>();
      if (a.iterator == 0) r.bad("iterator id 0");
      a.dataset_function = r.text();
    } else if (kind == 0) {
      a.tensor = r.tensor();
    } else {
      r.bad("argument kind " + std::to_string(kind) + " is unknown");
    }
  }
  r.end();
  return out;
}

std::string encode_tensors(const std::vector<Tensor>& tensors) {
  writer w;
  w.put(tensors_magic);
  w.put(static_cast<std::uint32_t>(tensors.size()));
  for (const auto& t : tensors) w.tensor(t);
  return w.take();
}

std::vector<Tensor> decode_tensors(const std::string& bytes, const char* what) {
  reader r(bytes, what);
  r.magic(tensors_magic);
  const auto n = r.count(max_count, "tensor");
  std::vector<Tensor> out;
  out.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(r.tensor());
  r.end();
  return out;
}

std::string encode_tensor(const Tensor& t) {
  writer w;
  w.put(tensor_magic);
  w.tensor(t);
  return w.take();
}

Tensor decode_tensor(const std::string& bytes) {
  reader r(bytes, "variable shard");
  r.magic(tensor_magic);
  Tensor t = r.tensor();
  r.end();
  return t;
}

namespace {

template <class T>
void combine(char* value, const char* delta, std::size_t n, int sign) {
  // Element by element through memcpy: the bytes of a std::string need not be aligned for T.
  for (std::size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, value + i * sizeof(T), sizeof(T));
    std::memcpy(&b, delta + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>) {
      // 16-bit elements: the sum in float32, rounded once to the format.
      const float x = static_cast<float>(a);
      const float y = static_cast<float>(b);
      a = T(sign > 0 ? x + y : x - y);
    } else {
      a = sign > 0 ? static_cast<T>(a + b) : static_cast<T>(a - b);
    }
    std::memcpy(value + i * sizeof(T), &a, sizeof(T));
  }
}

}  // namespace

std::optional<std::string> update_in_place(std::string& value, actors::update_op op, const std::string& delta) {
  reader rv(value, "variable shard");
  rv.magic(tensor_magic);
  const auto v = rv.tensor_view();
  rv.end();
  reader rd(delta, "variable update");
  rd.magic(tensor_magic);
  const auto d = rd.tensor_view();
  rd.end();
  if (v.dtype != d.dtype || v.shape != d.shape) {
    return "the update is a " + std::string(dtype_name(d.dtype)) + " tensor of " + std::to_string(d.nbytes) +
           " bytes and rank " + std::to_string(d.shape.size()) + ", the shard a " + std::string(dtype_name(v.dtype)) +
           " tensor of " + std::to_string(v.nbytes) + " bytes and rank " + std::to_string(v.shape.size()) +
           " (shapes and dtypes must match)";
  }
  if (op == actors::update_op::assign) {
    value = delta;
    return std::nullopt;
  }
  const int sign = op == actors::update_op::add ? 1 : -1;
  char* out = value.data() + v.offset;
  const char* in = delta.data() + d.offset;
  const std::size_t n = v.nbytes / dtype_size(v.dtype);
  switch (v.dtype) {
    case DType::f32: combine<float>(out, in, n, sign); break;
    case DType::f64: combine<double>(out, in, n, sign); break;
    case DType::i32: combine<std::int32_t>(out, in, n, sign); break;
    case DType::i64: combine<std::int64_t>(out, in, n, sign); break;
    case DType::f16: combine<float16_t>(out, in, n, sign); break;
    case DType::bf16: combine<bfloat16_t>(out, in, n, sign); break;
  }
  return std::nullopt;
}

std::optional<actors::shard_layout> shard_layout_of(const std::string& value) {
  reader r(value, "variable shard");
  r.magic(tensor_magic);
  const auto v = r.tensor_view();
  r.end();
  actors::shard_layout l;
  l.offset = v.offset;
  l.nbytes = v.nbytes;
  l.dtype = wire_dtype(v.dtype);
  l.rows = v.shape.empty() ? 1 : static_cast<std::size_t>(v.shape[0]);
  return l;
}

std::uint8_t wire_dtype(DType t) { return static_cast<std::uint8_t>(t); }

std::optional<std::string> combine_raw(char* value, const char* delta, std::size_t nbytes, std::uint8_t dtype,
                                       actors::update_op op) {
  if (op == actors::update_op::assign) {
    std::memcpy(value, delta, nbytes);
    return std::nullopt;
  }
  const int sign = op == actors::update_op::add ? 1 : -1;
  switch (dtype) {
    case 0: combine<float>(value, delta, nbytes / sizeof(float), sign); break;
    case 1: combine<double>(value, delta, nbytes / sizeof(double), sign); break;
    case 2: combine<std::int32_t>(value, delta, nbytes / sizeof(std::int32_t), sign); break;
    case 3: combine<std::int64_t>(value, delta, nbytes / sizeof(std::int64_t), sign); break;
    default: return "element type " + std::to_string(dtype) + " is unknown";
  }
  return std::nullopt;
}

std::string encode_table(const VariableTable& table) {
  writer w;
  w.put(table_magic);
  w.put(static_cast<std::uint32_t>(table.ps.size()));
  for (const auto& p : table.ps) {
    w.text(p.task);
    w.text(p.host);
    w.put(p.port);
  }
  w.put(static_cast<std::uint32_t>(table.variables.size()));
  for (const auto& v : table.variables) {
    w.text(v.name);
    w.put(static_cast<std::uint8_t>(v.dtype));
    w.put(static_cast<std::uint8_t>(v.shape.size()));
    for (auto d : v.shape) w.put(static_cast<std::int64_t>(d));
    w.put(static_cast<std::uint32_t>(v.shards.size()));
    for (const auto& s : v.shards) {
      w.put(static_cast<std::int32_t>(s.ps));
      w.put(static_cast<std::int64_t>(s.rows));
      w.text(s.key);
    }
  }
  return w.take();
}

VariableTable decode_table(const std::string& bytes) {
  reader r(bytes, "variable table");
  r.magic(table_magic);
  VariableTable t;
  t.ps.resize(r.count(max_count, "ps task"));
  for (auto& p : t.ps) {
    p.task = r.text();
    p.host = r.text();
    p.port = r.get<std::uint16_t>();
  }
  t.variables.resize(r.count(max_count, "variable"));
  for (auto& v : t.variables) {
    v.name = r.text();
    v.dtype = r.dtype();
    v.shape = r.shape();
    if (v.shape.empty()) r.bad("variable " + v.name + " is a scalar (its shards split axis 0)");
    v.shards.resize(r.count(max_count, "shard"));
    std::int64_t rows = 0;
    for (auto& s : v.shards) {
      s.ps = r.get<std::int32_t>();
      s.rows = r.get<std::int64_t>();
      s.key = r.text();
      if (s.ps < 0 || static_cast<std::size_t>(s.ps) >= t.ps.size()) {
        r.bad("shard " + s.key + " is on ps task " + std::to_string(s.ps) + " of " + std::to_string(t.ps.size()));
      }
      if (s.rows < 0 || s.rows > v.shape[0]) r.bad("shard " + s.key + " has " + std::to_string(s.rows) + " rows");
      rows += s.rows;
    }
    if (v.shards.empty() || rows != v.shape[0]) {
      r.bad("the shards of " + v.name + " hold " + std::to_string(rows) + " rows of " + std::to_string(v.shape[0]));
    }
  }
  r.end();
  return t;
}

Tensor rows_of(const Tensor& t, std::int64_t row, std::int64_t rows) {
  if (t.rank() == 0 || row < 0 || rows < 0 || row + rows > t.shape()[0]) {
    throw std::out_of_range("rows " + std::to_string(row) + ".." + std::to_string(row + rows) +
                            " of a tensor with " + std::to_string(t.rank() == 0 ? 0 : t.shape()[0]) + " rows");
  }
  Shape s = t.shape();
  const std::size_t row_bytes = s[0] == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(s[0]);
  s[0] = rows;
  if (row == 0 && rows == t.shape()[0]) return t;
  return Tensor::from_bytes(static_cast<const char*>(t.raw_data()) + static_cast<std::size_t>(row) * row_bytes,
                            static_cast<std::size_t>(rows) * row_bytes, t.dtype(), std::move(s));
}

Tensor join_rows(const std::vector<Tensor>& pieces, const Shape& shape, DType dtype) {
  if (pieces.size() == 1 && pieces[0].shape() == shape && pieces[0].dtype() == dtype) return pieces[0];
  Tensor out = Tensor::empty(shape, dtype);
  char* dst = static_cast<char*>(out.raw_mutable_data());
  std::size_t at = 0;
  for (const auto& p : pieces) {
    if (p.dtype() != dtype || p.rank() != static_cast<int>(shape.size()) || at + p.nbytes() > out.nbytes()) {
      throw std::invalid_argument("variable shards do not fit the variable's shape and dtype");
    }
    std::memcpy(dst + at, p.raw_data(), p.nbytes());
    at += p.nbytes();
  }
  if (at != out.nbytes()) throw std::invalid_argument("variable shards do not fill the variable");
  return out;
}

}  // namespace troupe::distribute::detail
