// troupe-launch --max-restarts and --elastic: a launch restarted after a failure, a lost worker
// replaced or left out, a lost ps task restarted alone.
#include "launch_harness.hpp"

using namespace launch_test;

TEST_CASE("troupe-launch --max-restarts restarts every worker after a failure and a preemption, saying why") {
  scratch dir;
  // Each worker counts its starts in $D/starts.$i. Rank 1 is killed by SIGKILL in the first run;
  // rank 0 exits 75 (preempted) in the second; the third run succeeds.
  auto r = run(workers(2, R"(echo x >> "$D/starts.$i"; n=$((TROUPE_RESTART_COUNT + 1))
echo "run $n"
if [ "$n" = 1 ]; then record; fi
if [ "$n" = 1 ] && [ "$i" = 1 ]; then await 0; kill -9 $$; fi
if [ "$n" = 2 ] && [ "$i" = 0 ]; then exit 75; fi
if [ "$n" -lt 3 ]; then sleep 60 & wait; fi
exit 0)",
                       dir, {"--max-restarts", "2", "--restart-backoff", "0.1"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(read_file(dir.path() + "/starts.0") == "x\nx\nx\n");
  CHECK(lines_of_rank(r.out, 1).back() == "run 3");  // rank 1 may be stopped before it says "run 2"
  CHECK(lines_of_rank(r.out, 0) == std::vector<std::string>{"run 1", "run 2", "run 3"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: restarting all 2 workers \(restart 1 of 2\) in 0\.1 s: )"
                                            R"(worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed by signal 9 \(SIGKILL\)\n)")));
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: restarting all 2 workers \(restart 2 of 2\) in 0\.2 s: )"
                                            R"(worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 75 )"
                                            R"(\(preempted: it saved a checkpoint to restart from\)\n)")));
}

TEST_CASE("troupe-launch --elastic leaves the others running when a worker but the chief dies while --min of them run") {
  scratch dir;
  // Rank 1 kills itself once all have started; the others see the elastic settings and finish.
  const std::string script = R"(record
if [ "$i" = 1 ]; then await 0 2; kill -9 $$; fi
await 1; sleep 0.3
echo "elastic=$TROUPE_ELASTIC min=$TROUPE_MIN_WORKERS max=$TROUPE_MAX_WORKERS"
exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--max", "4"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(lines_of_rank(r.out, 0) == std::vector<std::string>{"elastic=1 min=2 max=4"});
  CHECK(lines_of_rank(r.out, 2) == std::vector<std::string>{"elastic=1 min=2 max=4"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); --elastic: the 2 others go on without it\n)")));
  CHECK(r.err.find("stopping the others") == std::string::npos);
  // Below --min the others are stopped, as without --elastic.
  scratch below;
  auto b = run(workers(3, R"(record
if [ "$i" = 1 ]; then await 0 2; kill -9 $$; fi
sleep 60 & wait)", below, {"--elastic", "--min", "3"}), below);
  REQUIRE(b.finished);
  CHECK(b.exit_code == 137);
  CHECK(std::regex_search(b.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); stopping the others\n)")));
  // Rank 0 holds the cluster's membership: its death stops the others whatever --min says.
  scratch chief;
  auto c = run(workers(3, R"(record
if [ "$i" = 0 ]; then await 1 2; kill -9 $$; fi
sleep 60 & wait)", chief, {"--elastic", "--min", "1"}), chief);
  REQUIRE(c.finished);
  CHECK(c.exit_code == 137);
  CHECK(std::regex_search(c.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); stopping the others\n)")));
}

TEST_CASE("troupe-launch --elastic --max-restarts starts a joiner in a lost worker's place, with the run's token") {
  scratch dir;
  // Rank 1 kills itself on its first start; its replacement (TROUPE_JOIN=1) says what it got.
  const std::string script = R"(if [ -z "$TROUPE_JOIN" ]; then record; fi
echo "$TROUPE_CLUSTER_TOKEN" > "$D/token.$i.${TROUPE_JOIN:-0}"
if [ "$i" = 1 ] && [ -z "$TROUPE_JOIN" ]; then await 0 2; kill -9 $$; fi
if [ "$i" = 1 ]; then echo "joined=$TROUPE_JOIN elastic=$TROUPE_ELASTIC"; exit 0; fi
n=0; while [ ! -e "$D/token.1.1" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done
exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--max-restarts", "1"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(lines_of_rank(r.out, 1) == std::vector<std::string>{"joined=1 elastic=1"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed )"
                                            R"(by signal 9 \(SIGKILL\); --elastic: the 2 others go on without it\n)"
                                            R"(troupe-launch: starting a replacement for worker 1 \(1 of 1\); it joins the )"
                                            R"(running cluster\n)")));
  // The joiner holds the token the others were started with.
  CHECK(read_file(dir.path() + "/token.1.1") == read_file(dir.path() + "/token.0.0"));
  CHECK(read_file(dir.path() + "/token.1.0") == read_file(dir.path() + "/token.0.0"));
  CHECK(r.err.find("restarting") == std::string::npos);
}

TEST_CASE("troupe-launch --elastic --max-restarts: a replacement refused as the chief finishes came too late, no failure") {
  // Rank 1 kills itself; its replacement fails at once (as a joiner the chief refuses when its
  // fit ends does), while the chief still runs for a moment and then finishes: the replacement's
  // verdict waits for the chief's exit, and the run succeeds. With a chief that does not finish
  // within --grace, the same failure stops the run.
  for (const bool chief_finishes : {true, false}) {
    CAPTURE(chief_finishes);
    scratch dir;
    const std::string chief = chief_finishes ? "sleep 0.3; exit 0" : "sleep 60 & wait";
    const std::string script = R"(if [ -z "$TROUPE_JOIN" ]; then record; fi
if [ "$i" = 1 ] && [ -z "$TROUPE_JOIN" ]; then await 0; kill -9 $$; fi
if [ "$i" = 1 ]; then echo "refused" > "$D/refused"; exit 1; fi
n=0; while [ ! -e "$D/refused" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done
)" + chief;
    auto r = run(workers(2, script, dir, {"--elastic", "--min", "1", "--max-restarts", "1", "--grace", "0.5"}), dir);
    REQUIRE(r.finished);
    CHECK(r.exit_code == (chief_finishes ? 0 : 1));
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: starting a replacement for worker 1 \(1 of 1\))")));
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\), a replacement, )"
                                              R"(exited with status 1 after the chief finished the training)")) ==
          chief_finishes);
    CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with )"
                                              R"(status 1; stopping the others)")) == !chief_finishes);
  }
}

TEST_CASE("troupe-launch --elastic kills a worker stopped past the heartbeat limit as lost, not waiting for --timeout") {
  scratch dir;
  // Rank 2 stops itself; with a 50 ms heartbeat and 2 missed beats the limit is 150 ms.
  const std::string script = R"(record
if [ "$i" = 2 ]; then await 0 1; kill -STOP $$; fi
sleep 1.5; exit 0)";
  auto r = run(workers(3, script, dir, {"--elastic", "--min", "2", "--timeout", "20"}), dir,
               {"TROUPE_HEARTBEAT_MS=50", "TROUPE_MISSED_HEARTBEATS=2"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 10);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) has been )"
                                            R"(stopped for [0-9.]+ s, past the heartbeat limit)")));
  CHECK(std::regex_search(r.err, std::regex(R"(worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) was killed by signal 9 )"
                                            R"(\(SIGKILL\); --elastic: the 2 others go on without it)")));
  CHECK(r.err.find("timed out") == std::string::npos);
}

TEST_CASE("troupe-launch --max-restarts gives up with the last failure's status") {
  scratch dir;
  auto r = run(workers(2, R"(echo x >> "$D/starts.$i"; n=$((TROUPE_RESTART_COUNT + 1))
if [ "$i" = 1 ]; then exit $((4 + n)); fi
sleep 60 & wait)",
                       dir, {"--max-restarts", "1", "--restart-backoff", "0"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 6);  // the second run's failure, not the first's 5
  CHECK(read_file(dir.path() + "/starts.1") == "x\nx\n");
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: giving up after 1 restart; the last failure: worker 1 )"
                                            R"(\(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 6 \(exit status 6\)\n)")));
  // Without --max-restarts nothing is restarted.
  scratch once;
  auto r0 = run(workers(1, R"(echo x >> "$D/starts.$i"; exit 5)", once), once);
  CHECK(r0.exit_code == 5);
  CHECK(read_file(once.path() + "/starts.0") == "x\n");
  CHECK(r0.err.find("restarting") == std::string::npos);
}

// A worker that exits 98 says it cannot listen on its address: another process holds its port.
// The worker here only says so (holding a port the launcher is about to pick cannot be arranged);
// multi_worker_trainer_check.sh checks that a trainer whose port is held exits 98.
namespace {

// Rank 0 says so on its first $TAKEN starts; rank 1 waits for rank 0's good start (killed first).
const std::string port_taken_script = R"sh(echo x >> "$D/starts.$i"; echo "$TROUPE_RESTART_COUNT $TF_CONFIG" >> "$D/configs.$i"
if [ "$i" = 0 ]; then
  if [ "$(wc -l < "$D/starts.0")" -le "$TAKEN" ]; then echo "cannot listen: taken"; exit 98; fi
  record; exit 0
fi
await 0; exit 0)sh";

// The lines of `path`, the TF_CONFIG of each start in it ("RESTART_COUNT TF_CONFIG").
std::vector<std::string> configs(const std::string& path) { return lines_of(read_file(path)); }

}  // namespace

TEST_CASE("troupe-launch starts every worker again on fresh ports when one cannot listen on a port it picked") {
  scratch dir;
  // Worker 0 says its port was taken on its first two starts; the third start succeeds.
  auto r = run(workers(2, port_taken_script, dir), dir, {"TAKEN=2"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(read_file(dir.path() + "/starts.0") == "x\nx\nx\n");
  for (int retry : {1, 2}) {
    CAPTURE(retry);
    CHECK(std::regex_search(
        r.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:([0-9]+)\) cannot listen on 127\.0\.0\.1:\1: )"
                          R"(another process took the port \(exit status 98\); starting all 2 workers again on fresh )"
                          R"(ports \(retry )" + std::to_string(retry) + R"( of 3\)\n)")));
  }
  // Neither a failure nor a restart: the others are not "stopped" for it, no restart is counted.
  CHECK(r.err.find("stopping the others") == std::string::npos);
  CHECK(r.err.find("restarting") == std::string::npos);
  // Every start on ports of its own (rank 1, stopped early in the first two, saw the third).
  const auto c0 = configs(dir.path() + "/configs.0"), c1 = configs(dir.path() + "/configs.1");
  REQUIRE(c0.size() == 3);
  REQUIRE(!c1.empty());
  std::set<std::string> clusters;
  for (const std::string& c : c0) {
    CAPTURE(c);
    CHECK(c.rfind("0 ", 0) == 0);  // TROUPE_RESTART_COUNT stays 0
    clusters.insert(nlohmann::json::parse(c.substr(2))["cluster"].dump());
  }
  CHECK(nlohmann::json::parse(c1.back().substr(2))["cluster"] == nlohmann::json::parse(c0.back().substr(2))["cluster"]);
  CHECK(clusters.size() == 3);
}

TEST_CASE("troupe-launch gives up with status 98 after 3 starts on fresh ports, and at once on --port-base ports") {
  scratch dir;
  auto r = run(workers(2, port_taken_script, dir), dir, {"TAKEN=100"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 98);
  CHECK(read_file(dir.path() + "/starts.0") == "x\nx\nx\nx\n");  // the start and 3 retries
  CHECK(r.err.find("(retry 3 of 3)\n") != std::string::npos);
  CHECK(r.err.find("(retry 4 of") == std::string::npos);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:([0-9]+)\) exited with )"
                                            R"(status 98: it cannot listen on 127\.0\.0\.1:\1, which another process )"
                                            R"(holds \(as on each of 3 starts again on fresh ports\); stopping the others\n)")));
  // The user's --port-base: nothing to pick afresh; the port is named.
  scratch fixed;
  int base = 0;
  for (int attempt = 0; attempt < 50 && base == 0; ++attempt) {
    int candidate = bound_socket(0, false).port();
    if (candidate == 0 || candidate > 65534) continue;
    if (bound_socket(candidate + 1, false).ok()) base = candidate;
  }
  REQUIRE(base != 0);
  auto f = run(workers(2, port_taken_script, fixed, {"--port-base", std::to_string(base)}), fixed, {"TAKEN=100"});
  REQUIRE(f.finished);
  CHECK(f.exit_code == 98);
  CHECK(read_file(fixed.path() + "/starts.0") == "x\n");
  const std::string b = std::to_string(base);
  CHECK(std::regex_match(f.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:)" + b +
                                            R"(\) exited with status 98: it cannot listen on 127\.0\.0\.1:)" + b +
                                            R"(, which another process holds \(choose another --port-base than )" + b +
                                            R"(\); stopping the others\n)")));
  CHECK(f.err.find("again on fresh ports") == std::string::npos);
}

TEST_CASE("troupe-launch --ps with --max-restarts restarts a lost ps task alone on its address, within the budget") {
  // The task's type from TF_CONFIG; every start appends its pid to starts.<type>.
  const std::string typed = R"(t=${TF_CONFIG##*'"type": "'}; t=${t%%\"*}; echo $$ >> "$D/starts.$t"
)";
  scratch dir;
  auto r = run(workers(1, typed + R"(case $t in
ps) if [ ! -e "$D/config.ps" ]; then echo "$TF_CONFIG" > "$D/config.ps"; echo "$TROUPE_PS_RESTART_WAIT_S" > "$D/wait.ps"; exit 3; fi
    echo "$TF_CONFIG" > "$D/config2.ps"; n=0; while [ ! -e "$D/done" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 99; sleep 0.025; done ;;
chief) n=0; while [ ! -e "$D/config2.ps" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 98; sleep 0.025; done; touch "$D/done" ;;
*) n=0; while [ ! -e "$D/done" ]; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done ;;
esac)",
                       dir, {"--chief", "--ps", "1", "--max-restarts", "1", "--restart-backoff", "0"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto lines = [](const std::string& text) { return std::count(text.begin(), text.end(), '\n'); };
  CHECK(lines(read_file(dir.path() + "/starts.chief")) == 1);  // the chief and the worker kept running
  CHECK(lines(read_file(dir.path() + "/starts.worker")) == 1);
  CHECK(lines(read_file(dir.path() + "/starts.ps")) == 2);
  CHECK(read_file(dir.path() + "/config2.ps") == read_file(dir.path() + "/config.ps"));  // its same address
  CHECK(read_file(dir.path() + "/wait.ps") == "30\n");  // the chief's wait: 30 s plus the backoff
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, (127\.0\.0\.1:[0-9]+)\) exited with )"
                                            R"(status 3; restarting it alone on \1 \(restart 1 of 1\) in 0 s; the other tasks )"
                                            R"(keep running\n)")));
  CHECK(r.err.find("restarting all") == std::string::npos);

  // A ps task that fails again, past --max-restarts: the launch gives up with its status.
  scratch again;
  auto r2 = run(workers(1, typed + R"(if [ $t = ps ]; then exit 3; fi; sleep 60 & wait)", again,
                        {"--chief", "--ps", "1", "--max-restarts", "1", "--restart-backoff", "0"}),
                again);
  REQUIRE(r2.finished);
  CHECK(r2.exit_code == 3);
  CHECK(lines(read_file(again.path() + "/starts.ps")) == 2);
  CHECK(lines(read_file(again.path() + "/starts.chief")) == 1);
  CHECK(std::regex_search(r2.err, std::regex(R"(troupe-launch: giving up after 1 restart; the last failure: worker 2 )"
                                             R"(\(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with status 3 \(exit status 3\)\n)")));
}
