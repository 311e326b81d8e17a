#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"
#include "troupe/data/readers.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::data;
using troupe::testing::contains;
using troupe::testing::message_of;

namespace fs = std::filesystem;

using troupe::testing::temp_dir;

namespace {

/// Big-endian bytes of an unsigned value.
std::string be(std::uint64_t v, int bytes) {
  std::string out;
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

/// An IDX header: magic 0x0000TTDD and the dimensions.
std::string idx_header(unsigned type, const std::vector<std::uint32_t>& dims) {
  std::string out = be(type, 3) + be(dims.size(), 1);
  for (std::uint32_t d : dims) out += be(d, 4);
  return out;
}

std::string float_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return be(bits, 4);
}

std::string double_bits(double d) {
  std::uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return be(bits, 8);
}

const char* const iris =
    "sepal_length,sepal_width,petal_length,petal_width,species\n"
    "5.1,3.5,1.4,0.2,0\n"
    "7.0,3.2,4.7,1.4,1\n"
    "6.3,3.3,6.0,2.5,2\n";

}  // namespace

TEST_CASE("read_csv reads a header and every column as f32 features") {
  temp_dir dir;
  CsvData d = read_csv(dir.write("iris.csv", iris));
  CHECK(d.column_names == std::vector<std::string>{"sepal_length", "sepal_width", "petal_length", "petal_width", "species"});
  CHECK(d.features.dtype() == DType::f32);
  CHECK(d.features.shape() == Shape{3, 5});
  CHECK(d.features.to_vector<float>() ==
        std::vector<float>{5.1f, 3.5f, 1.4f, 0.2f, 0, 7.0f, 3.2f, 4.7f, 1.4f, 1, 6.3f, 3.3f, 6.0f, 2.5f, 2});
  CHECK_FALSE(d.labels.has_value());
}

TEST_CASE("read_csv splits off a label column and keeps selected columns in order") {
  temp_dir dir;
  const std::string path = dir.write("iris.csv", iris);
  CsvOptions opts;
  opts.label_column = "species";
  CsvData d = read_csv(path, opts);
  CHECK(d.column_names == std::vector<std::string>{"sepal_length", "sepal_width", "petal_length", "petal_width"});
  CHECK(d.features.shape() == Shape{3, 4});
  REQUIRE(d.labels.has_value());
  CHECK(d.labels->dtype() == DType::i64);
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2});

  opts.select_columns = {"petal_width", "sepal_length"};
  opts.dtype = DType::f64;
  opts.label_dtype = DType::i32;
  d = read_csv(path, opts);
  CHECK(d.column_names == std::vector<std::string>{"petal_width", "sepal_length"});
  CHECK(d.features.to_vector<double>() == std::vector<double>{0.2, 5.1, 1.4, 7.0, 2.5, 6.3});
  CHECK(d.labels->to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2});
}

TEST_CASE("read_csv handles CRLF, blank lines, no final newline, spaces, quotes and other delimiters") {
  temp_dir dir;
  CsvOptions opts;
  opts.delimiter = ';';
  opts.dtype = DType::i64;
  CsvData d = read_csv(dir.write("x.csv", "\"a\"; b\r\n\r\n1; +2\r\n  \r\n-3;\"4\"\r\n5;6.0"), opts);
  CHECK(d.column_names == std::vector<std::string>{"a", "b"});
  CHECK(d.features.shape() == Shape{3, 2});
  CHECK(d.features.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, -3, 4, 5, 6});
}

TEST_CASE("read_csv without a header names the columns by index") {
  temp_dir dir;
  CsvOptions opts;
  opts.header = false;
  opts.label_column = "2";
  CsvData d = read_csv(dir.write("x.csv", "1,2,0\n3,4,1\n"), opts);
  CHECK(d.column_names == std::vector<std::string>{"0", "1"});
  CHECK(d.features.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1});

  CsvOptions no_header;
  no_header.header = false;
  CsvData empty = read_csv(dir.write("empty.csv", ""), no_header);
  CHECK(empty.features.shape() == Shape{0, 0});
}

TEST_CASE("read_csv of a header without rows gives zero rows") {
  temp_dir dir;
  CsvData d = read_csv(dir.write("x.csv", "a,b,c\n"));
  CHECK(d.features.shape() == Shape{0, 3});
  CHECK(d.column_names.size() == 3);
}

TEST_CASE("read_csv names the file, line and column of a value that is not a number") {
  temp_dir dir;
  const std::string path = dir.write(
      "data.csv", "sepal_length,sepal_width,petal_length,petal_width\n1,2,3,4\n\n5,6,7,abc\n");
  const std::string msg = message_of([&] { read_csv(path); });
  CHECK(contains(msg, path + ":4: column 3 (\"petal_width\"): \"abc\" is not a number"));
  CHECK_THROWS_AS(read_csv(path), std::invalid_argument);

  const std::string empty_field = dir.write("empty_field.csv", "a,b\n1,\n");
  CHECK(contains(message_of([&] { read_csv(empty_field); }), ":2: column 1 (\"b\"): \"\" is not a number"));
}

TEST_CASE("read_csv reports fractional and out-of-range values of integer columns") {
  temp_dir dir;
  CsvOptions opts;
  opts.label_column = "y";
  const std::string fractional = dir.write("frac.csv", "x,y\n1,0\n2,1.5\n");
  CHECK(contains(message_of([&] { read_csv(fractional, opts); }),
                 ":3: column 1 (\"y\"): \"1.5\" is not an integer (the column is read as int64)"));
  opts.label_dtype = DType::i32;
  const std::string big = dir.write("big.csv", "x,y\n1,3000000000\n");
  CHECK(contains(message_of([&] { read_csv(big, opts); }), ":2: column 1 (\"y\"): \"3000000000\" is out of range for int32"));
  const std::string huge = dir.write("huge.csv", "x,y\n1e999,1\n");
  CHECK(contains(message_of([&] { read_csv(huge, opts); }), ":2: column 0 (\"x\"): \"1e999\" is out of range for float32"));
}

TEST_CASE("read_csv names the line and both counts of a row with the wrong number of fields") {
  temp_dir dir;
  const std::string path = dir.write("rows.csv", "a,b,c\n1,2,3\n4,5\n");
  const std::string msg = message_of([&] { read_csv(path); });
  CHECK(contains(msg, path + ":3:"));
  CHECK(contains(msg, "2 fields, expected 3"));
  CHECK_THROWS_AS(read_csv(path), std::invalid_argument);
}

TEST_CASE("read_csv names a missing file, an empty file and a missing column") {
  temp_dir dir;
  const std::string missing = dir.file("nope.csv");
  CHECK(contains(message_of([&] { read_csv(missing); }), "\"" + missing + "\": no such file"));
  CHECK_THROWS_AS(read_csv(missing), std::invalid_argument);
  CHECK(contains(message_of([&] { read_csv(dir.write("empty.csv", "\n\n")); }), "is empty (expected a header line)"));

  const std::string path = dir.write("iris.csv", iris);
  CsvOptions select;
  select.select_columns = {"sepal_length", "petal_area"};
  const std::string msg = message_of([&] { read_csv(path, select); });
  CHECK(contains(msg, "no column \"petal_area\""));
  CHECK(contains(msg, "\"sepal_length\", \"sepal_width\""));
  CsvOptions label;
  label.label_column = "class";
  CHECK(contains(message_of([&] { read_csv(path, label); }), "no label column \"class\""));
  CHECK_THROWS_AS(read_csv(path, label), std::invalid_argument);
}

TEST_CASE("read_csv refuses a NaN or Inf naming the file, line and column, or drops the row with a warning") {
  temp_dir dir;
  const std::string path = dir.write("nan.csv", "a,b,label\n1,2,0\n3,nan,1\n5,6,1\n-inf,8,0\n9,10,inf\n11,12,1\n");
  CsvOptions opts;
  opts.label_column = "label";
  const std::string msg = message_of([&] { read_csv(path, opts); });
  CHECK(contains(msg, path + ":3: column 1 (\"b\"): \"nan\" is not a finite number (NaN or Inf)"));
  CHECK(contains(msg, "drop such rows: --non-finite=drop, or CsvOptions::non_finite in the API"));
  CHECK_FALSE(contains(msg, "NonFinite::"));
  CHECK_THROWS_AS(read_csv(path, opts), std::invalid_argument);

  opts.non_finite = NonFinite::drop_row;
  CsvData d = read_csv(path, opts);
  CHECK(d.features.shape() == Shape{3, 2});
  CHECK(d.features.to_vector<float>() == std::vector<float>{1, 2, 5, 6, 11, 12});
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 1});
  REQUIRE(d.warnings.size() == 3);
  CHECK(d.warnings[0] == path + ":3: column 1 (\"b\"): \"nan\" is not a finite number: row dropped");
  CHECK(d.warnings[1] == path + ":5: column 0 (\"a\"): \"-inf\" is not a finite number: row dropped");
  CHECK(d.warnings[2] == path + ":6: column 2 (\"label\"): \"inf\" is not a finite number: row dropped");
}

TEST_CASE("read_csv skips a UTF-8 byte-order mark, so the first column keeps its name") {
  temp_dir dir;
  const std::string path = dir.write("bom.csv", "\xEF\xBB\xBFx,label\r\n1.5,0\r\n2.5,1\r\n");
  CsvOptions opts;
  opts.label_column = "label";
  const CsvData d = read_csv(path, opts);
  CHECK(d.column_names == std::vector<std::string>{"x"});
  CHECK(d.features.to_vector<float>() == std::vector<float>{1.5f, 2.5f});
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1});
  // Without a header too: the mark is not part of the first value.
  CsvOptions no_header;
  no_header.header = false;
  const std::string numbers = dir.write("bom_numbers.csv", "\xEF\xBB\xBF" "3,4\n");
  CHECK(read_csv(numbers, no_header).features.to_vector<float>() == std::vector<float>{3, 4});
}

TEST_CASE("read_csv of a file that looks semicolon- or tab-separated says which delimiter to set") {
  temp_dir dir;
  CsvOptions opts;
  opts.label_column = "label";
  const std::string semi = dir.write("semi.csv", "a;b;label\n1,5;2;0\n3;4;1\n");
  const std::string semi_msg = message_of([&] { read_csv(semi, opts); });
  CHECK(contains(semi_msg, "no label column \"label\""));
  CHECK(contains(semi_msg, "the file looks semicolon-separated; pass --delimiter ';', or set CsvOptions::delimiter = ';'"));
  const std::string tab = dir.write("tab.csv", "a\tb\tlabel\n1\t2\t0\n");
  const std::string tab_msg = message_of([&] { read_csv(tab, opts); });
  CHECK(contains(tab_msg, "the file looks tab-separated; pass --delimiter tab, or set CsvOptions::delimiter = '\\t'"));
  // With the delimiter set, both read.
  opts.delimiter = '\t';
  CHECK(read_csv(tab, opts).features.shape() == Shape{1, 2});
  // A comma file's own errors carry no such hint.
  opts.delimiter = ',';
  const std::string comma = dir.write("comma.csv", "a,b,label\n1,x,0\n");
  CHECK_FALSE(contains(message_of([&] { read_csv(comma, opts); }), "--delimiter"));
}

TEST_CASE("read_csv maps class names in the label column to sorted ids") {
  temp_dir dir;
  const std::string path = dir.write(
      "iris.csv", "sepal_length,species\n5.1,setosa\n7.0,versicolor\n6.3,virginica\n4.9,setosa\n6.4,versicolor\n");
  CsvOptions opts;
  opts.label_column = "species";
  CsvData d = read_csv(path, opts);
  CHECK(d.label_names == std::vector<std::string>{"setosa", "versicolor", "virginica"});
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 0, 1});
  // Numbers stay numbers; asked for numbers, a name is an error naming it.
  const std::string numeric = dir.write("numeric.csv", "x,y\n1,2\n3,0\n");
  opts.label_column = "y";
  CsvData n = read_csv(numeric, opts);
  CHECK(n.label_names.empty());
  CHECK(n.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 0});
  opts.label_column = "species";
  opts.labels = CsvLabels::numbers;
  CHECK(contains(message_of([&] { read_csv(path, opts); }), ":2: column 1 (\"species\"): \"setosa\" is not a number"));
  // Asked for names, numbers are names too.
  opts.label_column = "y";
  opts.labels = CsvLabels::names;
  CHECK(read_csv(numeric, opts).label_names == std::vector<std::string>{"0", "2"});
}

TEST_CASE("read_csv reads quoted fields with the delimiter and doubled quotes in them (RFC 4180)") {
  temp_dir dir;
  CsvData d = read_csv(dir.write("q.csv", "x,\"name, full\",y\n1,\"Smith, J.\",2\n3, \"say \"\"hi\"\"\" ,4\n\"5\",plain,\"6\"\n"),
                       [] {
                         CsvOptions o;
                         o.label_column = "name, full";
                         return o;
                       }());
  CHECK(d.column_names == std::vector<std::string>{"x", "y"});
  CHECK(d.features.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(d.label_names == std::vector<std::string>{"Smith, J.", "plain", "say \"hi\""});
  CHECK(d.labels->to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 2, 1});

  const std::string open = dir.write("open.csv", "a,b\n1,\"2\n");
  CHECK(contains(message_of([&] { read_csv(open); }),
                 open + ":2: the quoted field opened at character 3 is not closed on this line"));
  const std::string after = dir.write("after.csv", "a,b\n1,\"2\"x\n");
  CHECK(contains(message_of([&] { read_csv(after); }), after + ":2: text after the closing quote of field 1"));
  // A tab delimiter is not taken for a blank.
  CsvOptions tabs;
  tabs.delimiter = '\t';
  CsvData t = read_csv(dir.write("t.tsv", "a\tb\n1\t\"2\"\n"), tabs);
  CHECK(t.features.to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("csv_dataset yields one element per row, with the label when asked") {
  temp_dir dir;
  const std::string path = dir.write("iris.csv", iris);
  CsvOptions opts;
  opts.label_column = "species";
  Dataset ds = csv_dataset(path, opts);
  CHECK(ds.cardinality() == 3);
  std::vector<std::int64_t> labels;
  std::vector<float> first_features;
  for (const Element& e : ds) {
    REQUIRE(e.size() == 2);
    CHECK(e[0].shape() == Shape{4});
    if (first_features.empty()) first_features = e[0].to_vector<float>();
    labels.push_back(e[1].item<std::int64_t>());
  }
  CHECK(first_features == std::vector<float>{5.1f, 3.5f, 1.4f, 0.2f});
  CHECK(labels == std::vector<std::int64_t>{0, 1, 2});

  int rows = 0;
  for (const Element& e : csv_dataset(path)) {
    CHECK(e.size() == 1);
    CHECK(e[0].shape() == Shape{5});
    ++rows;
  }
  CHECK(rows == 3);
}

TEST_CASE("read_idx reads unsigned bytes as i32 and converts them when asked") {
  temp_dir dir;
  const std::string path = dir.write("images", idx_header(0x08, {2, 2, 3}) + std::string("\x00\x01\x02\x7f\x80\xff\x05\x06\x07\x08\x09\x0a", 12));
  Tensor t = read_idx(path);
  CHECK(t.dtype() == DType::i32);
  CHECK(t.shape() == Shape{2, 2, 3});
  CHECK(t.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 127, 128, 255, 5, 6, 7, 8, 9, 10});
  Tensor f = read_idx(path, DType::f32);
  CHECK(f.dtype() == DType::f32);
  CHECK(f.to_vector<float>()[5] == 255.0f);
}

TEST_CASE("read_idx decodes every element type big-endian") {
  temp_dir dir;
  CHECK(read_idx(dir.write("s8", idx_header(0x09, {3}) + std::string("\xff\x80\x7f", 3))).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{-1, -128, 127});
  CHECK(read_idx(dir.write("i16", idx_header(0x0B, {2}) + be(0xFFFE, 2) + be(0x0102, 2))).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{-2, 258});
  CHECK(read_idx(dir.write("i32", idx_header(0x0C, {2}) + be(0xFFFFFFFF, 4) + be(70000, 4)), DType::i64)
            .to_vector<std::int64_t>() == std::vector<std::int64_t>{-1, 70000});
  Tensor f32 = read_idx(dir.write("f32", idx_header(0x0D, {1, 2}) + float_bits(1.5f) + float_bits(-0.25f)));
  CHECK(f32.dtype() == DType::f32);
  CHECK(f32.shape() == Shape{1, 2});
  CHECK(f32.to_vector<float>() == std::vector<float>{1.5f, -0.25f});
  Tensor f64 = read_idx(dir.write("f64", idx_header(0x0E, {2}) + double_bits(3.25) + double_bits(-1e300)));
  CHECK(f64.dtype() == DType::f64);
  CHECK(f64.to_vector<double>() == std::vector<double>{3.25, -1e300});
  CHECK(read_idx(dir.write("scalar", idx_header(0x0C, {}) + be(42, 4))).item<std::int32_t>() == 42);
  CHECK(read_idx(dir.write("none", idx_header(0x08, {0, 28}))).shape() == Shape{0, 28});
}

TEST_CASE("read_idx rejects a bad magic, an unknown type, a short file and trailing bytes") {
  temp_dir dir;
  const std::string bad_magic = dir.write("bad_magic", std::string("\x01\x00\x08\x01", 4) + be(1, 4) + "x");
  std::string msg = message_of([&] { read_idx(bad_magic); });
  CHECK(contains(msg, "magic 0x01000801"));
  CHECK(contains(msg, "not an IDX file"));

  const std::string bad_type = dir.write("bad_type", idx_header(0x0A, {1}) + "x");
  CHECK(contains(message_of([&] { read_idx(bad_type); }), "unknown element type code 0x0A"));

  const std::string tiny = dir.write("tiny", std::string("\x00\x00", 2));
  CHECK(contains(message_of([&] { read_idx(tiny); }), "is 2 bytes, too short for the 4-byte IDX magic"));

  const std::string short_header = dir.write("short_header", idx_header(0x08, {5, 5}).substr(0, 8));
  CHECK(contains(message_of([&] { read_idx(short_header); }), "2 dimensions need a 12-byte header, the file has 8 bytes"));

  // 2 x 3 bytes of data expected after a 12-byte header: 18 bytes in all.
  const std::string short_data = dir.write("short_data", idx_header(0x08, {2, 3}) + "abcd");
  msg = message_of([&] { read_idx(short_data); });
  CHECK(contains(msg, "shorter than its header says"));
  CHECK(contains(msg, "needs 18 bytes"));
  CHECK(contains(msg, "the file has 16 bytes"));

  const std::string trailing = dir.write("trailing", idx_header(0x08, {2, 3}) + "abcdefgh");
  msg = message_of([&] { read_idx(trailing); });
  CHECK(contains(msg, "2 trailing bytes"));
  CHECK(contains(msg, "needs 18 bytes"));

  const std::string missing = dir.file("missing-idx");
  CHECK(contains(message_of([&] { read_idx(missing); }), "\"" + missing + "\": no such file"));
  for (const std::string& p : {bad_magic, bad_type, tiny, short_header, short_data, trailing, missing}) {
    CHECK_THROWS_AS(read_idx(p), std::invalid_argument);
  }
}

TEST_CASE("read_idx rejects a float that does not fit the integer dtype asked for") {
  temp_dir dir;
  const std::string path = dir.write("f32", idx_header(0x0D, {2}) + float_bits(1.0f) + float_bits(3e9f));
  CHECK(contains(message_of([&] { read_idx(path, DType::i32); }), "element 1"));
  CHECK(read_idx(path, DType::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 3000000000});
}

TEST_CASE("idx_dataset pairs images with labels and checks that their counts agree") {
  temp_dir dir;
  const std::string images = dir.write("images", idx_header(0x08, {3, 2, 2}) + std::string("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b", 12));
  const std::string labels = dir.write("labels", idx_header(0x08, {3}) + std::string("\x07\x02\x01", 3));
  Dataset ds = idx_dataset(images, labels);
  CHECK(ds.cardinality() == 3);
  std::vector<std::int64_t> ls;
  std::vector<float> second_image;
  for (const Element& e : ds) {
    REQUIRE(e.size() == 2);
    CHECK(e[0].dtype() == DType::f32);
    CHECK(e[0].shape() == Shape{2, 2});
    CHECK(e[1].dtype() == DType::i64);
    if (ls.size() == 1) second_image = e[0].to_vector<float>();
    ls.push_back(e[1].item<std::int64_t>());
  }
  CHECK(ls == std::vector<std::int64_t>{7, 2, 1});
  CHECK(second_image == std::vector<float>{4, 5, 6, 7});

  const std::string two_labels = dir.write("two_labels", idx_header(0x08, {2}) + std::string("\x07\x02", 2));
  const std::string msg = message_of([&] { idx_dataset(images, two_labels); });
  CHECK(contains(msg, "holds 3 images"));
  CHECK(contains(msg, "holds 2 labels"));
  CHECK(contains(msg, two_labels));
  CHECK_THROWS_AS(idx_dataset(images, two_labels), std::invalid_argument);
}

TEST_CASE("read_csv and read_idx read float16 and bfloat16, rounded to nearest even, and refuse a value beyond float16") {
  temp_dir dir;
  CsvOptions opts;
  opts.label_column = "y";
  opts.dtype = DType::f16;
  opts.label_dtype = DType::bf16;
  CsvData d = read_csv(dir.write("h.csv", "a,b,y\n0.1,65504,1\n-2.5,1.00048828125,3\n"), opts);
  CHECK(d.features.dtype() == DType::f16);
  CHECK(d.features.equals(Tensor::from_vector<double>({0.1, 65504, -2.5, 1.00048828125}, {2, 2}).cast(DType::f16)));
  CHECK(d.features.cast(DType::f32).to_vector<float>()[3] == 1.0f);  // 1 + 2^-11 ties to 1
  REQUIRE(d.labels.has_value());
  CHECK(d.labels->dtype() == DType::bf16);
  CHECK(d.labels->cast(DType::f32).to_vector<float>() == std::vector<float>{1, 3});
  CHECK(contains(message_of([&] { read_csv(dir.write("big.csv", "a,y\n70000,1\n"), opts); }),
                 "column 0 (\"a\"): \"70000\" is out of range for float16"));
  const std::string path = dir.write("images", idx_header(0x08, {3}) + std::string("\x00\x7f\xff", 3));
  CHECK(read_idx(path, DType::bf16).cast(DType::f32).to_vector<float>() == std::vector<float>{0, 127, 255});
  CHECK(read_idx(path, DType::f16).dtype() == DType::f16);
}

}  // namespace TROUPE_TEST_FILE
