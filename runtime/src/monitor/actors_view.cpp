// The actors an application spawns, as the dashboard shows them: the hook its ActorCluster
// reports into (Monitor::actor_events), the application's names and numbers for them
// (Monitor::describe_actor), the actions a person may ask of one (add_actor_action, taken and
// answered by the application; the route is routes.cpp's), and their JSON for /api/state and
// /api/actors.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "monitor/monitor_impl.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/actor_cluster.hpp"

namespace troupe {
namespace {

using json = nlohmann::ordered_json;

bool is_value_name(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

json values_json(const std::vector<std::pair<std::string, double>>& values) {
  json out = json::object();
  for (const auto& [name, value] : values) out[name] = json_number(value);
  return out;
}

}  // namespace

std::shared_ptr<actors::actor_board> Monitor::Impl::actors_locked() {
  if (!actor_board) actor_board = std::make_shared<actors::actor_board>();
  return actor_board;
}

std::function<void(const distribute::ActorEvent&)> Monitor::actor_events() {
  std::shared_ptr<actors::actor_board> board;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    board = impl_->actors_locked();
  }
  return [board](const distribute::ActorEvent& e) {
    const auto now = actors::actor_board::clock::now();
    switch (e.kind) {
      case distribute::ActorEvent::Kind::spawned: board->spawned(e.id, e.type, e.task, now); break;
      case distribute::ActorEvent::Kind::replied: board->replied(e.id, now); break;
      case distribute::ActorEvent::Kind::down:
        board->went_down(e.id, base::printable_line(e.cause, 512), now, e.stopped);
        break;
      case distribute::ActorEvent::Kind::restarted: board->restarted(e.previous_id, e.id, e.task, now); break;
    }
  };
}

void Monitor::describe_actor(std::uint64_t id, const std::string& label, std::int64_t step,
                             const std::vector<std::pair<std::string, double>>& values) {
  if (label.empty() || label.size() > 64 || !base::is_printable_line(label)) {
    throw std::invalid_argument("Monitor::describe_actor: label " + base::quoted(label) +
                                " is not 1 to 64 bytes of printable text");
  }
  if (values.size() > max_actor_values) {
    throw std::invalid_argument("Monitor::describe_actor: " + std::to_string(values.size()) + " numbers for " +
                                label + " (at most " + std::to_string(max_actor_values) + ")");
  }
  for (const auto& [name, value] : values) {
    if (!is_value_name(name)) {
      throw std::invalid_argument("Monitor::describe_actor: " + label + ": the name " + base::quoted(name) +
                                  " is not 1 to 32 of A-Z a-z 0-9 _");
    }
  }
  std::shared_ptr<actors::actor_board> board;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    board = impl_->actors_locked();
  }
  board->describe(id, label, step, values, actors::actor_board::clock::now());
}

void Monitor::add_actor_action(const std::string& name, const std::string& help) {
  const bool ok = !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (!ok) {
    throw std::invalid_argument("Monitor::add_actor_action: name " + base::quoted(name) + " is not 1 to 32 of a-z 0-9 _");
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const Impl::ActorAction& a : impl_->actor_actions) {
    if (a.name == name) throw std::invalid_argument("Monitor::add_actor_action: an action named " + name + " was already added");
  }
  if (impl_->actor_actions.size() >= max_actor_actions) {
    throw std::invalid_argument("Monitor::add_actor_action: " + name + " would be action " +
                                std::to_string(max_actor_actions + 1) + " (at most " + std::to_string(max_actor_actions) +
                                ")");
  }
  impl_->actor_actions.push_back({name, base::printable_line(help, 256)});
}

std::vector<ActorCommand> Monitor::take_actor_commands() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<ActorCommand> out(std::make_move_iterator(impl_->actor_commands.begin()),
                                std::make_move_iterator(impl_->actor_commands.end()));
  impl_->actor_commands.clear();
  return out;
}

void Monitor::answer_actor_command(const ActorCommand& command, const std::string& text, bool refused) {
  Impl& m = *impl_;
  std::string line = base::printable_line(text, 256);
  m.say(line);
  const double time_s = m.seconds_since_start();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.actor_answers.size() == Impl::max_actor_answers) m.actor_answers.pop_front();
  Impl::ActorAnswer a;
  a.sequence = ++m.actor_answers_total;
  a.step = m.last.step;
  a.time_s = time_s;
  a.command = command;
  a.command.label = base::printable_line(command.label, 64);
  a.text = std::move(line);
  a.refused = refused;
  m.actor_answers.push_back(std::move(a));
}

// Every actor's row (the newest of each label), and each label's numbers over the steps.
nlohmann::ordered_json Monitor::Impl::actors_json() const {
  if (!actor_board) return nullptr;
  const actors::actor_board_view v = actor_board->snapshot(actors::actor_board::clock::now());
  json rows = json::array();
  std::size_t running = 0;
  for (const actors::actor_row& r : v.rows) {
    running += r.down ? 0 : 1;
    rows.push_back({{"id", r.id},
                    {"label", r.label.empty() ? json(nullptr) : json(r.label)},
                    {"type", r.type},
                    {"task", r.task},
                    {"state", r.stopped ? "stopped" : r.down ? "down" : "running"},
                    {"cause", r.down ? json(r.cause) : json(nullptr)},
                    {"restarts", r.restarts},
                    {"last_reply_age_ms", r.last_reply_age_ms >= 0 ? json_number(r.last_reply_age_ms) : json(nullptr)},
                    {"age_ms", json_number(r.age_ms)},
                    {"step", r.step >= 0 ? json(r.step) : json(nullptr)},
                    {"values", values_json(r.values)}});
  }
  json history = json::array();
  for (const auto& [label, points] : v.history) {
    json out = json::array();
    for (const auto& p : points) out.push_back({{"step", p.step}, {"values", values_json(p.values)}});
    history.push_back({{"label", label}, {"points", std::move(out)}});
  }
  json actions = json::array();
  for (const ActorAction& a : actor_actions) actions.push_back({{"name", a.name}, {"help", a.help}});
  json pending = json::array();
  for (const ActorCommand& c : actor_commands) {
    pending.push_back({{"id", c.id}, {"label", c.label.empty() ? json(nullptr) : json(c.label)}, {"action", c.action}});
  }
  json answers = json::array();
  for (auto a = actor_answers.rbegin(); a != actor_answers.rend(); ++a) {
    answers.push_back({{"sequence", a->sequence},
                       {"step", a->step},
                       {"time_s", a->time_s},
                       {"id", a->command.id},
                       {"label", a->command.label.empty() ? json(nullptr) : json(a->command.label)},
                       {"action", a->command.action},
                       {"refused", a->refused},
                       {"text", a->text}});
  }
  return json{{"running", running},
              {"spawned", v.spawned},
              {"down", v.down},
              {"stopped", v.stopped},
              {"restarts", v.restarts},
              {"actors", std::move(rows)},
              {"history", std::move(history)},
              {"actions", std::move(actions)},
              {"pending", std::move(pending)},
              {"answers", std::move(answers)}};
}

}  // namespace troupe
