// troupe-launch --host-discovery-script: the script's output checked, workers added and removed.
#include "launch_harness.hpp"

using namespace launch_test;

TEST_CASE("troupe-launch --host-discovery-script adds a joining worker and removes it, neither a failure") {
  scratch dir;
  const std::string hosts = dir.path() + "/hosts";
  const std::string discover = dir.path() + "/discover.sh";
  std::ofstream(hosts) << "localhost:3\n";
  std::ofstream(discover) << "#!/bin/sh\ncat '" << hosts << "'\n";
  ::chmod(discover.c_str(), 0755);
  // Worker 2 is started by discovery: it says what it got and waits to be removed. The others
  // shrink the list once it runs, and wait (bounded) until it is gone.
  const std::string script = R"(record
if [ "$i" = 2 ]; then echo "join=$TROUPE_JOIN config=$TF_CONFIG"; sleep 60; exit 3; fi
await 2
[ "$i" = 0 ] && echo "127.0.0.1:2" > "$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"
p=$(cut -d' ' -f1 "$D/pid.2"); n=0
while kill -0 "$p" 2>/dev/null; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done
exit 0)";
  auto r = run(workers(2, script, dir,
                       {"--elastic", "--min", "2", "--max", "3", "--host-discovery-script", discover,
                        "--discovery-interval", "0.1"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  const std::vector<std::string> two = lines_of_rank(r.out, 2);
  REQUIRE(two.size() == 1);
  // It joins as the third task of a cluster of three, and its port is its own.
  const std::smatch m = [&] {
    std::smatch found;
    std::regex_match(two[0], found, std::regex(R"(join=1 config=(.*))"));
    return found;
  }();
  REQUIRE(m.size() == 2);
  const auto config = nlohmann::json::parse(m[1].str());
  CHECK(config["task"]["index"] == 2);
  REQUIRE(config["cluster"]["worker"].size() == 3);
  const std::set<std::string> ports(config["cluster"]["worker"].begin(), config["cluster"]["worker"].end());
  CHECK(ports.size() == 3);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: host discovery: the hosts are now 127\.0\.0\.1:3 \(3 slots\): )"
                                            R"(removing 0, adding 1 worker\n)"
                                            R"(troupe-launch: host discovery: starting worker 2 on 127\.0\.0\.1 )"
                                            R"(\(127\.0\.0\.1:[0-9]+\); it joins the running cluster\n)")));
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: removing worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) from )"
                                            R"(127\.0\.0\.1 \(SIGKILL\); the others drop it as a lost worker and go on\n)")));
  CHECK(std::regex_search(r.err, std::regex(R"(worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) left \(killed by SIGKILL\), )"
                                            R"(removed by host discovery; not a failure\n)")));
  CHECK(r.err.find("stopping the others") == std::string::npos);
  CHECK(r.err.find("replacement") == std::string::npos);
  check_no_worker_left(dir, 3);
}

TEST_CASE("troupe-launch host discovery: a worker added that fails after the chief finished came too late, no failure") {
  scratch dir;
  const std::string discover = dir.path() + "/discover.sh";
  std::ofstream(discover) << "#!/bin/sh\necho localhost:3\n";
  ::chmod(discover.c_str(), 0755);
  // Worker 2 (added) waits for the chief to end and then fails, as a joiner whose chief is gone
  // does; before the chief ends, the same failure stops the run (second launch).
  const std::string late = R"(record
if [ "$i" = 2 ]; then p=$(cut -d' ' -f1 "$D/pid.0"); n=0
  while kill -0 "$p" 2>/dev/null; do n=$((n+1)); [ $n -gt 400 ] && exit 97; sleep 0.025; done; exit 1; fi
await 2; exit 0)";
  auto r = run(workers(2, late, dir, {"--elastic", "--max", "3", "--host-discovery-script", discover}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(std::regex_search(r.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\), added by host )"
                                            R"(discovery, exited with status 1 after the chief finished the training)")));
  scratch early;
  auto e = run(workers(2, R"(record
if [ "$i" = 2 ]; then exit 1; fi
sleep 60 & wait)", early, {"--elastic", "--max", "3", "--host-discovery-script", discover}), early);
  REQUIRE(e.finished);
  CHECK(e.exit_code == 1);
  CHECK(std::regex_search(e.err, std::regex(R"(troupe-launch: worker 2 \(pid [0-9]+, 127\.0\.0\.1:[0-9]+\) exited with )"
                                            R"(status 1; stopping the others)")));
}

TEST_CASE("troupe-launch host discovery names a failing, a hanging and a malformed script while the workers run") {
  scratch dir;
  const std::string discover = dir.path() + "/discover.sh";
  // Each run of the script does the next thing in $D/mode: exit 3, hang, print a bad line.
  std::ofstream(discover) << "#!/bin/sh\nmode=$(cat '" << dir.path() << "/mode')\n"
                          << "[ \"$mode\" = fail ] && exit 3\n"
                          << "[ \"$mode\" = hang ] && { sleep 60 & echo $! > '" << dir.path() << "/sleep'; wait; }\n"
                          << "printf 'localhost:2\\nlocalhost:x\\n'\n";
  ::chmod(discover.c_str(), 0755);
  std::ofstream(dir.path() + "/mode") << "fail\n";
  // The launcher's stderr is read after the run: worker 0 switches the mode on a timer, giving
  // the script time to do each thing.
  const std::string timed = R"(record
[ "$i" = 1 ] && { sleep 4; exit 0; }
sleep 1; echo hang > "$D/mode"; sleep 1.5; echo bad > "$D/mode"; sleep 1; exit 0)";
  auto r = run(workers(2, timed, dir,
                       {"--elastic", "--host-discovery-script", discover, "--discovery-interval", "0.1",
                        "--discovery-timeout", "0.5"}),
               dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  const std::string head = "troupe-launch: host discovery: '" + discover + "' ";
  CHECK(r.err.find(head + "exited with status 3; the workers stay as they are\n") != std::string::npos);
  CHECK(r.err.find(head + "did not finish within 0.5 s (--discovery-timeout); killed it (SIGKILL); the workers stay "
                          "as they are\n") != std::string::npos);
  CHECK(r.err.find(head + "printed a bad list, line 2 ('localhost:x'): expected host:slots with slots 1..256; the "
                          "workers stay as they are\n") != std::string::npos);
  // Each trouble is said once while it lasts.
  CHECK(r.err.find(head + "exited with status 3") == r.err.rfind(head + "exited with status 3"));
  // The hanging script's sleep was killed with it.
  const pid_t sleeper = static_cast<pid_t>(std::stol(read_file(dir.path() + "/sleep")));
  CHECK(still_alive({sleeper}, 2000ms).empty());
  CHECK(r.err.find("host discovery: starting") == std::string::npos);
  check_no_worker_left(dir, 2);
}

TEST_CASE("troupe-launch host discovery reads host:slots lines and names a bad one by its number") {
  using troupe::launch::discovery_error;
  using troupe::launch::host_slots;
  using troupe::launch::parse_discovery_output;
  auto a = parse_discovery_output("# the hosts\nlocalhost:2\n\n", 8);
  CHECK(a.hosts == std::vector<host_slots>{{"127.0.0.1", 2}});
  CHECK(a.total == 2);
  CHECK(a.note.empty());
  CHECK(parse_discovery_output("127.0.0.1", 8).hosts == std::vector<host_slots>{{"127.0.0.1", 1}});
  // Over --max: cut down, said.
  auto capped = parse_discovery_output("localhost:6\n", 4);
  CHECK(capped.hosts == std::vector<host_slots>{{"127.0.0.1", 4}});
  CHECK(capped.note == "the hosts list 6 slots; capped at --max 4");

  auto message = [](const std::string& text) {
    try {
      parse_discovery_output(text, 8);
    } catch (const discovery_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message("localhost:2\nlocalhost:0\n") == "line 2 ('localhost:0'): expected host:slots with slots 1..256");
  CHECK(message("localhost:257") == "line 1 ('localhost:257'): expected host:slots with slots 1..256");
  CHECK(message("localhost:2x") == "line 1 ('localhost:2x'): expected host:slots with slots 1..256");
  CHECK(message("\n\nlocal host:2") == "line 3 ('local host:2'): expected host or host:slots (a host name or IPv4 address)");
  CHECK(message("localhost:1\n127.0.0.1:2") ==
        "line 2 ('127.0.0.1:2'): '127.0.0.1' is 127.0.0.1 again, named on line 1 (give each host once)");
  CHECK(message("gpu-node-7:4") ==
        "line 1 ('gpu-node-7:4'): 'gpu-node-7' is not this machine; discovered workers start on 127.0.0.1 only (a host "
        "elsewhere would need --rsh, which host discovery does not support)");
  CHECK(message("# nothing\n\n") == "the output names no host (expected host or host:slots lines)");
  CHECK(message(std::string("localhost:1\n\x01\x02:1")) ==
        "line 2 ('??:1'): expected host or host:slots (a host name or IPv4 address)");
}

TEST_CASE("troupe-launch host discovery adds up to --max and removes the newest, never the chief nor below --min") {
  using troupe::launch::host_membership;
  using troupe::launch::host_slots;
  using troupe::launch::worker;
  troupe::launch::launch_options options;
  options.num_workers = 3;
  options.min_workers = 2;
  options.max_workers = 5;
  auto running = [](int n) {
    std::vector<worker> w;
    for (int r = 0; r < n; ++r) {
      w.emplace_back(r, "127.0.0.1:" + std::to_string(4000 + r));
      w.back().running = true;
    }
    return w;
  };
  const std::vector<host_slots> local = {{"127.0.0.1", 3}};
  {
    host_membership m(options, local, 3);
    auto w = running(3);
    CHECK(m.plan({{"127.0.0.1", 3}}, w).add.empty());
    auto grow = m.plan({{"127.0.0.1", 9}}, w);  // at most --max 5 slots taken
    CHECK(grow.add == std::vector<std::string>{"127.0.0.1", "127.0.0.1"});
    CHECK(grow.notes == std::vector<std::string>{"not adding a worker on 127.0.0.1: 5 slots are taken, --max 5"});
    auto shrink = m.plan({{"127.0.0.1", 2}}, w);
    CHECK(shrink.remove == std::vector<int>{2});
    CHECK(shrink.add.empty());
  }
  {
    // Never below --min 2, and never the chief.
    host_membership m(options, local, 3);
    auto w = running(3);
    auto one = m.plan({{"127.0.0.1", 1}}, w);
    CHECK(one.remove == std::vector<int>{2});
    CHECK(one.notes == std::vector<std::string>{"keeping 2 workers running: removing more would leave fewer than --min 2"});
    options.min_workers = 1;
    host_membership chief(options, local, 3);
    auto c = chief.plan({{"127.0.0.1", 1}}, running(3));
    CHECK(c.remove == std::vector<int>{2, 1});
    auto two = running(2);
    auto keep = chief.plan({}, two);  // the script lists no slot at all: only the chief would be left
    CHECK(keep.remove == std::vector<int>{1});
    CHECK(keep.notes == std::vector<std::string>{
                            "keeping worker 0 on 127.0.0.1: it is the chief, which holds the cluster's membership"});
    options.min_workers = 2;
  }
  {
    // A removed worker is no longer counted; a lost one keeps its slot until the list shrinks.
    host_membership m(options, local, 3);
    auto w = running(3);
    m.removing(2);
    CHECK(m.removed(2));
    w[2].running = false;
    CHECK(m.plan({{"127.0.0.1", 3}}, w).add == std::vector<std::string>{"127.0.0.1"});
    host_membership lost(options, local, 3);
    auto l = running(3);
    l[1].running = false;  // lost on its own
    CHECK(lost.plan({{"127.0.0.1", 3}}, l).add.empty());
    auto fewer = lost.plan({{"127.0.0.1", 2}}, l);  // its slot goes first: nothing to stop
    CHECK(fewer.remove.empty());
    CHECK(lost.plan({{"127.0.0.1", 3}}, l).add == std::vector<std::string>{"127.0.0.1"});
  }
}
