// troupe-launch supervising its workers: TF_CONFIG and the environment, their output, their exits
// and the signals it forwards.
#include "launch_harness.hpp"

using namespace launch_test;

TEST_CASE("troupe-launch gives 3 workers distinct indices and one cluster of 3 distinct ports") {
  scratch dir;
  auto r = run(workers(3, R"(echo "TF_CONFIG=$TF_CONFIG"; echo "DEVICES=${TROUPE_DEVICES_PER_WORKER-unset}")", dir),
               dir, {"TF_CONFIG=stale", "TROUPE_DEVICES_PER_WORKER"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.err == "");
  CHECK(lines_of(r.out).size() == 6);
  auto ports = cluster_ports(r.out, 3);
  REQUIRE(ports.size() == 3);
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == 3);
  for (int port : ports) CHECK((port > 0 && port < 65536));
  for (int rank = 0; rank < 3; ++rank) CHECK(lines_of_rank(r.out, rank).at(1) == "DEVICES=unset");
}

TEST_CASE("troupe-launch passes --devices-per-worker as TROUPE_DEVICES_PER_WORKER") {
  scratch dir;
  auto r = run(workers(2, R"(echo "DEVICES=${TROUPE_DEVICES_PER_WORKER-unset}")", dir,
                       {"--devices-per-worker", "2"}),
               dir, {"TROUPE_DEVICES_PER_WORKER=7"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"DEVICES=2"});
}

TEST_CASE("troupe-launch gives its workers one fresh TROUPE_CLUSTER_TOKEN per launch unless the caller set one") {
  scratch dir;
  // The token every worker of one launch saw (empty when they differ).
  auto token_of = [&](const std::vector<std::string>& env) {
    auto r = run(workers(2, R"(echo "TOKEN=${TROUPE_CLUSTER_TOKEN-unset}")", dir), dir, env);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    const std::string t = lines_of_rank(r.out, 0).at(0);
    return t == lines_of_rank(r.out, 1).at(0) ? t : std::string();
  };
  const std::string first = token_of({"TROUPE_CLUSTER_TOKEN"});
  CHECK(first.size() == std::string("TOKEN=").size() + 64);
  CHECK(token_of({"TROUPE_CLUSTER_TOKEN"}) != first);  // another launch, another token
  const std::string from_empty = token_of({"TROUPE_CLUSTER_TOKEN="});  // empty counts as unset
  CHECK(from_empty.size() == first.size());
  CHECK(token_of({"TROUPE_CLUSTER_TOKEN=mine"}) == "TOKEN=mine");
}

TEST_CASE("troupe-launch prefixes every stdout and stderr line with the worker's rank") {
  scratch dir;
  auto r = run(workers(3, R"(echo "out $i"; echo "err $i" >&2; printf 'two\nlines\n'
printf 'hel'; sleep 0.2; echo lo; printf 'tail'; printf 'err tail' >&2)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    std::string n = std::to_string(rank);
    CHECK(lines_of_rank(r.out, rank) ==
          std::vector<std::string>{"out " + n, "two", "lines", "hello", "tail"});
    CHECK(lines_of_rank(r.err, rank) == std::vector<std::string>{"err " + n, "err tail"});
  }
  // Nothing unprefixed, nothing on the wrong stream.
  CHECK(lines_of(r.out).size() == 15);
  CHECK(lines_of(r.err).size() == 6);
}

TEST_CASE("troupe-launch keeps lines whole when 4 workers write 20000 lines each at once") {
  scratch dir;
  auto r = run(workers(4, R"(seq 0 19999 | sed "s/^/rank $i line /")", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  std::vector<int> next(4, 0);
  int bad = 0;
  for (const auto& line : lines_of(r.out)) {
    int rank = -1, rank_again = -1, number = -1;
    char tail = 0;
    if (std::sscanf(line.c_str(), "[rank %d] rank %d line %d%c", &rank, &rank_again, &number, &tail) != 3 ||
        rank != rank_again || rank < 0 || rank > 3 || number != next[rank]) {
      if (++bad <= 3) MESSAGE("bad line: " << line);
      continue;
    }
    ++next[rank];
  }
  CHECK(bad == 0);
  CHECK(next == std::vector<int>{20000, 20000, 20000, 20000});
}

TEST_CASE("troupe-launch exits with a failing worker's status and stops the others quickly") {
  scratch dir;
  auto r = run(workers(3, R"(if [ "$i" = 1 ]; then await 0 2; echo "giving up" >&2; exit 3; fi
sleep 60 & record $!; wait)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 3);
  CHECK(r.seconds < 4);
  CHECK(lines_of_rank(r.err, 1) == std::vector<std::string>{"giving up"});
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 1 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(exited with status 3; stopping the others\n)")));
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch exits 128+signal when a worker is killed by a signal") {
  scratch dir;
  auto r = run(workers(3, R"(if [ "$i" = 2 ]; then await 0 1; kill -9 $$; fi
sleep 60 & record $!; wait)",
                       dir),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 137);
  CHECK(r.seconds < 4);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(was killed by signal 9 \(SIGKILL\); stopping the others\n)")));
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch forwards SIGTERM to every worker and leaves none behind") {
  scratch dir;
  launcher l(workers(3, R"(trap 'echo "rank $i got TERM"; exit 0' TERM; sleep 60 & record $!; wait)", dir), dir);
  REQUIRE(dir.await_recorded(3));
  auto signalled = clock::now();
  REQUIRE(::kill(l.pid(), SIGTERM) == 0);
  auto r = l.wait(10s);
  REQUIRE(r.finished);
  CHECK(seconds_since(signalled) < 4);
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK(r.err.find("troupe-launch: received SIGTERM; forwarding it to 3 running workers\n") != std::string::npos);
  for (int rank = 0; rank < 3; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"rank " + std::to_string(rank) + " got TERM"});
  check_no_worker_left(dir, 6);
}

TEST_CASE("troupe-launch forwards SIGINT and kills what a worker leaves behind in its group") {
  // The shell's background sleep ignores SIGINT (POSIX, without job control): it outlives the
  // worker's shell and goes only because the launcher kills the worker's whole process group.
  scratch dir;
  launcher l(workers(2, R"(trap 'echo "rank $i got INT"; exit 0' INT; sleep 60 & record $!; wait)", dir), dir);
  REQUIRE(dir.await_recorded(2));
  auto signalled = clock::now();
  REQUIRE(::kill(l.pid(), SIGINT) == 0);
  auto r = l.wait(10s);
  REQUIRE(r.finished);
  CHECK(seconds_since(signalled) < 4);
  CHECK(r.exit_code == 128 + SIGINT);
  CHECK(r.err.find("troupe-launch: received SIGINT; forwarding it to 2 running workers\n") != std::string::npos);
  for (int rank = 0; rank < 2; ++rank)
    CHECK(lines_of_rank(r.out, rank) == std::vector<std::string>{"rank " + std::to_string(rank) + " got INT"});
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch stops everything after --timeout and exits 124") {
  scratch dir;
  auto r = run(workers(2, "sleep 60 & record $!; wait", dir, {"--timeout", "1"}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 124);
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 5);
  CHECK(r.err.find("troupe-launch: timed out after 1 s; stopping 2 running workers\n") != std::string::npos);
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch sends SIGKILL after the grace period to a worker that ignores SIGTERM") {
  scratch dir;
  auto r = run(workers(2, R"(if [ "$i" = 1 ]; then await 0; exit 5; fi
trap '' TERM; sleep 60 & record $!; wait)",
                       dir, {"--grace", "0.5"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 5);
  CHECK(r.seconds >= 0.5);
  CHECK(r.seconds < 4);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 0 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) )"
                                            R"(did not stop within 0\.5 s of SIGTERM; sending SIGKILL\n)")));
  check_no_worker_left(dir, 2);
}

TEST_CASE("troupe-launch leaves no process behind when every worker succeeds") {
  scratch dir;
  auto r = run(workers(2, "sleep 60 & record $!; exit 0", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds < 4);
  CHECK(r.err == "");
  check_no_worker_left(dir, 4);
}

TEST_CASE("troupe-launch waits for every worker when one finishes early") {
  scratch dir;
  auto r = run(workers(2, R"(if [ "$i" = 0 ]; then exit 0; fi; sleep 0.5; echo done)", dir), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.seconds >= 0.5);
  CHECK(lines_of_rank(r.out, 1) == std::vector<std::string>{"done"});
  CHECK(r.err == "");
}
