#pragma once

// troupe-doctor's reading of flight recorder dumps (docs/diagnosis.md has their format, version
// 1): every worker's dump in one directory, compared collective by collective. What it names:
//   - the first cross-worker collective where the workers disagree (op, dtype or bytes), with the
//     ranks on each side;
//   - a collective some ranks entered and another never did (it stopped before it, died, or
//     skipped it and went on: the order differs);
//   - ranks that wrote no dump, and collectives that failed;
//   - the slowest rank of every step (the last to enter its collectives), as a table.
// A dump is read strictly: a malformed or truncated file is a dump_error naming the file and the
// field. No troupe runtime is needed (troupe-launch uses this library after a failed run).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::doctor {

/// One entry of a dump, as written.
struct entry {
  std::uint64_t id = 0;
  std::uint64_t step = 0;
  std::int64_t collective = -1;  ///< -1: null (a step's own entry)
  std::string op;
  std::string dtype;  ///< empty: null
  std::uint64_t bytes = 0;
  std::string group;
  std::int64_t participants = 0;
  std::string state;
  std::int64_t enqueue_ns = 0;
  std::int64_t start_ns = 0;  ///< 0: null
  std::int64_t end_ns = 0;    ///< 0: null
  std::int64_t peer = -1;     ///< -1: null
  std::string label;
};

/// One worker's dump.
struct dump {
  std::string file;
  std::int64_t rank = 0;
  std::int64_t world = 1;
  std::string task;
  std::int64_t pid = 0;
  std::string reason;
  std::int64_t dumped_at_ns = 0;
  std::uint64_t capacity = 0;
  std::uint64_t recorded = 0;
  std::vector<entry> entries;
};

/// A dump that cannot be read: "FILE: FIELD: what is wrong".
class dump_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The largest dump file read (10,000,000 entries of about 400 bytes).
constexpr std::uintmax_t max_dump_bytes = std::uintmax_t{4} << 30;

/// Parses one dump's text; `file` names it in errors.
dump parse_dump(const std::string& text, const std::string& file);

/// Reads every flight_recorder.*.json in `dir` (not the .partial files a writer leaves while it
/// writes). A dir without one, or a file that cannot be read or parsed, is a dump_error.
std::vector<dump> read_dumps(const std::string& dir);

/// What the dumps say.
struct diagnosis {
  bool fault = false;  ///< a disagreement, a collective missing or failed, a rank without a dump
  std::string text;    ///< the report, lines ending in '\n'
  std::vector<std::string> faults;  ///< each fault's one line (also in `text`)
};

/// Compares the dumps (one per rank; two of one rank, or of clusters of different sizes, are a
/// dump_error). The slowest-rank table shows the last `table_steps` steps every rank recorded.
diagnosis diagnose(const std::vector<dump>& dumps, std::size_t table_steps = 10);

}  // namespace troupe::doctor
