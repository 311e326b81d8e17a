#include "troupe/distribute/cluster_resolver.hpp"

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "troupe/base/parse_number.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {
namespace {

using json = nlohmann::json;

constexpr const char* tf_config_example =
    R"({"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}})";

// Host lists of more hosts than this are rejected rather than expanded: "n[0-999999999]" is a typo,
// not a cluster.
constexpr std::size_t max_hosts = 1 << 20;

[[noreturn]] void fail(std::string_view context, const std::string& what) {
  throw std::invalid_argument(std::string(context) + ": " + what);
}

// Quoted, control bytes escaped and cut short: what users and peers wrote is echoed, never flooded.
std::string in_quotes(std::string_view s) { return base::quoted(s); }

// A host name longer than this is refused (DNS names have at most 253 characters).
constexpr std::size_t max_host_bytes = 255;

// A JSON value for an error message, shortened so a huge TF_CONFIG does not flood the log.
std::string shown(const json& value) {
  std::string s = value.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// A non-negative decimal; nullopt when s is not one or exceeds max.
std::optional<long long> parse_count(std::string_view s, long long max) {
  const auto x = base::parse_uint(s);
  if (!x || *x > static_cast<unsigned long long>(max)) return std::nullopt;
  return static_cast<long long>(*x);
}

// Calls each(item) for every comma-separated item of `list`, empty ones included.
template <class Each>
void for_each_item(std::string_view list, Each&& each) {
  std::size_t start = 0;
  while (start <= list.size()) {
    auto comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    each(list.substr(start, comma - start));
    start = comma + 1;
  }
}

std::string task_name(const std::string& job, std::size_t index) { return job + " " + std::to_string(index); }

// Checks "host:port" (IPv6 hosts in brackets: "[::1]:8888").
void check_address(const std::string& address, const std::string& job, std::size_t index, std::string_view context) {
  const std::string where = " of " + task_name(job, index);
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    fail(context,
         "address " + in_quotes(address) + where + R"( has no port (expected "host:port", e.g. "localhost:12345"))");
  }
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (const auto nul = address.find('\0'); nul != std::string::npos) {
    // C resolvers would stop at the NUL and reach another host than the one written.
    fail(context, "address " + in_quotes(address) + where + " has a NUL character at byte " + std::to_string(nul));
  }
  if (host.size() > max_host_bytes) {
    fail(context, "address " + in_quotes(address) + where + " has a host of " + std::to_string(host.size()) +
                      " bytes (at most " + std::to_string(max_host_bytes) + ")");
  }
  if (host.empty()) fail(context, "address " + in_quotes(address) + where + " has no host (expected \"host:port\")");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') {
      fail(context,
           "address " + in_quotes(address) + where + " has an unclosed IPv6 bracket (expected \"[::1]:port\")");
    }
  } else if (host.find(':') != std::string::npos) {
    fail(context, "address " + in_quotes(address) + where + " looks like an IPv6 address without brackets (write \"[" +
                      host + "]:" + port.substr(0, 16) + "\")");
  }
  for (char c : host) {
    if (c == ' ' || c == '/' || c == ',' || static_cast<unsigned char>(c) < 0x20 || c == '\x7f') {
      fail(context,
           "address " + in_quotes(address) + where + " has an invalid character in its host " + in_quotes(host));
    }
  }
  if (!all_digits(port)) {
    fail(context, "port " + in_quotes(port) + " in address " + in_quotes(address) + where +
                      " is not a number (expected 1..65535)");
  }
  const auto value = parse_count(port, 1'000'000);
  if (!value || *value < 1 || *value > 65535) {
    fail(context, "port " + (port.size() <= 16 ? port : in_quotes(port)) + " in address " + in_quotes(address) +
                      where + " is outside 1..65535");
  }
}

void validate_jobs(const ClusterSpec::JobMap& jobs, std::string_view context, bool allow_pending) {
  std::map<std::string, std::string> owner;  // address -> task
  for (const auto& [job, addresses] : jobs) {
    if (job.empty()) fail(context, "a job has an empty name (expected e.g. \"worker\")");
    if (addresses.empty()) {
      fail(context, "job " + in_quotes(job) + " has no tasks (list at least one \"host:port\")");
    }
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const std::string& address = addresses[i];
      if (allow_pending && address == ClusterSpec::pending_address) continue;
      check_address(address, job, i, context);
      auto [it, inserted] = owner.emplace(address, task_name(job, i));
      if (!inserted) {
        fail(context, "address " + in_quotes(address) + " is listed for both " + it->second + " and " +
                          task_name(job, i) + " (every task needs its own host:port)");
      }
    }
  }
}

std::string index_range(int n) { return n == 0 ? "none" : "0.." + std::to_string(n - 1); }

// Checks that task_type/task_id name a task of `spec` (an evaluator need not be listed).
void check_task(const ClusterSpec& spec, const std::string& task_type, long long task_id, std::string_view context) {
  if (task_type == "evaluator" && !spec.has_job("evaluator")) {
    if (task_id != 0) {
      fail(context,
           "task index " + std::to_string(task_id) + " of the evaluator is not 0 (there is at most one evaluator)");
    }
    return;
  }
  if (!spec.has_job(task_type)) {
    std::string jobs;
    for (const auto& j : spec.jobs()) jobs += (jobs.empty() ? "" : ", ") + j;
    fail(context, "task type " + in_quotes(task_type) + " has no job in the cluster (jobs: " + jobs + ")");
  }
  const int n = spec.num_tasks(task_type);
  if (task_id < 0 || task_id >= n) {
    fail(context, "task index " + std::to_string(task_id) + " is outside job " + in_quotes(task_type) + " with " +
                      std::to_string(n) + (n == 1 ? " task" : " tasks") + " (" + index_range(n) + ")");
  }
}

// Training needs a chief or a worker; chief and evaluator have at most one task each.
void check_roles(const ClusterSpec& spec, std::string_view context) {
  if (spec.empty()) fail(context, "the cluster is empty (list the workers' \"host:port\" addresses)");
  if (!spec.has_job("chief") && !spec.has_job("worker")) {
    fail(context, "the cluster has no \"chief\" or \"worker\" job, so no task trains");
  }
  for (const char* single : {"chief", "evaluator"}) {
    if (spec.has_job(single) && spec.num_tasks(single) > 1) {
      fail(context, std::string("job '") + single + "' has " + std::to_string(spec.num_tasks(single)) +
                        " tasks (there is at most one " + single + ")");
    }
  }
}

void check_job_name(const std::string& name, std::string_view context, const char* what) {
  if (name == "chief" || name == "worker" || name == "evaluator" || name == "ps") return;
  if (name == "master") {
    fail(context, std::string(what) + " 'master' is not supported (TF1 name; use \"chief\")");
  }
  fail(context, std::string(what) + " " + in_quotes(name) + " is unknown (expected chief, worker, ps or evaluator)");
}

std::optional<std::string> lookup(const EnvironmentMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// The first of `names` that is set (and not empty), with its name.
std::optional<std::pair<std::string, std::string>> first_of(const EnvironmentMap& env,
                                                            std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto v = lookup(env, name); v && !v->empty()) return std::make_pair(std::string(name), *v);
  }
  return std::nullopt;
}

EnvironmentMap process_environment(std::initializer_list<const char*> names) {
  EnvironmentMap env;
  for (const char* name : names) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

long long env_count(std::string_view context, const std::string& name, const std::string& value, long long min,
                    long long max) {
  auto x = parse_count(value, max);
  if (!x || *x < min) {
    fail(context,
         name + "=" + in_quotes(value) + " is not a number in " + std::to_string(min) + ".." + std::to_string(max));
  }
  return *x;
}

// One comma-separated element of a host list, with brackets ("rack[1-2]-n[01-02]") multiplied out.
void expand_host(std::string_view list, std::string_view item, std::vector<std::string>& out) {
  const auto bad = [&](const std::string& why) { fail("Slurm host list " + in_quotes(list), why); };
  const auto open = item.find('[');
  if (open == std::string_view::npos) {
    if (item.find(']') != std::string_view::npos) bad("host " + in_quotes(item) + " has a ']' without '['");
    out.emplace_back(item);
    return;
  }
  const auto close = item.find(']', open);
  if (close == std::string_view::npos) bad("host " + in_quotes(item) + " has an unclosed '['");
  const std::string_view prefix = item.substr(0, open);
  if (prefix.find(']') != std::string_view::npos) bad("host " + in_quotes(item) + " has a ']' without '['");
  const std::string_view ranges = item.substr(open + 1, close - open - 1);
  if (ranges.find('[') != std::string_view::npos) bad("host " + in_quotes(item) + " has nested '['");
  if (ranges.empty()) bad("host " + in_quotes(item) + " has an empty '[]'");

  std::vector<std::string> suffixes;
  expand_host(list, item.substr(close + 1), suffixes);

  for_each_item(ranges, [&](std::string_view range) {
    const auto dash = range.find('-');
    const std::string_view lo = range.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
    const auto lo_value = parse_count(lo, 999'999'999);
    const auto hi_value = parse_count(hi, 999'999'999);
    if (!lo_value || !hi_value) {
      bad(in_quotes(range) + " in " + in_quotes(item) +
          " is not a number or a range of numbers (expected e.g. [01-03,07])");
    }
    if (*hi_value < *lo_value) bad("range " + in_quotes(range) + " in " + in_quotes(item) + " runs backwards");
    // The width of the lower bound is kept: node[08-10] is node08, node09, node10.
    const std::size_t width = lo.size();
    for (long long v = *lo_value; v <= *hi_value; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      for (const auto& suffix : suffixes) {
        if (out.size() >= max_hosts) bad("expands to more than " + std::to_string(max_hosts) + " hosts");
        out.push_back(std::string(prefix) + digits + suffix);
      }
    }
  });
}

}  // namespace

// --- ClusterSpec ---

ClusterSpec::ClusterSpec(JobMap jobs) : jobs_(std::move(jobs)) { validate_jobs(jobs_, "ClusterSpec", true); }

std::vector<std::string> ClusterSpec::jobs() const {
  std::vector<std::string> out;
  out.reserve(jobs_.size());
  for (const auto& entry : jobs_) out.push_back(entry.first);
  return out;
}

bool ClusterSpec::has_job(const std::string& job) const { return jobs_.count(job) != 0; }

const std::vector<std::string>& ClusterSpec::task_addresses(const std::string& job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    std::string names;
    for (const auto& entry : jobs_) names += (names.empty() ? "" : ", ") + entry.first;
    throw std::invalid_argument("ClusterSpec: no job " + in_quotes(job) +
                                " (jobs: " + (names.empty() ? "none" : names) + ")");
  }
  return it->second;
}

int ClusterSpec::num_tasks(const std::string& job) const { return static_cast<int>(task_addresses(job).size()); }

const std::string& ClusterSpec::task_address(const std::string& job, int index) const {
  const auto& addresses = task_addresses(job);
  const int n = static_cast<int>(addresses.size());
  if (index < 0 || index >= n) {
    throw std::out_of_range("ClusterSpec: task index " + std::to_string(index) + " is outside job " + in_quotes(job) +
                            " with " + std::to_string(n) + (n == 1 ? " task" : " tasks") + " (" + index_range(n) + ")");
  }
  return addresses[static_cast<std::size_t>(index)];
}

void ClusterSpec::set_task_address(const std::string& job, int index, std::string address) {
  task_address(job, index);  // throws for an unknown job or index
  JobMap updated = jobs_;
  updated[job][static_cast<std::size_t>(index)] = std::move(address);
  validate_jobs(updated, "ClusterSpec::set_task_address", true);
  jobs_ = std::move(updated);
}

bool ClusterSpec::is_complete() const {
  for (const auto& [job, addresses] : jobs_) {
    for (const auto& a : addresses) {
      if (a == pending_address) return false;
    }
  }
  return true;
}

int ClusterSpec::num_training_tasks() const {
  int n = 0;
  for (const char* job : {"chief", "worker"}) {
    if (has_job(job)) n += num_tasks(job);
  }
  return n;
}

int ClusterSpec::id_in_cluster(const std::string& job, int index) const {
  if (job != "chief" && job != "worker") {
    throw std::invalid_argument("ClusterSpec::id_in_cluster: job " + in_quotes(job) +
                                " does not train (expected \"chief\" or \"worker\")");
  }
  task_address(job, index);  // throws for an unknown job or index
  if (job == "chief") return 0;
  return index + (has_job("chief") ? num_tasks("chief") : 0);
}

std::string ClusterSpec::as_json() const { return json(jobs_).dump(); }

// --- ClusterResolver ---

std::map<std::string, int> ClusterResolver::num_accelerators() const { return {{"GPU", Runtime::gpu_count()}}; }

std::string ClusterResolver::coordinator_address() const {
  const ClusterSpec spec = cluster_spec();
  if (spec.has_job("chief")) return spec.task_address("chief", 0);
  if (spec.has_job("worker")) return spec.task_address("worker", 0);
  throw std::invalid_argument("ClusterResolver::coordinator_address: the cluster has no \"chief\" or \"worker\" job");
}

std::string ClusterResolver::master() const {
  const auto layer = rpc_layer();
  const std::string address = coordinator_address();
  return layer && !layer->empty() ? *layer + "://" + address : address;
}

std::string ClusterResolver::task_address() const {
  const ClusterSpec spec = cluster_spec();
  const std::string type = task_type();
  if (!spec.has_job(type)) return {};
  return spec.task_address(type, task_id());
}

// --- TFConfigClusterResolver ---

namespace {

std::string tf_config_from_environment() {
  const char* v = std::getenv("TF_CONFIG");
  if (v == nullptr) {
    throw std::invalid_argument(std::string("TFConfigClusterResolver: TF_CONFIG is not set (expected JSON like ") +
                                tf_config_example + ")");
  }
  if (*v == '\0') {
    throw std::invalid_argument(std::string("TFConfigClusterResolver: TF_CONFIG is empty (expected JSON like ") +
                                tf_config_example + ")");
  }
  return v;
}

}  // namespace

TFConfigClusterResolver::TFConfigClusterResolver() : TFConfigClusterResolver(tf_config_from_environment()) {}

TFConfigClusterResolver::TFConfigClusterResolver(const std::string& tf_config_json) {
  constexpr std::string_view ctx = "TF_CONFIG";
  json config;
  try {
    config = json::parse(tf_config_json);
  } catch (const json::exception& e) {
    // A parse_error, or an out_of_range for a number beyond a double (1e999). what() is
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..."; keep the part after
    // the tag, which gives the position and what the parser expected, cut short: it quotes the
    // offending token, which may be the whole input.
    std::string detail = e.what();
    if (auto tag_end = detail.find("] "); detail.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos) {
      detail = detail.substr(tag_end + 2);
    }
    constexpr std::size_t max_detail = 200;
    if (detail.size() > max_detail) detail = detail.substr(0, max_detail) + "...";
    fail(ctx, "not valid JSON (" + detail + "); expected e.g. " + tf_config_example);
  }
  if (!config.is_object())
    fail(ctx, "expected a JSON object like " + std::string(tf_config_example) + ", got " + shown(config));

  // "cluster": job -> list of "host:port".
  auto cluster = config.find("cluster");
  if (cluster == config.end()) {
    fail(ctx, R"(has no "cluster" (expected e.g. "cluster": {"worker": ["host1:12345", "host2:12345"]}))");
  }
  if (!cluster->is_object()) {
    fail(ctx, "\"cluster\" must be an object mapping job names to lists of \"host:port\", got " + shown(*cluster));
  }
  ClusterSpec::JobMap jobs;
  for (auto it = cluster->begin(); it != cluster->end(); ++it) {
    const std::string& job = it.key();
    check_job_name(job, ctx, "job");
    if (!it->is_array()) {
      fail(ctx, "job " + in_quotes(job) + " in \"cluster\" must be a list of \"host:port\" strings, got " + shown(*it));
    }
    std::vector<std::string> addresses;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& a = (*it)[i];
      if (!a.is_string()) {
        fail(ctx, "job " + in_quotes(job) + " in \"cluster\" must be a list of \"host:port\" strings, but task " +
                      std::to_string(i) + " is " + shown(a));
      }
      addresses.push_back(a.get<std::string>());
    }
    jobs.emplace(job, std::move(addresses));
  }
  validate_jobs(jobs, ctx, false);
  spec_ = ClusterSpec(std::move(jobs));
  check_roles(spec_, ctx);

  // "task": {"type": ..., "index": ...}.
  auto task = config.find("task");
  if (task == config.end()) {
    fail(ctx,
         R"(has no "task" saying which task this process is (expected e.g. "task": {"type": "worker", "index": 0}))");
  }
  if (!task->is_object()) {
    fail(ctx, R"("task" must be an object like {"type": "worker", "index": 0}, got )" + shown(*task));
  }
  auto type = task->find("type");
  if (type == task->end()) fail(ctx, R"("task" has no "type" (expected "chief", "worker", "ps" or "evaluator"))");
  if (!type->is_string()) fail(ctx, R"("task" "type" must be a string, got )" + shown(*type));
  task_type_ = type->get<std::string>();
  check_job_name(task_type_, ctx, "task type");
  auto index = task->find("index");
  if (index == task->end()) fail(ctx, R"("task" has no "index" (expected e.g. "index": 0))");
  long long id = 0;
  if (index->is_number_unsigned()) {
    const auto u = index->get<std::uint64_t>();
    id = u > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) ? std::numeric_limits<long long>::max()
                                                                         : static_cast<long long>(u);
  } else if (index->is_number_integer()) {
    id = index->get<long long>();
  } else {
    fail(ctx, R"("task" "index" must be an integer, got )" + shown(*index));
  }
  if (id == std::numeric_limits<long long>::max()) {
    fail(ctx, "task index " + shown(*index) + " is outside job " + in_quotes(task_type_));
  }
  check_task(spec_, task_type_, id, ctx);
  task_id_ = static_cast<int>(id);

  if (auto layer = config.find("rpc_layer"); layer != config.end()) {
    if (!layer->is_string()) fail(ctx, R"("rpc_layer" must be a string like "grpc", got )" + shown(*layer));
    rpc_layer_ = layer->get<std::string>();
  }
  if (auto env = config.find("environment"); env != config.end()) {
    if (!env->is_string()) fail(ctx, R"("environment" must be a string like "cloud", got )" + shown(*env));
    environment_ = env->get<std::string>();
  }
}

// --- SimpleClusterResolver ---

SimpleClusterResolver::SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id,
                                             std::map<std::string, int> num_accelerators,
                                             std::optional<std::string> rpc_layer)
    : spec_(std::move(cluster_spec)),
      task_type_(std::move(task_type)),
      task_id_(task_id),
      num_accelerators_(std::move(num_accelerators)),
      rpc_layer_(std::move(rpc_layer)) {
  constexpr std::string_view ctx = "SimpleClusterResolver";
  for (const auto& job : spec_.jobs()) check_job_name(job, ctx, "job");
  check_roles(spec_, ctx);
  check_job_name(task_type_, ctx, "task type");
  check_task(spec_, task_type_, task_id_, ctx);
  for (const auto& [kind, count] : num_accelerators_) {
    if (count < 0) fail(ctx, "num_accelerators[" + in_quotes(kind) + "] = " + std::to_string(count) + " is negative");
  }
}

// --- SlurmClusterResolver ---

std::vector<std::string> SlurmClusterResolver::expand_hostlist(std::string_view hostlist) {
  if (hostlist.empty()) fail("Slurm host list", "is empty");
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0)
      fail("Slurm host list " + in_quotes(hostlist), "has a ']' without '[' at position " + std::to_string(i));
    if (c == ' ' || c == '\t' || c == '\n') {
      fail("Slurm host list " + in_quotes(hostlist), "has whitespace at position " + std::to_string(i));
    }
    if (c == ',' && (depth == 0 || i == hostlist.size())) {
      const std::string_view item = hostlist.substr(start, i - start);
      if (item.empty())
        fail("Slurm host list " + in_quotes(hostlist), "has an empty host name at position " + std::to_string(start));
      expand_host(hostlist, item, hosts);
      start = i + 1;
    }
  }
  if (depth != 0) fail("Slurm host list " + in_quotes(hostlist), "has an unclosed '['");
  return hosts;
}

std::vector<int> SlurmClusterResolver::expand_tasks_per_node(std::string_view tasks_per_node) {
  const auto bad = [&](const std::string& why) { fail("Slurm tasks per node " + in_quotes(tasks_per_node), why); };
  if (tasks_per_node.empty()) bad("is empty");
  std::vector<int> counts;
  for_each_item(tasks_per_node, [&](std::string_view item) {
    std::string_view count = item;
    long long repeat = 1;
    if (auto paren = item.find('('); paren != std::string_view::npos) {
      count = item.substr(0, paren);
      const std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        bad(in_quotes(item) + " is not N or N(xM) (expected e.g. \"2(x3),1\")");
      }
      const auto r = parse_count(rest.substr(2, rest.size() - 3), static_cast<long long>(max_hosts));
      if (!r || *r < 1)
        bad("repeat count in " + in_quotes(item) + " is not a number in 1.." + std::to_string(max_hosts));
      repeat = *r;
    }
    const auto n = parse_count(count, 1'000'000);
    if (!n) bad(in_quotes(item) + " is not N or N(xM) (expected e.g. \"2(x3),1\")");
    if (counts.size() + static_cast<std::size_t>(repeat) > max_hosts) {
      bad("names more than " + std::to_string(max_hosts) + " nodes");
    }
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
  });
  return counts;
}

namespace {

constexpr std::initializer_list<const char*> slurm_variables = {"SLURM_PROCID",
                                                                "SLURM_NTASKS",
                                                                "SLURM_NPROCS",
                                                                "SLURM_STEP_NODELIST",
                                                                "SLURM_JOB_NODELIST",
                                                                "SLURM_NODELIST",
                                                                "SLURM_STEP_TASKS_PER_NODE",
                                                                "SLURM_TASKS_PER_NODE"};

}  // namespace

SlurmClusterResolver::SlurmClusterResolver(int port_base)
    : SlurmClusterResolver(process_environment(slurm_variables), port_base) {}

SlurmClusterResolver::SlurmClusterResolver(const EnvironmentMap& env, int port_base) {
  constexpr std::string_view ctx = "SlurmClusterResolver";
  if (port_base < 1 || port_base > 65535) {
    fail(ctx, "port_base " + std::to_string(port_base) + " is outside 1..65535");
  }
  const auto procid = first_of(env, {"SLURM_PROCID"});
  if (!procid) fail(ctx, "SLURM_PROCID is not set (start the program with srun)");
  const auto ntasks = first_of(env, {"SLURM_NTASKS", "SLURM_NPROCS"});
  if (!ntasks) fail(ctx, "neither SLURM_NTASKS nor SLURM_NPROCS is set (start the program with srun)");
  const auto nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!nodelist) {
    fail(ctx, "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set (start the program with srun)");
  }

  const long long n = env_count(ctx, ntasks->first, ntasks->second, 1, 1'000'000);
  const long long rank = env_count(ctx, procid->first, procid->second, 0, 1'000'000);
  if (rank >= n) {
    fail(ctx, "SLURM_PROCID=" + std::to_string(rank) + " is outside " + ntasks->first + "=" + std::to_string(n) +
                  " tasks (0.." + std::to_string(n - 1) + ")");
  }

  std::vector<std::string> nodes;
  try {
    nodes = expand_hostlist(nodelist->second);
  } catch (const std::invalid_argument& e) {
    fail(ctx, nodelist->first + ": " + e.what());
  }

  std::vector<int> per_node;
  const auto tasks_per_node = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (tasks_per_node) {
    try {
      per_node = expand_tasks_per_node(tasks_per_node->second);
    } catch (const std::invalid_argument& e) {
      fail(ctx, tasks_per_node->first + ": " + e.what());
    }
    if (per_node.size() != nodes.size()) {
      fail(ctx, tasks_per_node->first + "=" + in_quotes(tasks_per_node->second) + " gives counts for " +
                    std::to_string(per_node.size()) + " nodes but " + nodelist->first + "=" +
                    in_quotes(nodelist->second) + " names " + std::to_string(nodes.size()));
    }
    long long total = 0;
    for (int c : per_node) total += c;
    if (total != n) {
      fail(ctx, ntasks->first + "=" + std::to_string(n) + " disagrees with " + tasks_per_node->first + "=" +
                    in_quotes(tasks_per_node->second) + ", which places " + std::to_string(total) + " tasks");
    }
  } else {
    const long long node_count = static_cast<long long>(nodes.size());
    if (n % node_count != 0) {
      fail(ctx, ntasks->first + "=" + std::to_string(n) + " tasks do not divide evenly among the " +
                    std::to_string(node_count) + " nodes of " + nodelist->first + "=" + in_quotes(nodelist->second) +
                    "; set SLURM_STEP_TASKS_PER_NODE (srun sets it)");
    }
    per_node.assign(nodes.size(), static_cast<int>(n / node_count));
  }

  std::vector<std::string> addresses;
  addresses.reserve(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (port_base + per_node[i] - 1 > 65535) {
      fail(ctx, "port_base " + std::to_string(port_base) + " + " + std::to_string(per_node[i]) + " tasks on node " +
                    in_quotes(nodes[i]) + " runs past port 65535");
    }
    for (int local = 0; local < per_node[i]; ++local) {
      addresses.push_back(nodes[i] + ":" + std::to_string(port_base + local));
    }
  }
  ClusterSpec::JobMap jobs{{"worker", std::move(addresses)}};
  validate_jobs(jobs, std::string(ctx) + ": " + nodelist->first + "=" + in_quotes(nodelist->second), false);
  spec_ = ClusterSpec(std::move(jobs));
  task_id_ = static_cast<int>(rank);
}

// --- MpiClusterResolver ---

namespace {

constexpr std::initializer_list<const char*> mpi_variables = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                                              "PMI_RANK", "PMI_SIZE", "TROUPE_COORDINATOR"};

}  // namespace

MpiClusterResolver::MpiClusterResolver(std::string coordinator_address)
    : MpiClusterResolver(process_environment(mpi_variables), std::move(coordinator_address)) {}

MpiClusterResolver::MpiClusterResolver(const EnvironmentMap& env, std::string coordinator) {
  constexpr std::string_view ctx = "MpiClusterResolver";
  std::optional<std::pair<std::string, std::string>> rank_var, size_var;
  if (auto r = first_of(env, {"OMPI_COMM_WORLD_RANK"})) {
    rank_var = r;
    size_var = first_of(env, {"OMPI_COMM_WORLD_SIZE"});
    if (!size_var) fail(ctx, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
  } else if (auto p = first_of(env, {"PMI_RANK"})) {
    rank_var = p;
    size_var = first_of(env, {"PMI_SIZE"});
    if (!size_var) fail(ctx, "PMI_RANK is set but PMI_SIZE is not");
  } else {
    fail(ctx,
         "neither OMPI_COMM_WORLD_RANK (Open MPI) nor PMI_RANK (MPICH, Intel MPI) is set "
         "(start the program with mpirun)");
  }
  const long long size = env_count(ctx, size_var->first, size_var->second, 1, 1'000'000);
  const long long rank = env_count(ctx, rank_var->first, rank_var->second, 0, 1'000'000);
  if (rank >= size) {
    fail(ctx, rank_var->first + "=" + std::to_string(rank) + " is outside " + size_var->first + "=" +
                  std::to_string(size) + " ranks (0.." + std::to_string(size - 1) + ")");
  }

  std::string source = "the coordinator address";
  if (coordinator.empty()) {
    auto from_env = first_of(env, {"TROUPE_COORDINATOR"});
    if (!from_env) {
      fail(ctx,
           "no coordinator address: pass one (\"host:port\" that rank 0 listens on) or set "
           "TROUPE_COORDINATOR=host:port");
    }
    coordinator = from_env->second;
    source = "TROUPE_COORDINATOR";
  }

  std::vector<std::string> addresses(static_cast<std::size_t>(size), std::string(ClusterSpec::pending_address));
  addresses[0] = coordinator;
  ClusterSpec::JobMap jobs{{"worker", std::move(addresses)}};
  if (coordinator == ClusterSpec::pending_address)
    fail(ctx, source + " is " + in_quotes(coordinator) + ", not host:port");
  check_address(coordinator, "worker", 0, std::string(ctx) + ": " + source);
  spec_ = ClusterSpec(std::move(jobs));
  rank_ = static_cast<int>(rank);
}

}  // namespace troupe::distribute
