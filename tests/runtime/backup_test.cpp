#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../common/temp_dir.hpp"
#include "test_util.hpp"
#include "troupe/distribute/preemption.hpp"
#include "troupe/nn/backup_and_restore.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::cpus;
using troupe::testing::message_of;
using troupe::testing::temp_dir;
namespace fs = std::filesystem;

namespace {

// A training run stopped from inside (as a kill would stop it, minus the process).
struct interrupted {};
struct exited {};

nn::Sequential mlp(std::uint64_t seed) {
  return nn::Sequential({nn::Dense(8, 16, nn::Activation::relu, seed),
                         nn::Dense(16, 3, nn::Activation::none, seed + 1)});
}

// Every variable's components, as bytes: equal maps are bit-identical runs.
std::map<std::string, std::vector<std::string>> bits(const std::map<std::string, Variable>& variables) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, v] : variables) {
    for (const Tensor& c : v.components()) {
      const Tensor host = c.to(Device());
      out[name].emplace_back(static_cast<const char*>(host.raw_data()), host.nbytes());
    }
  }
  return out;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

const nn::ClassificationData& blobs() {
  static const nn::ClassificationData d = nn::make_blobs({320, 8, 3, 2, 2.0f, 1.0f, 5});
  return d;
}

// A new dataset object each time, as a new process would build it (shuffle counts its passes).
data::Dataset training_set(std::int64_t steps_per_epoch) {
  auto slices = data::Dataset::from_tensor_slices({blobs().features, blobs().labels}).shuffle(320, 3);
  return steps_per_epoch > 0 ? slices.repeat().batch(16) : slices.batch(32);  // -1: 10 batches a pass
}

}  // namespace

TEST_CASE("BackupAndRestore: a fit interrupted three times ends bit-identical to one that never stopped") {
  for (std::int64_t steps_per_epoch : {std::int64_t{10}, std::int64_t{-1}}) {
    CAPTURE(steps_per_epoch);
    Runtime rt;
    MirroredStrategy s(rt, cpus(2));
    auto scope = s.scope();
    nn::FitOptions quiet;
    quiet.verbose = 0;

    nn::Model reference(mlp(11));
    reference.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    reference.fit(training_set(steps_per_epoch), 4, steps_per_epoch, quiet);
    const auto expected = bits(reference.variables());

    temp_dir dir("backup");
    nn::BackupOptions every_3;
    every_3.save_freq = 3;
    const std::vector<std::int64_t> stops = {5, 17, 29};  // steps after which the run is stopped
    std::vector<std::string> resumed_from;
    std::map<std::string, std::vector<std::string>> got;
    for (std::size_t attempt = 0; attempt <= stops.size(); ++attempt) {
      CAPTURE(attempt);
      nn::Model model(mlp(11));  // fresh weights, as a restarted process has
      model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
      nn::BackupAndRestore backup(dir.path.string(), every_3);
      resumed_from.push_back(backup.latest_backup() ? fs::path(*backup.latest_backup()).filename().string() : "");
      nn::FitOptions options = quiet;
      options.backup_and_restore = &backup;
      if (attempt < stops.size()) {
        options.on_step_end = [&](std::int64_t step, double) {
          if (step == stops[attempt]) throw interrupted{};
        };
        CHECK_THROWS_AS(model.fit(training_set(steps_per_epoch), 4, steps_per_epoch, options), interrupted);
      } else {
        model.fit(training_set(steps_per_epoch), 4, steps_per_epoch, options);
        got = bits(model.variables());
      }
    }
    // Each restart took up the newest backup, 2 steps before the stop: those steps ran twice.
    CHECK(resumed_from == std::vector<std::string>{"", "ckpt-3.ckpt", "ckpt-15.ckpt", "ckpt-27.ckpt"});
    REQUIRE(got.size() == expected.size());
    CHECK(got.count("_backup/position") == 0);
    for (const auto& [name, components] : expected) {
      CAPTURE(name);
      CHECK(got.at(name) == components);
    }
    CHECK(nn::BackupAndRestore(dir.path.string()).latest_backup() == std::nullopt);  // deleted at the end
  }
}

TEST_CASE("BackupAndRestore::save_now from fit's on_step_end saves that step, and the run resumes there") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  nn::FitOptions quiet;
  quiet.verbose = 0;
  nn::Model reference(mlp(31));
  reference.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  reference.fit(training_set(10), 2, 10, quiet);

  temp_dir dir("save-now");
  nn::BackupOptions rarely;
  rarely.save_freq = 1000;  // no periodic save within the run
  {
    nn::Model model(mlp(31));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    nn::BackupAndRestore backup(dir.path.string(), rarely);
    nn::FitOptions options = quiet;
    options.backup_and_restore = &backup;
    options.on_step_end = [&](std::int64_t step, double) {
      if (step == 7) backup.save_now();  // as a dashboard's "checkpoint" request would
      if (step == 9) throw interrupted{};
    };
    CHECK_THROWS_AS(model.fit(training_set(10), 2, 10, options), interrupted);
    CHECK(files_in(dir.path) == std::vector<std::string>{"ckpt-7.ckpt"});
  }
  nn::Model model(mlp(31));
  model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  nn::BackupAndRestore backup(dir.path.string(), rarely);
  nn::FitOptions options = quiet;
  options.backup_and_restore = &backup;
  std::vector<std::int64_t> steps;
  options.on_step_end = [&](std::int64_t step, double) { steps.push_back(step); };
  model.fit(training_set(10), 2, 10, options);
  CHECK(steps.front() == 8);
  CHECK(steps.back() == 20);
  CHECK(bits(model.variables()) == bits(reference.variables()));
}

namespace {

// How a test stops fit at a step boundary: a callback's stop_training (Keras's
// model.stop_training), or a request through model.control() (as a signal's poller or the
// dashboard makes one).
enum class StopBy { callback, control };

// One run of a fit under `backup` that stops after step `stop` (-1: never). Returns its History;
// `first_step` receives the first step it ran (0: none).
nn::History fit_until(nn::Model& model, nn::BackupAndRestore& backup, std::int64_t steps_per_epoch, int epochs,
                      std::int64_t stop, StopBy by, std::int64_t& first_step, std::ostream* out = nullptr) {
  nn::FitOptions options;
  options.verbose = out != nullptr ? 2 : 0;
  options.out = out;
  options.backup_and_restore = &backup;
  first_step = 0;
  options.on_step_end = [&](std::int64_t step, double) {
    if (first_step == 0) first_step = step;
    if (step == stop && by == StopBy::control) model.control().request_stop("stopped by the test");
  };
  auto stopper = std::make_shared<nn::LambdaCallback>();
  stopper->batch_end = [&](std::int64_t, nn::Logs&) {
    if (model.control().step() == stop && by == StopBy::callback) model.control().stop_training("stopped by the test");
  };
  options.callbacks = {stopper};
  return model.fit(training_set(steps_per_epoch), epochs, steps_per_epoch, options);
}

}  // namespace

TEST_CASE("fit stopped at step boundaries of several epochs resumes at the next step, bit-identical to one run") {
  for (std::int64_t steps_per_epoch : {std::int64_t{10}, std::int64_t{-1}}) {
    for (StopBy by : {StopBy::callback, StopBy::control}) {
      for (std::int64_t save_freq : {std::int64_t{0}, std::int64_t{4}}) {
        CAPTURE(steps_per_epoch);
        CAPTURE(static_cast<int>(by));
        CAPTURE(save_freq);
        Runtime rt;
        MirroredStrategy s(rt, cpus(2));
        auto scope = s.scope();
        nn::Model reference(mlp(41));
        reference.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
        nn::FitOptions quiet;
        quiet.verbose = 0;
        const nn::History whole = reference.fit(training_set(steps_per_epoch), 4, steps_per_epoch, quiet);
        REQUIRE(whole.steps == 40);

        temp_dir dir("stop-resume");
        nn::BackupOptions backup_options;
        backup_options.save_freq = save_freq;
        // Inside the first epoch, at the last step of the first (with -1: the end of the pass is
        // known only to the next run; 10 is no multiple of save_freq), inside the second and the
        // third, at the last step of the third, and at the first step of the fourth.
        const std::vector<std::int64_t> stops = {3, 10, 17, 25, 30, 31};
        std::int64_t done = 0;
        std::int64_t expected_first = 1;
        for (std::size_t attempt = 0; attempt <= stops.size(); ++attempt) {
          CAPTURE(attempt);
          nn::Model model(mlp(41));  // fresh weights, as a restarted process has
          model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
          nn::BackupAndRestore backup(dir.path.string(), backup_options);
          const std::int64_t stop = attempt < stops.size() ? stops[attempt] : -1;
          std::int64_t first = 0;
          const nn::History h = fit_until(model, backup, steps_per_epoch, 4, stop, by, first);
          CHECK(first == expected_first);  // not a step lost, none run twice
          done += h.steps;
          if (stop > 0) {
            CHECK(h.stopped_at_step == stop);
            CHECK(h.stop_reason == "stopped by the test");
            CHECK(model.control().step() == stop);
            // The stop's own step is backed up, whatever save_freq says.
            CHECK(fs::path(backup.latest_backup().value_or("")).filename() == "ckpt-" + std::to_string(stop) + ".ckpt");
            expected_first = stop + 1;
          } else {
            CHECK(h.stop_reason.empty());
            CHECK(model.control().step() == 40);
            CHECK(bits(model.variables()) == bits(reference.variables()));
            CHECK(backup.latest_backup() == std::nullopt);  // completed: deleted
          }
        }
        CHECK(done == 40);
      }
    }
  }
}

TEST_CASE("fit resumed with no epoch left trains nothing, says so and keeps the backup") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  temp_dir dir("nothing-left");
  nn::Model reference(mlp(43));
  reference.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
  nn::FitOptions quiet;
  quiet.verbose = 0;
  reference.fit(training_set(10), 5, 10, quiet);

  std::map<std::string, std::vector<std::string>> at_stop;
  for (std::int64_t stop : {std::int64_t{34}, std::int64_t{30}}) {  // inside epoch 4; at the end of epoch 3
    CAPTURE(stop);
    temp_dir run_dir("nothing-left-run");
    {
      nn::Model model(mlp(43));
      model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
      nn::BackupAndRestore backup(run_dir.path.string());
      std::int64_t first = 0;
      const nn::History h = fit_until(model, backup, 10, 5, stop, StopBy::control, first);
      REQUIRE(h.stopped_at_step == stop);
      at_stop = bits(model.variables());
    }
    for (int epochs : {3, 2}) {  // fewer epochs than the backup stands in or after
      CAPTURE(epochs);
      nn::Model model(mlp(43));
      model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
      nn::BackupAndRestore backup(run_dir.path.string());
      std::ostringstream out;
      std::int64_t first = 0;
      const nn::History h = fit_until(model, backup, 10, epochs, -1, StopBy::control, first, &out);
      CHECK(h.steps == 0);
      CHECK(h.loss.empty());
      CHECK(first == 0);
      CHECK(model.control().step() == stop);
      CHECK(contains(out.str(), "Nothing left to train: the run stands at step " + std::to_string(stop)));
      CHECK(contains(out.str(), "the backup in " + run_dir.path.string() + " is kept"));
      CHECK(!contains(out.str(), "nan"));
      CHECK(bits(model.variables()) == at_stop);
      CHECK(fs::path(backup.latest_backup().value_or("")).filename() == "ckpt-" + std::to_string(stop) + ".ckpt");
    }
    // Asked for the whole run again, it takes the backup up and ends as one run would.
    nn::Model model(mlp(43));
    model.compile(std::make_shared<nn::Adam>(0.01f), nn::Loss::sparse_categorical_crossentropy());
    nn::BackupAndRestore backup(run_dir.path.string());
    std::int64_t first = 0;
    const nn::History h = fit_until(model, backup, 10, 5, -1, StopBy::control, first);
    CHECK(first == stop + 1);
    CHECK(h.steps == 50 - stop);
    CHECK(bits(model.variables()) == bits(reference.variables()));
    CHECK(backup.latest_backup() == std::nullopt);
  }
}

TEST_CASE("BackupAndRestore: a custom loop with a random engine resumes bit-identical after two interruptions") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  constexpr std::int64_t steps = 24;
  // One step: every replica's features scaled by a factor the loop draws from `engine`.
  auto train = [&](nn::Model& model, std::mt19937_64& engine, nn::BackupAndRestore* backup,
                   std::int64_t stop_after) -> std::uint64_t {
    nn::TrainingPosition at;
    if (backup != nullptr) at = backup->restore();
    DistributedDataset dist = s.experimental_distribute_dataset(training_set(10));
    DistributedIterator it = dist.make_iterator();
    CHECK(nn::BackupAndRestore::skip(it, at.iterator_position) == at.iterator_position);
    for (std::int64_t step = at.step; step < steps; ++step) {
      const float scale = std::uniform_real_distribution<float>(0.5f, 1.5f)(engine);
      s.run([&](const data::Element& e) { return model.train_step({e[0] * scale, e[1]}, 16); }, it.get_next());
      if (backup != nullptr) backup->on_step_end({step + 1, 0, step + 1, step + 1, 0});
      if (step + 1 == stop_after) throw interrupted{};
    }
    if (backup != nullptr) backup->on_train_end();
    return engine();
  };
  auto make_model = [] {
    nn::Model model(mlp(21));
    model.compile(std::make_shared<nn::SGD>(0.05f, 0.9f), nn::Loss::sparse_categorical_crossentropy());
    return model;
  };

  nn::Model reference = make_model();
  std::mt19937_64 reference_engine(99);
  const std::uint64_t reference_next = train(reference, reference_engine, nullptr, -1);

  temp_dir dir("backup-loop");
  nn::BackupOptions every_4;
  every_4.save_freq = 4;
  for (std::int64_t stop : {std::int64_t{7}, std::int64_t{19}}) {
    nn::Model model = make_model();
    std::mt19937_64 engine(99);
    nn::BackupAndRestore backup(dir.path.string(), every_4);
    backup.track(model.variables());
    backup.track_rng("scale", engine);
    CHECK_THROWS_AS(train(model, engine, &backup, stop), interrupted);
  }
  nn::Model model = make_model();
  std::mt19937_64 engine(12345);  // a different seed: the backup's state must replace it
  nn::BackupAndRestore backup(dir.path.string(), every_4);
  backup.track(model.variables());
  backup.track_rng("scale", engine);
  CHECK(fs::path(backup.latest_backup().value_or("")).filename() == "ckpt-16.ckpt");
  const std::uint64_t next = train(model, engine, &backup, -1);
  CHECK(next == reference_next);
  CHECK(bits(model.variables()) == bits(reference.variables()));
}

TEST_CASE("CheckpointManager removes the temporary files that interrupted saves of its prefix left") {
  temp_dir dir("stale");
  Variable v(Tensor::scalar<float>(1.0f));
  CheckpointManager(Checkpoint({{"v", v}}), dir.path.string(), 3).save(2);
  // A pid that no process has any more: a child that exited and was reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const std::string dead = std::to_string(child);
  const std::string live = std::to_string(::getppid());  // a save of a process still running
  for (const std::string& name : std::vector<std::string>{"ckpt-3.ckpt.tmp-" + dead + "-0", "ckpt-4.worker-1.tmp.ckpt",
                                  "ckpt-4.worker-1.tmp.ckpt.tmp-" + dead + "-2", "ckpt-5.ckpt.tmp-" + live + "-1",
                                  "model-3.ckpt.tmp-" + dead + "-0", "ckpt-x.ckpt.tmp-" + dead + "-0", "notes.txt"}) {
    dir.write(name, std::string(100, 'x'));
  }
  CheckpointManager manager(Checkpoint({{"v", v}}), dir.path.string(), 3);
  CHECK(files_in(dir.path) == std::vector<std::string>{"ckpt-2.ckpt", "ckpt-5.ckpt.tmp-" + live + "-1",
                                                      "ckpt-x.ckpt.tmp-" + dead + "-0",
                                                      "model-3.ckpt.tmp-" + dead + "-0", "notes.txt"});
  CHECK(manager.restore_or_initialize() == 2);
}

TEST_CASE("CheckpointManager and BackupAndRestore report an unusable directory before any training") {
  temp_dir dir("unusable");
  Variable v(Tensor::scalar<float>(1.0f));
  const std::string file = dir.write("a-file", "x");
  const std::string is_file = message_of([&] { CheckpointManager(Checkpoint({{"v", v}}), file, 2); });
  CHECK(contains(is_file, "the checkpoint directory " + file + " is not a directory (it is a file)"));
  CHECK_THROWS_AS(CheckpointManager(Checkpoint({{"v", v}}), file, 2), CheckpointError);
  CHECK(contains(message_of([&] { nn::BackupAndRestore b(file); }), "is not a directory (it is a file)"));
  const std::string below = message_of([&] { CheckpointManager(Checkpoint({{"v", v}}), file + "/run", 2); });
  CHECK(contains(below, "cannot create the checkpoint directory " + file + "/run"));
  // A missing directory is made at once.
  CheckpointManager(Checkpoint({{"v", v}}), dir.file("new/run"), 2);
  CHECK(fs::is_directory(dir.file("new/run")));
  CHECK(files_in(dir.file("new/run")).empty());  // the probe is gone

  // Read-only: by its mode, or for root (who writes anyway) by the immutable attribute.
  const std::string read_only = dir.file("read-only");
  fs::create_directories(read_only);
  const bool root = ::geteuid() == 0;
  const std::string immutable = "chattr +i '" + read_only + "' 2>/dev/null";
  const bool made_read_only = root ? std::system(immutable.c_str()) == 0 : ::chmod(read_only.c_str(), 0555) == 0;
  if (made_read_only) {
    const std::string why = message_of([&] { CheckpointManager(Checkpoint({{"v", v}}), read_only, 2); });
    CHECK(contains(why, "CheckpointManager: cannot write in the checkpoint directory " + read_only + ": "));
    CHECK(contains(why, " (make it writable, or give another directory)"));
    CHECK(contains(message_of([&] { nn::BackupAndRestore b(read_only); }), "cannot write in the checkpoint directory"));
  } else {
    MESSAGE("root without chattr here: the read-only directory case is not checked");
  }
  if (root) {
    const std::string mutable_again = "chattr -i '" + read_only + "' 2>/dev/null";
    CHECK(std::system(mutable_again.c_str()) >= 0);
  }
  ::chmod(read_only.c_str(), 0755);
}

TEST_CASE("PreemptionCheckpointHandler saves at the step a watcher or SIGTERM stops, and the next one resumes there") {
  Runtime rt;
  MirroredStrategy s(rt, cpus(2));
  auto scope = s.scope();
  temp_dir dir("preempt");
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);

  auto counting_run = [&](std::int64_t watch_at, std::int64_t sigterm_in, std::int64_t until) {
    Variable count(Tensor::scalar<std::int64_t>(0), "count");
    CheckpointManager manager(Checkpoint({{"count", count}}), dir.path.string(), 2);
    TerminationConfig config;
    PreemptionCheckpointHandler* self = nullptr;
    config.termination_watcher_fn = [&] { return self->total_run_calls() == watch_at; };
    config.exit_fn = [] { throw exited{}; };
    PreemptionCheckpointHandler handler(s, manager, config);
    self = &handler;
    const std::int64_t restored = handler.total_run_calls();
    CHECK(count.value().item<std::int64_t>() == restored);
    while (handler.total_run_calls() < until) {
      handler.run([&] {
        count.assign_add(Tensor::scalar<std::int64_t>(1));
        if (handler.total_run_calls() + 1 == sigterm_in) ::raise(SIGTERM);
      });
    }
    return std::make_pair(restored, count.value().item<std::int64_t>());
  };
  // The watcher says stop at 6: saved at 6 (runs done), exit_fn called.
  CHECK_THROWS_AS(counting_run(6, -1, 10), exited);
  CHECK(files_in(dir.path) == std::vector<std::string>{"ckpt-6.ckpt"});
  // SIGTERM during the 9th run: saved at 9.
  CHECK_THROWS_AS(counting_run(-1, 9, 20), exited);
  CHECK(files_in(dir.path) == std::vector<std::string>{"ckpt-6.ckpt", "ckpt-9.ckpt"});
  // Nothing stops the third: it resumes at 9 and counts on to 12.
  CHECK(counting_run(-1, -1, 12) == std::make_pair(std::int64_t{9}, std::int64_t{12}));
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  CHECK(reinterpret_cast<void*>(after.sa_handler) == reinterpret_cast<void*>(before.sa_handler));  // the handler put SIGTERM back
}

}  // namespace TROUPE_TEST_FILE
