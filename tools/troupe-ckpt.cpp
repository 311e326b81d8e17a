// troupe-ckpt: prints what troupe checkpoint files hold (step, variables, dtypes, shapes, sizes)
// and whether each tensor matches its checksum; a directory lists the checkpoints that
// CheckpointManager keeps there (ckpt-<step>.ckpt) and the sharded checkpoints of a
// ParameterServerStrategy (ckpt-<step>/ with a manifest.json and one file per ps task, each
// checked against the manifest's size and XXH64); a sharded checkpoint's own directory is shown
// whole. --stats adds each tensor's min, max and mean
// and flags NaN and Inf, which a diverged run writes with valid checksums.
// Exit status: 0 when every file is intact (and, with --stats, finite); 1 when one is damaged,
// unreadable or (with --stats) holds NaN/Inf, or a directory holds no checkpoint (the reason on
// stderr); 2 for a usage error.
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_line.hpp"

#include "troupe/checkpoint.hpp"
#include "troupe/distribute/sharded_checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s + "  ";
}

// "min .. max, mean m" of a tensor's finite values, and its NaN and Inf counts.
struct value_stats {
  double min = 0, max = 0, mean = 0;
  std::int64_t finite = 0, nan = 0, inf = 0;
};

value_stats stats_of(const troupe::Tensor& t) {
  value_stats s;
  double sum = 0;
  for (double v : t.cast(troupe::DType::f64).to_vector<double>()) {
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      s.min = s.finite ? std::min(s.min, v) : v;
      s.max = s.finite ? std::max(s.max, v) : v;
      sum += v;
      ++s.finite;
    }
  }
  s.mean = s.finite ? sum / static_cast<double>(s.finite) : 0.0;
  return s;
}

std::string describe(const value_stats& s) {
  std::ostringstream out;
  out << std::setprecision(6);
  if (s.finite > 0) out << "min " << s.min << "  max " << s.max << "  mean " << s.mean;
  if (s.nan > 0 || s.inf > 0) {
    out << (s.finite > 0 ? "  " : "") << "NON-FINITE: " << s.nan << " NaN, " << s.inf << " Inf";
  }
  return out.str();
}

// Prints one file's step and variables; returns whether it is intact (and finite, with stats).
bool inspect(const std::string& path, bool stats) {
  troupe::CheckpointInfo info;
  try {
    info = troupe::inspect_checkpoint(path, stats);
  } catch (const troupe::CheckpointError& e) {
    std::cerr << "troupe-ckpt: " << e.what() << "\n";
    return false;
  }
  std::size_t bad = 0, non_finite = 0;
  for (const auto& e : info.entries) bad += e.checksum_ok ? 0 : 1;
  std::cout << path << ": step " << info.step << ", " << info.entries.size() << " variables, " << info.file_bytes
            << " bytes\n";
  std::size_t width = 4;
  for (const auto& e : info.entries) width = std::max(width, e.name.size());
  for (const auto& e : info.entries) {
    std::string line = "  " + pad(e.name, width) + pad(std::string(troupe::dtype_name(e.dtype)), 7) +
                       pad(troupe::shape_to_string(e.shape), 14) + std::to_string(e.nbytes) + " bytes  " +
                       (e.checksum_ok ? "ok" : "CHECKSUM MISMATCH");
    if (stats) {
      const value_stats s = stats_of(e.value);
      non_finite += (s.nan > 0 || s.inf > 0) ? 1 : 0;
      line += "  " + describe(s);
    }
    std::cout << line << "\n";
  }
  if (bad > 0) {
    std::cerr << "troupe-ckpt: checkpoint " << path << ": " << bad << " of " << info.entries.size()
              << " tensors fail their checksum\n";
  }
  if (non_finite > 0) {
    std::cerr << "troupe-ckpt: checkpoint " << path << ": " << non_finite << " of " << info.entries.size()
              << " tensors hold NaN or Inf (a diverged run?)\n";
  }
  return bad == 0 && non_finite == 0;
}

bool list_files(const std::string& dir, const std::vector<std::string>& files, bool stats);

bool is_sharded(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "manifest.json", ec);
}

// A sharded checkpoint of a ParameterServerStrategy (a directory with a manifest): its variables
// and shards, then each ps task's file with its size, XXH64 and whether it is intact.
bool inspect_sharded(const std::string& path, bool stats) {
  troupe::distribute::ShardedCheckpointInfo info;
  try {
    info = troupe::distribute::inspect_sharded_checkpoint(path);
  } catch (const troupe::CheckpointError& e) {
    std::cerr << "troupe-ckpt: " << e.what() << "\n";
    return false;
  }
  std::cout << path << ": sharded checkpoint, step " << info.step << ", " << info.variables.size()
            << " variables over " << info.num_ps << " ps tasks\n";
  std::size_t width = 4;
  for (const auto& v : info.variables) width = std::max(width, v.name.size());
  for (const auto& v : info.variables) {
    std::string line = "  " + pad(v.name, width) + pad(std::string(troupe::dtype_name(v.dtype)), 7) +
                       pad(troupe::shape_to_string(v.shape), 14) + std::to_string(v.shards.size()) + " shard" +
                       (v.shards.size() == 1 ? "" : "s") + ":";
    for (std::size_t i = 0; i < v.shards.size(); ++i) {
      line += std::string(i ? "," : "") + " " + v.shards[i].key + " on ps " + std::to_string(v.shards[i].ps) + " (" +
              std::to_string(v.shards[i].rows) + " rows)";
    }
    std::cout << line << "\n";
  }
  bool intact = true;
  for (const auto& f : info.files) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(f.xxh64));
    std::cout << "  " << pad(fs::path(f.path).filename().string(), 18) << f.bytes << " bytes  xxh64 " << hash << "  "
              << f.entries.size() << " tensors  " << (f.problem.empty() ? "ok" : "DAMAGED OR MISSING") << "\n";
    if (!f.problem.empty()) {
      std::cerr << "troupe-ckpt: sharded checkpoint " << path << ": " << f.problem << "\n";
      intact = false;
    } else if (stats) {
      intact = inspect(f.path, true) && intact;
    }
  }
  return intact;
}

// A directory: one line per checkpoint, oldest first (every table with --stats).
bool list_directory(const std::string& dir, bool stats) {
  if (is_sharded(dir)) return inspect_sharded(dir, stats);
  const std::vector<std::string> files = troupe::checkpoint_files(dir);
  const std::vector<std::string> sharded = troupe::distribute::sharded_checkpoint_dirs(dir);
  if (files.empty() && sharded.empty()) {
    std::cerr << "troupe-ckpt: " << dir << ": no checkpoint files (expected ckpt-<step>.ckpt, as CheckpointManager "
              << "writes them, or ckpt-<step>/ with a manifest.json, as it writes those of variables on ps tasks)\n";
    return false;
  }
  if (!sharded.empty()) {
    std::cout << dir << ": " << sharded.size() << " sharded checkpoint" << (sharded.size() == 1 ? "" : "s")
              << ", oldest first\n";
    bool intact = true;
    for (const std::string& d : sharded) {
      if (stats) {
        intact = inspect_sharded(d, true) && intact;
        continue;
      }
      try {
        const auto info = troupe::distribute::inspect_sharded_checkpoint(d);
        std::size_t bad = 0;
        for (const auto& f : info.files) {
          if (f.problem.empty()) continue;
          ++bad;
          std::cerr << "troupe-ckpt: sharded checkpoint " << d << ": " << f.problem << "\n";
        }
        std::cout << "  " << pad(fs::path(d).filename().string() + "/", 16) << "step " << info.step << ", "
                  << info.variables.size() << " variables, " << info.files.size() << " shard files, "
                  << (bad == 0 ? std::string("intact")
                               : std::to_string(bad) + " of " + std::to_string(info.files.size()) +
                                     " shard files damaged or missing")
                  << "\n";
        intact = intact && bad == 0;
      } catch (const troupe::CheckpointError& e) {
        std::cout << "  " << pad(fs::path(d).filename().string() + "/", 16) << "UNREADABLE\n";
        std::cerr << "troupe-ckpt: " << e.what() << "\n";
        intact = false;
      }
    }
    if (files.empty()) return intact;
    return list_files(dir, files, stats) && intact;
  }
  return list_files(dir, files, stats);
}

bool list_files(const std::string& dir, const std::vector<std::string>& files, bool stats) {
  std::cout << dir << ": " << files.size() << " checkpoint" << (files.size() == 1 ? "" : "s") << ", oldest first\n";
  bool intact = true;
  for (const std::string& f : files) {
    if (stats) {
      intact = inspect(f, true) && intact;
      continue;
    }
    try {
      const troupe::CheckpointInfo info = troupe::inspect_checkpoint(f);
      std::size_t bad = 0;
      for (const auto& e : info.entries) bad += e.checksum_ok ? 0 : 1;
      std::cout << "  " << pad(fs::path(f).filename().string(), 16) << "step " << info.step << ", "
                << info.entries.size() << " variables, " << info.file_bytes << " bytes, "
                << (bad == 0 ? "intact"
                            : std::to_string(bad) + " of " + std::to_string(info.entries.size()) +
                                  " tensors fail their checksum") << "\n";
      intact = intact && bad == 0;
    } catch (const troupe::CheckpointError& e) {
      std::cout << "  " << pad(fs::path(f).filename().string(), 16) << "UNREADABLE\n";
      std::cerr << "troupe-ckpt: " << e.what() << "\n";
      intact = false;
    }
  }
  return intact;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  bool stats = false;
  CLI::App app{"usage: troupe-ckpt [--stats] PATH...\n"
               "Prints each checkpoint's step and variables (name, dtype, shape, bytes) and checks every\n"
               "tensor against its checksum; a directory lists its checkpoints (ckpt-<step>.ckpt, and the\n"
               "sharded ckpt-<step>/ of a ParameterServerStrategy, each shard file checked against its\n"
               "manifest). Exits 1 when a file is damaged, missing or unreadable, or with --stats holds NaN\n"
               "or Inf.\n",
               "troupe-ckpt"};
  // Not ->required(): CLI11 checks requirements before unknown flags, and "--stast" deserves its own
  // message rather than "paths is required".
  app.add_option("paths", paths, "checkpoint files or directories")->type_name("PATH");
  app.add_flag("--stats", stats, "per tensor: min, max and mean, and NaN/Inf flagged");
  if (const std::optional<int> status = troupe::tools::parse_command_line(app, argc, argv)) return *status;
  if (paths.empty()) {
    std::cerr << "troupe-ckpt: no PATH given (a checkpoint file or a directory of them)\n"
                 "Run with --help for more information.\n";
    return 2;
  }
  bool intact = true;
  for (const std::string& p : paths) {
    std::error_code ec;
    intact = (fs::is_directory(p, ec) ? list_directory(p, stats) : inspect(p, stats)) && intact;
  }
  return intact ? 0 : 1;
}
