// Sharded checkpoints of a ParameterServerStrategy (troupe/distribute/sharded_checkpoint.hpp): the
// ps tasks' side (save_shard_file) and the chief's (the temporary directory and its rename,
// restore and resharding); the manifest and the reading of the files are sharded_manifest.cpp's.
#include "troupe/distribute/sharded_checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <system_error>

#include <nlohmann/json.hpp>

#include "distribute/cluster/ps_access.hpp"
#include "distribute/cluster/shard_checkpoint.hpp"
#include "distribute/cluster/sharded_checkpoint_impl.hpp"
#include "distribute/cluster/sharded_manifest.hpp"
#include "elements.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/format/checkpoint_file.hpp"
#include "troupe/log.hpp"

namespace troupe::distribute {

namespace fs = std::filesystem;
namespace tf = troupe::format;

namespace {

using detail::hash_file;
using detail::hex64;
using detail::join_shards;
using detail::JoinedVariable;
using detail::Manifest;
using detail::manifest_name;
using detail::read_manifest;
using detail::read_shard_files;

std::string errno_text(int e) { return std::strerror(e); }

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("checkpoint " + path + ": cannot open it to sync: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError("checkpoint " + path + ": fsync failed: " + errno_text(e));
}

// `text` to `path` atomically: a temporary file beside it, fsync, rename, the directory fsynced.
void write_file_atomically(const std::string& path, const std::string& text) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string tmp = path + std::string(tf::checkpoint_temporary_marker) + std::to_string(::getpid()) + "-" +
                          std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("checkpoint " + path + ": cannot create " + tmp + ": " + errno_text(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw CheckpointError("checkpoint " + path + ": write failed: " + errno_text(e));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError("checkpoint " + path + ": fsync failed: " + errno_text(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError("checkpoint " + path + ": cannot rename " + tmp + " to it: " + errno_text(e));
  }
  fsync_path(fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY);
}

std::string temporary_dir_name(const std::string& final_dir) {
  static std::atomic<std::uint64_t> counter{0};
  return final_dir + std::string(tf::checkpoint_temporary_marker) + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "ckpt-<step>" -> step.
std::optional<std::int64_t> step_of_dir(const std::string& name) {
  if (name.compare(0, 5, "ckpt-") != 0 || !all_digits(std::string_view(name).substr(5))) return std::nullopt;
  std::int64_t v = 0;
  std::from_chars(name.data() + 5, name.data() + name.size(), v);
  return v;
}

// "ckpt-<step>.tmp-<pid>-<n>" -> pid; nullopt for any other name.
std::optional<long> temporary_dir_writer(const std::string& name) {
  const std::size_t marker = name.find(tf::checkpoint_temporary_marker);
  if (marker == std::string::npos || !step_of_dir(name.substr(0, marker))) return std::nullopt;
  const std::string tail = name.substr(marker + tf::checkpoint_temporary_marker.size());
  const std::size_t dash = tail.find('-');
  if (dash == std::string::npos || !all_digits(std::string_view(tail).substr(0, dash)) ||
      !all_digits(std::string_view(tail).substr(dash + 1))) {
    return std::nullopt;
  }
  long pid = 0;
  std::from_chars(tail.data(), tail.data() + dash, pid);
  return pid;
}

std::vector<std::pair<std::int64_t, std::string>> list_dirs(const std::string& directory) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  fs::directory_iterator it(directory, ec);
  if (ec) return out;
  for (const fs::directory_entry& e : it) {
    std::error_code type_ec;
    if (!e.is_directory(type_ec)) continue;
    const auto step = step_of_dir(e.path().filename().string());
    if (!step || !fs::is_regular_file(e.path() / manifest_name, type_ec)) continue;
    out.emplace_back(*step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}


}  // namespace

// --- the ps task's side ---------------------------------------------------------------------------

namespace detail {

std::optional<std::string> save_shard_file(const std::string& path, std::int64_t step,
                                           const std::vector<actors::shard_snapshot>& shards, std::uint64_t& file_bytes,
                                           std::uint64_t& file_hash) {
  try {
    const fs::path dir = fs::path(path).parent_path();
    std::error_code ec;
    const auto status = fs::symlink_status(dir, ec);
    if (ec || !fs::is_directory(status)) {
      return "the checkpoint directory " + dir.string() +
             " does not exist here or is not a directory (the chief and every ps task need the same file system "
             "at the same path)";
    }
    std::vector<tf::checkpoint_tensor> tensors;
    std::vector<std::array<std::int64_t, 2>> states(shards.size());
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const auto& s = shards[i];
      const auto& l = s.layout;
      if (!s.value || l.offset + l.nbytes > s.value->size() || l.rows == 0 || l.dtype > 5) {
        return "variable shard " + base::quoted(s.key) + " is malformed";
      }
      const auto type = static_cast<base::scalar_type>(l.dtype);
      const std::size_t esize = dtype_size(static_cast<DType>(l.dtype));
      if (l.nbytes % (l.rows * esize) != 0) return "variable shard " + base::quoted(s.key) + " is malformed";
      const std::vector<std::int64_t> shape{static_cast<std::int64_t>(l.rows),
                                            static_cast<std::int64_t>(l.nbytes / l.rows / esize)};
      tensors.push_back({s.key, type, shape, s.value->data() + l.offset, l.nbytes});
      for (std::size_t k = 0; k < s.slots.size(); ++k) {
        if (s.slots[k].size() != l.nbytes) return "variable shard " + base::quoted(s.key) + "'s slots are malformed";
        tensors.push_back({s.key + "/slot_" + std::to_string(k), type, shape, s.slots[k].data(), l.nbytes});
      }
      states[i] = {s.applied, s.kind ? static_cast<std::int64_t>(*s.kind) : -1};
      tensors.push_back({s.key + "/state", base::scalar_type::i64, {2}, states[i].data(), 16});
    }
    tf::write_checkpoint_file(path, step, tensors);
    std::string problem;
    const auto got = hash_file(path, problem);
    if (!got) return path + " was written but is " + problem;
    file_bytes = got->first;
    file_hash = got->second;
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string("cannot write ") + path + ": " + e.what();
  }
}

}  // namespace detail

// --- the chief's side -------------------------------------------------------------------------------

namespace detail {

std::string absolute_checkpoint_directory(const std::string& directory) {
  return fs::weakly_canonical(fs::absolute(directory)).string();
}

void make_checkpoint_directory(const std::string& directory, const std::string& who) {
  std::error_code ec;
  const auto status = fs::status(directory, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    throw CheckpointError(who + ": the checkpoint directory " + directory +
                          " is not a directory (it is a file); give a directory, or a path that does not exist yet");
  }
  if (!fs::exists(status)) {
    fs::create_directories(directory, ec);
    if (ec) throw CheckpointError(who + ": cannot create the checkpoint directory " + directory + ": " + ec.message());
  }
}

void remove_interrupted_saves(const std::string& directory, const std::string& who) {
  std::error_code ec;
  fs::directory_iterator it(directory, ec);
  if (ec) return;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    const auto writer = temporary_dir_writer(name);
    if (!writer) continue;
    std::error_code type_ec;
    if (!e.is_directory(type_ec)) continue;
    if (*writer > 0 && *writer != static_cast<long>(::getpid()) &&
        (::kill(static_cast<pid_t>(*writer), 0) == 0 || errno == EPERM)) {
      continue;
    }
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) troupe::log(LogLevel::info, who + ": removed " + e.path().string() + ", left by an interrupted save");
  }
}

std::string save_sharded(ParameterServerStrategy& strategy, const std::string& final_dir, std::int64_t step,
                         const std::vector<ShardedVariable>& variables, const std::string& who,
                         const std::vector<std::string>& checkpoint_names) {
  // The ps tasks write only into a save in progress named ckpt-<step>.tmp-<pid>-<n>
  // (check_shard_checkpoint_target), whatever the checkpoint's own name.
  const fs::path parent = fs::path(final_dir).parent_path();
  const std::string tmp = temporary_dir_name((parent / ("ckpt-" + std::to_string(step))).string());
  std::error_code ec;
  if (!fs::create_directory(tmp, ec) || ec) {
    throw CheckpointError(who + ": cannot create " + tmp + ": " + ec.message());
  }
  try {
    Manifest m;
    m.step = step;
    m.num_ps = strategy.num_ps();
    m.variables = variables;
    for (std::size_t i = 0; i < checkpoint_names.size() && i < variables.size(); ++i) {
      m.checkpoint_names[variables[i].name] = checkpoint_names[i];
    }
    std::vector<actors::dispatcher::saved_file> files;
    try {
      files = PsAccess::dispatcher(strategy).save_shards(tmp, step, PsAccess::timeout(strategy));
    } catch (const std::runtime_error& e) {
      throw CheckpointError(who + ": cannot save step " + std::to_string(step) + " to " + final_dir + ": " + e.what());
    }
    for (std::size_t i = 0; i < files.size(); ++i) {
      m.files.push_back({actors::shard_file_name(static_cast<int>(i), m.num_ps), files[i].bytes, files[i].hash});
    }
    // Last: the manifest, and the rename that makes the checkpoint exist.
    write_file_atomically((fs::path(tmp) / manifest_name).string(), manifest_json(m));
    fsync_path(tmp, O_RDONLY | O_DIRECTORY);
    std::string aside;
    if (fs::exists(final_dir, ec)) {
      aside = temporary_dir_name((parent / ("ckpt-" + std::to_string(step))).string());
      fs::rename(final_dir, aside);
    }
    fs::rename(tmp, final_dir);
    fsync_path(parent.string(), O_RDONLY | O_DIRECTORY);
    if (!aside.empty()) fs::remove_all(aside, ec);
  } catch (const CheckpointError&) {
    fs::remove_all(tmp, ec);
    throw;
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    throw CheckpointError(who + ": cannot save step " + std::to_string(step) + " to " + final_dir + ": " + e.what());
  }
  return final_dir;
}

std::int64_t restore_sharded(ParameterServerStrategy& strategy, const std::string& path,
                             const std::vector<RestoreTarget>& targets) {
  const Manifest m = read_manifest(path);
  const auto files = read_shard_files(path, m);
  std::map<std::string, const ShardedVariable*> saved, by_checkpoint_name;
  for (const auto& v : m.variables) {
    saved[v.name] = &v;
    if (auto c = m.checkpoint_names.find(v.name); c != m.checkpoint_names.end()) by_checkpoint_name[c->second] = &v;
  }
  std::vector<actors::dispatcher::shard_restore> restores;
  for (const RestoreTarget& target : targets) {
    const ShardedVariable& v = target.current;
    // A Checkpoint's variable by the name the Checkpoint saved it under, when one did (the ps
    // tasks' names differ between two models of one strategy: "kernel", "kernel_2"); else by its
    // own name, then by its Checkpoint's name.
    const ShardedVariable* found = nullptr;
    if (!target.alias.empty() && !by_checkpoint_name.empty()) {
      if (auto c = by_checkpoint_name.find(target.alias); c != by_checkpoint_name.end()) found = c->second;
    } else {
      auto it = saved.find(v.name);
      if (it == saved.end() && !target.alias.empty()) it = saved.find(target.alias);
      if (it != saved.end()) found = it->second;
    }
    if (found == nullptr) {
      std::string held;
      for (const auto& sv : m.variables) {
        const auto c = m.checkpoint_names.find(sv.name);
        held += (held.empty() ? "" : ", ") + base::quoted(c == m.checkpoint_names.end() ? sv.name : c->second);
      }
      throw CheckpointError("sharded checkpoint " + path + " has no variable " + base::quoted(v.name) +
                            (target.alias.empty() || target.alias == v.name ? std::string()
                                                                            : " (" + base::quoted(target.alias) + ")") +
                            " (it holds " + (held.empty() ? std::string("none") : held) + ")");
    }
    const ShardedVariable& sv = *found;
    if (sv.dtype != v.dtype || sv.shape != v.shape) {
      throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(sv.name) + " is " +
                            dtype_text(sv.dtype) + " " + shape_to_string(sv.shape) + ", the strategy's " +
                            base::quoted(v.name) + " is " + dtype_text(v.dtype) + " " + shape_to_string(v.shape));
    }
    const JoinedVariable joined = join_shards(files, sv, path);
    const std::int64_t kind = joined.kind;
    std::size_t row_bytes = dtype_size(v.dtype);
    for (std::size_t d = 1; d < v.shape.size(); ++d) row_bytes *= static_cast<std::size_t>(v.shape[d]);
    // The saved rows cut along the current shards.
    std::int64_t row = 0;
    for (const auto& s : v.shards) {
      actors::dispatcher::shard_restore r;
      r.ps = s.ps;
      r.key = s.key;
      const std::size_t at = static_cast<std::size_t>(row) * row_bytes, n = static_cast<std::size_t>(s.rows) * row_bytes;
      r.elements = joined.elements.substr(at, n);
      for (const auto& sl : joined.slots) r.slots += sl.substr(at, n);
      // The largest step among the saved shards whose rows this one takes.
      for (std::size_t k = 0; k < joined.parts.size(); ++k) {
        const std::int64_t b = joined.first_row[k], e = b + joined.parts[k].rows;
        if (b < row + s.rows && row < e) r.applied = std::max(r.applied, joined.parts[k].applied);
      }
      r.optimizer = kind < 0 ? 0xff : static_cast<std::uint8_t>(kind);
      if (kind < 0) r.applied = 0;
      restores.push_back(std::move(r));
      row += s.rows;
    }
  }
  try {
    PsAccess::dispatcher(strategy).restore_shards(std::move(restores), PsAccess::timeout(strategy));
  } catch (const std::runtime_error& e) {
    throw CheckpointError("sharded checkpoint " + path + ": " + e.what());
  }
  return m.step;
}

void verify_sharded(const std::string& dir) { read_shard_files(dir, read_manifest(dir)); }

void prune_sharded(const std::string& directory, int max_to_keep, const std::string& keep) {
  auto all = list_dirs(directory);
  std::error_code ec;
  std::size_t excess = all.size() > static_cast<std::size_t>(max_to_keep) ? all.size() - max_to_keep : 0;
  for (const auto& [step, dir] : all) {
    if (excess == 0) break;
    if (fs::path(dir) == fs::path(keep)) continue;
    fs::remove_all(dir, ec);
    if (ec) troupe::log(LogLevel::warning, "CheckpointManager: cannot delete the old checkpoint " + dir + ": " + ec.message());
    --excess;
  }
}

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(fs::path(dir) / manifest_name, ec);
}

}  // namespace detail

// --- ShardedCheckpointManager: every variable of the strategy -----------------------------------

ShardedCheckpointManager::ShardedCheckpointManager(ParameterServerStrategy& strategy, std::string directory,
                                                   int max_to_keep)
    : strategy_(&strategy), max_to_keep_(max_to_keep) {
  if (max_to_keep < 1) {
    throw std::invalid_argument("ShardedCheckpointManager: max_to_keep " + std::to_string(max_to_keep) +
                                " (expected 1 or more)");
  }
  if (directory.empty()) throw std::invalid_argument("ShardedCheckpointManager: the directory is empty");
  detail::make_checkpoint_directory(directory, "ShardedCheckpointManager");
  // The ps tasks are handed an absolute path without "." or ".." components.
  directory_ = detail::absolute_checkpoint_directory(directory);
  // Where Model::fit restores every shard from after a lost ps task came back (PsFitLoop).
  detail::PsAccess::set_checkpoint_directory(strategy, directory_);
  detail::remove_interrupted_saves(directory_, "ShardedCheckpointManager");
}

std::string ShardedCheckpointManager::save(std::int64_t step) {
  if (step < 0) throw std::invalid_argument("ShardedCheckpointManager::save: step " + std::to_string(step) + " (expected >= 0)");
  const std::string final_dir = (fs::path(directory_) / ("ckpt-" + std::to_string(step))).string();
  detail::save_sharded(*strategy_, final_dir, step, strategy_->variables(), "ShardedCheckpointManager");
  detail::prune_sharded(directory_, max_to_keep_, final_dir);
  return final_dir;
}

std::optional<std::string> ShardedCheckpointManager::latest_checkpoint() const {
  auto all = list_dirs(directory_);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

std::vector<std::string> ShardedCheckpointManager::checkpoints() const { return sharded_checkpoint_dirs(directory_); }

std::int64_t ShardedCheckpointManager::restore(const std::string& path) {
  std::vector<detail::RestoreTarget> targets;
  for (ShardedVariable& v : strategy_->variables()) targets.push_back({std::move(v), std::string()});
  return detail::restore_sharded(*strategy_, path, targets);
}

std::optional<std::int64_t> ShardedCheckpointManager::restore_or_initialize() {
  auto all = list_dirs(directory_);
  if (all.empty()) return std::nullopt;
  std::string problems;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      // Check the files first: a damaged checkpoint is skipped, a mismatch with the variables is not.
      detail::verify_sharded(it->second);
    } catch (const CheckpointError& e) {
      std::cerr << "troupe: ShardedCheckpointManager: skipping " << it->second << ": " << e.what() << std::endl;
      problems += std::string("\n  ") + e.what();
      continue;
    }
    return restore(it->second);
  }
  throw CheckpointError("ShardedCheckpointManager: no checkpoint in " + directory_ + " reads back intact:" + problems);
}

// --- inspection -----------------------------------------------------------------------------------

bool ShardedCheckpointInfo::intact() const {
  return std::all_of(files.begin(), files.end(), [](const ShardFileInfo& f) { return f.problem.empty(); });
}

ShardedCheckpointInfo inspect_sharded_checkpoint(const std::string& path) {
  const Manifest m = read_manifest(path);
  ShardedCheckpointInfo info;
  info.path = path;
  info.step = m.step;
  info.num_ps = m.num_ps;
  info.variables = m.variables;
  for (const auto& f : m.files) {
    ShardFileInfo fi;
    fi.path = (fs::path(path) / f.name).string();
    fi.bytes = f.bytes;
    fi.xxh64 = f.xxh64;
    std::string problem;
    const auto got = hash_file(fi.path, problem);
    if (!got) {
      fi.problem = fi.path + " is " + problem;
    } else if (got->first != f.bytes || got->second != f.xxh64) {
      fi.problem = fi.path + " has " + std::to_string(got->first) + " bytes with XXH64 " + hex64(got->second) +
                   ", the manifest says " + std::to_string(f.bytes) + " bytes with " + hex64(f.xxh64);
    }
    try {
      const CheckpointInfo ci = inspect_checkpoint(fi.path);
      fi.entries = ci.entries;
      for (const auto& e : ci.entries) {
        if (!e.checksum_ok && fi.problem.empty()) fi.problem = fi.path + ": tensor " + base::quoted(e.name) + " fails its checksum";
      }
    } catch (const CheckpointError& e) {
      if (fi.problem.empty()) fi.problem = e.what();
    }
    info.files.push_back(std::move(fi));
  }
  return info;
}

ShardedCheckpointValues read_sharded_checkpoint(const std::string& path) {
  const Manifest m = read_manifest(path);
  const auto files = read_shard_files(path, m);
  ShardedCheckpointValues out;
  out.path = path;
  out.step = m.step;
  for (const auto& [name, checkpoint_name] : m.checkpoint_names) out.checkpoint_names.emplace(checkpoint_name, name);
  for (const ShardedVariable& v : m.variables) {
    const JoinedVariable joined = join_shards(files, v, path);
    out.variables.emplace(v.name, Tensor::from_bytes(joined.elements.data(), joined.elements.size(), v.dtype, v.shape));
    const std::vector<std::string> names = detail::shard_slot_names(joined.kind);
    for (std::size_t k = 0; k < joined.slots.size() && k < names.size(); ++k) {
      const std::string& slot = joined.slots[k];
      out.slots[v.name].emplace(names[k], Tensor::from_bytes(slot.data(), slot.size(), v.dtype, v.shape));
    }
  }
  return out;
}

std::vector<std::string> sharded_checkpoint_dirs(const std::string& directory) {
  std::vector<std::string> out;
  for (auto& [step, dir] : list_dirs(directory)) out.push_back(dir);
  return out;
}

}  // namespace troupe::distribute
