#pragma once

#include <optional>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/dtype.hpp"
#include "troupe/tensor.hpp"

/// Readers for the files the examples train on: numeric CSV tables and IDX files (MNIST).
///
/// Every reader loads the whole file when called. A missing or unreadable file, a malformed file
/// and a bad option all throw std::invalid_argument; the message names the file and, for CSV, the
/// line and the column (name and index) to fix, e.g.
///   data.csv:17: column 3 ("petal_width"): "abc" is not a number
namespace troupe::data {

/// How read_csv parses a file.
struct CsvOptions {
  /// The first non-empty line names the columns. Without a header the columns are named by their
  /// index: "0", "1", ...
  bool header = true;
  /// The field separator. Fields cannot contain it (no quoting); surrounding spaces and one pair
  /// of surrounding double quotes are removed.
  char delimiter = ',';
  /// The dtype of the feature tensor.
  DType dtype = DType::f32;
  /// The feature columns, by name, in this order; empty: every column but the label column.
  std::vector<std::string> select_columns;
  /// A column read into CsvData::labels instead of the features.
  std::optional<std::string> label_column;
  /// The dtype of the labels.
  DType label_dtype = DType::i64;
};

/// A CSV file read into tensors.
struct CsvData {
  /// The names of the feature columns, in the order of the features' second dimension.
  std::vector<std::string> column_names;
  /// The feature values, shape [rows, columns].
  Tensor features;
  /// The label column's values, shape [rows], when CsvOptions::label_column is set.
  std::optional<Tensor> labels;
};

/// Reads a CSV file of numbers. Handles "\n" and "\r\n" line endings and a missing final
/// newline; empty lines are skipped (line numbers in errors count them). Integer dtypes accept
/// integral values written as "3" or "3.0".
CsvData read_csv(const std::string& path, const CsvOptions& options = {});

/// One element per row of a CSV file: {features row} or, with a label column, {features row,
/// label}. The file is read (and checked) when the dataset is made.
Dataset csv_dataset(const std::string& path, const CsvOptions& options = {});

/// Reads an IDX file (the MNIST format): magic 0x0000TTDD with TT the element type (0x08 unsigned
/// byte, 0x09 signed byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64) and DD the number
/// of dimensions, then DD big-endian uint32 dimensions, then the big-endian elements.
/// Bytes, int16 and int32 give i32, float32 gives f32 and float64 gives f64, unless `as` names
/// the dtype to convert to (values are converted, not scaled: divide images by 255 yourself).
Tensor read_idx(const std::string& path, std::optional<DType> as = std::nullopt);

/// Elements {image, label} from a pair of IDX files (e.g. train-images-idx3-ubyte and
/// train-labels-idx1-ubyte) whose first dimensions agree.
Dataset idx_dataset(const std::string& images_path, const std::string& labels_path,
                    DType image_dtype = DType::f32, DType label_dtype = DType::i64);

}  // namespace troupe::data
