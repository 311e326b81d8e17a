#pragma once
// The monitor's state, shared by its parts: the step boundary (monitor.cpp), the Model::fit
// callback (fit_callback.cpp), the dashboard's routes (routes.cpp), the cross-worker exchange of a
// custom loop (step_exchange.*) and the trace writer (trace_writer.*).
//
// Threads: the training thread runs the boundary and the callback; the HTTP server's thread runs
// the routes. What both touch is under `mutex` (or atomic).

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "distribute/strategies/step_profile.hpp"
#include "monitor/commands.hpp"
#include "monitor/http_server.hpp"
#include "monitor/step_exchange.hpp"
#include "monitor/trace_writer.hpp"
#include "troupe/actors/actor_board.hpp"
#include "troupe/actors/cluster_health.hpp"
#include "troupe/actors/metrics_stream.hpp"
#include "troupe/actors/ps_cluster_board.hpp"
#include "troupe/actors/worker_report.hpp"
#include "troupe/base/process_usage.hpp"
#include "troupe/monitor.hpp"

namespace troupe {

/// A number for the dashboard's JSON: null when it is not finite (JSON has no NaN or infinity).
inline nlohmann::ordered_json json_number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

namespace distribute::detail {
class StrategyBackend;
}
namespace nn {
class TrainingControl;
}

struct Monitor::Impl {
  static constexpr std::size_t max_queued_commands = 64;
  static constexpr std::size_t max_own_failures = 64;
  static constexpr std::int64_t max_trace_steps = 100000;

  // A failure of the monitor's own (a trace it cannot write), shown among the cluster's events.
  struct OwnFailure {
    std::chrono::system_clock::time_point wall;
    std::int64_t at_ns;  // profile_now_ns()
    std::string text;
  };

  Impl(distribute::Strategy& s, nn::Optimizer* opt, MonitorOptions o);

  distribute::Strategy& strategy;
  nn::Optimizer* optimizer;
  MonitorOptions options;
  distribute::detail::StrategyBackend& backend;
  distribute::detail::StepProfile profile;
  int worker = 0;
  int workers = 1;
  int local_replicas = 1;
  int replicas_in_sync = 1;
  std::ostream* log = nullptr;
  std::unique_ptr<actors::metrics_stream> stream;
  std::unique_ptr<detail::HttpServer> server;
  int subscription = 0;
  std::int64_t t0_ns = 0;
  std::int64_t last_boundary_ns = 0;
  std::function<void(std::int64_t)> save;
  std::vector<double> shares;  // this worker's replicas' losses of the step (share × replicas)
  bool have_shares = false;
  std::unique_ptr<detail::StepExchange> exchanger;  // several workers, custom loop
  detail::TraceWriter tracer;
  // The step being built at a boundary, its vectors sized once: a step allocates nothing.
  actors::step_event scratch;

  // With callback(): fit's TrainingControl while fit runs (under mutex), which the dashboard's
  // controls go to; before, they wait in `commands`. A trace asked for waits in trace_request.
  bool callback_mode = false;
  nn::TrainingControl* control = nullptr;
  std::int64_t trace_request = 0;

  // The dashboard's requests, from the HTTP thread to the training thread.
  std::mutex mutex;
  std::condition_variable command_ready;
  std::deque<std::pair<int, double>> commands;

  // What /api/state shows (under mutex).
  actors::step_event last;
  std::atomic<bool> paused{false};
  std::atomic<bool> stopped{false};
  std::vector<std::int64_t> heard_ns;  // when each worker's row last arrived
  std::deque<OwnFailure> failures;     // the newest max_own_failures
  // The cluster's health as the chief's control plane records it; null for one process.
  actors::cluster_health* health = nullptr;
  // This worker's log tail, which its heartbeat carries to the chief; null for one process.
  actors::log_tail* tail = nullptr;
  // Under ParameterServerStrategy (on the chief): the closure queue, the workers and ps tasks as
  // the dispatcher records them; null otherwise.
  std::shared_ptr<actors::ps_cluster_board> ps_board;
  // The task name of this process's row when no control plane names it: the chief's under
  // ParameterServerStrategy, else "/job:localhost/replica:0/task:0".
  std::string own_task = "/job:localhost/replica:0/task:0";
  // The actors an application's ActorCluster reports (actor_events, describe_actor); null until
  // either is first called. Shared with the hooks handed out, which may outlive the monitor.
  std::shared_ptr<actors::actor_board> actor_board;
  std::shared_ptr<actors::actor_board> actors_locked();  // under mutex: made on first use
  // The actions the Actors card offers (add_actor_action), the commands asked for that the
  // application has not taken yet, and its newest answers, newest last (under mutex).
  struct ActorAction {
    std::string name;
    std::string help;
  };
  std::vector<ActorAction> actor_actions;
  std::deque<ActorCommand> actor_commands;
  struct ActorAnswer {
    std::uint64_t sequence = 0;
    std::int64_t step = 0;
    double time_s = 0;
    ActorCommand command;
    std::string text;
    bool refused = false;
  };
  static constexpr std::size_t max_actor_answers = 16;
  std::deque<ActorAnswer> actor_answers;
  std::uint64_t actor_answers_total = 0;
  std::string trace_status = "idle";
  std::string trace_written;

  // The run as the dashboard's header shows it (under mutex).
  std::chrono::system_clock::time_point start_wall;
  int epoch = -1;                    // 0-based, -1 before fit's first epoch (or without fit)
  int epochs = 0;                    // fit's, 0 unknown
  std::int64_t steps_per_epoch = -1;  // fit's, -1 unknown
  std::int64_t first_step = 0;       // the step fit began after (a resumed run's)
  std::int64_t begin_ns = 0;         // when fit began
  std::string end_status;            // "" while training; "finished", "stopped" or "failed" after
  std::string end_reason;
  bool has_save = false;             // set_checkpoint_function was given a function
  // fit's compiled metrics, by name ("accuracy", ...), shared by every step's event.
  std::shared_ptr<const std::vector<std::string>> metric_names;

  // Every epoch's logs (loss, metrics, val_*), for the charts; thinned like the history.
  struct EpochRecord {
    int epoch = 0;  // 1-based
    std::int64_t step = 0;
    double time_s = 0;
    std::vector<std::pair<std::string, double>> logs;
  };
  static constexpr std::size_t max_epoch_records = 2048;
  std::deque<EpochRecord> epoch_records;
  int epoch_stride = 1;
  // What happened to the run at a step (pause, resume, learning rate, checkpoint, stop), for the
  // charts' marks; the newest max_marks.
  struct Mark {
    std::uint64_t sequence = 0;
    std::int64_t step = 0;
    double time_s = 0;
    std::string kind;
    std::string text;
  };
  static constexpr std::size_t max_marks = 512;
  std::deque<Mark> marks;
  std::uint64_t marks_total = 0;
  // What the monitor said (its log lines), the newest max_log_lines, for the cluster panel; the
  // last few ride on this worker's heartbeat to the chief too (`tail`).
  static constexpr std::size_t max_log_lines = 200;
  std::deque<std::string> log_lines;
  std::uint64_t log_lines_total = 0;  // said so far, those pushed out included

  // The application's controls (add_control), under mutex: the value the application reads, and
  // one set from the page that waits for the next step boundary (the newest wins).
  struct AppControl {
    MonitorControl spec;
    double value = 0;
    std::optional<double> pending;
  };
  std::vector<AppControl> app_controls;
  std::atomic<bool> controls_pending{false};  // a step boundary without a set takes no lock
  // Text summaries (publish_text), under mutex: the newest max_texts_per_tag of each tag, oldest
  // first; the page asks for those after the sequence it has.
  struct TextRecord {
    std::uint64_t sequence = 0;
    std::string tag;
    std::int64_t step = 0;
    double time_s = 0;
    std::string text;
  };
  static constexpr std::size_t max_texts_per_tag = 4;
  std::deque<TextRecord> texts;
  std::vector<std::string> text_tags;
  std::uint64_t texts_total = 0;

  void say(const std::string& line) {
    if (log) *log << line << std::endl;
    if (tail) tail->add(line);
    std::lock_guard<std::mutex> lock(mutex);
    if (log_lines.size() == max_log_lines) log_lines.pop_front();
    log_lines.push_back(line);
    ++log_lines_total;
  }

  // The run's record for the page (monitor.cpp): a mark at `step`, an epoch's logs, the end.
  void mark(std::int64_t step, const std::string& kind, const std::string& text);
  void record_epoch(int epoch, std::int64_t step, const std::map<std::string, double>& logs);
  // Training ended: "finished", "stopped" or "failed" (with why); open pages are told at once.
  void end(const std::string& status, const std::string& reason);
  double seconds_since_start() const;
  std::int64_t last_step() {
    std::lock_guard<std::mutex> lock(mutex);
    return last.step;
  }
  bool can_checkpoint_locked() const { return options.checkpoints && (callback_mode || has_save); }

  // Tracing (monitor.cpp): a range from step `first`, its status under mutex.
  void start_trace(std::int64_t first, std::int64_t last, const std::string& base);
  void record_trace(std::int64_t step, std::int64_t boundary_ns, std::int64_t input_start_ns, std::int64_t input_ns);
  void finish_trace();

  // The step boundary's parts (monitor.cpp).
  detail::Taken take_command();
  detail::Taken take_locked();
  detail::Taken exchange(const detail::Taken& command, std::int64_t step, const actors::worker_metrics& mine,
                 actors::step_event& event);
  void apply(const detail::Taken& command, std::int64_t step);
  void publish(const actors::step_event& e, bool now);
  // An elastic cluster that changed its members inside fit: worker, workers, replicas_in_sync
  // and heard_ns follow the ring as it is now (the rows, the step's parts and the replica losses
  // then cover every member, a joiner beyond the size at the start too). True when they changed.
  bool follow_members();
  // The controls set from the page take effect after `step` (said and marked).
  void apply_controls(std::int64_t step);
  actors::step_event& next_event();

  // The dashboard's routes (routes.cpp).
  detail::HttpResponse handle(const detail::HttpRequest& r);
  detail::HttpResponse enqueue(int command, double value);
  void forward_locked(int command, double value);
  detail::HttpResponse get(const detail::HttpRequest& r);
  detail::HttpResponse post(const detail::HttpRequest& r);
  detail::HttpResponse set_control(const detail::HttpRequest& r);
  detail::HttpResponse actor_command(const detail::HttpRequest& r);
  std::string state_json(const detail::HttpRequest& r);
  nlohmann::ordered_json ps_cluster_json() const;  // null without a parameter-server cluster
  nlohmann::ordered_json actors_json() const;      // null without actors; under mutex
  nlohmann::ordered_json progress_json() const;  // under mutex
  base::process_usage process_usage;  // under mutex
};

}  // namespace troupe
