#include "troupe/distribute/actor_cluster.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <iostream>
#include <stdexcept>

#include "distribute/cluster/actor_host.hpp"
#include "distribute/cluster/cluster_net.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "troupe/actors/app_actors.hpp"
#include "troupe/base/parse_number.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute {

// --- what a host makes of a spawn ----------------------------------------------------------------

namespace detail {

actors::actor_made make_actor(const FunctionRegistry& registry, const std::string& task, const std::string& type,
                              const std::string& args) {
  const std::string what = "actor type " + base::quoted(type) + " on " + task;
  const ActorFactory* factory = registry.find_actor(type);
  if (factory == nullptr) {
    std::string known;
    for (const auto& n : registry.actor_types()) known += (known.empty() ? "" : ", ") + n;
    return {{}, what + " is not registered there (it has: " + (known.empty() ? "none" : known) + ")"};
  }
  std::shared_ptr<Actor> actor;
  try {
    actor = (*factory)(decode_tensors(args, "actor arguments"));
  } catch (const std::exception& e) {
    return {{}, what + ": its factory failed: " + e.what()};
  }
  if (!actor) return {{}, what + ": its factory returned no actor"};
  // Each message's tensors are decoded on the actor's own thread, as its reply is encoded there.
  return {[actor](const std::string& name, const std::string& payload) {
            auto reply = actor->receive(name, decode_tensors(payload, "actor message"));
            return actors::call_reply{true, encode_tensors(reply)};
          },
          {}};
}

}  // namespace detail

// --- ActorCluster --------------------------------------------------------------------------------

struct ActorCluster::Impl {
  ClusterSpec cluster;
  std::string task;
  FunctionRegistry registry;
  ActorClusterOptions options;
  std::shared_ptr<actors::control_credentials> credentials;
  std::unique_ptr<actors::actor_client> client;
  std::atomic<bool> closed{false};

  actors::actor_client& client_for(const std::string& what) {
    if (closed) throw Error(what + ": its ActorCluster is gone");
    return *client;
  }

  // Tells options.on_event, when set.
  void report(ActorEvent::Kind kind, std::uint64_t id, const std::string& type, const std::string& where,
              const std::string& cause = {}) const {
    if (options.on_event) options.on_event(ActorEvent{kind, id, type, where, cause});
  }

  void log(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      std::cerr << "troupe: actors: " + line + "\n" << std::flush;
    }
  }
};

struct ActorHandle::Impl {
  std::shared_ptr<ActorCluster::Impl> cluster;
  std::shared_ptr<actors::actor_ref> ref;
  std::uint64_t id = 0;
  std::string type;
  std::string task;

  std::string describe() const { return "actor " + base::quoted(type) + " #" + std::to_string(id) + " on " + task; }

  std::string encode(const std::string& name, const std::vector<Tensor>& tensors, const char* op) const {
    if (name.size() > actors::app_message_limits::max_name_bytes) {
      throw std::invalid_argument("ActorHandle::" + std::string(op) + ": " + describe() + ": a message name of " +
                                  std::to_string(name.size()) + " bytes (at most " +
                                  std::to_string(actors::app_message_limits::max_name_bytes) + ")");
    }
    std::string payload = detail::encode_tensors(tensors);
    if (payload.size() > cluster->options.max_message_bytes) {
      throw std::invalid_argument("ActorHandle::" + std::string(op) + ": " + describe() + ": message " +
                                  base::quoted(name) + " is " + std::to_string(payload.size()) + " bytes (at most " +
                                  std::to_string(cluster->options.max_message_bytes) +
                                  ": ActorClusterOptions::max_message_bytes)");
    }
    return payload;
  }
};

namespace {

struct task_ref {
  std::string job;
  int index = 0;
};

// "worker:1" or "/job:worker/replica:0/task:1"; nothing when it is neither.
std::optional<task_ref> parse_task(const std::string& task) {
  std::string job, index;
  const std::string prefix = "/job:";
  if (task.rfind(prefix, 0) == 0) {
    const auto slash = task.find('/', prefix.size());
    const std::string mid = "/replica:0/task:";
    if (slash == std::string::npos || task.compare(slash, mid.size(), mid) != 0) return std::nullopt;
    job = task.substr(prefix.size(), slash - prefix.size());
    index = task.substr(slash + mid.size());
  } else {
    const auto colon = task.find(':');
    if (colon == std::string::npos) return std::nullopt;
    job = task.substr(0, colon);
    index = task.substr(colon + 1);
  }
  const auto n = base::parse_int(index);
  if (job.empty() || !n || *n < 0 || *n > 1'000'000) return std::nullopt;
  return task_ref{job, static_cast<int>(*n)};
}

std::string tasks_of(const ClusterSpec& cluster) {
  std::string out;
  for (const auto& job : cluster.jobs()) {
    for (int i = 0; i < cluster.num_tasks(job); ++i) out += (out.empty() ? "" : ", ") + job + ":" + std::to_string(i);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

ActorCluster::ActorCluster(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry registry,
                           ActorClusterOptions options)
    : ActorCluster(runtime, resolver.cluster_spec(),
                   resolver.task_type() + ":" + std::to_string(resolver.task_id()), std::move(registry),
                   std::move(options)) {}

ActorCluster::ActorCluster(Runtime& runtime, const ClusterSpec& cluster, const std::string& own_task,
                           FunctionRegistry registry, ActorClusterOptions options)
    : impl_(std::make_shared<Impl>()) {
  auto& s = *impl_;
  const auto own = parse_task(own_task);
  if (!own) {
    throw std::invalid_argument("ActorCluster: own task " + base::quoted(own_task) +
                                " is not TYPE:INDEX (e.g. chief:0) or /job:TYPE/replica:0/task:INDEX");
  }
  if (options.max_message_bytes < 1024 || options.max_message_bytes > actors::app_message_limits::max_payload_bytes) {
    throw std::invalid_argument("ActorCluster: max_message_bytes is " + std::to_string(options.max_message_bytes) +
                                " (expected 1024.." + std::to_string(actors::app_message_limits::max_payload_bytes) +
                                ")");
  }
  const actors::liveness_policy liveness{options.heartbeat_interval, options.missed_heartbeats};
  liveness.check("ActorClusterOptions");
  detail::require_token(detail::cluster_addresses(cluster), options.cluster_token, options.insecure, "ActorCluster",
                        "ActorClusterOptions::insecure");
  s.cluster = cluster;
  s.task = detail::task_name(own->job, own->index);
  s.registry = std::move(registry);
  s.options = std::move(options);
  s.credentials = actors::make_credentials(runtime.system(), s.options.cluster_token);
  actors::actor_client_options co;
  co.task = s.task;
  co.credentials = s.credentials;
  co.liveness = liveness;
  co.connect_timeout = s.options.connect_timeout;
  // The client's supervisor may still be ending when this object is gone: nothing is called then.
  std::weak_ptr<Impl> weak = impl_;
  co.on_down = [weak](const actors::actor_down& d) {
    auto self = weak.lock();
    if (!self || self->closed) return;
    self->report(ActorEvent::Kind::down, d.id, d.type, d.task, d.cause);
    if (self->options.on_down) self->options.on_down(ActorDown{d.id, d.type, d.task, d.cause});
  };
  co.log = [weak](const std::string& line) {
    if (auto self = weak.lock()) self->log(line);
  };
  s.client = std::make_unique<actors::actor_client>(runtime.system(), std::move(co));
}

ActorCluster::~ActorCluster() {
  impl_->closed = true;
  impl_->client.reset();
}

const std::string& ActorCluster::task() const { return impl_->task; }

ActorHandle ActorCluster::spawn(const std::string& type, const std::string& task, const std::vector<Tensor>& args) {
  auto& s = *impl_;
  const std::string what = "ActorCluster::spawn: actor type " + base::quoted(type) + " on " + base::quoted(task);
  auto h = std::make_shared<ActorHandle::Impl>();
  h->cluster = impl_;
  h->type = type;
  if (type.empty() || type.size() > 64) throw std::invalid_argument(what + ": a type name of 1..64 bytes");
  bool local = task == "local";
  std::optional<task_ref> where;
  if (!local) {
    where = parse_task(task);
    if (!where) {
      throw std::invalid_argument(what + ": the task is not \"local\", TYPE:INDEX (e.g. worker:1) or "
                                  "/job:TYPE/replica:0/task:INDEX");
    }
    const auto jobs = s.cluster.jobs();
    if (std::find(jobs.begin(), jobs.end(), where->job) == jobs.end() ||
        where->index >= s.cluster.num_tasks(where->job)) {
      throw std::invalid_argument(what + ": the cluster has no such task (it has: " + tasks_of(s.cluster) + ")");
    }
    local = detail::task_name(where->job, where->index) == s.task;  // this task itself
  }
  const std::string args_bytes = detail::encode_tensors(args);
  if (args_bytes.size() > s.options.max_message_bytes) {
    throw std::invalid_argument(what + ": its arguments are " + std::to_string(args_bytes.size()) +
                                " bytes (at most " + std::to_string(s.options.max_message_bytes) +
                                ": ActorClusterOptions::max_message_bytes)");
  }
  auto& client = s.client_for(what);
  if (local) {
    if (s.registry.find_actor(type) == nullptr) {
      std::string known;
      for (const auto& n : s.registry.actor_types()) known += (known.empty() ? "" : ", ") + n;
      throw std::invalid_argument(what + ": the type is not registered in this ActorCluster's registry (it has: " +
                                  (known.empty() ? "none" : known) + ")");
    }
    auto made = detail::make_actor(s.registry, "local", type, args_bytes);
    if (!made.receive) throw Error("ActorCluster::spawn: " + made.error);
    h->ref = client.spawn_local(type, std::move(made.receive));
  } else {
    const std::string name = detail::task_name(where->job, where->index);
    const auto [host, port] =
        detail::split_host_port(s.cluster.task_address(where->job, where->index), "ActorCluster::spawn");
    try {
      h->ref = client.spawn(actors::task_endpoint{name, host, port}, type, args_bytes);
    } catch (const std::runtime_error& e) {
      // The host's refusals name the type and the task already; the connection's do not.
      const std::string why = e.what();
      throw Error(why.rfind("actor type ", 0) == 0 ? "ActorCluster::spawn: " + why : what + ": " + why);
    }
  }
  h->id = actors::actor_client::id(*h->ref);
  h->task = actors::actor_client::task(*h->ref);
  s.report(ActorEvent::Kind::spawned, h->id, h->type, h->task);
  return ActorHandle(std::move(h));
}

// --- ActorHandle ---------------------------------------------------------------------------------

const ActorHandle::Impl& ActorHandle::checked(const char* what) const {
  if (!impl_) throw std::logic_error(std::string("ActorHandle::") + what + ": an empty handle (from ActorCluster::spawn)");
  return *impl_;
}

std::vector<Tensor> ActorHandle::request(const std::string& name, const std::vector<Tensor>& tensors,
                                         std::chrono::milliseconds timeout) const {
  const auto& h = checked("request");
  const std::string payload = h.encode(name, tensors, "request");
  const std::string what = h.describe() + ": request " + base::quoted(name);
  auto r = h.cluster->client_for(what).request(*h.ref, name, payload, timeout);
  if (r.what == actors::actor_reply::status::ok || r.what == actors::actor_reply::status::failed) {
    h.cluster->report(ActorEvent::Kind::replied, h.id, h.type, h.task);
  }
  switch (r.what) {
    case actors::actor_reply::status::ok: return detail::decode_tensors(r.payload, "actor reply");
    case actors::actor_reply::status::failed: throw Error(what + " failed: " + r.payload);
    case actors::actor_reply::status::timed_out: throw Error(what + ": " + r.payload);
    case actors::actor_reply::status::down: throw Error(what + ": the actor is down: " + r.payload);
  }
  throw Error(what + ": no reply");
}

void ActorHandle::send(const std::string& name, const std::vector<Tensor>& tensors) const {
  const auto& h = checked("send");
  const std::string payload = h.encode(name, tensors, "send");
  const std::string what = h.describe() + ": send " + base::quoted(name);
  auto& client = h.cluster->client_for(what);
  if (!client.send(*h.ref, name, payload)) {
    throw Error(what + ": the actor is down: " + client.down(*h.ref).value_or("it is gone"));
  }
}

void ActorHandle::stop() const {
  const auto& h = checked("stop");
  if (h.cluster->closed) return;
  h.cluster->client->stop(*h.ref);
}

std::optional<std::string> ActorHandle::down() const {
  const auto& h = checked("down");
  if (h.cluster->closed) return std::string("its ActorCluster is gone");
  return h.cluster->client->down(*h.ref);
}

std::uint64_t ActorHandle::id() const { return checked("id").id; }
const std::string& ActorHandle::type() const { return checked("type").type; }
const std::string& ActorHandle::task() const { return checked("task").task; }

}  // namespace troupe::distribute
