// The monitor's step boundary (Monitor::on_step_end for a custom loop), its construction and its
// public side. The fit callback is in fit_callback.cpp, the dashboard's routes in routes.cpp.
#include "troupe/monitor.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <exception>
#include <sstream>

#include "distribute/cluster/cluster_net.hpp"
#include "distribute/cluster/ps_access.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/step_profile.hpp"
#include "monitor/assets.hpp"
#include "monitor/http_server.hpp"
#include "monitor/monitor_impl.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/metrics_stream.hpp"
#include <nlohmann/json.hpp>
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/optimizers.hpp"
#include "troupe/runtime.hpp"

namespace troupe {
namespace {

using distribute::detail::profile_now_ns;
using detail::Taken;

const std::chrono::milliseconds paused_poll{100};

}  // namespace

Monitor::Impl::Impl(distribute::Strategy& s, nn::Optimizer* opt, MonitorOptions o)
    : strategy(s),
      optimizer(opt),
      options(std::move(o)),
      backend(s.backend()),
      profile(static_cast<int>(s.backend().devices().size())),
      tracer(s.backend().workers().rank(), s.backend().first_replica_id(), s.backend().devices(), profile_now_ns()) {}

void Monitor::Impl::start_trace(std::int64_t first, std::int64_t last, const std::string& base) {
  tracer.start(first, last, base);
  std::lock_guard<std::mutex> lock(mutex);
  trace_status = "recording steps " + std::to_string(first) + ".." + std::to_string(last);
}

// Records the step when it is in the traced range, and writes the file after the range's last.
void Monitor::Impl::record_trace(std::int64_t step, std::int64_t boundary_ns, std::int64_t input_start_ns,
                                 std::int64_t input_ns) {
  if (!tracer.wants(step)) return;
  tracer.record(step, last_boundary_ns, boundary_ns, input_start_ns, input_ns, profile);
  if (step == tracer.last()) finish_trace();
}

void Monitor::Impl::finish_trace() {
  const detail::TraceWriter::Written w = tracer.write();
  if (w.ok) say(w.summary);
  std::lock_guard<std::mutex> lock(mutex);
  if (w.ok) {
    trace_status = "written";
    trace_written = w.path;
    return;
  }
  trace_status = "failed: cannot write " + w.path;
  if (failures.size() == max_own_failures) failures.pop_front();
  failures.push_back({std::chrono::system_clock::now(), profile_now_ns(), "trace: cannot write " + w.path});
}

Taken Monitor::Impl::take_command() {
  std::lock_guard<std::mutex> lock(mutex);
  return take_locked();
}

Taken Monitor::Impl::take_locked() {
  if (commands.empty()) return {};
  Taken t{commands.front().first, commands.front().second, false};
  commands.pop_front();
  t.more = !commands.empty();
  return t;
}

// Every worker's row: the chief's command travels to all, the timings to the chief.
Taken Monitor::Impl::exchange(const Taken& command, std::int64_t step, const actors::worker_metrics& mine,
                              actors::step_event& event) {
  detail::StepExchange::Mine m;
  m.step = step;
  m.replica_shares = have_shares ? &shares : nullptr;
  m.metrics = &mine;
  const Taken taken = exchanger->exchange(command, m, event);
  std::lock_guard<std::mutex> lock(mutex);
  std::fill(heard_ns.begin(), heard_ns.end(), profile_now_ns());
  return taken;
}

// Applies a command after `step`, identically on every worker.
void Monitor::Impl::apply(const Taken& command, std::int64_t step) {
  const int c = command.code;
  const double value = command.argument;
  if (c == detail::none) return;
  if (c == detail::pause && !paused) {
    paused = true;
    say("paused after step " + std::to_string(step));
    mark(step, "pause", "paused");
  } else if (c == detail::resume && paused) {
    paused = false;
    say("resumed after step " + std::to_string(step));
    mark(step, "resume", "resumed");
  } else if (c == detail::set_learning_rate && optimizer && std::isfinite(value) && value > 0) {
    optimizer->set_learning_rate(static_cast<float>(value));
    std::ostringstream line;
    line << "learning rate " << static_cast<float>(value) << " from step " << step + 1;
    say(line.str());
    mark(step, "learning_rate", line.str());
  } else if (c == detail::checkpoint || c == detail::stop || c == detail::stop_without_checkpoint) {
    if (save && c != detail::stop_without_checkpoint) {
      save(step);
      say("checkpoint saved at step " + std::to_string(step));
      mark(step, "checkpoint", "checkpoint saved");
    } else if (c == detail::checkpoint) {
      say("checkpoint asked for at step " + std::to_string(step) + ", but this trainer has no checkpoint directory");
    }
    if (c != detail::checkpoint) {
      stopped = true;
      paused = false;
      say("stopped after step " + std::to_string(step));
      mark(step, "stop", "stopped from the dashboard");
    }
  } else if (c == detail::trace) {
    const auto n = static_cast<std::int64_t>(value);
    start_trace(step + 1, step + std::clamp<std::int64_t>(n, 1, max_trace_steps),
                options.trace_file.empty() ? "troupe-trace.json" : options.trace_file);
  }
  std::lock_guard<std::mutex> lock(mutex);
  last.paused = paused;
}

// The step boundary's hand-over: a copy into /api/state's `last` (its vectors keep their
// storage) and into the stream's ring, which the stream drains on its own timer. No message, no
// allocation and no wakeup per step; `now` (a pause, a stop) asks the stream to push at once.
// The cluster's record learns the step too, so that a worker lost is marked where it happened.
bool Monitor::Impl::follow_members() {
  const int n = backend.workers().size();
  const int rank = backend.workers().rank();
  const int replicas = backend.num_replicas_in_sync();
  std::lock_guard<std::mutex> lock(mutex);
  if (n == workers && rank == worker && replicas == replicas_in_sync) return false;
  workers = n;
  worker = rank;
  replicas_in_sync = replicas;
  heard_ns.resize(static_cast<std::size_t>(n), profile_now_ns());
  return true;
}

void Monitor::Impl::publish(const actors::step_event& e, bool now) {
  if (health) health->set_step(e.step);
  if (ps_board) ps_board->set_step(e.step);
  {
    std::lock_guard<std::mutex> lock(mutex);
    last = e;
    last.paused = paused;
  }
  if (!stream) return;
  stream->push(e);
  if (now) stream->flush_now();
}

double Monitor::Impl::seconds_since_start() const { return static_cast<double>(profile_now_ns() - t0_ns) / 1e9; }

void Monitor::Impl::mark(std::int64_t step, const std::string& kind, const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex);
  if (marks.size() == max_marks) marks.pop_front();
  marks.push_back({++marks_total, step, seconds_since_start(), kind, text});
}

// Keeps the epoch's loss, metrics and val_* (not the step's parts); when full, every other record
// goes and from then on every 2nd (4th, ...) epoch is kept, so the records span the whole run.
void Monitor::Impl::record_epoch(int epoch_index, std::int64_t step, const std::map<std::string, double>& logs) {
  EpochRecord r;
  r.epoch = epoch_index + 1;
  r.step = step;
  r.time_s = seconds_since_start();
  for (const auto& [name, value] : logs) {
    if (name.find('/') == std::string::npos && name != "samples_per_second") r.logs.emplace_back(name, value);
  }
  std::lock_guard<std::mutex> lock(mutex);
  if ((r.epoch - 1) % epoch_stride != 0) return;
  epoch_records.push_back(std::move(r));
  if (epoch_records.size() < max_epoch_records) return;
  std::deque<EpochRecord> kept;
  for (std::size_t i = 0; i < epoch_records.size(); i += 2) kept.push_back(std::move(epoch_records[i]));
  epoch_records = std::move(kept);
  epoch_stride *= 2;
}

void Monitor::Impl::end(const std::string& status, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!end_status.empty()) return;
    end_status = status;
    end_reason = reason;
  }
  if (stream) stream->flush_now();
  if (!server) return;
  // Open pages learn it from their event stream (the state poll may come too late: the process
  // may exit right after); the message is written before the server closes.
  // With the whole state (every epoch's logs and mark it keeps): the page's last poll may find the
  // process gone.
  nlohmann::json message = {{"end", {{"status", status}, {"reason", reason}, {"step", last_step()}}}};
  message["state"] = nlohmann::json::parse(state_json(detail::HttpRequest{}));
  server->push(message.dump());
}

// Fresh scalars for the next step's event; its vectors keep their storage.
actors::step_event& Monitor::Impl::next_event() {
  actors::step_event& e = scratch;
  e.step = 0;
  e.time_s = e.loss = e.learning_rate = e.samples_per_s = 0;
  e.paused = false;
  e.replica_loss.clear();
  e.workers.clear();
  e.metrics.clear();
  e.metric_names.reset();
  return e;
}

Monitor::Monitor(distribute::Strategy& strategy, nn::Optimizer* optimizer, MonitorOptions options)
    : impl_(std::make_unique<Impl>(strategy, optimizer, std::move(options))) {
  Impl& m = *impl_;
  const MonitorOptions& o = m.options;
  Runtime* rt = m.backend.runtime();
  if (!rt) throw std::invalid_argument("Monitor: the default strategy has no runtime to run a metrics stream in");
  if (o.dashboard_port < -1 || o.dashboard_port > 65535) {
    throw std::invalid_argument("Monitor: dashboard_port " + std::to_string(o.dashboard_port) +
                                " is out of range (expected -1 for none, 0 for any free port, or 1..65535)");
  }
  if (o.dashboard_port >= 0 && !distribute::detail::is_loopback(o.dashboard_address) && o.dashboard_token.empty()) {
    throw std::invalid_argument("Monitor: the dashboard would listen on " + o.dashboard_address +
                                " without a token; set a dashboard token (anyone who reaches the port could steer "
                                "the training), or bind 127.0.0.1");
  }
  if (!o.trace_file.empty() && (o.trace_first_step < 1 || o.trace_last_step < o.trace_first_step)) {
    throw std::invalid_argument("Monitor: trace steps " + std::to_string(o.trace_first_step) + ":" +
                                std::to_string(o.trace_last_step) + " are not a range A:B with 1 <= A <= B");
  }
  m.worker = m.backend.workers().rank();
  m.workers = m.backend.workers().size();
  m.local_replicas = static_cast<int>(m.backend.devices().size());
  m.replicas_in_sync = m.backend.num_replicas_in_sync();
  m.heard_ns.assign(static_cast<std::size_t>(m.workers), profile_now_ns());
  m.health = m.backend.workers().health();
  m.tail = m.backend.workers().log_tail();
  if (auto* ps = dynamic_cast<distribute::ParameterServerStrategy*>(&strategy)) {
    m.ps_board = distribute::detail::PsAccess::dispatcher(*ps).board();
    if (const distribute::ClusterResolver* r = ps->cluster_resolver()) {
      m.own_task = distribute::detail::task_name(r->task_type(), r->task_id());
    }
  }
  if (m.workers > 1) m.exchanger = std::make_unique<detail::StepExchange>(m.backend, m.profile);
  m.shares.assign(static_cast<std::size_t>(m.local_replicas), 0.0);
  m.log = o.log ? o.log : (m.worker == 0 ? &std::cout : nullptr);
  m.t0_ns = m.last_boundary_ns = profile_now_ns();
  m.start_wall = std::chrono::system_clock::now();
  m.last.learning_rate = optimizer ? optimizer->learning_rate() : NAN;
  m.last.loss = NAN;
  m.scratch.replica_loss.reserve(static_cast<std::size_t>(m.replicas_in_sync));
  m.scratch.workers.reserve(static_cast<std::size_t>(m.workers));
  m.scratch.metrics.reserve(actors::step_event::reserved_metrics);
  if (!o.trace_file.empty()) m.start_trace(o.trace_first_step, o.trace_last_step, o.trace_file);
  if (o.dashboard_port >= 0 && m.worker == 0) {
    // The stream, its thread and its history exist where a dashboard reads them: a worker that
    // serves none (or a run only traced) keeps no history that nobody would read.
    m.stream = std::make_unique<actors::metrics_stream>(rt->system(), o.history_capacity, o.push_interval,
                                                        static_cast<std::size_t>(m.replicas_in_sync),
                                                        static_cast<std::size_t>(m.workers));
    Impl* self = &m;
    // The page's scripts and icon load without its ?token= (a <script src> carries none), and say
    // nothing about the run: served to anyone who reaches the port. The page itself, the API and
    // the commands need the token.
    std::vector<std::string> open_paths = {"/favicon.svg", "/favicon.ico"};
    for (const detail::DashboardScript& script : detail::dashboard_scripts()) open_paths.emplace_back(script.path);
    m.server = std::make_unique<detail::HttpServer>(o.dashboard_address, o.dashboard_port, o.dashboard_token,
                                                    [self](const detail::HttpRequest& r) { return self->handle(r); },
                                                    std::move(open_paths));
    detail::HttpServer* server = m.server.get();
    m.subscription = m.stream->subscribe([server](const std::string& json) { server->push(json); },
                                         [server] { return server->has_listeners(); });
    m.say("dashboard: " + dashboard_url());
  }
  m.backend.set_step_profile(&m.profile);
}

Monitor::~Monitor() {
  Impl& m = *impl_;
  m.backend.set_step_profile(nullptr);
  try {
    // Destroyed by an exception (a lost worker, an error in a step): the run failed.
    if (std::uncaught_exceptions() > 0) {
      m.end("failed", "the trainer ended with an error");
    } else {
      m.end(m.stopped ? "stopped" : "finished", "");
    }
    if (m.server) m.server->drain(std::chrono::milliseconds(500));
  } catch (...) {
    // Telling the page must not end the program from a destructor.
  }
  if (m.stream) m.stream->flush_now();
  // Training ended inside the traced range: what was recorded is written.
  try {
    if (m.tracer.pending()) m.finish_trace();
  } catch (...) {
    // A trace that cannot be written must not end the program from a destructor.
  }
  if (m.server) m.stream->unsubscribe(m.subscription);
  m.server.reset();
  m.stream.reset();
}

void Monitor::set_checkpoint_function(std::function<void(std::int64_t)> save) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->has_save = static_cast<bool>(save);
  impl_->save = std::move(save);
}

void Monitor::record_replica_losses(const std::vector<Tensor>& shares) {
  Impl& m = *impl_;
  if (shares.size() != m.shares.size()) {
    throw std::invalid_argument("Monitor::record_replica_losses: " + std::to_string(shares.size()) +
                                " losses for " + std::to_string(m.shares.size()) + " local replicas");
  }
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const Tensor host = shares[i].to(Device());
    m.shares[i] = host.dtype() == DType::f64 ? host.item<double>() : static_cast<double>(host.item<float>());
  }
  m.have_shares = true;
}

StepDecision Monitor::on_step_end(std::int64_t step, double loss) {
  Impl& m = *impl_;
  const std::int64_t now = profile_now_ns();
  std::int64_t input_start = 0;
  const std::int64_t input_ns = m.profile.take_input_wait(&input_start);
  const double step_ms = static_cast<double>(now - m.last_boundary_ns) / 1e6;

  actors::step_event& e = m.next_event();
  e.step = step;
  e.time_s = static_cast<double>(now - m.t0_ns) / 1e9;
  e.loss = loss;
  e.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  const double per_second = step_ms > 0 ? 1e3 / step_ms : 0.0;
  e.samples_per_s = m.options.global_batch_size > 0 ? per_second * static_cast<double>(m.options.global_batch_size)
                                                    : per_second;

  actors::worker_metrics mine;
  mine.worker = m.worker;
  mine.step = step;
  mine.input_ms = static_cast<double>(input_ns) / 1e6;
  double span_ms = 0;
  for (int r = 0; r < m.local_replicas; ++r) {
    const auto& rec = m.profile.replica(r);
    span_ms = std::max(span_ms, static_cast<double>(rec.end_ns - rec.start_ns) / 1e6);
    mine.compute_ms = std::max(mine.compute_ms, static_cast<double>(rec.end_ns - rec.start_ns - rec.collective_ns) / 1e6);
    mine.all_reduce_ms = std::max(mine.all_reduce_ms, static_cast<double>(rec.collective_ns) / 1e6);
    mine.all_reduce_bytes = rec.collective_bytes;
    mine.collectives = rec.collectives;
  }
  mine.other_ms = std::max(0.0, step_ms - mine.input_ms - span_ms);
  mine.samples_per_s = e.samples_per_s;
  mine.paused = m.paused;

  m.record_trace(step, now, input_start, input_ns);

  Taken command = m.worker == 0 ? m.take_command() : Taken{};
  if (m.workers > 1) {
    command = m.exchange(command, step, mine, e);
  } else {
    e.workers.assign(1, mine);
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.heard_ns[0] = now;
    }
    if (m.have_shares) {
      e.replica_loss.resize(m.shares.size());
      for (std::size_t i = 0; i < m.shares.size(); ++i) e.replica_loss[i] = m.shares[i] * m.replicas_in_sync;
    }
  }
  m.have_shares = false;
  m.apply(command, step);
  // Several commands arrived during the step: all of them apply at this boundary, in order.
  while (command.more && !m.stopped) {
    command = m.worker == 0 ? m.take_command() : Taken{};
    if (m.workers > 1) {
      actors::step_event again = e;
      command = m.exchange(command, step, mine, again);
    }
    m.apply(command, step);
  }
  m.apply_controls(step);
  e.paused = m.paused;
  e.workers[static_cast<std::size_t>(m.worker)].paused = m.paused;
  e.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  // A step that changed the state (paused, stopped) is shown at once.
  const bool changed = m.paused || m.stopped || command.code != detail::none;
  m.publish(e, changed);

  // Paused: every worker waits here; the chief polls for commands, and every poll is one more
  // exchange so that all workers leave the pause after the same step.
  while (m.paused && !m.stopped) {
    Taken c;
    if (m.worker == 0) {
      std::unique_lock<std::mutex> lock(m.mutex);
      m.command_ready.wait_for(lock, paused_poll, [&] { return !m.commands.empty(); });
      c = m.take_locked();
    }
    if (m.workers > 1) {
      actors::step_event idle = m.last;
      mine.paused = true;
      c = m.exchange(c, step, mine, idle);
      std::lock_guard<std::mutex> lock(m.mutex);
      m.last.workers = idle.workers;
    } else {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.heard_ns[0] = profile_now_ns();
    }
    m.apply(c, step);
    m.apply_controls(step);
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.last.workers.empty()) m.last.workers[static_cast<std::size_t>(m.worker)].paused = m.paused;
  }
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.last.learning_rate = m.optimizer ? m.optimizer->learning_rate() : NAN;
  }
  m.profile.take_input_wait(nullptr);
  m.last_boundary_ns = profile_now_ns();
  return m.stopped ? StepDecision::stop : StepDecision::proceed;
}

int Monitor::dashboard_port() const noexcept { return impl_->server ? impl_->server->port() : -1; }

std::string Monitor::dashboard_url() const {
  if (!impl_->server) return {};
  const std::string& a = impl_->options.dashboard_address;
  const std::string host = a.find(':') != std::string::npos ? "[" + a + "]" : a;
  std::string url = "http://" + host + ":" + std::to_string(impl_->server->port()) + "/";
  if (!impl_->options.dashboard_token.empty()) url += "?token=" + impl_->options.dashboard_token;
  return url;
}

bool Monitor::stopped() const noexcept { return impl_->stopped; }

std::string Monitor::trace_written() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->trace_written;
}

}  // namespace troupe
