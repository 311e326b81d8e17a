// troupe-launch's command line and the pieces it builds the cluster from: usage and its errors,
// the ports, TF_CONFIG and the line prefixer.
#include "launch_harness.hpp"

using namespace launch_test;

TEST_CASE("troupe-launch rejects bad usage with exit status 2 and says what is wrong") {
  struct bad_usage {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<bad_usage> cases = {
      {{}, "missing -n N (the number of workers)"},
      {{"-n", "2"}, "no program to run (expected: -- program args...)"},
      {{"-n", "2", "--"}, "no program to run (expected: -- program args...)"},
      {{"-n"}, "--num-workers: 1 required N missing"},
      {{"-n", "0", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '0'"},
      {{"-n", "-3", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '-3'"},
      {{"-n", "abc", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got 'abc'"},
      {{"-n", "2x", "--", "/bin/true"}, "-n: expected a positive number of workers (1..256), got '2x'"},
      {{"-n", "100000000000000000000", "--", "/bin/true"},
       "-n: expected a positive number of workers (1..256), got '100000000000000000000'"},
      {{"-n", "2", "--frobnicate", "--", "/bin/true"}, "unknown option '--frobnicate'"},
      {{"-n", "2", "--timeout", "0", "--", "/bin/true"}, "--timeout: expected a number of seconds > 0, got '0'"},
      {{"-n", "2", "--timeout", "soon", "--", "/bin/true"}, "--timeout: expected a number of seconds > 0, got 'soon'"},
      {{"-n", "2", "--devices-per-worker", "none", "--", "/bin/true"},
       "--devices-per-worker: expected a positive number of devices (1..1024), got 'none'"},
      {{"-n", "2", "--max-restarts", "-1", "--", "/bin/true"},
       "--max-restarts: expected a number of restarts (0..1000), got '-1'"},
      {{"-n", "2", "--restart-backoff", "later", "--", "/bin/true"},
       "--restart-backoff: expected a number of seconds >= 0, got 'later'"},
      {{"-n", "2", "--port-base", "65535", "--", "/bin/true"},
       "--port-base 65535: ports up to 65536 for 2 workers (expected at most 65535)"},
      {{"-n", "3", "--min", "2", "--", "/bin/true"}, "--min needs --elastic"},
      {{"-n", "3", "--elastic", "--min", "4", "--", "/bin/true"},
       "--min: expected a number of workers (1..3), got '4'"},
      {{"-n", "3", "--elastic", "--max", "2", "--", "/bin/true"},
       "--max: expected a number of workers (3..65536, at least -n), got '2'"},
      {{"-n", "2", "--host-discovery-script", "/bin/true", "--", "/bin/true"}, "--host-discovery-script needs --elastic"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/nonexistent/discover", "--", "/bin/true"},
       "--host-discovery-script: '/nonexistent/discover' is not an executable file"},
      {{"--hosts", "127.0.0.1:1,node7:2", "--elastic", "--host-discovery-script", "/bin/true", "--", "/bin/true"},
       "--host-discovery-script starts workers on this machine only (127.0.0.1, localhost): host 'node7' would need "
       "--rsh, which host discovery does not support"},
      {{"-n", "2", "--chief", "--elastic", "--host-discovery-script", "/bin/true", "--", "/bin/true"},
       "--host-discovery-script adds and removes MultiWorkerMirroredStrategy workers; not with --ps or --chief"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--discovery-interval", "0", "--", "/bin/true"},
       "--discovery-interval: expected a number of seconds > 0, got '0'"},
      {{"-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--discovery-timeout", "never", "--", "/bin/true"},
       "--discovery-timeout: expected a number of seconds > 0, got 'never'"},
      {{"-n", "2", "--discovery-interval", "2", "--", "/bin/true"}, "--discovery-interval needs --host-discovery-script"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    scratch dir;
    auto r = run(c.args, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind("troupe-launch: " + c.message + "\n", 0) == 0);
    CHECK(r.err.find("Run with --help for more information.") != std::string::npos);
    CHECK(r.out == "");
  }
}

TEST_CASE("troupe-launch prints its usage for --help and exits 0") {
  scratch dir;
  auto r = run({"--help"}, dir, {}, 5s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("troupe-launch -n N [options] [--] program [args...]\n", 0) == 0);
  CHECK(r.out.find("Usage: troupe-launch [OPTIONS]") != std::string::npos);
  CHECK(r.out.find("--grace SECONDS=5") != std::string::npos);  // the defaults shown
  CHECK(r.err == "");
}

TEST_CASE("troupe-launch exits 127 when the program cannot be executed") {
  scratch dir;
  std::string not_executable = dir.path() + "/not-executable";
  std::ofstream(not_executable) << "#!/bin/sh\nexit 0\n";
  ::chmod(not_executable.c_str(), 0644);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/nonexistent/troupe-no-such-program",
       "cannot execute '/nonexistent/troupe-no-such-program': No such file or directory"},
      {"troupe-no-such-program-4f2a", "cannot execute 'troupe-no-such-program-4f2a': command not found in PATH"},
      {not_executable, "cannot execute '" + not_executable + "': Permission denied"},
  };
  for (const auto& [program, message] : cases) {
    CAPTURE(program);
    auto r = run({"-n", "2", "--", program, "arg"}, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 127);
    CHECK(r.err == "troupe-launch: " + message + "\n");
    CHECK(r.out == "");
  }
}

TEST_CASE("troupe-launch --port-base uses consecutive ports and refuses a busy one") {
  scratch dir;
  {
    bound_socket busy(0, true);
    REQUIRE(busy.ok());
    auto r = run({"-n", "2", "--port-base", std::to_string(busy.port()), "--", "/bin/true"}, dir, {}, 5s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("troupe-launch: port " + std::to_string(busy.port()) + " on 127.0.0.1 is in use") !=
          std::string::npos);
  }
  // Three consecutive free ports, as far as one can tell before the launcher looks again.
  int base = 0;
  for (int attempt = 0; attempt < 50 && base == 0; ++attempt) {
    int candidate = bound_socket(0, false).port();
    if (candidate == 0 || candidate > 65533) continue;
    bound_socket second(candidate + 1, false), third(candidate + 2, false);
    if (second.ok() && third.ok()) base = candidate;
  }
  REQUIRE(base != 0);
  auto r = run(workers(3, R"(echo "TF_CONFIG=$TF_CONFIG")", dir, {"--port-base", std::to_string(base)}), dir);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(cluster_ports(r.out, 3) == std::vector<int>{base, base + 1, base + 2});
}

TEST_CASE("troupe-launch line_prefixer holds a partial line until its newline or finish") {
  line_prefixer lines("[rank 2] ");
  CHECK(lines.feed("a\nb", 3) == "[rank 2] a\n");
  CHECK(lines.held_bytes() == 1);
  CHECK(lines.feed("c", 1) == "");
  CHECK(lines.feed("\n\nd\n", 4) == "[rank 2] bc\n[rank 2] \n[rank 2] d\n");
  CHECK(lines.finish() == "");
  CHECK(lines.feed("tail", 4) == "");
  CHECK(lines.finish() == "[rank 2] tail\n");
  CHECK(lines.held_bytes() == 0);
}

TEST_CASE("troupe-launch line_prefixer cuts a line longer than its bound into lines") {
  line_prefixer lines("> ", 4);
  CHECK(lines.feed("ab", 2) == "");
  CHECK(lines.feed("cdefghij\n", 9) == "> abcd\n> efgh\n> ij\n");
  CHECK(lines.feed("wxyz\n", 5) == "> wxyz\n");
  CHECK(lines.feed("1234", 4) == "> 1234\n");
  CHECK(lines.feed("\n", 1) == "> \n");
  CHECK(lines.finish() == "");
}

TEST_CASE("troupe-launch builds TF_CONFIG with the cluster and the task index") {
  auto addresses = troupe::launch::worker_addresses({40000, 40001});
  CHECK(addresses == std::vector<std::string>{"127.0.0.1:40000", "127.0.0.1:40001"});
  auto config = nlohmann::json::parse(troupe::launch::tf_config_json(addresses, 1));
  CHECK(config == nlohmann::json::parse(
                      R"({"cluster": {"worker": ["127.0.0.1:40000", "127.0.0.1:40001"]}, "task": {"type": "worker", "index": 1}})"));
}

TEST_CASE("troupe-launch builds TF_CONFIG with roles: a chief, the workers and the ps tasks") {
  const std::vector<std::string> a{"h:1", "h:2", "h:3", "h:4"};
  const auto cluster = nlohmann::json::parse(R"({"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]})");
  const char* types[] = {"chief", "worker", "worker", "ps"};
  const int indices[] = {0, 0, 1, 0};
  for (int rank = 0; rank < 4; ++rank) {
    auto config = nlohmann::json::parse(troupe::launch::tf_config_json(a, rank, true, 1));
    CHECK(config["cluster"] == cluster);
    CHECK(config["task"]["type"] == types[rank]);
    CHECK(config["task"]["index"] == indices[rank]);
  }
  auto options = troupe::launch::parse_launch_options({"--ps", "1", "-n", "2", "--chief", "--", "prog"});
  CHECK(options.num_workers == 4);  // processes: the chief, 2 workers and the ps task
  CHECK(options.ps == 1);
  CHECK(options.chief);
  CHECK_THROWS_AS(troupe::launch::parse_launch_options({"--ps", "0", "-n", "2", "prog"}),
                  troupe::launch::usage_error);
  CHECK_THROWS_AS(troupe::launch::parse_launch_options({"--hosts", "a:2", "--ps", "1", "--chief", "prog"}),
                  troupe::launch::usage_error);
}

TEST_CASE("troupe-launch picks distinct free ports from the kernel") {
  auto ports = troupe::launch::pick_free_ports(8, std::nullopt);
  REQUIRE(ports.size() == 8);
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == 8);
  for (int port : ports) CHECK(bound_socket(port, true).ok());
}

TEST_CASE("troupe-launch parses options with or without -- and with attached values") {
  using troupe::launch::parse_launch_options;
  auto a = parse_launch_options({"-n4", "--devices-per-worker=2", "--timeout", "1.5", "prog", "-n", "x"});
  CHECK(a.num_workers == 4);
  CHECK(a.devices_per_worker == 2);
  CHECK(a.timeout_s == 1.5);
  CHECK(a.grace_s == troupe::launch::default_grace_s);
  CHECK(a.program == std::vector<std::string>{"prog", "-n", "x"});
  auto b = parse_launch_options({"--num-workers=3", "--grace", "0", "--port-base", "5000", "--", "--prog"});
  CHECK(b.num_workers == 3);
  CHECK(b.grace_s == 0);
  CHECK(b.port_base == 5000);
  CHECK(b.program == std::vector<std::string>{"--prog"});
  CHECK_THROWS_WITH_AS(parse_launch_options({"-n", "300", "--", "p"}),
                       "-n: expected a positive number of workers (1..256), got '300'",
                       troupe::launch::usage_error);
}

TEST_CASE("troupe-launch parses --hosts, a hostfile, --rsh and --ranks, and refuses what does not add up") {
  using troupe::launch::host_slots;
  using troupe::launch::parse_launch_options;
  auto a = parse_launch_options({"--hosts", "h1:2,h2", "--rsh", "ssh -o BatchMode=yes", "--ranks=0,2", "--", "p"});
  CHECK(a.num_workers == 3);
  CHECK(a.hosts == std::vector<host_slots>{{"h1", 2}, {"h2", 1}});
  CHECK(a.rsh == std::vector<std::string>{"ssh", "-o", "BatchMode=yes"});
  CHECK(a.ranks == std::vector<int>{0, 2});
  CHECK(troupe::launch::host_addresses(a.hosts, 23456) ==
        std::vector<std::string>{"h1:23456", "h1:23457", "h2:23456"});
  CHECK(parse_launch_options({"-n", "3", "--hosts", "h1:2,h2", "p"}).num_workers == 3);

  scratch dir;
  const std::string hostfile = dir.path() + "/hosts";
  std::ofstream(hostfile) << "# the cluster\nnode1 slots=4\n\nnode2:2  # two\nnode3\n";
  auto b = parse_launch_options({"--hostfile", hostfile, "p"});
  CHECK(b.hosts == std::vector<host_slots>{{"node1", 4}, {"node2", 2}, {"node3", 1}});
  CHECK(b.num_workers == 7);
  CHECK(b.rsh == std::vector<std::string>{"ssh"});

  auto message = [](std::vector<std::string> args) {
    try {
      parse_launch_options(args);
    } catch (const troupe::launch::usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message({"-n", "2", "--hosts", "h1:2,h2", "p"}) ==
        "-n 2 but the hosts have 3 slots (give one of them, or make them agree)");
  CHECK(message({"--hosts", "h1:0", "p"}) == "--hosts: expected a number of workers per host (1..256), got '0'");
  CHECK(message({"--hosts", "h1,,h2", "p"}) == "--hosts: an empty entry in 'h1,,h2'");
  CHECK(message({"--hosts", "h1", "--hostfile", hostfile, "p"}) == "give --hosts or --hostfile, not both");
  CHECK(message({"-n", "2", "--ranks", "2", "p"}) == "--ranks: expected a rank 0..1, got '2'");
  // Under host discovery the ranks up to --max may be shown.
  CHECK(parse_launch_options({"-n", "2", "--elastic", "--max", "4", "--host-discovery-script", "/bin/true", "--ranks",
                              "3", "p"})
            .ranks == std::vector<int>{3});
  CHECK(message({"-n", "2", "--elastic", "--max", "4", "--host-discovery-script", "/bin/true", "--ranks", "4", "p"}) ==
        "--ranks: expected a rank 0..3, got '4'");
  std::ofstream(dir.path() + "/bad") << "node1 cpus=4\n";
  CHECK(message({"--hostfile", dir.path() + "/bad", "p"}) ==
        "--hostfile: " + dir.path() + "/bad:1: expected \"host slots=N\", got 'node1 cpus=4'");
  CHECK(message({"--hostfile", dir.path() + "/none", "p"}) == "--hostfile: cannot read '" + dir.path() + "/none'");
}
