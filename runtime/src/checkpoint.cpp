#include "troupe/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <charconv>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "distribute/cluster/ps_access.hpp"
#include "distribute/cluster/sharded_checkpoint_impl.hpp"
#include "distribute/cluster/sharded_manifest.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/sharded_checkpoint.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/format/checkpoint_file.hpp"
#include "troupe/log.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
namespace tp = troupe::format;

tp::scalar_type to_scalar(DType d) {
  switch (d) {
    case DType::f32: return tp::scalar_type::f32;
    case DType::f64: return tp::scalar_type::f64;
    case DType::i32: return tp::scalar_type::i32;
    case DType::i64: return tp::scalar_type::i64;
    case DType::f16: return tp::scalar_type::f16;
    case DType::bf16: return tp::scalar_type::bf16;
  }
  throw std::invalid_argument("checkpoint: unknown dtype " + std::to_string(static_cast<int>(d)));
}

DType from_scalar(tp::scalar_type t) {
  switch (t) {
    case tp::scalar_type::f32: return DType::f32;
    case tp::scalar_type::f64: return DType::f64;
    case tp::scalar_type::i32: return DType::i32;
    case tp::scalar_type::i64: return DType::i64;
    case tp::scalar_type::f16: return DType::f16;
    case tp::scalar_type::bf16: return DType::bf16;
  }
  throw std::invalid_argument("checkpoint: unknown element type " + std::to_string(static_cast<int>(t)));
}

void require_cross_replica(const char* op) {
  if (distribute::has_strategy() && !distribute::in_cross_replica_context()) {
    throw std::logic_error(std::string(op) +
                           ": call it in cross-replica context, not inside a replica function (Strategy::run)");
  }
}

// The variable's value as a cross-replica read gives it, also outside the strategy's scope: the
// primary component, or the aggregate for on_read variables (over every worker).
Tensor saved_value(const Variable& v) { return v.value(); }

// Sets the value as assign does in cross-replica context (inside or outside the scope): every
// component, and an on_read SUM value split so that it sums back over every replica.
void assign_restored(Variable& v, const Tensor& value) { v.assign(value); }

// The strategy whose workers take part in a save: the open scope's, else (a checkpoint saved in
// main after training) the one its variables were created under.
distribute::Strategy& saving_strategy(const std::map<std::string, Variable>& variables) {
  if (distribute::has_strategy()) return distribute::get_strategy();
  for (const auto& [name, variable] : variables) {
    distribute::Strategy& s = variable.distribute_strategy();
    if (&s != &distribute::detail::default_strategy()) return s;
  }
  return distribute::get_strategy();
}

std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + " " + shape_to_string(shape);
}

// Reads and verifies the whole file; every problem with the file itself is a CheckpointError.
tp::checkpoint_contents load(const std::string& path, bool verify_checksums = true) {
  try {
    tp::checkpoint_read_options options;
    options.verify_tensor_checksums = verify_checksums;
    return tp::read_checkpoint_file(path, options);
  } catch (const tp::checkpoint_file_error& e) {
    throw CheckpointError(e.what());
  }
}

// Variables on the ps tasks of a ParameterServerStrategy whose shards keep optimizer slots there
// (momentum's, Adam's m and v, made by the ps task's first optimizer update), restored from a
// checkpoint file, which holds values only: restoring them would leave slots of another point of
// training beside them. Throws std::invalid_argument naming the first such variable and what
// restores the slots too: a sharded checkpoint (what Checkpoint::save writes for ps variables).
// One round of requests per variable, its shards' at once.
void refuse_ps_slots(const std::map<std::string, Variable>& variables) {
  for (const auto& [key, variable] : variables) {
    auto* ps = dynamic_cast<distribute::ParameterServerStrategy*>(&variable.distribute_strategy());
    if (ps == nullptr) continue;
    std::vector<actors::dispatcher::shard_op> shards;
    for (const auto& v : ps->variables()) {
      if (v.name != variable.name()) continue;
      for (const auto& shard : v.shards) shards.push_back({shard.ps, shard.key, actors::update_op::assign, {}});
    }
    if (shards.empty()) continue;
    const std::vector<int> slots =
        distribute::detail::PsAccess::dispatcher(*ps).shard_slots(shards, distribute::detail::PsAccess::timeout(*ps));
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] == 0) continue;
      throw std::invalid_argument(
          "Checkpoint::restore: variable '" + key + "' lives on the ps tasks of a ParameterServerStrategy, where its "
          "shard '" + shards[i].key + "' keeps " + std::to_string(slots[i]) +
          " optimizer slot(s) beside its values (made by the ps task's optimizer); a checkpoint file holds values "
          "only, and restoring them would leave slots of another point of training beside them: restore a sharded "
          "checkpoint (the directory Checkpoint::save and CheckpointManager write for variables on the ps tasks, "
          "with their slots), or into variables no optimizer has updated yet");
    }
  }
}

// The ParameterServerStrategy whose ps tasks hold `variables`, or nullptr when none of them lives
// on ps tasks. A checkpoint of ps variables is a sharded checkpoint (a directory: every ps task's
// file and the chief's manifest), so every variable must then live on that strategy's ps tasks.
distribute::ParameterServerStrategy* ps_strategy_of(const std::map<std::string, Variable>& variables,
                                                    const char* who) {
  distribute::ParameterServerStrategy* found = nullptr;
  std::string first;
  for (const auto& [key, variable] : variables) {
    auto* ps = dynamic_cast<distribute::ParameterServerStrategy*>(&variable.distribute_strategy());
    if (ps == nullptr || found == ps) continue;
    if (found != nullptr) {
      throw std::invalid_argument(std::string(who) + ": variables '" + first + "' and '" + key +
                                  "' live on the ps tasks of two ParameterServerStrategy objects; a checkpoint is of "
                                  "one cluster (make a Checkpoint per strategy)");
    }
    found = ps;
    first = key;
  }
  if (found == nullptr) return nullptr;
  for (const auto& [key, variable] : variables) {
    if (dynamic_cast<distribute::ParameterServerStrategy*>(&variable.distribute_strategy()) == nullptr) {
      throw std::invalid_argument(
          std::string(who) + ": variable '" + key + "' lives in this process, beside variables on the ps tasks ('" +
          first + "'): a checkpoint of ps variables is written by the ps tasks themselves, so every variable must "
          "be made in the ParameterServerStrategy's scope (or be checkpointed by a Checkpoint of its own)");
    }
  }
  return found;
}

// The name in a sharded checkpoint of the variable a Checkpoint tracks as `key`: the name that
// Checkpoint saved it under, when one did; else `key` itself, else the variable's own name.
const std::string* saved_name(const distribute::ShardedCheckpointValues& saved, const std::string& key,
                              const std::string& own) {
  if (!saved.checkpoint_names.empty()) {
    const auto it = saved.checkpoint_names.find(key);
    return it == saved.checkpoint_names.end() ? nullptr : &it->second;
  }
  if (saved.variables.count(key) != 0) return &key;
  return saved.variables.count(own) != 0 ? &own : nullptr;
}

// What a sharded checkpoint holds for the Checkpoint's `key` (a variable of this process named
// `own`): the variable saved under that name, or, for an optimizer's slot
// "<optimizer>/<slot>/<variable>" (Optimizer::variables(): "adam/m/dense_0/kernel"), the slot the
// ps tasks kept beside that variable (zeros when no optimizer had updated it). nullopt when it
// holds neither.
std::optional<Tensor> sharded_value(const distribute::ShardedCheckpointValues& saved, const std::string& key,
                                    const std::string& own) {
  if (const std::string* name = saved_name(saved, key, own)) return saved.variables.at(*name);
  const std::size_t first = key.find('/');
  const std::size_t second = first == std::string::npos ? first : key.find('/', first + 1);
  if (second == std::string::npos) return std::nullopt;
  const std::string slot = key.substr(first + 1, second - first - 1);
  const std::string of = key.substr(second + 1);
  bool known = false;  // a slot some ps optimizer keeps ("momentum", "m", "v")
  for (auto kind : {actors::shard_optimizer::momentum, actors::shard_optimizer::adam}) {
    for (const std::string& n : distribute::detail::shard_slot_names(static_cast<std::int64_t>(kind))) known |= n == slot;
  }
  const std::string* name = known ? saved_name(saved, of, of) : nullptr;
  if (name == nullptr) return std::nullopt;
  const Tensor& value = saved.variables.at(*name);
  const auto slots = saved.slots.find(*name);
  if (slots == saved.slots.end()) return Tensor::zeros(value.shape(), value.dtype());
  const auto it = slots->second.find(slot);
  if (it == slots->second.end()) {
    std::string kept;
    for (const auto& [slot_name, tensor] : slots->second) kept += (kept.empty() ? "'" : ", '") + slot_name + "'";
    throw CheckpointError("sharded checkpoint " + saved.path + ": no slot '" + slot + "' of variable '" + of +
                          "' for '" + key + "': the ps tasks' optimizer kept " + kept +
                          " (restore into a model compiled with the optimizer it was trained with)");
  }
  return it->second;
}

// The shards of every ps variable of `variables` (their strategy's description of each), in the
// checkpoint's order, with the name each has in the Checkpoint.
std::vector<distribute::detail::RestoreTarget> ps_targets(distribute::ParameterServerStrategy& strategy,
                                                          const std::map<std::string, Variable>& variables) {
  std::map<std::string, distribute::ShardedVariable> all;
  for (auto& v : strategy.variables()) {
    std::string name = v.name;
    all.emplace(std::move(name), std::move(v));
  }
  std::vector<distribute::detail::RestoreTarget> out;
  for (const auto& [key, variable] : variables) {
    auto it = all.find(variable.name());
    if (it == all.end()) {
      throw std::logic_error("Checkpoint: variable '" + key + "' (" + variable.name() +
                             ") is not among its ParameterServerStrategy's variables");
    }
    out.push_back({it->second, key});
  }
  return out;
}

// The value for every variable, once the file is known to hold each with its dtype and shape.
// Nothing is assigned here, so a mismatch leaves every variable as it was.
std::vector<std::pair<Variable, Tensor>> match(const tp::checkpoint_contents& file,
                                               const std::map<std::string, Variable>& variables) {
  std::vector<std::string> missing;
  std::vector<std::pair<Variable, Tensor>> staged;
  staged.reserve(variables.size());
  for (const auto& [name, variable] : variables) {
    const tp::checkpoint_entry* e = file.find(name);
    if (e == nullptr) {
      missing.push_back("'" + name + "'");
      continue;
    }
    const DType dtype = from_scalar(e->type);
    const Shape& shape = e->shape;
    if (dtype != variable.dtype() || shape != variable.shape()) {
      throw CheckpointError("checkpoint " + file.path() + ": variable '" + name + "' is " +
                            describe(variable.dtype(), variable.shape()) + ", the file holds it as " +
                            describe(dtype, shape));
    }
    Tensor value = e->nbytes == 0 ? Tensor::zeros(shape, dtype) : Tensor::from_bytes(e->data, e->nbytes, dtype, shape);
    staged.emplace_back(variable, std::move(value));
  }
  if (!missing.empty()) {
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
    std::string held;
    for (const auto& e : file.tensors()) held += (held.empty() ? "'" : ", '") + e.name + "'";
    throw CheckpointError("checkpoint " + file.path() + ": no variable " + names + " in the file (it holds " +
                          (held.empty() ? std::string("no variables") : held) + ")");
  }
  return staged;
}

std::int64_t restore_from(const tp::checkpoint_contents& file, Checkpoint& checkpoint) {
  auto staged = match(file, checkpoint.variables());
  refuse_ps_slots(checkpoint.variables());
  for (auto& [variable, value] : staged) assign_restored(variable, value);
  checkpoint.set_step(file.step());
  return file.step();
}

// The step in "ckpt-<step>.ckpt", or nullopt for any other name.
std::optional<std::int64_t> step_of(const std::string& filename) {
  constexpr std::string_view prefix = "ckpt-", suffix = ".ckpt";
  if (filename.size() <= prefix.size() + suffix.size()) return std::nullopt;
  if (filename.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  if (filename.compare(filename.size() - suffix.size(), suffix.size(), suffix) != 0) return std::nullopt;
  const char* begin = filename.data() + prefix.size();
  const char* end = filename.data() + filename.size() - suffix.size();
  if (!std::all_of(begin, end, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::int64_t step = 0;
  auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return step;
}

// The N in "<name>-<N>.ckpt", or nullopt for any other name.
std::optional<std::int64_t> number_of(const std::string& filename) {
  constexpr std::string_view suffix = ".ckpt";
  if (filename.size() <= suffix.size()) return std::nullopt;
  if (filename.compare(filename.size() - suffix.size(), suffix.size(), suffix) != 0) return std::nullopt;
  const std::size_t dash = filename.rfind('-', filename.size() - suffix.size());
  if (dash == std::string::npos || dash == 0) return std::nullopt;
  const char* begin = filename.data() + dash + 1;
  const char* end = filename.data() + filename.size() - suffix.size();
  if (begin == end || !std::all_of(begin, end, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::int64_t n = 0;
  auto [ptr, ec] = std::from_chars(begin, end, n);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return n;
}

// (step, path) of every checkpoint in `directory`, oldest first.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& directory) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  fs::directory_iterator it(directory, ec);
  if (ec) return out;  // no directory yet: no checkpoints
  for (const fs::directory_entry& entry : it) {
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;
    if (auto step = step_of(entry.path().filename().string())) out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether `digits` is a non-empty run of decimal digits.
bool all_digits(std::string_view digits) {
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What a save of this manager's prefix may leave behind when it is killed: the temporary of a
// chief's save ("ckpt-<step>.ckpt.tmp-<pid>-<n>"), a non-chief worker's file
// ("ckpt-<step>.worker-<rank>.tmp.ckpt") and that file's own temporary. Returns the pid of the
// writer when the name carries one (0 when it does not); nullopt for any other name.
std::optional<long> stale_temporary_writer(const std::string& filename) {
  constexpr std::string_view prefix = "ckpt-";
  if (filename.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  std::string_view rest(filename);
  rest.remove_prefix(prefix.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || !all_digits(rest.substr(0, dot))) return std::nullopt;
  rest.remove_prefix(dot);
  long pid = 0;
  const std::size_t marker = rest.rfind(tp::checkpoint_temporary_marker);
  if (marker != std::string_view::npos) {  // ".tmp-<pid>-<n>" at the end
    std::string_view tail = rest.substr(marker + tp::checkpoint_temporary_marker.size());
    const std::size_t dash = tail.find('-');
    if (dash == std::string_view::npos || !all_digits(tail.substr(0, dash)) || !all_digits(tail.substr(dash + 1))) {
      return std::nullopt;
    }
    auto [ptr, ec] = std::from_chars(tail.data(), tail.data() + dash, pid);
    if (ec != std::errc() || pid <= 0) return std::nullopt;
    rest = rest.substr(0, marker);
  }
  if (rest == ".ckpt") return marker != std::string_view::npos ? std::optional<long>(pid) : std::nullopt;
  constexpr std::string_view worker = ".worker-", worker_end = ".tmp.ckpt";
  if (rest.size() > worker.size() + worker_end.size() && rest.compare(0, worker.size(), worker) == 0 &&
      rest.compare(rest.size() - worker_end.size(), worker_end.size(), worker_end) == 0 &&
      all_digits(rest.substr(worker.size(), rest.size() - worker.size() - worker_end.size()))) {
    return pid;
  }
  return std::nullopt;
}

// Removes the temporary files that killed saves of this prefix left in `directory`. A file whose
// writer (by the pid in its name) is still running on this host is another process's save in
// progress and stays.
void remove_stale_temporaries(const std::string& directory) {
  std::error_code ec;
  fs::directory_iterator it(directory, ec);
  if (ec) return;
  for (const fs::directory_entry& entry : it) {
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;
    const std::string name = entry.path().filename().string();
    const std::optional<long> writer = stale_temporary_writer(name);
    if (!writer) continue;
    if (*writer > 0 && *writer != static_cast<long>(::getpid()) &&
        (::kill(static_cast<pid_t>(*writer), 0) == 0 || errno == EPERM)) {
      continue;
    }
    std::error_code remove_ec;
    if (fs::remove(entry.path(), remove_ec)) {
      log(LogLevel::info, "CheckpointManager: removed " + entry.path().string() + ", left by an interrupted save");
    } else if (remove_ec) {
      log(LogLevel::warning, "CheckpointManager: cannot remove " + entry.path().string() +
                                 ", left by an interrupted save: " + remove_ec.message());
    }
  }
}

// A checkpoint directory that cannot be written is reported now, before any training, not at the
// first save: the directory is created when missing, and a probe file is created and removed.
void check_directory_usable(const std::string& directory) {
  std::error_code ec;
  const fs::file_status status = fs::status(directory, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    throw CheckpointError("CheckpointManager: the checkpoint directory " + directory +
                          " is not a directory (it is a file); give a directory, or a path that does not exist yet");
  }
  if (!fs::exists(status)) {
    fs::create_directories(directory, ec);
    if (ec) {
      throw CheckpointError("CheckpointManager: cannot create the checkpoint directory " + directory + ": " +
                            ec.message() + " (give a directory this process can create and write)");
    }
  }
  const std::string probe = (fs::path(directory) / (".ckpt-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw CheckpointError("CheckpointManager: cannot write in the checkpoint directory " + directory + ": " +
                          std::strerror(err) + " (make it writable, or give another directory)");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// The files "<file_prefix>-<N>.ckpt" beside `file_prefix`, as (N, path).
std::vector<std::pair<std::int64_t, std::string>> numbered_files(const std::string& file_prefix) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  const fs::path prefix(file_prefix);
  const std::string stem = prefix.filename().string() + "-";
  const fs::path parent = prefix.parent_path().empty() ? fs::path(".") : prefix.parent_path();
  std::error_code ec;
  fs::directory_iterator it(parent, ec);
  if (ec) return out;
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, stem.size(), stem) != 0) continue;
    // The number starts right after the stem: "model-1.ckpt" is model's, "model-a-1.ckpt" is not.
    if (const auto n = number_of(name); n && name.rfind('-') == stem.size() - 1) {
      out.emplace_back(*n, (prefix.parent_path() / name).string());
    }
    // A sharded checkpoint (of variables on ps tasks) is the directory "<prefix>-<N>".
    const std::string_view number = std::string_view(name).substr(stem.size());
    std::error_code type_ec;
    if (all_digits(number) && number.size() <= 18 && entry.is_directory(type_ec)) {
      std::int64_t n = 0;
      std::from_chars(number.data(), number.data() + number.size(), n);
      out.emplace_back(n, (prefix.parent_path() / name).string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What restore reads for `save_path`: the file itself, or "<save_path>.ckpt" (TensorFlow's form
// of the path save returned). Neither there: a CheckpointError that names what save wrote when
// `save_path` is a prefix given to save.
std::string resolve_save_path(const std::string& save_path) {
  std::error_code ec;
  if (fs::is_regular_file(save_path, ec) || fs::is_directory(save_path, ec)) return save_path;
  const std::string with_suffix = save_path + ".ckpt";
  if (fs::is_regular_file(with_suffix, ec)) return with_suffix;
  const auto numbered = numbered_files(save_path);
  if (numbered.empty()) return save_path;  // load names the missing file
  throw CheckpointError("checkpoint " + save_path + ": no such file; save(\"" + save_path +
                        "\") numbers its files, the highest being " + numbered.back().second +
                        " (restore the path save returned, or latest_checkpoint(directory))");
}

void create_parent_directory(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw CheckpointError("checkpoint " + path + ": cannot create its directory: " + ec.message());
}

// Writes the sharded checkpoint of `variables` (all on `strategy`'s ps tasks) as `dir`.
std::string save_sharded(distribute::ParameterServerStrategy& strategy, const std::map<std::string, Variable>& variables,
                         const std::string& dir, std::int64_t step, const char* who) {
  std::vector<distribute::ShardedVariable> shards;
  std::vector<std::string> names;
  for (auto& t : ps_targets(strategy, variables)) {
    shards.push_back(std::move(t.current));
    names.push_back(std::move(t.alias));
  }
  const std::string absolute = distribute::detail::absolute_checkpoint_directory(dir);
  create_parent_directory(absolute);
  return distribute::detail::save_sharded(strategy, absolute, step, shards, who, names);
}

// Restores `checkpoint`'s variables (all on `strategy`'s ps tasks) from the sharded checkpoint
// `dir`, resharded onto their current shards.
std::int64_t restore_sharded(distribute::ParameterServerStrategy& strategy, Checkpoint& checkpoint,
                             const std::string& dir) {
  const std::int64_t step = distribute::detail::restore_sharded(strategy, dir, ps_targets(strategy, checkpoint.variables()));
  checkpoint.set_step(step);
  return step;
}

// The sharded checkpoints "ckpt-<step>" of a CheckpointManager's directory, (step, path), oldest first.
std::vector<std::pair<std::int64_t, std::string>> list_sharded(const std::string& directory) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  for (std::string& dir : distribute::sharded_checkpoint_dirs(distribute::detail::absolute_checkpoint_directory(directory))) {
    const std::string name = fs::path(dir).filename().string();
    std::int64_t step = 0;
    std::from_chars(name.data() + 5, name.data() + name.size(), step);  // "ckpt-<digits>", as listed
    out.emplace_back(step, std::move(dir));
  }
  return out;
}

}  // namespace

Checkpoint::Checkpoint(std::map<std::string, Variable> variables) : variables_(std::move(variables)) {}

void Checkpoint::add(const std::string& name, Variable variable) {
  if (variables_.count(name) != 0) {
    throw std::invalid_argument("Checkpoint::add: a variable named '" + name + "' is already present");
  }
  variables_.emplace(name, std::move(variable));
}

void Checkpoint::add(const std::map<std::string, Variable>& variables) {
  for (const auto& [name, variable] : variables) {
    if (variables_.count(name) != 0) {
      throw std::invalid_argument("Checkpoint::add: a variable named '" + name + "' is already present");
    }
  }
  for (const auto& [name, variable] : variables) variables_.emplace(name, variable);
}

std::string Checkpoint::save(const std::string& file_prefix) {
  require_cross_replica("Checkpoint::save");
  if (file_prefix.empty()) throw std::invalid_argument("Checkpoint::save: empty file prefix");
  // Past every number already on disk for this prefix: a new run never overwrites an old file.
  std::int64_t last = save_counter_;
  for (const auto& [n, path] : numbered_files(file_prefix)) last = std::max(last, n);
  const std::string written = write(file_prefix + "-" + std::to_string(last + 1));
  save_counter_ = last + 1;
  return written;
}

std::string Checkpoint::write(const std::string& path_prefix) {
  require_cross_replica("Checkpoint::write");
  // Variables on ps tasks: a sharded checkpoint, every ps task writing its own shards with their
  // optimizer slots at once, the manifest last, the directory renamed into place.
  if (auto* ps = ps_strategy_of(variables_, "Checkpoint::write")) {
    return save_sharded(*ps, variables_, path_prefix, step_, "Checkpoint::write");
  }
  // Under multi-worker every worker takes part (on_read values are aggregated over all of them)
  // and writes the same file, but only the chief writes the real path: the others write a
  // temporary one next to it and remove it, as TensorFlow's workers do.
  auto& backend = saving_strategy(variables_).backend();
  const bool chief = backend.workers().rank() == 0;
  const std::string path = chief ? path_prefix + ".ckpt"
                                 : path_prefix + ".worker-" + std::to_string(backend.workers().rank()) + ".tmp.ckpt";
  std::vector<Tensor> values;  // keeps the bytes alive while the file references them
  std::vector<tp::checkpoint_tensor> tensors;
  values.reserve(variables_.size());
  tensors.reserve(variables_.size());
  for (const auto& [name, variable] : variables_) {
    const Tensor& v = values.emplace_back(saved_value(variable).to(Device()));  // GPU values come to the host
    tensors.push_back(tp::checkpoint_tensor{name, to_scalar(v.dtype()), v.shape(), v.raw_data(), v.nbytes()});
  }
  create_parent_directory(path);
  try {
    tp::write_checkpoint_file(path, step_, tensors);
  } catch (const tp::checkpoint_file_error& e) {
    throw CheckpointError(e.what());
  }
  if (!chief) {
    std::error_code ec;
    fs::remove(path, ec);
  }
  return path;
}

void Checkpoint::restore(const std::string& save_path) {
  require_cross_replica("Checkpoint::restore");
  const std::string path = resolve_save_path(save_path);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (auto* ps = ps_strategy_of(variables_, "Checkpoint::restore")) {
      restore_sharded(*ps, *this, path);
      return;
    }
    // Variables of this process (a model outside the cluster): each variable's shards joined, an
    // optimizer's slot from the slots the ps tasks kept beside its variable.
    const distribute::ShardedCheckpointValues saved = distribute::read_sharded_checkpoint(path);
    std::vector<std::pair<Variable, Tensor>> staged;
    for (const auto& [key, variable] : variables_) {
      const std::optional<Tensor> found = sharded_value(saved, key, variable.name());
      if (!found) {
        std::string held;
        for (const auto& [name, value] : saved.variables) held += (held.empty() ? "'" : ", '") + name + "'";
        if (!saved.checkpoint_names.empty()) {
          held.clear();
          for (const auto& [name, value] : saved.checkpoint_names) held += (held.empty() ? "'" : ", '") + name + "'";
        }
        throw CheckpointError("sharded checkpoint " + path + ": no variable '" + key + "' in it (it holds " + held +
                              " and the slots of the optimizer the ps tasks ran)");
      }
      Tensor value = *found;
      // A scalar lives on the ps tasks as one row.
      if (value.dtype() != variable.dtype() || value.num_elements() != shape_num_elements(variable.shape())) {
        throw CheckpointError("sharded checkpoint " + path + ": variable '" + key + "' is " +
                              describe(variable.dtype(), variable.shape()) + ", the checkpoint holds it as " +
                              describe(value.dtype(), value.shape()));
      }
      if (value.shape() != variable.shape()) value = value.reshape(variable.shape());
      staged.emplace_back(variable, std::move(value));
    }
    for (auto& [variable, value] : staged) assign_restored(variable, value);
    step_ = saved.step;
    return;
  }
  restore_from(load(path), *this);
}

CheckpointManager::CheckpointManager(Checkpoint checkpoint, std::string directory, int max_to_keep)
    : checkpoint_(std::move(checkpoint)), directory_(std::move(directory)), max_to_keep_(max_to_keep) {
  if (max_to_keep_ < 1) {
    throw std::invalid_argument("CheckpointManager: max_to_keep " + std::to_string(max_to_keep_) +
                                " (expected at least 1)");
  }
  if (directory_.empty()) throw std::invalid_argument("CheckpointManager: empty directory name");
  check_directory_usable(directory_);
  remove_stale_temporaries(directory_);
  distribute::detail::remove_interrupted_saves(directory_, "CheckpointManager");
  // Variables on ps tasks: where Model::fit restores every shard from after a lost ps task came
  // back (PsFitLoop), as the ps tasks reach it.
  if (auto* ps = ps_strategy_of(checkpoint_.variables(), "CheckpointManager")) {
    distribute::detail::PsAccess::set_checkpoint_directory(*ps, distribute::detail::absolute_checkpoint_directory(directory_));
  }
}

std::string CheckpointManager::save(std::int64_t step) {
  if (step < 0) {
    throw std::invalid_argument("CheckpointManager::save: step " + std::to_string(step) + " (expected >= 0)");
  }
  checkpoint_.set_step(step);
  if (auto* ps = ps_strategy_of(checkpoint_.variables(), "CheckpointManager::save")) {
    const std::string dir = (fs::path(distribute::detail::absolute_checkpoint_directory(directory_)) /
                             ("ckpt-" + std::to_string(step))).string();
    const std::string written = save_sharded(*ps, checkpoint_.variables(), dir, step, "CheckpointManager::save");
    distribute::detail::prune_sharded(fs::path(dir).parent_path().string(), max_to_keep_, written);
    return written;
  }
  const std::string written = checkpoint_.write((fs::path(directory_) / ("ckpt-" + std::to_string(step))).string());
  if (saving_strategy(checkpoint_.variables()).backend().workers().rank() != 0) return written;  // the chief keeps the directory
  auto all = list_checkpoints(directory_);
  std::size_t excess = all.size() > static_cast<std::size_t>(max_to_keep_) ? all.size() - max_to_keep_ : 0;
  for (const auto& [old_step, path] : all) {
    if (excess == 0) break;
    if (fs::path(path) == fs::path(written)) continue;
    std::error_code ec;
    if (!fs::remove(path, ec) && ec) {
      log(LogLevel::warning, "CheckpointManager: cannot delete the old checkpoint " + path + ": " + ec.message());
    }
    --excess;
  }
  return written;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  auto all = sharded() ? list_sharded(directory_) : list_checkpoints(directory_);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  if (!sharded()) return checkpoint_files(directory_);
  std::vector<std::string> out;
  for (auto& [step, dir] : list_sharded(directory_)) out.push_back(std::move(dir));
  return out;
}

bool CheckpointManager::sharded() const {
  return ps_strategy_of(checkpoint_.variables(), "CheckpointManager") != nullptr;
}

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  std::optional<std::string> latest;
  fs::file_time_type latest_time;
  std::int64_t latest_number = -1;
  std::error_code ec;
  fs::directory_iterator it(directory, ec);
  if (ec) return std::nullopt;
  for (const fs::directory_entry& entry : it) {
    std::error_code entry_ec;
    const std::string name = entry.path().filename().string();
    std::optional<std::int64_t> n;
    if (entry.is_regular_file(entry_ec)) {
      n = number_of(name);
    } else if (distribute::detail::is_sharded_checkpoint(entry.path().string())) {
      // A sharded checkpoint of ps variables, the directory "<prefix>-<N>".
      const std::size_t dash = name.rfind('-');
      if (dash != std::string::npos && dash > 0 && all_digits(std::string_view(name).substr(dash + 1)) &&
          name.size() - dash - 1 <= 18) {
        std::int64_t v = 0;
        std::from_chars(name.data() + dash + 1, name.data() + name.size(), v);
        n = v;
      }
    }
    if (!n) continue;
    const fs::file_time_type time = entry.last_write_time(entry_ec);
    if (entry_ec) continue;
    if (!latest || time > latest_time || (time == latest_time && *n > latest_number)) {
      latest = entry.path().string();
      latest_time = time;
      latest_number = *n;
    }
  }
  return latest;
}

std::vector<std::string> checkpoint_files(const std::string& directory) {
  std::vector<std::string> out;
  for (auto& [step, path] : list_checkpoints(directory)) out.push_back(std::move(path));
  return out;
}

std::optional<std::int64_t> CheckpointManager::restore_or_initialize() {
  require_cross_replica("CheckpointManager::restore_or_initialize");
  if (auto* ps = ps_strategy_of(checkpoint_.variables(), "CheckpointManager::restore_or_initialize")) {
    const auto all = list_sharded(directory_);
    std::string problems;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      try {
        // The files first: a damaged checkpoint is skipped, a mismatch with the variables is not.
        distribute::detail::verify_sharded(it->second);
      } catch (const CheckpointError& e) {
        log(LogLevel::warning, std::string("CheckpointManager: skipping a damaged checkpoint, ") + e.what() +
                                   (std::next(it) != all.rend() ? "; trying an older one" : ""));
        problems += std::string("\n  ") + e.what();
        continue;
      }
      return restore_sharded(*ps, checkpoint_, it->second);
    }
    if (all.empty()) return std::nullopt;
    throw CheckpointError("CheckpointManager: none of the " + std::to_string(all.size()) + " checkpoints in " +
                          directory_ + " reads back intact:" + problems);
  }
  auto all = list_checkpoints(directory_);
  if (all.empty()) return std::nullopt;
  std::string problems;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    tp::checkpoint_contents file;
    try {
      file = load(it->second);
    } catch (const CheckpointError& e) {
      log(LogLevel::warning, std::string("CheckpointManager: skipping a damaged checkpoint, ") + e.what() +
                                 (std::next(it) != all.rend() ? "; trying an older one" : ""));
      problems += std::string("\n  ") + e.what();
      continue;
    }
    return restore_from(file, checkpoint_);
  }
  throw CheckpointError("CheckpointManager: none of the " + std::to_string(all.size()) + " checkpoints in " +
                        directory_ + " reads back intact:" + problems);
}

CheckpointInfo inspect_checkpoint(const std::string& path, bool read_values) {
  const tp::checkpoint_contents file = load(path, /*verify_checksums=*/false);
  CheckpointInfo info;
  info.path = path;
  info.step = file.step();
  info.file_bytes = file.file_bytes();
  for (const tp::checkpoint_entry& e : file.tensors()) {
    info.entries.push_back(CheckpointEntry{e.name, from_scalar(e.type), e.shape, e.nbytes,
                                           tp::xxhash64(e.data, e.nbytes) == e.checksum, Tensor()});
    if (read_values) info.entries.back().value = Tensor::from_bytes(e.data, e.nbytes, from_scalar(e.type), e.shape);
  }
  return info;
}

}  // namespace troupe
