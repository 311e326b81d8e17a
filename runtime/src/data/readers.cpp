#include "troupe/data/readers.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace troupe::data {

namespace {

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

/// The whole file, or std::invalid_argument naming it and why it cannot be read.
std::string read_whole_file(const std::string& path, const char* op) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    throw std::invalid_argument(std::string(op) + ": cannot open " + in_quotes(path) + ": no such file");
  }
  if (std::filesystem::is_directory(status)) {
    throw std::invalid_argument(std::string(op) + ": cannot read " + in_quotes(path) + ": it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument(std::string(op) + ": cannot open " + in_quotes(path) + ": " + std::strerror(errno));
  }
  std::string data;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size > 0) {
    data.resize(static_cast<std::size_t>(size));
    in.read(data.data(), size);
  }
  if (in.bad() || (size > 0 && in.gcount() != size)) {
    throw std::invalid_argument(std::string(op) + ": reading " + in_quotes(path) + " failed after " +
                                std::to_string(in.gcount()) + " of " + std::to_string(size) + " bytes");
  }
  return data;
}

// ---- CSV --------------------------------------------------------------------------------------

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// The fields of one line (RFC 4180 within a line): a field that starts with '"' runs to its
/// closing quote, may hold the delimiter and writes a quote as "". Blanks around a field, and
/// inside its quotes, are removed. A quote left open, or text after a closing quote, throws
/// std::invalid_argument naming the file and line.
std::vector<std::string> split_fields(std::string_view line, char delimiter, const std::string& path,
                                      std::size_t line_number) {
  auto blank = [delimiter](char c) { return (c == ' ' || c == '\t') && c != delimiter; };
  auto fail = [&](const std::string& problem) {
    throw std::invalid_argument(path + ":" + std::to_string(line_number) + ": " + problem);
  };
  std::vector<std::string> fields;
  std::size_t i = 0;
  const std::size_t n = line.size();
  while (true) {
    while (i < n && blank(line[i])) ++i;
    std::string field;
    if (i < n && line[i] == '"') {
      const std::size_t opened = i++;
      while (true) {
        const std::size_t quote = line.find('"', i);
        if (quote == std::string_view::npos) {
          fail("the quoted field opened at character " + std::to_string(opened + 1) +
               " is not closed on this line (expected a closing \"; fields cannot span lines)");
        }
        field.append(line.substr(i, quote - i));
        i = quote + 1;
        if (i < n && line[i] == '"') {  // "" is a quote inside the field
          field.push_back('"');
          ++i;
          continue;
        }
        break;
      }
      while (i < n && blank(line[i])) ++i;
      if (i < n && line[i] != delimiter) {
        fail("text after the closing quote of field " + std::to_string(fields.size()) + " (expected the delimiter " +
             in_quotes(std::string(1, delimiter)) + ")");
      }
      field = std::string(trim(field));
    } else {
      const std::size_t end = std::min(line.find(delimiter, i), n);
      field = std::string(trim(line.substr(i, end - i)));
      i = end;
    }
    fields.push_back(std::move(field));
    if (i >= n) return fields;
    ++i;  // the delimiter
  }
}

struct CsvLine {
  std::size_t number;  // 1-based, counting skipped empty lines
  std::string_view text;
};

/// The non-empty lines, without their "\n" or "\r\n".
std::vector<CsvLine> split_lines(std::string_view text) {
  std::vector<CsvLine> lines;
  std::size_t number = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++number;
    if (!trim(line).empty()) lines.push_back({number, line});
    start = end + 1;
  }
  return lines;
}

/// Where a value came from, for error messages.
struct FieldSite {
  const std::string& path;
  std::size_t line;
  std::size_t column;
  const std::string& column_name;
};

[[noreturn]] void bad_value(const FieldSite& site, std::string_view text, const std::string& problem) {
  throw std::invalid_argument(site.path + ":" + std::to_string(site.line) + ": column " + std::to_string(site.column) +
                              " (" + in_quotes(site.column_name) + "): " + in_quotes(text) + " " + problem);
}

template <class T>
T parse_value(std::string_view text, const FieldSite& site) {
  std::string_view digits = text;
  // from_chars refuses a leading '+', which CSV writers do emit.
  if (digits.size() > 1 && digits.front() == '+' && digits[1] != '-' && digits[1] != '+') digits.remove_prefix(1);
  const char* begin = digits.data();
  const char* end = digits.data() + digits.size();
  T value{};
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc() && ptr == end && !digits.empty()) return value;
  if constexpr (std::is_floating_point_v<T>) {
    if (ec == std::errc::result_out_of_range && ptr == end) {
      bad_value(site, text, "is out of range for " + std::string(dtype_name(dtype_v<T>)));
    }
    bad_value(site, text, "is not a number");
  } else {
    // Integral values written as floats ("3.0", "1e3") are accepted; anything else is reported
    // as precisely as possible.
    double d = 0;
    auto [fptr, fec] = std::from_chars(begin, end, d);
    if (digits.empty() || fptr != end || (fec != std::errc() && fec != std::errc::result_out_of_range)) {
      bad_value(site, text, "is not a number");
    }
    const std::string type = std::string(dtype_name(dtype_v<T>));
    if (std::isnan(d) || d != std::floor(d)) bad_value(site, text, "is not an integer (the column is read as " + type + ")");
    if (fec == std::errc::result_out_of_range || d < static_cast<double>(std::numeric_limits<T>::min()) ||
        d >= -static_cast<double>(std::numeric_limits<T>::min())) {
      bad_value(site, text, "is out of range for " + type);
    }
    return static_cast<T>(d);
  }
}

/// Values of one dtype, appended one at a time and turned into a tensor at the end.
class ValueBuffer {
 public:
  explicit ValueBuffer(DType dtype) : dtype_(dtype) {}
  void reserve(std::size_t n) { bytes_.reserve(n * dtype_size(dtype_)); }
  /// Appends the value in `text`; returns false (appending nothing) for NaN or Inf.
  bool append(std::string_view text, const FieldSite& site) {
    switch (dtype_) {
      case DType::f32: return put_finite(parse_value<float>(text, site));
      case DType::f64: return put_finite(parse_value<double>(text, site));
      case DType::i32: put(parse_value<std::int32_t>(text, site)); return true;
      case DType::i64: put(parse_value<std::int64_t>(text, site)); return true;
      case DType::f16: return put_half<float16_t>(parse_value<double>(text, site), text, site);
      case DType::bf16: return put_half<bfloat16_t>(parse_value<double>(text, site), text, site);
    }
    return true;
  }
  /// Appends a class id.
  void append_id(std::int64_t id) {
    switch (dtype_) {
      case DType::f32: return put(static_cast<float>(id));
      case DType::f64: return put(static_cast<double>(id));
      case DType::i32: return put(static_cast<std::int32_t>(id));
      case DType::i64: return put(id);
      case DType::f16: return put(float16_t(id));
      case DType::bf16: return put(bfloat16_t(id));
    }
  }
  std::size_t size_bytes() const { return bytes_.size(); }
  void truncate(std::size_t bytes) { bytes_.resize(bytes); }
  Tensor to_tensor(Shape shape) const { return Tensor::from_bytes(bytes_.data(), bytes_.size(), dtype_, std::move(shape)); }

 private:
  // A value rounded to nearest even; false for NaN or Inf, as put_finite; a finite value
  // beyond the format's range is an error rather than an infinity.
  template <class H>
  bool put_half(double v, std::string_view text, const FieldSite& site) {
    if (!std::isfinite(v)) return false;
    const H h(v);
    if (!std::isfinite(static_cast<float>(h))) bad_value(site, text, "is out of range for " + std::string(dtype_name(dtype_v<H>)));
    put(h);
    return true;
  }
  template <class T>
  bool put_finite(T v) {
    if (!std::isfinite(v)) return false;
    put(v);
    return true;
  }
  template <class T>
  void put(T v) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }

  DType dtype_;
  std::vector<unsigned char> bytes_;
};

std::size_t find_column(const std::vector<std::string>& names, const std::string& name, const std::string& path,
                        const char* what) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + in_quotes(n);
  throw std::invalid_argument("read_csv: " + in_quotes(path) + " has no " + what + " " + in_quotes(name) +
                              " (its columns: " + (list.empty() ? "none" : list) + ")");
}

// ---- IDX --------------------------------------------------------------------------------------

std::uint32_t load_be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

std::uint64_t load_be64(const unsigned char* p) {
  return (std::uint64_t{load_be32(p)} << 32) | load_be32(p + 4);
}

struct IdxType {
  const char* name;
  std::size_t size;
  DType natural;
};

std::optional<IdxType> idx_type(unsigned code) {
  switch (code) {
    case 0x08: return IdxType{"unsigned byte", 1, DType::i32};
    case 0x09: return IdxType{"signed byte", 1, DType::i32};
    case 0x0B: return IdxType{"int16", 2, DType::i32};
    case 0x0C: return IdxType{"int32", 4, DType::i32};
    case 0x0D: return IdxType{"float32", 4, DType::f32};
    case 0x0E: return IdxType{"float64", 8, DType::f64};
    default: return std::nullopt;
  }
}

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, static_cast<unsigned>(v));
  return buf;
}

/// Converts a float element to an integer dtype, refusing what does not fit.
template <class T, class S>
T convert(S v, std::size_t index, const std::string& path) {
  if constexpr (std::is_floating_point_v<S> && std::is_integral_v<T>) {
    if (!(v >= static_cast<S>(std::numeric_limits<T>::min()) && v < -static_cast<S>(std::numeric_limits<T>::min()))) {
      throw std::invalid_argument("read_idx: " + in_quotes(path) + ": element " + std::to_string(index) + " (" +
                                  std::to_string(v) + ") does not fit in " + std::string(dtype_name(dtype_v<T>)));
    }
  }
  return static_cast<T>(v);
}

template <class T>
void decode_idx(const unsigned char* src, std::size_t count, unsigned code, T* out, const std::string& path) {
  switch (code) {
    case 0x08:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(src[i]);
      break;
    case 0x09:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<std::int8_t>(src[i]));
      break;
    case 0x0B:
      for (std::size_t i = 0; i < count; ++i) {
        const auto bits = static_cast<std::uint16_t>((src[2 * i] << 8) | src[2 * i + 1]);
        out[i] = static_cast<T>(static_cast<std::int16_t>(bits));
      }
      break;
    case 0x0C:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<std::int32_t>(load_be32(src + 4 * i)));
      break;
    case 0x0D:
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint32_t bits = load_be32(src + 4 * i);
        float f;
        std::memcpy(&f, &bits, sizeof f);
        out[i] = convert<T>(f, i, path);
      }
      break;
    case 0x0E:
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t bits = load_be64(src + 8 * i);
        double d;
        std::memcpy(&d, &bits, sizeof d);
        out[i] = convert<T>(d, i, path);
      }
      break;
    default:
      break;  // rejected while reading the header
  }
}

/// a * b, or SIZE_MAX when it does not fit (the file is then certainly too short).
std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}

}  // namespace

namespace {

// When the first line holds no `delimiter` but a semicolon or a tab, the file was most likely
// written with that separator (a spreadsheet in a locale whose decimal mark is a comma, a TSV
// export): what to pass instead, appended to whatever error reading it raised.
std::string delimiter_hint(const std::vector<CsvLine>& lines, char delimiter) {
  if (lines.empty() || lines[0].text.find(delimiter) != std::string_view::npos) return {};
  struct candidate {
    char c;
    const char* looks;
    const char* flag;
    const char* option;
  };
  for (const candidate& k : {candidate{';', "semicolon", "--delimiter ';'", "';'"},
                             candidate{'\t', "tab", "--delimiter tab", "'\\t'"}}) {
    if (k.c != delimiter && lines[0].text.find(k.c) != std::string_view::npos) {
      return std::string(" (the first line holds no ") + in_quotes(std::string(1, delimiter)) + " but " + k.looks +
             "s: the file looks " + k.looks + "-separated; pass " + k.flag + ", or set CsvOptions::delimiter = " +
             k.option + ")";
    }
  }
  return {};
}

CsvData read_csv_lines(const std::string& path, const std::vector<CsvLine>& lines, const CsvOptions& options);

}  // namespace

CsvData read_csv(const std::string& path, const CsvOptions& options) {
  const std::string text = read_whole_file(path, "read_csv");
  std::string_view body(text);
  constexpr std::string_view utf8_bom = "\xEF\xBB\xBF";  // what Excel's "CSV UTF-8" writes first
  if (body.substr(0, utf8_bom.size()) == utf8_bom) body.remove_prefix(utf8_bom.size());
  const std::vector<CsvLine> lines = split_lines(body);
  try {
    return read_csv_lines(path, lines, options);
  } catch (const std::invalid_argument& e) {
    const std::string hint = delimiter_hint(lines, options.delimiter);
    if (hint.empty()) throw;
    throw std::invalid_argument(e.what() + hint);
  }
}

namespace {

CsvData read_csv_lines(const std::string& path, const std::vector<CsvLine>& lines, const CsvOptions& options) {

  std::vector<std::string> names;
  std::size_t first_row = 0;
  if (options.header) {
    if (lines.empty()) throw std::invalid_argument("read_csv: " + in_quotes(path) + " is empty (expected a header line)");
    names = split_fields(lines[0].text, options.delimiter, path, lines[0].number);
    first_row = 1;
  } else if (!lines.empty()) {
    const std::size_t n = split_fields(lines[0].text, options.delimiter, path, lines[0].number).size();
    for (std::size_t i = 0; i < n; ++i) names.push_back(std::to_string(i));
  }

  std::optional<std::size_t> label_index;
  if (options.label_column) label_index = find_column(names, *options.label_column, path, "label column");
  std::vector<std::size_t> feature_indices;
  if (!options.select_columns.empty()) {
    for (const auto& name : options.select_columns) feature_indices.push_back(find_column(names, name, path, "column"));
  } else {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (i != label_index) feature_indices.push_back(i);
    }
  }

  CsvData out;
  ValueBuffer features(options.dtype);
  features.reserve((lines.size() - first_row) * feature_indices.size());
  // A NaN or Inf: refused, or its row dropped with a warning (returned).
  auto non_finite = [&](const FieldSite& site, const std::string& value) {
    if (options.non_finite == NonFinite::refuse) {
      bad_value(site, value,
                "is not a finite number (NaN or Inf); fix the row, or drop such rows: --non-finite=drop, or "
                "CsvOptions::non_finite in the API");
    }
    return site.path + ":" + std::to_string(site.line) + ": column " + std::to_string(site.column) + " (" +
           in_quotes(site.column_name) + "): " + in_quotes(value) + " is not a finite number: row dropped";
  };
  struct LabelText {
    std::size_t line;
    std::string text;
  };
  std::vector<LabelText> label_texts;  // of the rows kept
  std::size_t rows = 0;
  for (std::size_t r = first_row; r < lines.size(); ++r) {
    const CsvLine& line = lines[r];
    const std::vector<std::string> fields = split_fields(line.text, options.delimiter, path, line.number);
    if (fields.size() != names.size()) {
      throw std::invalid_argument(path + ":" + std::to_string(line.number) + ": " + std::to_string(fields.size()) +
                                  " fields, expected " + std::to_string(names.size()) +
                                  (options.header ? " (the header's column count)" : " (the first row's field count)"));
    }
    const std::size_t mark = features.size_bytes();
    std::optional<std::string> dropped;
    for (std::size_t c : feature_indices) {
      const FieldSite site{path, line.number, c, names[c]};
      if (!features.append(fields[c], site)) {
        dropped = non_finite(site, fields[c]);
        break;
      }
    }
    if (!dropped && label_index && options.labels != CsvLabels::names) {
      const std::string& label = fields[*label_index];
      double d = 0;
      auto [ptr, ec] = std::from_chars(label.data(), label.data() + label.size(), d);
      if (ec == std::errc() && ptr == label.data() + label.size() && !std::isfinite(d)) {
        dropped = non_finite(FieldSite{path, line.number, *label_index, names[*label_index]}, label);
      }
    }
    if (dropped) {
      features.truncate(mark);
      out.warnings.push_back(std::move(*dropped));
      continue;
    }
    if (label_index) label_texts.push_back({line.number, fields[*label_index]});
    ++rows;
  }

  for (std::size_t c : feature_indices) out.column_names.push_back(names[c]);
  out.features = features.to_tensor({static_cast<std::int64_t>(rows), static_cast<std::int64_t>(feature_indices.size())});
  if (label_index) {
    auto is_number = [](std::string_view t) {
      if (t.size() > 1 && t.front() == '+') t.remove_prefix(1);
      double d = 0;
      auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
      return !t.empty() && ptr == t.data() + t.size() && (ec == std::errc() || ec == std::errc::result_out_of_range);
    };
    bool as_names = options.labels == CsvLabels::names;
    if (options.labels == CsvLabels::automatic) {
      for (const LabelText& l : label_texts) as_names = as_names || !is_number(l.text);
    }
    ValueBuffer labels(options.label_dtype);
    labels.reserve(rows);
    if (as_names) {
      std::map<std::string, std::int64_t> ids;
      for (const LabelText& l : label_texts) ids.emplace(l.text, 0);
      for (auto& [name, id] : ids) {
        id = static_cast<std::int64_t>(out.label_names.size());
        out.label_names.push_back(name);
      }
      for (const LabelText& l : label_texts) labels.append_id(ids.at(l.text));
    } else {
      for (const LabelText& l : label_texts) {
        labels.append(l.text, FieldSite{path, l.line, *label_index, names[*label_index]});
      }
    }
    out.labels = labels.to_tensor({static_cast<std::int64_t>(rows)});
  }
  return out;
}

}  // namespace

Dataset csv_dataset(const std::string& path, const CsvOptions& options) {
  CsvData data = read_csv(path, options);
  std::vector<Tensor> components{std::move(data.features)};
  if (data.labels) components.push_back(std::move(*data.labels));
  return Dataset::from_tensor_slices(std::move(components));
}

Tensor read_idx(const std::string& path, std::optional<DType> as) {
  const std::string file = read_whole_file(path, "read_idx");
  const auto* bytes = reinterpret_cast<const unsigned char*>(file.data());
  const std::uint64_t size = file.size();
  if (size < 4) {
    throw std::invalid_argument("read_idx: " + in_quotes(path) + " is " + std::to_string(size) +
                                " bytes, too short for the 4-byte IDX magic");
  }
  const std::uint32_t magic = load_be32(bytes);
  if (bytes[0] != 0 || bytes[1] != 0) {
    throw std::invalid_argument("read_idx: " + in_quotes(path) + " has magic " + hex(magic, 8) +
                                ", not an IDX file (expected 0x0000TTDD: two zero bytes, a type code and a "
                                "dimension count)");
  }
  const unsigned code = bytes[2];
  const std::optional<IdxType> type = idx_type(code);
  if (!type) {
    throw std::invalid_argument("read_idx: " + in_quotes(path) + ": unknown element type code " + hex(code, 2) +
                                " in magic " + hex(magic, 8) + " (expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E)");
  }
  const std::size_t rank = bytes[3];
  const std::uint64_t header_bytes = 4 + 4 * std::uint64_t{rank};
  if (size < header_bytes) {
    throw std::invalid_argument("read_idx: " + in_quotes(path) + " is shorter than its header says: " +
                                std::to_string(rank) + " dimensions need a " + std::to_string(header_bytes) +
                                "-byte header, the file has " + std::to_string(size) + " bytes");
  }
  Shape shape;
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const std::uint32_t dim = load_be32(bytes + 4 + 4 * d);
    shape.push_back(dim);
    count = saturating_mul(count, dim);
  }
  const std::uint64_t data_bytes = saturating_mul(count, type->size);
  const std::uint64_t expected =
      data_bytes > std::numeric_limits<std::uint64_t>::max() - header_bytes ? data_bytes : header_bytes + data_bytes;
  const std::string layout = "shape " + shape_to_string(shape) + " of " + type->name + " needs " +
                             std::to_string(expected) + " bytes (" + std::to_string(header_bytes) + " of header), the file has " +
                             std::to_string(size) + " bytes";
  if (size < expected) throw std::invalid_argument("read_idx: " + in_quotes(path) + " is shorter than its header says: " + layout);
  if (size > expected) {
    throw std::invalid_argument("read_idx: " + in_quotes(path) + " has " + std::to_string(size - expected) +
                                " trailing bytes after its data: " + layout);
  }

  const DType dtype = as.value_or(type->natural);
  Tensor out = Tensor::empty(shape, dtype);
  const unsigned char* src = bytes + header_bytes;
  const auto n = static_cast<std::size_t>(count);
  switch (dtype) {
    case DType::f32: decode_idx(src, n, code, out.mutable_data<float>(), path); break;
    case DType::f64: decode_idx(src, n, code, out.mutable_data<double>(), path); break;
    case DType::i32: decode_idx(src, n, code, out.mutable_data<std::int32_t>(), path); break;
    case DType::i64: decode_idx(src, n, code, out.mutable_data<std::int64_t>(), path); break;
    case DType::f16:
    case DType::bf16: {
      // Decoded to float32, then rounded to nearest even (every IDX element type fits float32's range).
      Tensor wide = Tensor::empty(shape, DType::f32);
      decode_idx(src, n, code, wide.mutable_data<float>(), path);
      return wide.cast(dtype);
    }
  }
  return out;
}

Dataset idx_dataset(const std::string& images_path, const std::string& labels_path, DType image_dtype,
                    DType label_dtype) {
  Tensor images = read_idx(images_path, image_dtype);
  Tensor labels = read_idx(labels_path, label_dtype);
  const auto check_rank = [](const Tensor& t, const std::string& path) {
    if (t.rank() == 0) {
      throw std::invalid_argument("idx_dataset: " + in_quotes(path) +
                                  " holds a scalar (0 dimensions); expected a first dimension of examples");
    }
  };
  check_rank(images, images_path);
  check_rank(labels, labels_path);
  if (images.shape()[0] != labels.shape()[0]) {
    throw std::invalid_argument("idx_dataset: " + in_quotes(images_path) + " holds " + std::to_string(images.shape()[0]) +
                                " images (shape " + shape_to_string(images.shape()) + ") but " + in_quotes(labels_path) +
                                " holds " + std::to_string(labels.shape()[0]) + " labels (shape " +
                                shape_to_string(labels.shape()) + "); the two files need the same count");
  }
  return Dataset::from_tensor_slices({std::move(images), std::move(labels)});
}

namespace {

// The elements of read(path) for each path in turn.
class FilesIterator final : public detail::IteratorImpl {
 public:
  FilesIterator(std::shared_ptr<const std::vector<std::string>> paths,
                std::shared_ptr<const std::function<Dataset(const std::string&)>> read)
      : paths_(std::move(paths)), read_(std::move(read)) {}
  std::optional<Element> next() override {
    while (true) {
      if (current_) {
        if (auto e = current_->next()) return e;
        current_.reset();
      }
      if (next_file_ >= paths_->size()) return std::nullopt;
      const Dataset file = (*read_)((*paths_)[next_file_++]);
      current_ = file.impl()->make_iterator();
    }
  }

 private:
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::shared_ptr<const std::function<Dataset(const std::string&)>> read_;
  std::size_t next_file_ = 0;
  std::unique_ptr<detail::IteratorImpl> current_;
};

class FilesDataset final : public detail::DatasetImpl {
 public:
  FilesDataset(std::shared_ptr<const std::vector<std::string>> paths,
               std::shared_ptr<const std::function<Dataset(const std::string&)>> read)
      : paths_(std::move(paths)), read_(std::move(read)) {}
  std::unique_ptr<detail::IteratorImpl> make_iterator() const override {
    return std::make_unique<FilesIterator>(paths_, read_);
  }
  std::int64_t cardinality() const override { return paths_->empty() ? 0 : unknown_cardinality; }
  std::int64_t num_files() const override { return static_cast<std::int64_t>(paths_->size()); }
  std::shared_ptr<const detail::DatasetImpl> shard_files(std::int64_t num_shards, std::int64_t index) const override {
    if (num_shards < 1 || index < 0 || index >= num_shards) {
      throw std::invalid_argument("shard_files: shard " + std::to_string(index) + " of " + std::to_string(num_shards) +
                                  " (expected 0 <= index < num_shards)");
    }
    auto mine = std::make_shared<std::vector<std::string>>();
    for (std::size_t i = static_cast<std::size_t>(index); i < paths_->size(); i += static_cast<std::size_t>(num_shards)) {
      mine->push_back((*paths_)[i]);
    }
    return std::make_shared<FilesDataset>(std::move(mine), read_);
  }

 private:
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::shared_ptr<const std::function<Dataset(const std::string&)>> read_;
};

}  // namespace

Dataset files_dataset(std::vector<std::string> paths, std::function<Dataset(const std::string&)> read) {
  if (!read) throw std::invalid_argument("files_dataset: the read function is empty (expected a callable)");
  if (paths.empty()) throw std::invalid_argument("files_dataset: no files (expected at least one path)");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty()) {
      throw std::invalid_argument("files_dataset: path " + std::to_string(i) + " is empty (expected a file name)");
    }
  }
  return Dataset(std::make_shared<FilesDataset>(std::make_shared<const std::vector<std::string>>(std::move(paths)),
                                                std::make_shared<const std::function<Dataset(const std::string&)>>(std::move(read))));
}

Dataset csv_files_dataset(std::vector<std::string> paths, const CsvOptions& options) {
  return files_dataset(std::move(paths), [options](const std::string& path) { return csv_dataset(path, options); });
}

}  // namespace troupe::data
