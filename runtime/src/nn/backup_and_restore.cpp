#include "troupe/nn/backup_and_restore.hpp"

#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "troupe/distribute/context.hpp"
#include "troupe/distribute/input.hpp"
#include "troupe/distribute/preemption.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/log.hpp"

namespace troupe::nn {
namespace {

constexpr const char* position_name = "_backup/position";
const std::string rng_prefix = "_backup/rng/";

// An engine's state as the words its stream operator writes (the state, then the index).
std::vector<std::int64_t> engine_words(const std::mt19937_64& engine) {
  std::ostringstream text;
  text << engine;
  std::istringstream in(text.str());
  std::vector<std::int64_t> words;
  std::uint64_t w = 0;
  while (in >> w) words.push_back(static_cast<std::int64_t>(w));
  return words;
}

void set_engine(std::mt19937_64& engine, const std::vector<std::int64_t>& words, const std::string& name) {
  std::ostringstream text;
  for (std::int64_t w : words) text << static_cast<std::uint64_t>(w) << ' ';
  std::istringstream in(text.str());
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) throw CheckpointError("BackupAndRestore: the backed-up state of the random engine '" + name + "' does not read back");
  engine = restored;
}

Tensor position_tensor(const TrainingPosition& at) {
  return Tensor::from_vector<std::int64_t>(
      {at.step, at.epoch, at.step_in_epoch, at.iterator_position, at.input_passes}, {5});
}

BackupOptions checked(BackupOptions options) {
  if (options.save_freq < 0) {
    throw std::invalid_argument("BackupAndRestore: save_freq " + std::to_string(options.save_freq) +
                                " (expected a number of steps >= 1, or 0 for every epoch)");
  }
  if (options.max_to_keep < 1) {
    throw std::invalid_argument("BackupAndRestore: max_to_keep " + std::to_string(options.max_to_keep) +
                                " (expected at least 1)");
  }
  return options;
}

}  // namespace

BackupAndRestore::BackupAndRestore(std::string backup_dir, BackupOptions options)
    : dir_(std::move(backup_dir)),
      options_(checked(options)),
      manager_(Checkpoint({}), dir_, options_.max_to_keep) {}

BackupAndRestore::~BackupAndRestore() = default;

void BackupAndRestore::track(const std::map<std::string, Variable>& variables) {
  for (const auto& [name, variable] : variables) track(name, variable);
}

void BackupAndRestore::track(const std::string& name, Variable variable) {
  if (restored_) throw std::logic_error("BackupAndRestore::track: '" + name + "' comes after restore (track everything first)");
  if (name.rfind("_backup/", 0) == 0) {
    throw std::invalid_argument("BackupAndRestore::track: the name '" + name + "' is reserved (names starting _backup/)");
  }
  manager_.checkpoint().add(name, std::move(variable));  // a name already present throws
}

void BackupAndRestore::track_rng(const std::string& name, std::mt19937_64& engine) {
  if (restored_) throw std::logic_error("BackupAndRestore::track_rng: '" + name + "' comes after restore");
  if (!engines_.emplace(name, &engine).second) {
    throw std::invalid_argument("BackupAndRestore::track_rng: a random engine named '" + name + "' is already tracked");
  }
}

// The bookkeeping variables live in the strategy of the caller's scope, like the tracked ones.
void BackupAndRestore::prepare() {
  if (restored_) return;
  if (distribute::has_strategy() && !distribute::in_cross_replica_context()) {
    throw std::logic_error("BackupAndRestore: call restore and save in cross-replica context, not inside Strategy::run");
  }
  strategy_ = &distribute::get_strategy();
  auto scope = strategy_->scope();
  position_.emplace(position_tensor({}), position_name);
  manager_.checkpoint().add(position_name, *position_);
  for (const auto& [name, engine] : engines_) {
    const std::vector<std::int64_t> words = engine_words(*engine);
    Variable state(Tensor::from_vector<std::int64_t>(words, {static_cast<std::int64_t>(words.size())}),
                   rng_prefix + name);
    engine_states_.emplace(name, state);
    manager_.checkpoint().add(rng_prefix + name, state);
  }
  restored_ = true;
}

TrainingPosition BackupAndRestore::restore() {
  if (restored_) throw std::logic_error("BackupAndRestore::restore: call it once, before training");
  prepare();
  auto scope = strategy_->scope();
  bool found = false;
  if (options_.save_before_preemption) {
    distribute::TerminationConfig config;
    config.save_fn = [this](std::int64_t) { write(last_); };
    preemption_ = std::make_unique<distribute::PreemptionCheckpointHandler>(*strategy_, manager_, config);
    found = preemption_->restored_step() >= 0;
  } else {
    found = manager_.restore_or_initialize().has_value();
  }
  TrainingPosition at;
  if (found) {
    const std::vector<std::int64_t> p = position_->value().to_vector<std::int64_t>();
    at = TrainingPosition{p[0], p[1], p[2], p[3], p[4]};
    for (auto& [name, engine] : engines_) set_engine(*engine, engine_states_.at(name).value().to_vector<std::int64_t>(), name);
    log(LogLevel::info, "BackupAndRestore: resuming from " + manager_.latest_checkpoint().value_or(dir_) + " at step " +
                            std::to_string(at.step) + " (epoch " + std::to_string(at.epoch + 1) + ")");
  }
  last_ = at;
  return at;
}

void BackupAndRestore::write(const TrainingPosition& at) {
  prepare();
  auto scope = strategy_->scope();
  position_->assign(position_tensor(at));
  for (auto& [name, engine] : engines_) {
    const std::vector<std::int64_t> words = engine_words(*engine);
    engine_states_.at(name).assign(Tensor::from_vector<std::int64_t>(words, {static_cast<std::int64_t>(words.size())}));
  }
  manager_.save(at.step);
}

void BackupAndRestore::save(const TrainingPosition& at) {
  last_ = at;
  write(at);
}

void BackupAndRestore::save_now() { write(last_); }

void BackupAndRestore::on_step_end(const TrainingPosition& at) {
  last_ = at;
  if (options_.save_freq > 0 && at.step % options_.save_freq == 0) write(at);
  if (preemption_) {
    preemption_->set_total_run_calls(at.step);
    preemption_->save_checkpoint_if_preempted();
  }
}

void BackupAndRestore::on_epoch_end(const TrainingPosition& at) {
  last_ = at;
  if (options_.save_freq == 0) write(at);
}

void BackupAndRestore::on_train_end() {
  preemption_.reset();
  if (!options_.delete_checkpoint) return;
  for (const std::string& path : manager_.checkpoints()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);  // every worker removes the same files: a missing one is fine
  }
}

std::int64_t BackupAndRestore::skip(distribute::DistributedIterator& iterator, std::int64_t n) {
  std::int64_t taken = 0;
  for (; taken < n; ++taken) {
    if (!iterator.get_next_as_optional()) break;
  }
  return taken;
}

void BackupAndRestore::replay_passes(const distribute::DistributedDataset& dataset, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    distribute::DistributedIterator pass = dataset.make_iterator();
    pass.get_next_as_optional();
  }
}

}  // namespace troupe::nn
