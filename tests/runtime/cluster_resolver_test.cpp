#include "troupe/distribute/cluster_resolver.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "troupe/runtime.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::distribute;
using troupe::testing::contains;
using troupe::testing::message_of;
using troupe::testing::scoped_env;

namespace {

// num_accelerators() counts this machine's GPUs: none under TROUPE_FORCE_CPU=1, else what its
// /dev/nvidia<N> nodes say (known without CUDA).
void check_num_accelerators(const ClusterResolver& r) {
  {
    scoped_env force("TROUPE_FORCE_CPU", "1");
    CHECK(r.num_accelerators() == std::map<std::string, int>{{"GPU", 0}});
  }
  scoped_env unforced("TROUPE_FORCE_CPU", std::nullopt);
  const auto expected = troupe::testing::expected_gpu_count();
  if (expected) {
    CHECK(r.num_accelerators() == std::map<std::string, int>{{"GPU", *expected}});
  } else {
    MESSAGE("num_accelerators() not compared: CUDA_VISIBLE_DEVICES narrows the /dev/nvidia* GPUs");
  }
}

// Kubeflow's training operator: <job>-<replica type>-<index>.<namespace>.svc:2222.
const std::string kubeflow_tf_config =
    R"({"cluster": {"chief": ["mnist-chief-0.kubeflow.svc:2222"],
                    "worker": ["mnist-worker-0.kubeflow.svc:2222", "mnist-worker-1.kubeflow.svc:2222"]},
        "task": {"type": "worker", "index": 1}, "environment": "cloud"})";

std::string tf_config_error(const std::string& json) {
  return message_of([&] { TFConfigClusterResolver r(json); });
}

std::string two_worker_config(const std::string& task) {
  return R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": )" + task + "}";
}

std::string cluster_error(const std::string& cluster) {
  return tf_config_error(R"({"cluster": )" + cluster + R"(, "task": {"type": "worker", "index": 0}})");
}

std::string slurm_error(const EnvironmentMap& env, int port_base = 8888) {
  return message_of([&] { SlurmClusterResolver r(env, port_base); });
}

std::string hostlist_error(const std::string& list) {
  return message_of([&] { SlurmClusterResolver::expand_hostlist(list); });
}

std::string tasks_per_node_error(const std::string& counts) {
  return message_of([&] { SlurmClusterResolver::expand_tasks_per_node(counts); });
}

using Strings = std::vector<std::string>;

}  // namespace

// --- ClusterSpec ---

TEST_CASE("cluster spec lists jobs, tasks and addresses in order and as TF_CONFIG json") {
  ClusterSpec spec({{"worker", {"w0:2222", "w1:2222", "w2:2222"}}, {"chief", {"c0:2222"}}});
  CHECK(spec.jobs() == Strings{"chief", "worker"});
  CHECK(spec.has_job("worker"));
  CHECK_FALSE(spec.has_job("ps"));
  CHECK(spec.num_tasks("worker") == 3);
  CHECK(spec.num_tasks("chief") == 1);
  CHECK(spec.task_addresses("worker") == Strings{"w0:2222", "w1:2222", "w2:2222"});
  CHECK(spec.task_address("worker", 2) == "w2:2222");
  CHECK(spec.as_json() == R"({"chief":["c0:2222"],"worker":["w0:2222","w1:2222","w2:2222"]})");
  CHECK(spec.num_training_tasks() == 4);
  CHECK(spec.id_in_cluster("chief", 0) == 0);
  CHECK(spec.id_in_cluster("worker", 0) == 1);
  CHECK(spec.id_in_cluster("worker", 2) == 3);
  CHECK(spec.is_complete());
  CHECK_FALSE(spec.empty());
  CHECK(ClusterSpec().empty());
  CHECK(ClusterSpec().as_json() == "{}");
  CHECK(spec == ClusterSpec({{"chief", {"c0:2222"}}, {"worker", {"w0:2222", "w1:2222", "w2:2222"}}}));
  CHECK(spec != ClusterSpec(ClusterSpec::JobMap{{"worker", {"w0:2222"}}}));
}

TEST_CASE("cluster spec without a chief ranks worker i as i and accepts bracketed IPv6 hosts") {
  ClusterSpec spec({{"worker", {"[::1]:5000", "[fe80::2]:5000"}}});
  CHECK(spec.id_in_cluster("worker", 1) == 1);
  CHECK(spec.num_training_tasks() == 2);
}

TEST_CASE("cluster spec rejects unknown jobs, indices outside a job and bad addresses with clear errors") {
  ClusterSpec spec({{"worker", {"w0:2222", "w1:2222"}}});
  CHECK_THROWS_AS(spec.num_tasks("ps"), std::invalid_argument);
  CHECK(contains(message_of([&] { spec.task_addresses("ps"); }), "no job 'ps' (jobs: worker)"));
  CHECK_THROWS_AS(spec.task_address("worker", 2), std::out_of_range);
  CHECK(contains(message_of([&] { spec.task_address("worker", 2); }),
                 "task index 2 is outside job 'worker' with 2 tasks (0..1)"));
  CHECK(contains(message_of([&] { spec.task_address("worker", -1); }), "task index -1"));
  CHECK(contains(message_of([&] { spec.id_in_cluster("evaluator", 0); }), "job 'evaluator' does not train"));

  CHECK(contains(message_of([] {
                   ClusterSpec({{"worker", {"a:1", "a:1"}}});
                 }),
                 "address 'a:1' is listed for both worker 0 and worker 1"));
  CHECK(contains(message_of([] { ClusterSpec(ClusterSpec::JobMap{{"worker", {}}}); }), "job 'worker' has no tasks"));
  CHECK(contains(message_of([] { ClusterSpec(ClusterSpec::JobMap{{"", {"a:1"}}}); }), "empty name"));
  CHECK(contains(message_of([] {
                   ClusterSpec(ClusterSpec::JobMap{{"worker", {"hostonly"}}});
                 }),
                 "address 'hostonly' of worker 0 has no port"));
  CHECK(contains(message_of([] {
                   ClusterSpec(ClusterSpec::JobMap{{"worker", {"::1:80"}}});
                 }),
                 "without brackets (write \"[::1]:80\")"));
  CHECK(contains(message_of([] {
                   ClusterSpec(ClusterSpec::JobMap{{"worker", {"[::1:80"}}});
                 }),
                 "unclosed IPv6 bracket"));
  CHECK(contains(message_of([] {
                   ClusterSpec(ClusterSpec::JobMap{{"worker", {":80"}}});
                 }),
                 "address ':80' of worker 0 has no host"));
  CHECK(contains(message_of([] { ClusterSpec(ClusterSpec::JobMap{{"worker", {"a b:80"}}}); }), "invalid character"));
}

TEST_CASE("cluster spec keeps pending addresses until set_task_address fills them in") {
  const std::string pending(ClusterSpec::pending_address);
  ClusterSpec spec({{"worker", {"coord:7000", pending, pending}}});
  CHECK_FALSE(spec.is_complete());
  spec.set_task_address("worker", 1, "host1:7001");
  CHECK_FALSE(spec.is_complete());
  CHECK(contains(message_of([&] { spec.set_task_address("worker", 2, "host1:7001"); }),
                 "address 'host1:7001' is listed for both worker 1 and worker 2"));
  CHECK(spec.task_address("worker", 2) == pending);  // a rejected update changes nothing
  CHECK(contains(message_of([&] { spec.set_task_address("worker", 2, "host2:x"); }), "port 'x'"));
  CHECK_THROWS_AS(spec.set_task_address("worker", 3, "host3:7003"), std::out_of_range);
  spec.set_task_address("worker", 2, "host2:7002");
  CHECK(spec.is_complete());
  CHECK(spec.task_addresses("worker") == Strings{"coord:7000", "host1:7001", "host2:7002"});
}

// --- TFConfigClusterResolver ---

TEST_CASE("TF_CONFIG as Kubeflow sets it resolves a worker in a chief plus two workers cluster") {
  TFConfigClusterResolver r(kubeflow_tf_config);
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 1);
  CHECK(r.environment() == "cloud");
  CHECK_FALSE(r.rpc_layer().has_value());
  const ClusterSpec spec = r.cluster_spec();
  CHECK(spec.jobs() == Strings{"chief", "worker"});
  CHECK(spec.task_addresses("worker") ==
        Strings{"mnist-worker-0.kubeflow.svc:2222", "mnist-worker-1.kubeflow.svc:2222"});
  CHECK(r.coordinator_address() == "mnist-chief-0.kubeflow.svc:2222");
  CHECK(r.master() == "mnist-chief-0.kubeflow.svc:2222");
  CHECK(r.task_address() == "mnist-worker-1.kubeflow.svc:2222");
  CHECK(spec.id_in_cluster(r.task_type(), r.task_id()) == 2);
  check_num_accelerators(r);
}

TEST_CASE("TF_CONFIG for the chief with an rpc_layer gives a grpc master url") {
  TFConfigClusterResolver r(
      R"({"cluster": {"chief": ["c:2222"], "worker": ["w0:2222"]}, "task": {"type": "chief", "index": 0},
          "rpc_layer": "grpc"})");
  CHECK(r.task_type() == "chief");
  CHECK(r.task_id() == 0);
  CHECK(r.rpc_layer() == std::optional<std::string>("grpc"));
  CHECK(r.coordinator_address() == "c:2222");
  CHECK(r.master() == "grpc://c:2222");
  CHECK(r.environment().empty());
}

TEST_CASE("TF_CONFIG with workers only makes worker 0 the coordinator") {
  TFConfigClusterResolver r(two_worker_config(R"({"type": "worker", "index": 1})"));
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 1);
  CHECK(r.cluster_spec().num_tasks("worker") == 2);
  CHECK(r.coordinator_address() == "localhost:12345");
  CHECK(r.task_address() == "localhost:23456");
  CHECK(r.cluster_spec().as_json() == R"({"worker":["localhost:12345","localhost:23456"]})");
}

TEST_CASE("TF_CONFIG for an evaluator resolves whether or not the evaluator is listed") {
  TFConfigClusterResolver listed(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
          "task": {"type": "evaluator", "index": 0}})");
  CHECK(listed.task_type() == "evaluator");
  CHECK(listed.task_id() == 0);
  CHECK(listed.task_address() == "e:1");
  CHECK(listed.coordinator_address() == "c:1");
  CHECK(listed.cluster_spec().num_training_tasks() == 2);

  TFConfigClusterResolver unlisted(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}})");
  CHECK(unlisted.task_type() == "evaluator");
  CHECK(unlisted.task_address().empty());
  CHECK(unlisted.coordinator_address() == "c:1");
  CHECK(contains(tf_config_error(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator", "index": 1}})"),
                 "task index 1 of the evaluator is not 0"));
}

TEST_CASE("TF_CONFIG is read from the environment and its absence is a clear error") {
  {
    scoped_env env("TF_CONFIG", two_worker_config(R"({"type": "worker", "index": 0})"));
    TFConfigClusterResolver r;
    CHECK(r.task_id() == 0);
    CHECK(r.cluster_spec().task_address("worker", 1) == "localhost:23456");
  }
  {
    scoped_env env("TF_CONFIG", std::nullopt);
    const std::string m = message_of([] { TFConfigClusterResolver r; });
    CHECK(contains(m, "TF_CONFIG is not set"));
    CHECK(contains(m, R"("task": {"type": "worker", "index": 0})"));
  }
  {
    scoped_env env("TF_CONFIG", std::string());
    CHECK(contains(message_of([] { TFConfigClusterResolver r; }), "TF_CONFIG is empty"));
  }
}

TEST_CASE("TF_CONFIG that is not JSON is rejected quoting the parser's position") {
  const std::string m = tf_config_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": worker}})");
  CHECK(contains(m, "TF_CONFIG: not valid JSON"));
  CHECK(contains(m, "line 1, column"));
  CHECK_FALSE(contains(m, "[json.exception"));
  CHECK(contains(tf_config_error("{'cluster': {}}"), "not valid JSON"));
  CHECK(contains(tf_config_error(""), "not valid JSON"));
  CHECK(contains(tf_config_error("[1, 2]"), "expected a JSON object"));
  CHECK_THROWS_AS(TFConfigClusterResolver("{"), std::invalid_argument);
}

TEST_CASE("TF_CONFIG with a number beyond a double is rejected as invalid JSON, not a stray json exception") {
  // Found by fuzz/tf_config_fuzz: nlohmann's parser throws out_of_range, not parse_error, here.
  const std::string m = tf_config_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1e999}})");
  CHECK(m == std::string("TF_CONFIG: not valid JSON (number overflow parsing '1e999'); expected e.g. ") +
                 R"({"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}})");
  CHECK_THROWS_AS(TFConfigClusterResolver("3e388888888888888888888"), std::invalid_argument);
  // The parser quotes the offending token; a huge one is cut short.
  const std::string huge = tf_config_error("1" + std::string(100'000, '0') + "e999999");
  CHECK(contains(huge, "TF_CONFIG: not valid JSON (number overflow parsing '100000"));
  CHECK(huge.size() < 400);
}

TEST_CASE("TF_CONFIG without a well-formed cluster is rejected naming the value") {
  CHECK(contains(tf_config_error(R"({"task": {"type": "worker", "index": 0}})"), R"(has no "cluster")"));
  CHECK(contains(cluster_error(R"(["a:1"])"), R"("cluster" must be an object mapping job names)"));
  CHECK(contains(cluster_error(R"({"worker": "localhost:12345"})"),
                 R"(job 'worker' in "cluster" must be a list of "host:port" strings, got "localhost:12345")"));
  CHECK(contains(cluster_error(R"({"worker": ["a:1", 12345]})"), "but task 1 is 12345"));
  CHECK(contains(cluster_error("{}"), "the cluster is empty"));
  CHECK(contains(cluster_error(R"({"worker": []})"), "job 'worker' has no tasks"));
  CHECK(contains(cluster_error(R"({"chief": ["a:1", "b:1"], "worker": ["w:1"]})"),
                 "job 'chief' has 2 tasks (there is at most one chief)"));
  CHECK(contains(tf_config_error(R"({"cluster": {"evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}})"),
                 R"(no "chief" or "worker" job)"));
}

TEST_CASE("TF_CONFIG without a well-formed task is rejected naming the value") {
  CHECK(contains(tf_config_error(R"({"cluster": {"worker": ["a:1"]}})"), R"(has no "task")"));
  CHECK(contains(tf_config_error(two_worker_config("[0]")), R"("task" must be an object)"));
  CHECK(contains(tf_config_error(two_worker_config(R"({"index": 0})")), R"("task" has no "type")"));
  CHECK(
      contains(tf_config_error(two_worker_config(R"({"type": 1, "index": 0})")), R"("type" must be a string, got 1)"));
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "worker"})")), R"("task" has no "index")"));
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "worker", "index": "0"})")),
                 R"("index" must be an integer, got "0")"));
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "worker", "index": 1.5})")),
                 R"("index" must be an integer, got 1.5)"));
  CHECK(
      contains(tf_config_error(two_worker_config(R"({"type": "worker", "index": 0})").insert(1, R"("rpc_layer": 7, )")),
               R"("rpc_layer" must be a string)"));
}

TEST_CASE("TF_CONFIG task index outside its job is rejected with the job's range") {
  CHECK(tf_config_error(two_worker_config(R"({"type": "worker", "index": 3})")) ==
        "TF_CONFIG: task index 3 is outside job 'worker' with 2 tasks (0..1)");
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "worker", "index": -1})")),
                 "task index -1 is outside job 'worker' with 2 tasks (0..1)"));
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "worker", "index": 99999999999})")),
                 "task index 99999999999 is outside job 'worker'"));
  CHECK(contains(tf_config_error(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                                     "task": {"type": "chief", "index": 1}})"),
                 "task index 1 is outside job 'chief' with 1 task (0..0)"));
}

TEST_CASE("TF_CONFIG with an unknown task type is rejected") {
  CHECK(contains(tf_config_error(two_worker_config(R"({"type": "trainer", "index": 0})")),
                 "task type 'trainer' is unknown (expected chief, worker, ps or evaluator)"));
  CHECK(contains(cluster_error(R"({"worker": ["w:1"], "master": ["m:1"]})"), "use \"chief\""));
  CHECK(contains(cluster_error(R"({"worker": ["w:1"], "trainers": ["t:1"]})"), "job 'trainers' is unknown"));
  CHECK(contains(tf_config_error(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "chief", "index": 0}})"),
                 "task type 'chief' has no job in the cluster (jobs: worker)"));
}

TEST_CASE("TF_CONFIG with duplicate addresses, missing ports or bad ports is rejected naming the task") {
  CHECK(contains(cluster_error(R"({"chief": ["h:2222"], "worker": ["w:2222", "h:2222"]})"),
                 "address 'h:2222' is listed for both chief 0 and worker 1"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:12345", "localhost"]})"),
                 "TF_CONFIG: address 'localhost' of worker 1 has no port"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:http"]})"),
                 "port 'http' in address 'localhost:http' of worker 0 is not a number"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:"]})"), "port '' in address 'localhost:'"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:70000"]})"),
                 "port 70000 in address 'localhost:70000' of worker 0 is outside 1..65535"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:0"]})"), "port 0 in address 'localhost:0'"));
  CHECK(contains(cluster_error(R"({"worker": ["localhost:-5"]})"), "port '-5'"));
  CHECK(contains(cluster_error(R"({"worker": ["pending", "w:1"]})"), "address 'pending' of worker 0 has no port"));
}

TEST_CASE("a host with a NUL character is refused, in TF_CONFIG and in a cluster spec") {
  CHECK(cluster_error(R"({"worker": ["local\u0000host:2222"]})") ==
        "TF_CONFIG: address 'local\\0host:2222' of worker 0 has a NUL character at byte 5");
  CHECK(message_of([] {
          ClusterSpec(ClusterSpec::JobMap{{"worker", {std::string("w0\0evil:2222", 12)}}});
        }) == "ClusterSpec: address 'w0\\0evil:2222' of worker 0 has a NUL character at byte 2");
  ClusterSpec spec(ClusterSpec::JobMap{{"worker", {"w0:1", std::string(ClusterSpec::pending_address)}}});
  CHECK(message_of([&] { spec.set_task_address("worker", 1, std::string("w1\0:2", 5)); }) ==
        "ClusterSpec::set_task_address: address 'w1\\0:2' of worker 1 has a NUL character at byte 2");
  CHECK(contains(cluster_error(R"({"worker": ["local\u0001host:2222"]})"),
                 "has an invalid character in its host 'local\\x01host'"));
}

TEST_CASE("a huge host name is refused and echoed once, cut short") {
  const std::string host(120'000, 'h');
  const std::string msg = cluster_error(R"({"worker": [")" + host + R"(:2222"]})");
  CHECK(msg == "TF_CONFIG: address '" + std::string(64, 'h') +
                   "...' (120005 bytes) of worker 0 has a host of 120000 bytes (at most 255)");
  CHECK(msg.size() < 200);
  // A host of 255 bytes is still a host.
  CHECK_NOTHROW(ClusterSpec(ClusterSpec::JobMap{{"worker", {std::string(255, 'h') + ":2222"}}}));
  // Every echo of user text is bounded: a long job name, task type, or port.
  CHECK(cluster_error(R"({")" + std::string(100'000, 'j') + R"(": ["h:1"]})") ==
        "TF_CONFIG: job '" + std::string(64, 'j') + "...' (100000 bytes) is unknown (expected chief, worker, ps or "
        "evaluator)");
  CHECK(cluster_error(R"({"worker": ["h:)" + std::string(50'000, '7') + R"("]})") ==
        "TF_CONFIG: port '" + std::string(64, '7') + "...' (50000 bytes) in address 'h:" + std::string(62, '7') +
            "...' (50002 bytes) of worker 0 is outside 1..65535");
}

// --- SimpleClusterResolver ---

TEST_CASE("simple resolver returns the spec, task and accelerators it was given") {
  ClusterSpec spec({{"chief", {"c:1"}}, {"worker", {"w0:1", "w1:1"}}});
  SimpleClusterResolver r(spec, "worker", 1, {{"GPU", 2}}, "grpc");
  CHECK(r.cluster_spec() == spec);
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 1);
  CHECK(r.num_accelerators() == std::map<std::string, int>{{"GPU", 2}});
  CHECK(r.master() == "grpc://c:1");
  CHECK(r.task_address() == "w1:1");

  SimpleClusterResolver cpu(ClusterSpec(ClusterSpec::JobMap{{"worker", {"w0:1"}}}), "worker", 0);
  CHECK(cpu.num_accelerators().empty());
  CHECK_FALSE(cpu.rpc_layer().has_value());
  CHECK(cpu.coordinator_address() == "w0:1");
}

TEST_CASE("simple resolver rejects an empty cluster, unknown task types and indices outside the job") {
  CHECK(contains(message_of([] { SimpleClusterResolver r(ClusterSpec(), "worker", 0); }),
                 "SimpleClusterResolver: the cluster is empty"));
  ClusterSpec spec({{"worker", {"w0:1", "w1:1"}}});
  CHECK(message_of([&] { SimpleClusterResolver r(spec, "worker", 2); }) ==
        "SimpleClusterResolver: task index 2 is outside job 'worker' with 2 tasks (0..1)");
  CHECK(contains(message_of([&] { SimpleClusterResolver r(spec, "boss", 0); }), "task type 'boss' is unknown"));
  CHECK(contains(message_of([&] {
                   SimpleClusterResolver r(spec, "worker", 0, {{"GPU", -1}});
                 }),
                 "num_accelerators['GPU'] = -1 is negative"));
  CHECK(contains(message_of([] {
                   SimpleClusterResolver r(ClusterSpec(ClusterSpec::JobMap{{"ps", {"p:1"}}}), "ps", 0);
                 }),
                 "no \"chief\" or \"worker\" job"));
}

TEST_CASE("TF_CONFIG with chief, workers, parameter servers and an evaluator names every role") {
  TFConfigClusterResolver r(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"],
                                            "evaluator": ["e:1"]},
                               "task": {"type": "ps", "index": 1}})");
  CHECK(r.task_type() == "ps");
  CHECK(r.task_id() == 1);
  CHECK(r.task_address() == "p:2");
  CHECK(r.cluster_spec().num_tasks("ps") == 2);
  CHECK(r.cluster_spec().num_training_tasks() == 3);  // the chief and the workers; ps tasks hold variables
  CHECK(r.coordinator_address() == "c:1");
  CHECK_THROWS_AS(r.cluster_spec().id_in_cluster("ps", 0), std::invalid_argument);
  SimpleClusterResolver s(r.cluster_spec(), "ps", 0);
  CHECK(s.task_address() == "p:1");
}

// --- Slurm ---

TEST_CASE("slurm host lists expand ranges, keep zero padding and join several groups") {
  CHECK(SlurmClusterResolver::expand_hostlist("node[01-03,07],gpu-a[1-2]") ==
        Strings{"node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"});
  CHECK(SlurmClusterResolver::expand_hostlist("node1") == Strings{"node1"});
  CHECK(SlurmClusterResolver::expand_hostlist("a,b.example.com,c") == Strings{"a", "b.example.com", "c"});
  CHECK(SlurmClusterResolver::expand_hostlist("n[8-11]") == Strings{"n8", "n9", "n10", "n11"});
  CHECK(SlurmClusterResolver::expand_hostlist("n[098-101]") == Strings{"n098", "n099", "n100", "n101"});
  CHECK(SlurmClusterResolver::expand_hostlist("n[007]") == Strings{"n007"});
  CHECK(SlurmClusterResolver::expand_hostlist("rack[1-2]-n[01-02]") ==
        Strings{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"});
  CHECK(SlurmClusterResolver::expand_hostlist("n[1-2].ib,login") == Strings{"n1.ib", "n2.ib", "login"});
  CHECK(SlurmClusterResolver::expand_hostlist("cn[0001-1000]").size() == 1000);
  CHECK(SlurmClusterResolver::expand_hostlist("cn[0001-1000]").back() == "cn1000");
}

TEST_CASE("malformed slurm host lists are rejected quoting the list") {
  CHECK(contains(hostlist_error("node[01-03"), "Slurm host list 'node[01-03': host 'node[01-03' has an unclosed '['"));
  CHECK(contains(hostlist_error("node01-03]"), "']' without '['"));
  CHECK(contains(hostlist_error("node[3-1]"), "range '3-1' in 'node[3-1]' runs backwards"));
  CHECK(contains(hostlist_error("node[a-c]"), "'a-c' in 'node[a-c]' is not a number or a range of numbers"));
  CHECK(contains(hostlist_error("node[1-]"), "'1-' in 'node[1-]' is not a number"));
  CHECK(contains(hostlist_error("node[1,,3]"), "'' in 'node[1,,3]' is not a number"));
  CHECK(contains(hostlist_error("node[]"), "empty '[]'"));
  CHECK(contains(hostlist_error("node[[1]]"), "nested '['"));
  CHECK(contains(hostlist_error("a,,b"), "empty host name at position 2"));
  CHECK(contains(hostlist_error("a,"), "empty host name"));
  CHECK(contains(hostlist_error("a b"), "whitespace"));
  CHECK(contains(hostlist_error(""), "is empty"));
  CHECK(contains(hostlist_error("n[0-99999999]"), "more than"));
}

TEST_CASE("slurm tasks per node expand repetitions") {
  CHECK(SlurmClusterResolver::expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(SlurmClusterResolver::expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(SlurmClusterResolver::expand_tasks_per_node("1,3(x2),2") == std::vector<int>{1, 3, 3, 2});
  CHECK(contains(tasks_per_node_error("2(x)"), "'2(x)' is not N or N(xM)"));
  CHECK(contains(tasks_per_node_error("2(xy)"), "repeat count in '2(xy)' is not a number"));
  CHECK(contains(tasks_per_node_error("2(3)"), "'2(3)' is not N or N(xM)"));
  CHECK(contains(tasks_per_node_error("two"), "'two' is not N or N(xM)"));
  CHECK(contains(tasks_per_node_error("2,,1"), "'' is not N or N(xM)"));
  CHECK(contains(tasks_per_node_error("2(x0)"), "repeat count in '2(x0)'"));
  CHECK(contains(tasks_per_node_error(""), "Slurm tasks per node '': is empty"));
}

TEST_CASE("slurm resolver places tasks on nodes in block order with one port per local task") {
  const EnvironmentMap env{{"SLURM_PROCID", "3"},
                           {"SLURM_NTASKS", "7"},
                           {"SLURM_STEP_NODELIST", "node[01-03],gpu-a1"},
                           {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}};
  SlurmClusterResolver r(env);
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 3);
  CHECK(r.cluster_spec().jobs() == Strings{"worker"});
  CHECK(r.cluster_spec().task_addresses("worker") == Strings{"node01:8888", "node01:8889", "node02:8888", "node02:8889",
                                                             "node03:8888", "node03:8889", "gpu-a1:8888"});
  CHECK(r.task_address() == "node02:8889");
  CHECK(r.coordinator_address() == "node01:8888");
  check_num_accelerators(r);

  SlurmClusterResolver other_port(env, 20000);
  CHECK(other_port.cluster_spec().task_address("worker", 6) == "gpu-a1:20000");
}

TEST_CASE("slurm resolver falls back to the job's node list, SLURM_NPROCS and an even split") {
  SlurmClusterResolver r(EnvironmentMap{{"SLURM_PROCID", "0"},
                                        {"SLURM_NPROCS", "4"},
                                        {"SLURM_JOB_NODELIST", "c[1-2]"},
                                        {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  CHECK(r.cluster_spec().task_addresses("worker") == Strings{"c1:8888", "c1:8889", "c2:8888", "c2:8889"});

  SlurmClusterResolver even(EnvironmentMap{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_NODELIST", "x,y,z"}});
  CHECK(even.task_id() == 5);
  CHECK(even.cluster_spec().task_addresses("worker") ==
        Strings{"x:8888", "x:8889", "y:8888", "y:8889", "z:8888", "z:8889"});
}

TEST_CASE("slurm resolver rejects missing variables and counts that disagree") {
  const EnvironmentMap good{{"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "4"},
                            {"SLURM_STEP_NODELIST", "n[1-2]"},
                            {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  auto with = [&](const std::string& name, std::optional<std::string> value) {
    EnvironmentMap env = good;
    if (value) {
      env[name] = *value;
    } else {
      env.erase(name);
    }
    return env;
  };
  CHECK(contains(slurm_error(with("SLURM_PROCID", std::nullopt)), "SLURM_PROCID is not set"));
  CHECK(contains(slurm_error(with("SLURM_NTASKS", std::nullopt)), "neither SLURM_NTASKS nor SLURM_NPROCS"));
  CHECK(contains(slurm_error(with("SLURM_STEP_NODELIST", std::nullopt)), "none of SLURM_STEP_NODELIST"));
  CHECK(contains(slurm_error(with("SLURM_NTASKS", "5")),
                 "SLURM_NTASKS=5 disagrees with SLURM_STEP_TASKS_PER_NODE='2(x2)', which places 4 tasks"));
  CHECK(
      contains(slurm_error(with("SLURM_STEP_NODELIST", "n[1-3]")),
               "SLURM_STEP_TASKS_PER_NODE='2(x2)' gives counts for 2 nodes but SLURM_STEP_NODELIST='n[1-3]' names 3"));
  CHECK(contains(slurm_error(with("SLURM_PROCID", "4")), "SLURM_PROCID=4 is outside SLURM_NTASKS=4 tasks (0..3)"));
  CHECK(contains(slurm_error(with("SLURM_PROCID", "first")), "SLURM_PROCID='first' is not a number"));
  CHECK(contains(slurm_error(with("SLURM_NTASKS", "0")), "SLURM_NTASKS='0' is not a number in 1.."));
  CHECK(contains(slurm_error(with("SLURM_STEP_NODELIST", "n[1-2")),
                 "SlurmClusterResolver: SLURM_STEP_NODELIST: Slurm host list 'n[1-2'"));
  CHECK(contains(slurm_error(with("SLURM_STEP_TASKS_PER_NODE", "2(x2")),
                 "SLURM_STEP_TASKS_PER_NODE: Slurm tasks per node"));
  CHECK(contains(slurm_error(with("SLURM_STEP_NODELIST", "n1,n1")),
                 "address 'n1:8888' is listed for both worker 0 and worker 2"));
  EnvironmentMap uneven{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_NODELIST", "a,b"}};
  CHECK(contains(slurm_error(uneven), "SLURM_NTASKS=3 tasks do not divide evenly among the 2 nodes"));
  CHECK(contains(slurm_error(good, 65535), "port_base 65535 + 2 tasks on node 'n1' runs past port 65535"));
  CHECK(contains(slurm_error(good, 0), "port_base 0 is outside 1..65535"));
}

TEST_CASE("slurm resolver reads the process environment") {
  scoped_env procid("SLURM_PROCID", "1");
  scoped_env ntasks("SLURM_NTASKS", "2");
  scoped_env nprocs("SLURM_NPROCS", std::nullopt);
  scoped_env step_nodes("SLURM_STEP_NODELIST", "gpu[07-08]");
  scoped_env step_tasks("SLURM_STEP_TASKS_PER_NODE", "1(x2)");
  SlurmClusterResolver r(9000);
  CHECK(r.task_id() == 1);
  CHECK(r.cluster_spec().task_addresses("worker") == Strings{"gpu07:9000", "gpu08:9000"});
  CHECK(r.task_address() == "gpu08:9000");
}

// --- mpirun ---

TEST_CASE("mpi resolver takes rank and size from Open MPI and lists only the coordinator") {
  MpiClusterResolver r(EnvironmentMap{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, "head:7000");
  CHECK(r.task_type() == "worker");
  CHECK(r.task_id() == 2);
  CHECK(r.world_size() == 4);
  const std::string pending(ClusterSpec::pending_address);
  const ClusterSpec spec = r.cluster_spec();
  CHECK(spec.task_addresses("worker") == Strings{"head:7000", pending, pending, pending});
  CHECK_FALSE(spec.is_complete());
  CHECK(r.coordinator_address() == "head:7000");
  CHECK(r.task_address() == pending);
}

TEST_CASE("mpi resolver takes rank and size from PMI and the coordinator from TROUPE_COORDINATOR") {
  MpiClusterResolver r(EnvironmentMap{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"TROUPE_COORDINATOR", "10.0.0.1:29500"}});
  CHECK(r.task_id() == 0);
  CHECK(r.world_size() == 2);
  CHECK(r.coordinator_address() == "10.0.0.1:29500");
  CHECK(r.task_address() == "10.0.0.1:29500");
  // An explicit address wins over the environment; Open MPI's variables over PMI's.
  MpiClusterResolver both(EnvironmentMap{{"OMPI_COMM_WORLD_RANK", "1"},
                                         {"OMPI_COMM_WORLD_SIZE", "3"},
                                         {"PMI_RANK", "0"},
                                         {"PMI_SIZE", "2"},
                                         {"TROUPE_COORDINATOR", "ignored:1"}},
                          "chosen:2");
  CHECK(both.task_id() == 1);
  CHECK(both.world_size() == 3);
  CHECK(both.coordinator_address() == "chosen:2");
}

TEST_CASE("mpi resolver rejects missing ranks, ranks outside the world and bad coordinators") {
  auto error = [](const EnvironmentMap& env, std::string coordinator = "h:1") {
    return message_of([&] { MpiClusterResolver r(env, coordinator); });
  };
  CHECK(contains(error({}), "neither OMPI_COMM_WORLD_RANK (Open MPI) nor PMI_RANK"));
  CHECK(contains(error({{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE is not"));
  CHECK(contains(error({{"PMI_RANK", "0"}}), "PMI_SIZE is not"));
  CHECK(contains(error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
                 "OMPI_COMM_WORLD_RANK=4 is outside OMPI_COMM_WORLD_SIZE=4 ranks (0..3)"));
  CHECK(contains(error({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}), "PMI_RANK='x' is not a number"));
  CHECK(contains(error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, ""), "no coordinator address"));
  CHECK(contains(error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"TROUPE_COORDINATOR", "head"}}, ""),
                 "MpiClusterResolver: TROUPE_COORDINATOR: address 'head' of worker 0 has no port"));
  CHECK(contains(error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, "head:99999"), "port 99999"));
  CHECK(contains(error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, "pending"), "is 'pending', not host:port"));
}

TEST_CASE("mpi resolver reads the process environment") {
  scoped_env rank("OMPI_COMM_WORLD_RANK", "1");
  scoped_env size("OMPI_COMM_WORLD_SIZE", "2");
  scoped_env coordinator("TROUPE_COORDINATOR", "node0:5555");
  MpiClusterResolver r;
  CHECK(r.task_id() == 1);
  CHECK(r.cluster_spec().task_address("worker", 0) == "node0:5555");
}

}  // namespace TROUPE_TEST_FILE
