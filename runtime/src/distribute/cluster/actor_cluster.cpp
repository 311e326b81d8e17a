#include "troupe/distribute/actor_cluster.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "distribute/cluster/actor_cluster_impl.hpp"
#include "distribute/cluster/actor_host.hpp"
#include "distribute/cluster/cluster_net.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "troupe/actors/app_actors.hpp"
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

// --- ActorCluster::Impl and ActorHandle::Impl ----------------------------------------------------

std::shared_ptr<actors::actor_ref> ActorCluster::Impl::spawn_remote(const std::string& type, const std::string& job,
                                                                    int index, const std::string& args_bytes,
                                                                    const std::string& what, bool* reached,
                                                                    std::chrono::milliseconds wait_listening) {
  if (reached) *reached = true;
  const std::string name = detail::task_name(job, index);
  const auto [host, port] = detail::split_host_port(cluster.task_address(job, index), "ActorCluster::spawn");
  std::shared_ptr<actors::actor_ref> ref;
  try {
    ref = client_for(what).spawn(actors::task_endpoint{name, host, port}, type, args_bytes, wait_listening);
  } catch (const std::runtime_error& e) {
    // The host's refusals name the type and the task already; the connection's do not.
    const std::string why = e.what();
    if (why.rfind("actor type ", 0) == 0) throw Error("ActorCluster::spawn: " + why);
    load.unreachable(name);
    if (reached) *reached = false;
    throw Error(what + ": " + why);
  }
  load.spawned(actors::actor_client::id(*ref), name);
  return ref;
}

void ActorCluster::Impl::log(const std::string& line) const {
  if (options.log) {
    options.log(line);
  } else {
    std::cerr << "troupe: actors: " + line + "\n" << std::flush;
  }
}

std::shared_ptr<const ActorHandle::Impl::incarnation> ActorHandle::Impl::reachable(std::chrono::milliseconds wait,
                                                                                   const std::string& what) const {
  std::unique_lock<std::mutex> lock(mutex);
  if (restarting) changed.wait_for(lock, wait, [&] { return !restarting; });
  if (!exhausted.empty()) throw ActorRestartsExhausted(what + ": " + exhausted);
  if (!cancelled.empty()) throw Error(what + ": the actor is down: " + cancelled);
  if (restarting) {
    throw Error(what + ": the actor is down and restarting: no new actor within " + std::to_string(wait.count()) +
                " ms");
  }
  return now;
}

std::string ActorHandle::Impl::describe(const incarnation& inc) const {
  return "actor " + base::quoted(type) + " #" + std::to_string(inc.id) + " on " + inc.task;
}

std::string ActorHandle::Impl::encode(const std::string& name, const std::vector<Tensor>& tensors, const char* op) const {
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

// --- ActorCluster --------------------------------------------------------------------------------

ActorCluster::ActorCluster(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry registry,
                           ActorClusterOptions options)
    : ActorCluster(runtime, resolver.cluster_spec(),
                   resolver.task_type() + ":" + std::to_string(resolver.task_id()), std::move(registry),
                   std::move(options)) {}

ActorCluster::ActorCluster(Runtime& runtime, const ClusterSpec& cluster, const std::string& own_task,
                           FunctionRegistry registry, ActorClusterOptions options)
    : impl_(std::make_shared<Impl>()) {
  auto& s = *impl_;
  const auto own = detail::parse_task(own_task);
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
  s.credentials = actors::make_credentials(runtime.system(), s.options.cluster_token, "ActorCluster");
  actors::actor_client_options co;
  co.task = s.task;
  co.credentials = s.credentials;
  co.liveness = liveness;
  co.connect_timeout = s.options.connect_timeout;
  co.data_connections = s.options.data_connections;
  // The client's supervisor may still be ending when this object is gone: nothing is called then.
  std::weak_ptr<Impl> weak = impl_;
  co.on_down = [weak](const actors::actor_down& d) {
    if (auto self = weak.lock()) detail::actor_went_down(self, d);
  };
  co.log = [weak](const std::string& line) {
    if (auto self = weak.lock()) self->log(line);
  };
  s.client = std::make_unique<actors::actor_client>(runtime.system(), std::move(co));
}

ActorCluster::~ActorCluster() {
  impl_->closed = true;
  impl_->restarter.stop();  // a restart under way ends first (it gives up: the cluster is gone)
  impl_->client.reset();    // fails the asynchronous requests in flight
  impl_->callbacks.stop();  // runs their callbacks
}

const std::string& ActorCluster::task() const { return impl_->task; }

std::vector<int> ActorCluster::load(const std::string& job) const { return impl_->load_of(job); }

ActorHandle ActorCluster::spawn(const std::string& type, const std::string& task, const std::vector<Tensor>& args) {
  return spawn(type, task, args, RestartPolicy{});
}

ActorHandle ActorCluster::spawn(const std::string& type, const std::string& task, const std::vector<Tensor>& args,
                                const RestartPolicy& policy) {
  auto& s = *impl_;
  const std::string what = "ActorCluster::spawn: actor type " + base::quoted(type) + " on " + base::quoted(task);
  auto h = std::make_shared<ActorHandle::Impl>();
  h->cluster = impl_;
  h->type = type;
  if (type.empty() || type.size() > 64) throw std::invalid_argument(what + ": a type name of 1..64 bytes");
  detail::check_restart_policy(policy, what);
  bool local = task == "local";
  std::optional<detail::task_ref> where;
  std::string any_job;
  const auto jobs = s.cluster.jobs();
  if (const auto job = detail::any_job(task)) {
    any_job = *job;
    if (std::find(jobs.begin(), jobs.end(), any_job) == jobs.end() || s.cluster.num_tasks(any_job) == 0) {
      throw std::invalid_argument(what + ": the cluster has no " + base::quoted(any_job) + " tasks (it has: " +
                                  detail::tasks_of(s.cluster) + ")");
    }
  } else if (!local) {
    where = detail::parse_task(task);
    if (!where) {
      throw std::invalid_argument(what + ": the task is not \"local\", \"any\", \"any:JOB\", TYPE:INDEX (e.g. "
                                  "worker:1) or /job:TYPE/replica:0/task:INDEX");
    }
    if (std::find(jobs.begin(), jobs.end(), where->job) == jobs.end() ||
        where->index >= s.cluster.num_tasks(where->job)) {
      throw std::invalid_argument(what + ": the cluster has no such task (it has: " + detail::tasks_of(s.cluster) + ")");
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
  std::shared_ptr<actors::actor_ref> ref;
  if (local) {
    if (s.registry.find_actor(type) == nullptr) {
      std::string known;
      for (const auto& n : s.registry.actor_types()) known += (known.empty() ? "" : ", ") + n;
      throw std::invalid_argument(what + ": the type is not registered in this ActorCluster's registry (it has: " +
                                  (known.empty() ? "none" : known) + ")");
    }
    auto made = detail::make_actor(s.registry, "local", type, args_bytes);
    if (!made.receive) throw Error("ActorCluster::spawn: " + made.error);
    ref = client.spawn_local(type, std::move(made.receive));
  } else if (where) {
    // A task still starting (not listening yet) is waited for, within the spawn's timeout.
    ref = s.spawn_remote(type, where->job, where->index, args_bytes, what, nullptr, s.options.connect_timeout);
  } else {
    if (s.placement_order(any_job).empty()) {
      throw std::invalid_argument(what + ": no " + any_job + " task but this spawner's own");
    }
    auto placed = s.place_any(type, any_job, args_bytes, what, "", s.options.connect_timeout);
    if (placed.refused) throw Error(*placed.refused);
    ref = std::move(placed.ref);
    if (!ref) throw Error(what + ": no " + any_job + " task could be reached:" + placed.tried);
  }
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    h->adopt(ref);
  }
  if (!local && policy.max_restarts > 0) {
    h->supervised = true;
    h->policy = policy;
    h->job = where ? where->job : any_job;
    h->args_bytes = args_bytes;
    s.supervise(h->now->id, h);
  }
  s.report(ActorEvent::Kind::spawned, h->now->id, h->type, h->now->task);
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
  const auto started = std::chrono::steady_clock::now();
  const auto inc = h.reachable(timeout, h.describe() + ": request " + base::quoted(name));
  const std::string what = h.describe(*inc) + ": request " + base::quoted(name);
  const auto left = std::max(std::chrono::milliseconds(1),
                             timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - started));
  auto r = h.cluster->client_for(what).request(*inc->ref, name, payload, left);
  if (r.what == actors::actor_reply::status::ok || r.what == actors::actor_reply::status::failed) {
    h.cluster->report(ActorEvent::Kind::replied, inc->id, h.type, inc->task);
  }
  switch (r.what) {
    case actors::actor_reply::status::ok: return detail::decode_tensors(r.payload, "actor reply");
    case actors::actor_reply::status::failed: throw Error(what + " failed: " + r.payload);
    case actors::actor_reply::status::timed_out: throw Error(what + ": " + r.payload);
    case actors::actor_reply::status::down: throw Error(what + ": the actor is down: " + r.payload);
  }
  throw Error(what + ": no reply");
}

// --- ActorRequest --------------------------------------------------------------------------------

struct ActorRequest::State {
  std::shared_ptr<ActorCluster::Impl> cluster;
  std::string what;  // "actor 'x' #3 on ...: request 'y'"
  std::mutex mutex;
  std::condition_variable completed;
  bool done = false;
  std::vector<Tensor> reply;
  std::exception_ptr error;
  bool has_then = false;
  std::function<void(std::vector<Tensor>)> on_reply;
  std::function<void(const Error&)> on_error;

  // Runs the callbacks on the cluster's callback thread (called once, with done set).
  static void dispatch(const std::shared_ptr<State>& st) {
    st->cluster->callbacks.post([st] {
      if (!st->error) {
        if (st->on_reply) st->on_reply(st->reply);
        return;
      }
      try {
        std::rethrow_exception(st->error);
      } catch (const Error& e) {
        if (st->on_error) {
          st->on_error(e);
        } else {
          st->cluster->log("an asynchronous request's error no callback handled: " + std::string(e.what()));
        }
      }
    });
  }

  static void complete(const std::shared_ptr<State>& st, std::vector<Tensor> reply, std::exception_ptr error) {
    bool call = false;
    {
      std::lock_guard<std::mutex> lock(st->mutex);
      if (st->done) return;
      st->done = true;
      st->reply = std::move(reply);
      st->error = std::move(error);
      call = st->has_then;
    }
    st->completed.notify_all();
    if (call) dispatch(st);
  }
};

ActorRequest::State& ActorRequest::checked(const char* what) const {
  if (!state_) {
    throw std::logic_error(std::string("ActorRequest::") + what + ": an empty request (from ActorHandle::request_async)");
  }
  return *state_;
}

std::vector<Tensor> ActorRequest::receive() const {
  auto& st = checked("receive");
  std::unique_lock<std::mutex> lock(st.mutex);
  st.completed.wait(lock, [&] { return st.done; });  // the request's timeout completes it
  if (st.error) std::rethrow_exception(st.error);
  return st.reply;
}

void ActorRequest::then(std::function<void(std::vector<Tensor>)> on_reply,
                        std::function<void(const Error&)> on_error) const {
  auto& st = checked("then");
  bool call = false;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    if (st.has_then) throw std::logic_error("ActorRequest::then: " + st.what + ": then() was called already");
    st.has_then = true;
    st.on_reply = std::move(on_reply);
    st.on_error = std::move(on_error);
    call = st.done;
  }
  if (call) State::dispatch(state_);
}

bool ActorRequest::ready() const {
  auto& st = checked("ready");
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.done;
}

ActorRequest ActorHandle::request_async(const std::string& name, const std::vector<Tensor>& tensors,
                                        std::chrono::milliseconds timeout) const {
  const auto& h = checked("request_async");
  std::string payload = h.encode(name, tensors, "request_async");
  auto st = std::make_shared<ActorRequest::State>();
  st->cluster = h.cluster;
  std::shared_ptr<const Impl::incarnation> inc;
  try {
    inc = h.reachable(std::chrono::milliseconds(0), h.describe() + ": request " + base::quoted(name));
  } catch (const Error&) {
    st->what = h.describe() + ": request " + base::quoted(name);
    ActorRequest::State::complete(st, {}, std::current_exception());
    return ActorRequest(st);
  }
  st->what = h.describe(*inc) + ": request " + base::quoted(name);
  if (h.cluster->closed) {
    ActorRequest::State::complete(st, {}, std::make_exception_ptr(Error(st->what + ": its ActorCluster is gone")));
    return ActorRequest(st);
  }
  // The reply is decoded where it arrives (a runtime thread); the callbacks run elsewhere.
  h.cluster->client_for(st->what).request_async(*inc->ref, name, std::move(payload), timeout,
                                                [st, id = inc->id, type = h.type, task = inc->task](actors::actor_reply r) {
    const std::string& what = st->what;
    if (r.what == actors::actor_reply::status::ok || r.what == actors::actor_reply::status::failed) {
      st->cluster->report(ActorEvent::Kind::replied, id, type, task);
    }
    switch (r.what) {
      case actors::actor_reply::status::ok:
        try {
          ActorRequest::State::complete(st, detail::decode_tensors(r.payload, "actor reply"), nullptr);
        } catch (const std::exception& e) {
          ActorRequest::State::complete(st, {}, std::make_exception_ptr(Error(what + ": " + e.what())));
        }
        return;
      case actors::actor_reply::status::failed:
        return ActorRequest::State::complete(st, {}, std::make_exception_ptr(Error(what + " failed: " + r.payload)));
      case actors::actor_reply::status::timed_out:
        return ActorRequest::State::complete(st, {}, std::make_exception_ptr(Error(what + ": " + r.payload)));
      case actors::actor_reply::status::down:
        return ActorRequest::State::complete(
            st, {}, std::make_exception_ptr(Error(what + ": the actor is down: " + r.payload)));
    }
  });
  return ActorRequest(st);
}

void ActorHandle::send(const std::string& name, const std::vector<Tensor>& tensors) const {
  const auto& h = checked("send");
  const std::string payload = h.encode(name, tensors, "send");
  // A one-way message does not wait for a restart: it goes to the actor running now, or fails.
  const auto inc = h.reachable(std::chrono::milliseconds(0), h.describe() + ": send " + base::quoted(name));
  const std::string what = h.describe(*inc) + ": send " + base::quoted(name);
  auto& client = h.cluster->client_for(what);
  if (!client.send(*inc->ref, name, payload)) {
    throw Error(what + ": the actor is down: " + client.down(*inc->ref).value_or("it is gone"));
  }
}

void ActorHandle::stop() const {
  const auto& h = checked("stop");
  if (h.cluster->closed) return;
  std::shared_ptr<const Impl::incarnation> inc;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    h.stopped = true;
    // The actor now is the one that went down: the restart under way stops its new actor, or
    // makes none (actor_restart.cpp).
    if (h.restarting) return;
    inc = h.now;
  }
  h.cluster->client->stop(*inc->ref);
}

std::optional<std::string> ActorHandle::down() const {
  const auto& h = checked("down");
  if (h.cluster->closed) return std::string("its ActorCluster is gone");
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    if (!h.exhausted.empty()) return h.exhausted;
    if (!h.cancelled.empty()) return h.cancelled;
  }
  return h.cluster->client->down(*h.current()->ref);
}

int ActorHandle::restarts() const {
  const auto& h = checked("restarts");
  std::lock_guard<std::mutex> lock(h.mutex);
  return h.restarts;
}

std::uint64_t ActorHandle::id() const { return checked("id").current()->id; }
const std::string& ActorHandle::type() const { return checked("type").type; }
const std::string& ActorHandle::task() const { return checked("task").current()->task; }

}  // namespace troupe::distribute
