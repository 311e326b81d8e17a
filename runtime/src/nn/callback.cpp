#include "troupe/nn/callback.hpp"

#include <cmath>
#include <stdexcept>

namespace troupe::nn {

void TrainingControl::stop_training(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  if (std::this_thread::get_id() == fit_thread_) {
    if (!immediate_stop_) immediate_stop_ = reason;
    return;
  }
  if (!pending_.stop) pending_.stop_reason = reason;
  pending_.stop = true;
}

void TrainingControl::request_stop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  if (!pending_.stop) pending_.stop_reason = reason;
  pending_.stop = true;
}

std::optional<std::string> TrainingControl::take_immediate_stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<std::string> out = std::move(immediate_stop_);
  immediate_stop_.reset();
  return out;
}

void TrainingControl::request_checkpoint() {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.checkpoint = true;
}

void TrainingControl::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.pause = true;
}

void TrainingControl::resume() {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.pause = false;
}

void TrainingControl::set_learning_rate(double learning_rate) {
  if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
    throw std::invalid_argument("TrainingControl::set_learning_rate: " + std::to_string(learning_rate) +
                                " (expected a finite number > 0)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.learning_rate = learning_rate;
}

std::int64_t TrainingControl::step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_;
}

int TrainingControl::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

bool TrainingControl::paused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return paused_;
}

bool TrainingControl::stop_requested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopped_;
}

TrainingControl::Requests TrainingControl::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  Requests out = std::move(pending_);
  pending_ = Requests{};
  return out;
}

void TrainingControl::set_position(std::int64_t step, int epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  epoch_ = epoch;
}

void TrainingControl::set_paused(bool paused) {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = paused;
}

bool TrainingControl::stopped_for(const std::string& reason) const {
  const std::uint32_t code = reason_code(reason);
  std::lock_guard<std::mutex> lock(mutex_);
  return stopped_for_ == code;
}

void TrainingControl::set_stopped_for(std::uint32_t code) {
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_for_ = code;
}

std::uint32_t TrainingControl::reason_code(const std::string& reason) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : reason) h = (h ^ c) * 16777619u;
  return h & 0x7fffffffu;
}

void TrainingControl::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_for_.reset();
  pending_ = Requests{};
  immediate_stop_.reset();
  fit_thread_ = std::this_thread::get_id();
  stopped_ = false;
  paused_ = false;
  step_ = 0;
  epoch_ = 0;
}

Model& Callback::model() const {
  if (model_ == nullptr) throw std::logic_error("Callback::model: the callback is not attached to a fit");
  return *model_;
}

void Callback::set_model(Model& model, const FitParams& params) {
  model_ = &model;
  params_ = params;
}

void LambdaCallback::on_train_begin(Logs& logs) {
  if (train_begin) train_begin(logs);
}
void LambdaCallback::on_train_end(Logs& logs) {
  if (train_end) train_end(logs);
}
void LambdaCallback::on_epoch_begin(int epoch, Logs& logs) {
  if (epoch_begin) epoch_begin(epoch, logs);
}
void LambdaCallback::on_epoch_end(int epoch, Logs& logs) {
  if (epoch_end) epoch_end(epoch, logs);
}
void LambdaCallback::on_train_batch_begin(std::int64_t batch, Logs& logs) {
  if (batch_begin) batch_begin(batch, logs);
}
void LambdaCallback::on_train_batch_end(std::int64_t batch, Logs& logs) {
  if (batch_end) batch_end(batch, logs);
}
void LambdaCallback::on_checkpoint(std::int64_t step, Logs& logs) {
  if (checkpoint) checkpoint(step, logs);
}

}  // namespace troupe::nn
