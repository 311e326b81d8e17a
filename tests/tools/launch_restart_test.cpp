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
