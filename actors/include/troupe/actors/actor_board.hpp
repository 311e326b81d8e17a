#pragma once

// What a spawner knows of the actors it spawned, for the dashboard's Actors card: where each one
// lives (its type and task), whether it runs, how often it was restarted, when it last answered,
// and the numbers the application says about it (a trial's accuracy and learning rate), with a
// short history of those numbers.
//
// The spawner's ActorCluster reports spawns, replies and downs into it (from the threads that see
// them; an actor its spawner stopped is down too, marked stopped); the application names its actors and gives their numbers (Monitor::describe_actor); the
// dashboard reads snapshots. A plain class without CAF: time is passed in, so tests decide it.
//
// A label is the application's name for a role an actor plays ("trial 3"). A new actor given a
// label that another actor held takes that one's place (its row, its history) and counts as a
// restart of it: an application that respawns a lost actor elsewhere labels the new one as the
// old. An unlabelled actor is a row of its own. Memory is bounded: at most max_rows rows (the
// oldest down ones go first), max_values numbers per actor, max_history points per label.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors {

/// One number the application said about an actor, at its step.
struct actor_values_point {
  std::int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
};

/// One row of the board: an actor (the newest of its label).
struct actor_row {
  std::uint64_t id = 0;        ///< the spawner's number for it (ActorHandle::id)
  std::string label;           ///< the application's name for it; "" for none
  std::string type;            ///< its registered type
  std::string task;            ///< where it runs: a full task name, or "local"
  bool down = false;           ///< it went down (and no actor took its label since)
  bool stopped = false;        ///< down because its spawner stopped it (not lost)
  std::string cause;           ///< why, when down
  int restarts = 0;            ///< actors that held its label before it, plus restarts reported for it
  double last_reply_age_ms = -1;  ///< since its last reply; -1 before any
  double age_ms = 0;           ///< since it was spawned (or restarted)
  std::int64_t step = -1;      ///< the step of its newest numbers; -1 before any
  std::vector<std::pair<std::string, double>> values;  ///< its newest numbers, in the order given
};

/// What the board shows.
struct actor_board_view {
  std::vector<actor_row> rows;  ///< in the order first spawned (a label keeps its place)
  std::uint64_t spawned = 0;    ///< actors spawned in all
  std::uint64_t down = 0;       ///< actors that went down in all, but those stopped (replaced ones included)
  std::uint64_t stopped = 0;    ///< actors their spawner stopped, in all
  std::uint64_t restarts = 0;   ///< restarts in all
  /// Every label's numbers over its steps, oldest first (at most max_history points each).
  std::vector<std::pair<std::string, std::vector<actor_values_point>>> history;
};

class actor_board {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t max_rows = 1024;
  static constexpr std::size_t max_values = 16;
  static constexpr std::size_t max_history = 256;

  /// An actor spawned on `task`.
  void spawned(std::uint64_t id, const std::string& type, const std::string& task, clock::time_point now);
  /// Actor `previous` started again (a restart policy's) as `id`, now on `task`: its row, label
  /// and history go on under the new id. An unknown `previous` is ignored.
  void restarted(std::uint64_t previous, std::uint64_t id, const std::string& task, clock::time_point now);
  /// An actor answered a request.
  void replied(std::uint64_t id, clock::time_point now);
  /// An actor went down, for `cause`; `stopped`: its spawner stopped it (it was not lost).
  void went_down(std::uint64_t id, const std::string& cause, clock::time_point now, bool stopped = false);
  /// The application's name and numbers for an actor at `step` (at most max_values numbers; the
  /// caller checks names). An id never spawned gets a row of unknown type and task.
  void describe(std::uint64_t id, const std::string& label, std::int64_t step,
                std::vector<std::pair<std::string, double>> values, clock::time_point now);

  actor_board_view snapshot(clock::time_point now) const;

 private:
  struct entry {
    actor_row row;
    clock::time_point since{};
    clock::time_point last_reply{};
    bool replied = false;
    std::uint64_t order = 0;
  };
  entry& find_or_add(std::uint64_t id, clock::time_point now);
  void trim();

  mutable std::mutex mutex_;
  std::map<std::uint64_t, entry> actors_;
  std::map<std::string, std::deque<actor_values_point>> history_;
  std::map<std::string, std::uint64_t> label_holder_;  // label -> id of the actor holding it
  std::uint64_t next_order_ = 0;
  std::uint64_t spawned_ = 0;
  std::uint64_t down_ = 0;
  std::uint64_t stopped_ = 0;
  std::uint64_t restarts_ = 0;
};

}  // namespace troupe::actors
