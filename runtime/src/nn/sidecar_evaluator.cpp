// SidecarEvaluator (troupe/nn/sidecar_evaluator.hpp): watches a directory of sharded checkpoints
// and evaluates each new one with a local copy of the model.
#include "troupe/nn/sidecar_evaluator.hpp"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "troupe/base/parse_number.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/checkpoint.hpp"
#include "troupe/distribute/sharded_checkpoint.hpp"
#include "troupe/format/event_file.hpp"

namespace troupe::nn {

namespace fs = std::filesystem;

namespace {

// The step a checkpoint directory's name carries ("ckpt-<step>").
std::optional<std::int64_t> step_of(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  if (name.rfind("ckpt-", 0) != 0) return std::nullopt;
  const auto v = base::parse_int(std::string_view(name).substr(5));
  if (!v || *v < 0) return std::nullopt;
  return static_cast<std::int64_t>(*v);
}

// Loads the checkpoint's variables into the model's, each found by its name in the Checkpoint that
// saved them (a model's CheckpointManager: "dense_0/kernel"), else by its own (which the ps tasks
// keep it under), else by that checkpoint name.
void load_into(const Model& model, const distribute::ShardedCheckpointValues& values) {
  auto variables = model.layers().named_trainable_variables();
  for (auto& named : model.layers().named_non_trainable_variables()) variables.push_back(std::move(named));
  for (const auto& [checkpoint_name, variable] : variables) {
    const auto saved_as = values.checkpoint_names.find(checkpoint_name);
    auto it = values.variables.find(saved_as != values.checkpoint_names.end() ? saved_as->second : variable.name());
    if (it == values.variables.end()) it = values.variables.find(checkpoint_name);
    if (it == values.variables.end()) {
      throw CheckpointError("sharded checkpoint " + values.path + " has no variable " + base::quoted(variable.name()) +
                            " (the model's " + base::quoted(checkpoint_name) +
                            "): the evaluator's model is not the one trained");
    }
    const Tensor current = variable.value();
    Tensor saved = it->second;
    // The ps tasks keep a scalar as one row.
    if (current.rank() == 0 && saved.shape() == Shape{1}) saved = saved.reshape({});
    if (saved.dtype() != current.dtype() || saved.shape() != current.shape()) {
      throw CheckpointError("sharded checkpoint " + values.path + ": variable " + base::quoted(it->first) + " is " +
                            std::string(dtype_name(saved.dtype())) + " " + shape_to_string(saved.shape()) +
                            ", the evaluator's model has " + std::string(dtype_name(current.dtype())) + " " +
                            shape_to_string(current.shape()));
    }
    Variable target = variable;
    target.assign(saved);
  }
}

}  // namespace

SidecarEvaluator::SidecarEvaluator(Model& model, data::Dataset data, std::string checkpoint_dir, std::int64_t steps,
                                   int max_evaluations, SidecarEvaluatorOptions options)
    : model_(&model),
      data_(std::move(data)),
      checkpoint_dir_(std::move(checkpoint_dir)),
      steps_(steps),
      max_evaluations_(max_evaluations),
      options_(std::move(options)) {
  if (checkpoint_dir_.empty()) {
    throw std::invalid_argument("SidecarEvaluator: checkpoint_dir is empty (expected the training's checkpoint directory)");
  }
  if (steps_ < 0) {
    throw std::invalid_argument("SidecarEvaluator: steps " + std::to_string(steps_) +
                                " is negative (expected the batches per evaluation, or 0 for the whole dataset)");
  }
  if (max_evaluations_ < 0) {
    throw std::invalid_argument("SidecarEvaluator: max_evaluations " + std::to_string(max_evaluations_) +
                                " is negative (expected a count, or 0 for no limit)");
  }
  if (options_.poll_interval.count() <= 0) {
    throw std::invalid_argument("SidecarEvaluator: poll_interval must be positive");
  }
}

void SidecarEvaluator::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
}

bool SidecarEvaluator::stop_requested() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

std::vector<SidecarEvaluation> SidecarEvaluator::start() {
  std::vector<SidecarEvaluation> done;
  std::unique_ptr<format::EventFileWriter> events;
  if (!options_.tensorboard_dir.empty()) events = std::make_unique<format::EventFileWriter>(options_.tensorboard_dir);
  const data::Dataset batches = steps_ > 0 ? data_.take(steps_) : data_;
  auto finished = [&] {
    if (max_evaluations_ > 0 && static_cast<int>(done.size()) >= max_evaluations_) return true;
    return options_.final_step && last_step_ >= *options_.final_step;
  };
  while (!stop_requested() && !finished()) {
    // Every complete checkpoint above the last step, oldest first.
    std::vector<std::pair<std::int64_t, std::string>> fresh;
    for (const std::string& dir : distribute::sharded_checkpoint_dirs(checkpoint_dir_)) {
      const auto step = step_of(dir);
      if (step && *step > last_step_) fresh.emplace_back(*step, dir);
    }
    std::sort(fresh.begin(), fresh.end());
    for (const auto& [step, dir] : fresh) {
      if (stop_requested() || finished()) break;
      distribute::ShardedCheckpointValues values;
      try {
        values = distribute::read_sharded_checkpoint(dir);
      } catch (const CheckpointError& e) {
        // Damaged, or deleted by the trainer's max_to_keep since it was listed: skipped for good.
        last_step_ = step;
        const std::string line = "evaluator: skipping step " + std::to_string(step) + " (" + dir + "): " + e.what();
        std::cerr << "troupe: " << line << std::endl;
        if (options_.out) *options_.out << line << std::endl;
        continue;
      }
      load_into(*model_, values);
      SidecarEvaluation evaluation;
      evaluation.checkpoint = dir;
      evaluation.step = step;
      evaluation.result = model_->evaluate(batches);
      last_step_ = step;
      // eval_loss and the compiled metrics, as Keras's SidecarEvaluator names them.
      std::vector<std::pair<std::string, double>> scalars{{"eval_loss", evaluation.result.loss}};
      for (const std::string& m : model_->metrics()) scalars.emplace_back("eval_" + m, evaluation.result.accuracy);
      if (events) {
        for (const auto& [tag, value] : scalars) events->add_scalar(tag, step, value);
        events->flush();
      }
      if (options_.out) {
        std::ostringstream line;
        line << "evaluator: step " << step << " (" << dir << "):" << std::setprecision(6);
        for (const auto& [tag, value] : scalars) line << " " << tag << "=" << value;
        line << " samples=" << evaluation.result.samples;
        *options_.out << line.str() << std::endl;
      }
      done.push_back(evaluation);
      if (options_.on_evaluation) options_.on_evaluation(done.back());
    }
    if (stop_requested() || finished()) break;
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, options_.poll_interval, [&] { return stop_; });
  }
  return done;
}

}  // namespace troupe::nn
