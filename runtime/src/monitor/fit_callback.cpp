// The monitor inside Model::fit: each step comes from fit's logs, and the dashboard's controls go
// to fit's TrainingControl, which every worker agrees on in the step's own reduction.
#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "monitor/monitor_impl.hpp"
#include "troupe/nn/callback.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/optimizers.hpp"

namespace troupe {

using distribute::detail::profile_now_ns;

class Monitor::FitCallback : public nn::Callback {
 public:
  explicit FitCallback(Monitor::Impl& m) : m_(m) {}

  void on_train_begin(nn::Logs&) override {
    nn::TrainingControl& control = model().control();
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      m_.control = &control;
      // Commands given before training began go to fit now, in order.
      while (!m_.commands.empty()) {
        m_.forward_locked(m_.commands.front().first, m_.commands.front().second);
        m_.commands.pop_front();
      }
    }
    m_.last_boundary_ns = profile_now_ns();
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      m_.epochs = params().epochs;
      m_.steps_per_epoch = params().steps;
      m_.first_step = control.step();
      m_.begin_ns = profile_now_ns();
    }
    // The names read at every step, made once.
    auto names = std::make_shared<std::vector<std::string>>();
    for (const std::string& name : params().metrics) {
      if (name != "loss" && names->size() < actors::step_event::reserved_metrics) names->push_back(name);
    }
    metric_names_ = std::move(names);
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      m_.metric_names = metric_names_;
    }
    m_.follow_members();
    make_keys();
  }

  // The names of fit's logs read at every step: a replica's loss, a worker's parts (by ring rank).
  void make_keys() {
    replica_keys_.clear();
    for (int g = 0; g < m_.replicas_in_sync; ++g) replica_keys_.push_back("loss/replica_" + std::to_string(g));
    part_keys_.clear();
    for (int w = 0; w < m_.workers; ++w) {
      const std::string prefix = w == m_.worker ? "time/" : "worker_" + std::to_string(w) + "/time/";
      part_keys_.push_back({prefix + "input_ms", prefix + "compute_ms", prefix + "all_reduce_ms", prefix + "step_ms"});
    }
  }

  void on_epoch_begin(int epoch, nn::Logs&) override {
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.epoch = epoch;
  }

  void on_epoch_end(int epoch, nn::Logs& logs) override {
    m_.record_epoch(epoch, model().control().step(), logs);
  }

  void on_train_batch_begin(std::int64_t, nn::Logs&) override {
    m_.profile.take_input_wait(nullptr);
    m_.last_boundary_ns = profile_now_ns();
  }

  void on_train_batch_end(std::int64_t, nn::Logs& logs) override {
    const std::int64_t now = profile_now_ns();
    const std::int64_t step = model().control().step();
    static const std::string loss_key = "loss", step_key = "time/step_ms";
    const auto get = [&logs](const std::string& name) {
      const auto it = logs.find(name);
      return it == logs.end() ? NAN : it->second;
    };
    std::int64_t input_start = 0;
    const std::int64_t input_ns = m_.profile.take_input_wait(&input_start);
    // A change of members inside fit (elastic): fit's logs name the ring as it is now.
    if (m_.follow_members()) make_keys();

    actors::step_event& e = m_.next_event();
    e.step = step;
    e.time_s = static_cast<double>(now - m_.t0_ns) / 1e9;
    e.loss = get(loss_key);
    e.learning_rate = m_.optimizer ? m_.optimizer->learning_rate() : NAN;
    const double step_ms = get(step_key);
    const double per_second = step_ms > 0 ? 1e3 / step_ms : 0.0;
    e.samples_per_s = m_.options.global_batch_size > 0
                          ? per_second * static_cast<double>(m_.options.global_batch_size)
                          : per_second;
    e.metric_names = metric_names_;
    for (const std::string& name : *metric_names_) e.metrics.push_back(get(name));
    e.replica_loss.assign(static_cast<std::size_t>(m_.replicas_in_sync), NAN);
    for (int g = 0; g < m_.replicas_in_sync; ++g) {
      e.replica_loss[static_cast<std::size_t>(g)] = get(replica_keys_[static_cast<std::size_t>(g)]);
    }
    // This worker's parts of this step; every other worker's of the step before, as fit's
    // reduction carried them.
    e.workers.assign(static_cast<std::size_t>(m_.workers), actors::worker_metrics{});
    for (int w = 0; w < m_.workers; ++w) {
      actors::worker_metrics& x = e.workers[static_cast<std::size_t>(w)];
      const std::array<std::string, 4>& keys = part_keys_[static_cast<std::size_t>(w)];
      const auto part = [&](std::size_t i) {
        const double value = get(keys[i]);
        return std::isfinite(value) ? value : 0.0;
      };
      x.worker = w;
      x.step = step;
      x.input_ms = part(0);
      x.compute_ms = part(1);
      x.all_reduce_ms = part(2);
      const double whole = get(keys[3]);
      x.other_ms = std::isfinite(whole) ? std::max(0.0, whole - x.input_ms - x.compute_ms - x.all_reduce_ms) : 0.0;
      x.samples_per_s = e.samples_per_s;
    }
    actors::worker_metrics& mine = e.workers[static_cast<std::size_t>(m_.worker)];
    for (int r = 0; r < m_.local_replicas; ++r) {
      mine.all_reduce_bytes = m_.profile.replica(r).collective_bytes;
      mine.collectives = m_.profile.replica(r).collectives;
    }

    m_.record_trace(step, now, input_start, input_ns);
    std::int64_t trace_steps = 0;
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      std::fill(m_.heard_ns.begin(), m_.heard_ns.end(), now);
      std::swap(trace_steps, m_.trace_request);
    }
    if (trace_steps > 0) {
      m_.start_trace(step + 1, step + std::clamp<std::int64_t>(trace_steps, 1, Impl::max_trace_steps),
                     m_.options.trace_file.empty() ? "troupe-trace.json" : m_.options.trace_file);
    }
    m_.apply_controls(step);
    m_.publish(e, false);
  }

  void on_learning_rate(std::int64_t step, double learning_rate) override {
    std::ostringstream line;
    line << "learning rate " << static_cast<float>(learning_rate) << " from step " << step + 1;
    m_.say(line.str());
    m_.mark(step, "learning_rate", line.str());
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.learning_rate = learning_rate;
  }

  void on_pause(std::int64_t step) override {
    if (m_.stream) m_.stream->flush_now();  // the steps before the pause reach the dashboard now
    m_.paused = true;
    m_.say("paused after step " + std::to_string(step));
    m_.mark(step, "pause", "paused");
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.paused = true;
    for (auto& w : m_.last.workers) w.paused = true;  // fit paused every worker after this step
  }

  void on_resume(std::int64_t step) override {
    m_.paused = false;
    m_.say("resumed after step " + std::to_string(step));
    m_.mark(step, "resume", "resumed");
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.last.paused = false;
    for (auto& w : m_.last.workers) w.paused = false;
  }

  void on_checkpoint(std::int64_t step, nn::Logs&) override {
    m_.say("checkpoint requested at step " + std::to_string(step));
    m_.mark(step, "checkpoint", "checkpoint requested");
  }

  void on_train_end(nn::Logs& logs) override {
    nn::TrainingControl& control = model().control();
    if (m_.stream) m_.stream->flush_now();
    const bool dashboard_stop = control.stopped_for(Monitor::dashboard_stop_reason);
    {
      std::lock_guard<std::mutex> lock(m_.mutex);
      m_.control = nullptr;
      m_.paused = false;
      m_.last.paused = false;
      if (dashboard_stop) m_.stopped = true;
    }
    if (dashboard_stop) {
      m_.say("stopped after step " + std::to_string(control.step()));
      m_.mark(control.step(), "stop", "stopped from the dashboard");
    }
    const auto loss = logs.find("loss");
    if (loss != logs.end() && !std::isfinite(loss->second)) {
      m_.end("failed", "the loss is not finite at step " + std::to_string(control.step()));
    } else if (dashboard_stop) {
      m_.end("stopped", "stopped from the dashboard after step " + std::to_string(control.step()));
    } else {
      m_.end("finished", "");
    }
  }

 private:
  Monitor::Impl& m_;
  std::vector<std::string> replica_keys_;              // "loss/replica_<g>"
  std::vector<std::array<std::string, 4>> part_keys_;  // per worker: its input, compute, all-reduce, step
  std::shared_ptr<const std::vector<std::string>> metric_names_;  // fit's compiled metrics
};

std::shared_ptr<nn::Callback> Monitor::callback() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->callback_mode = true;
  }
  return std::make_shared<FitCallback>(*impl_);
}

}  // namespace troupe
