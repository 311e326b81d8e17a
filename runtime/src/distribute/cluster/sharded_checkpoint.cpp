// Sharded checkpoints of a ParameterServerStrategy (troupe/distribute/sharded_checkpoint.hpp): the
// ps tasks' side (save_shard_file) and the chief's (the manifest, the temporary directory and its
// rename, restore and resharding).
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
#include "elements.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/format/checkpoint_file.hpp"
#include "troupe/log.hpp"

namespace troupe::distribute {

namespace fs = std::filesystem;
namespace tf = troupe::format;

namespace {

constexpr const char* manifest_name = "manifest.json";
constexpr const char* manifest_format = "troupe sharded checkpoint";
constexpr int manifest_version = 1;
constexpr std::uintmax_t max_manifest_bytes = 64u << 20;

std::string errno_text(int e) { return std::strerror(e); }

std::string hex64(std::uint64_t v) {
  char buf[17];
  for (int i = 15; i >= 0; --i) {
    buf[i] = "0123456789abcdef"[v & 0xf];
    v >>= 4;
  }
  buf[16] = '\0';
  return buf;
}

std::optional<std::uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// The whole file's size and XXH64, read in pieces; nullopt (and `problem`) when it cannot be read.
std::optional<std::pair<std::uint64_t, std::uint64_t>> hash_file(const std::string& path, std::string& problem) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    problem = "missing or unreadable (" + errno_text(errno) + ")";
    return std::nullopt;
  }
  tf::xxhash64_stream h;
  std::vector<char> buf(1 << 20);
  std::uint64_t total = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    h.update(buf.data(), n);
    total += n;
  }
  if (in.bad()) {
    problem = "read failed";
    return std::nullopt;
  }
  return std::make_pair(total, h.digest());
}

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

// --- the manifest -----------------------------------------------------------------------------

struct Manifest {
  std::int64_t step = 0;
  int num_ps = 0;
  std::vector<ShardedVariable> variables;
  struct File {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint64_t xxh64 = 0;
  };
  std::vector<File> files;
};

std::string dtype_text(DType d) { return std::string(dtype_name(d)); }

std::optional<DType> dtype_from(const std::string& s) {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16}) {
    if (s == dtype_text(d)) return d;
  }
  return std::nullopt;
}

std::string manifest_json(const Manifest& m) {
  nlohmann::json j;
  j["format"] = manifest_format;
  j["version"] = manifest_version;
  j["step"] = m.step;
  j["num_ps"] = m.num_ps;
  j["files"] = nlohmann::json::array();
  for (const auto& f : m.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}});
  j["variables"] = nlohmann::json::array();
  for (const auto& v : m.variables) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& s : v.shards) shards.push_back({{"key", s.key}, {"ps", s.ps}, {"rows", s.rows}});
    j["variables"].push_back({{"name", v.name}, {"dtype", dtype_text(v.dtype)}, {"shape", v.shape}, {"shards", shards}});
  }
  return j.dump(1) + "\n";
}

// Reads and checks `dir`/manifest.json, trusting nothing in it.
Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / manifest_name).string();
  auto bad = [&](const std::string& what) {
    return CheckpointError("sharded checkpoint " + path + ": " + what);
  };
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw bad("missing or unreadable (" + ec.message() + "): not a checkpoint, or one whose save did not finish");
  if (size > max_manifest_bytes) throw bad(std::to_string(size) + " bytes, more than a manifest holds");
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw bad(std::string("not valid JSON (truncated or damaged?): ") + e.what());
  }
  Manifest m;
  try {
    if (j.at("format").get<std::string>() != manifest_format || j.at("version").get<int>() != manifest_version) {
      throw bad("format " + j.at("format").dump() + " version " + j.at("version").dump() + " (expected \"" +
                manifest_format + "\" version " + std::to_string(manifest_version) + ")");
    }
    m.step = j.at("step").get<std::int64_t>();
    m.num_ps = j.at("num_ps").get<int>();
    if (m.step < 0 || m.num_ps < 1 || m.num_ps > 65536) {
      throw bad("step " + std::to_string(m.step) + ", num_ps " + std::to_string(m.num_ps) + " out of range");
    }
    const auto& files = j.at("files");
    if (!files.is_array() || files.size() != static_cast<std::size_t>(m.num_ps)) {
      throw bad("it lists " + std::to_string(files.size()) + " shard files for " + std::to_string(m.num_ps) + " ps tasks");
    }
    for (std::size_t i = 0; i < files.size(); ++i) {
      Manifest::File f;
      f.name = files[i].at("name").get<std::string>();
      f.bytes = files[i].at("bytes").get<std::uint64_t>();
      const auto h = parse_hex64(files[i].at("xxh64").get<std::string>());
      if (f.name != actors::shard_file_name(static_cast<int>(i), m.num_ps) || !h) {
        throw bad("shard file " + std::to_string(i) + " is " + base::quoted(f.name) + " with xxh64 " +
                  files[i].at("xxh64").dump() + " (expected " + actors::shard_file_name(static_cast<int>(i), m.num_ps) +
                  " and 16 hex digits)");
      }
      f.xxh64 = *h;
      m.files.push_back(std::move(f));
    }
    std::set<std::string> names, keys;
    for (const auto& jv : j.at("variables")) {
      ShardedVariable v;
      v.name = jv.at("name").get<std::string>();
      const auto dt = dtype_from(jv.at("dtype").get<std::string>());
      if (!dt) throw bad("variable " + base::quoted(v.name) + " has dtype " + jv.at("dtype").dump());
      v.dtype = *dt;
      v.shape = jv.at("shape").get<Shape>();
      if (v.shape.empty() || !names.insert(v.name).second) {
        throw bad("variable " + base::quoted(v.name) + " is listed twice or has no rows");
      }
      std::uint64_t elements = 1;
      for (std::size_t a = 0; a < v.shape.size(); ++a) {
        const std::int64_t d = v.shape[a];
        if (d < (a == 0 ? 1 : 0) || d > (std::int64_t{1} << 40)) {
          throw bad("variable " + base::quoted(v.name) + " has shape " + shape_to_string(v.shape));
        }
        elements *= static_cast<std::uint64_t>(d == 0 ? 1 : d);
        if (elements > (std::uint64_t{1} << 40)) {
          throw bad("variable " + base::quoted(v.name) + " has shape " + shape_to_string(v.shape) + " (too large)");
        }
      }
      std::int64_t rows = 0;
      for (const auto& js : jv.at("shards")) {
        ShardedVariable::Shard s{js.at("ps").get<int>(), js.at("rows").get<std::int64_t>(), js.at("key").get<std::string>()};
        if (s.ps < 0 || s.ps >= m.num_ps || s.rows < 1 || s.rows > v.shape[0] || !keys.insert(s.key).second) {
          throw bad("variable " + base::quoted(v.name) + "'s shard " + base::quoted(s.key) + " (ps " +
                    std::to_string(s.ps) + ", " + std::to_string(s.rows) + " rows) is out of range or listed twice");
        }
        rows += s.rows;
        v.shards.push_back(std::move(s));
      }
      if (rows != v.shape[0]) {
        throw bad("variable " + base::quoted(v.name) + "'s shards hold " + std::to_string(rows) + " rows of " +
                  std::to_string(v.shape[0]));
      }
      m.variables.push_back(std::move(v));
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  }
  return m;
}

// Every shard file checked against the manifest (size and XXH64), then read (every tensor's own
// checksum). Throws CheckpointError naming the first bad file.
std::vector<tf::checkpoint_contents> read_shard_files(const std::string& dir, const Manifest& m) {
  std::vector<tf::checkpoint_contents> out;
  for (const auto& f : m.files) {
    const std::string path = (fs::path(dir) / f.name).string();
    std::string problem;
    const auto got = hash_file(path, problem);
    if (!got) throw CheckpointError("sharded checkpoint " + dir + ": shard file " + path + " is " + problem);
    if (got->first != f.bytes || got->second != f.xxh64) {
      throw CheckpointError("sharded checkpoint " + dir + ": shard file " + path + " has " +
                            std::to_string(got->first) + " bytes with XXH64 " + hex64(got->second) +
                            ", the manifest says " + std::to_string(f.bytes) + " bytes with " + hex64(f.xxh64) +
                            " (damaged or replaced)");
    }
    try {
      out.push_back(tf::read_checkpoint_file(path));
    } catch (const tf::checkpoint_file_error& e) {
      throw CheckpointError(e.what());
    }
  }
  return out;
}

// One saved shard's tensors, found in its ps task's file and checked against the manifest.
struct SavedShard {
  const tf::checkpoint_entry* value = nullptr;
  std::vector<const tf::checkpoint_entry*> slots;
  std::int64_t applied = 0;
  std::int64_t kind = -1;
  std::int64_t rows = 0;
};

SavedShard find_shard(const tf::checkpoint_contents& file, const ShardedVariable& v, const ShardedVariable::Shard& s) {
  auto bad = [&](const std::string& what) {
    return CheckpointError("sharded checkpoint file " + file.path() + ": shard " + base::quoted(s.key) + " of " +
                           base::quoted(v.name) + ": " + what);
  };
  SavedShard out;
  out.rows = s.rows;
  out.value = file.find(s.key);
  if (!out.value) throw bad("missing");
  const std::size_t row_bytes = [&] {
    std::size_t n = dtype_size(v.dtype);
    for (std::size_t d = 1; d < v.shape.size(); ++d) n *= static_cast<std::size_t>(v.shape[d]);
    return n;
  }();
  const std::size_t nbytes = row_bytes * static_cast<std::size_t>(s.rows);
  if (out.value->type != troupe::detail::to_scalar_type(v.dtype) || out.value->nbytes != nbytes) {
    throw bad("holds " + std::to_string(out.value->nbytes) + " bytes of another type, expected " +
              std::to_string(nbytes) + " bytes of " + dtype_text(v.dtype));
  }
  const auto* state = file.find(s.key + "/state");
  if (!state || state->type != base::scalar_type::i64 || state->nbytes != 16) throw bad("its state is missing or malformed");
  std::int64_t st[2];
  std::memcpy(st, state->data, 16);
  out.applied = st[0];
  out.kind = st[1];
  if (out.kind < -1 || out.kind > static_cast<std::int64_t>(actors::shard_optimizer::adamw) || out.applied < 0 ||
      (out.kind < 0 && out.applied != 0)) {
    throw bad("its state says optimizer " + std::to_string(out.kind) + " after " + std::to_string(out.applied) + " updates");
  }
  const int nslots = out.kind < 0 ? 0 : actors::slot_count(static_cast<actors::shard_optimizer>(out.kind));
  for (int k = 0; k < nslots; ++k) {
    const auto* slot = file.find(s.key + "/slot_" + std::to_string(k));
    if (!slot || slot->type != out.value->type || slot->nbytes != nbytes) throw bad("slot " + std::to_string(k) + " is missing or of another size");
    out.slots.push_back(slot);
  }
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
                         const std::vector<ShardedVariable>& variables, const std::string& who) {
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
  std::map<std::string, const ShardedVariable*> saved;
  for (const auto& v : m.variables) saved[v.name] = &v;
  std::vector<actors::dispatcher::shard_restore> restores;
  for (const RestoreTarget& target : targets) {
    const ShardedVariable& v = target.current;
    auto it = saved.find(v.name);
    if (it == saved.end() && !target.alias.empty()) it = saved.find(target.alias);
    if (it == saved.end()) {
      std::string held;
      for (const auto& sv : m.variables) held += (held.empty() ? "" : ", ") + base::quoted(sv.name);
      throw CheckpointError("sharded checkpoint " + path + " has no variable " + base::quoted(v.name) +
                            (target.alias.empty() || target.alias == v.name ? std::string()
                                                                            : " (" + base::quoted(target.alias) + ")") +
                            " (it holds " + (held.empty() ? std::string("none") : held) + ")");
    }
    const ShardedVariable& sv = *it->second;
    if (sv.dtype != v.dtype || sv.shape != v.shape) {
      throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(sv.name) + " is " +
                            dtype_text(sv.dtype) + " " + shape_to_string(sv.shape) + ", the strategy's " +
                            base::quoted(v.name) + " is " + dtype_text(v.dtype) + " " + shape_to_string(v.shape));
    }
    std::vector<SavedShard> parts;
    std::int64_t kind = -1;
    for (const auto& s : sv.shards) {
      parts.push_back(find_shard(files[static_cast<std::size_t>(s.ps)], sv, s));
      if (parts.back().kind >= 0) {
        if (kind >= 0 && kind != parts.back().kind) {
          throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(v.name) +
                                "'s shards were updated by different optimizers");
        }
        kind = parts.back().kind;
      }
    }
    const int nslots = kind < 0 ? 0 : actors::slot_count(static_cast<actors::shard_optimizer>(kind));
    std::size_t row_bytes = dtype_size(v.dtype);
    for (std::size_t d = 1; d < v.shape.size(); ++d) row_bytes *= static_cast<std::size_t>(v.shape[d]);
    // The saved rows laid end to end (slots of a shard no optimizer touched yet are zeros), then
    // cut along the current shards.
    const std::size_t total = row_bytes * static_cast<std::size_t>(v.shape[0]);
    std::string elements;
    elements.reserve(total);
    std::vector<std::string> slots(static_cast<std::size_t>(nslots));
    std::vector<std::int64_t> first_row, steps;
    std::int64_t row = 0;
    for (const auto& p : parts) {
      elements.append(static_cast<const char*>(p.value->data), p.value->nbytes);
      for (int k = 0; k < nslots; ++k) {
        if (p.slots.empty()) {
          slots[static_cast<std::size_t>(k)].append(p.value->nbytes, '\0');
        } else {
          slots[static_cast<std::size_t>(k)].append(static_cast<const char*>(p.slots[static_cast<std::size_t>(k)]->data),
                                                    p.value->nbytes);
        }
      }
      first_row.push_back(row);
      steps.push_back(p.applied);
      row += p.rows;
    }
    row = 0;
    for (const auto& s : v.shards) {
      actors::dispatcher::shard_restore r;
      r.ps = s.ps;
      r.key = s.key;
      const std::size_t at = static_cast<std::size_t>(row) * row_bytes, n = static_cast<std::size_t>(s.rows) * row_bytes;
      r.elements = elements.substr(at, n);
      for (const auto& sl : slots) r.slots += sl.substr(at, n);
      // The largest step among the saved shards whose rows this one takes.
      for (std::size_t k = 0; k < parts.size(); ++k) {
        const std::int64_t b = first_row[k], e = first_row[k] + parts[k].rows;
        if (b < row + s.rows && row < e) r.applied = std::max(r.applied, steps[k]);
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
  for (const ShardedVariable& v : m.variables) {
    std::string elements;
    for (const auto& s : v.shards) {
      if (s.ps < 0 || static_cast<std::size_t>(s.ps) >= files.size()) {
        throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(v.name) +
                              " names ps task " + std::to_string(s.ps) + ", which has no shard file");
      }
      const SavedShard p = find_shard(files[static_cast<std::size_t>(s.ps)], v, s);
      elements.append(static_cast<const char*>(p.value->data), p.value->nbytes);
    }
    std::size_t expected = dtype_size(v.dtype);
    for (std::int64_t d : v.shape) expected *= static_cast<std::size_t>(d);
    if (elements.size() != expected) {
      throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(v.name) + "'s shards hold " +
                            std::to_string(elements.size()) + " bytes, its shape " + shape_to_string(v.shape) +
                            " needs " + std::to_string(expected));
    }
    out.variables.emplace(v.name, Tensor::from_bytes(elements.data(), elements.size(), v.dtype, v.shape));
  }
  return out;
}

std::vector<std::string> sharded_checkpoint_dirs(const std::string& directory) {
  std::vector<std::string> out;
  for (auto& [step, dir] : list_dirs(directory)) out.push_back(dir);
  return out;
}

}  // namespace troupe::distribute
