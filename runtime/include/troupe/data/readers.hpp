#pragma once

#include <functional>
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

/// What read_csv does with a NaN or Inf value ("nan", "inf", "-Infinity", or a number too large
/// for the dtype is still an error).
enum class NonFinite {
  refuse,    ///< throw std::invalid_argument naming the file, line and column
  drop_row,  ///< skip the row and say so in CsvData::warnings
};

/// How read_csv reads the label column.
enum class CsvLabels {
  automatic,  ///< numbers when every label is a number, else names
  numbers,    ///< class ids written as numbers
  names,      ///< class names ("setosa"), mapped to ids 0.. in sorted order (CsvData::label_names)
};

/// How read_csv parses a file.
struct CsvOptions {
  /// The first non-empty line names the columns. Without a header the columns are named by their
  /// index: "0", "1", ...
  bool header = true;
  /// The field separator. A field in double quotes may contain it, and writes a quote as ""
  /// (RFC 4180, within one line: a quoted field cannot span lines). Spaces around fields (and
  /// inside the quotes) are removed.
  char delimiter = ',';
  /// The dtype of the feature tensor.
  DType dtype = DType::f32;
  /// The feature columns, by name, in this order; empty: every column but the label column.
  std::vector<std::string> select_columns;
  /// A column read into CsvData::labels instead of the features.
  std::optional<std::string> label_column;
  /// The dtype of the labels.
  DType label_dtype = DType::i64;
  /// Numbers or names in the label column.
  CsvLabels labels = CsvLabels::automatic;
  /// A row with a NaN or Inf feature or label.
  NonFinite non_finite = NonFinite::refuse;
};

/// A CSV file read into tensors.
struct CsvData {
  /// The names of the feature columns, in the order of the features' second dimension.
  std::vector<std::string> column_names;
  /// The feature values, shape [rows, columns].
  Tensor features;
  /// The label column's values, shape [rows], when CsvOptions::label_column is set.
  std::optional<Tensor> labels;
  /// When the labels were names: label_names[id] is the name of class id.
  std::vector<std::string> label_names;
  /// One line per row dropped (NonFinite::drop_row), naming the file, line and column.
  std::vector<std::string> warnings;
};

/// Reads a CSV file of numbers (and class names in the label column). Handles "\n" and "\r\n" line endings and a missing final
/// newline; empty lines are skipped (line numbers in errors count them); a UTF-8 byte-order mark
/// at the start (Excel's "CSV UTF-8") is skipped. Integer dtypes accept integral values written as
/// "3" or "3.0". When the file fails to read and its first line holds no delimiter but a
/// semicolon or a tab, the error says which delimiter to set.
CsvData read_csv(const std::string& path, const CsvOptions& options = {});

/// One element per row of a CSV file: {features row} or, with a label column, {features row,
/// label}. The file is read (and checked) when the dataset is made.
Dataset csv_dataset(const std::string& path, const CsvOptions& options = {});

/// The elements of read(path) for each path in turn: a file-based dataset (tf.data's
/// list_files(paths, shuffle=False).flat_map(read)). Each file is opened when the pass reaches it.
/// Under MultiWorkerMirroredStrategy, AutoShardPolicy::file (and automatic, with at least as
/// many files as workers) gives each worker only its own files: worker w of W reads files
/// w, w + W, ... An empty list, an empty path or an empty `read` throws std::invalid_argument.
Dataset files_dataset(std::vector<std::string> paths, std::function<Dataset(const std::string&)> read);

/// csv_dataset over several files, one after another: a file-based dataset (see files_dataset).
/// Every file is read with `options` when the pass reaches it (a worker may lack the files of
/// others), so a bad file fails that get_next, naming the file.
Dataset csv_files_dataset(std::vector<std::string> paths, const CsvOptions& options = {});

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
