#include "troupe/distribute/server.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>
#include <mutex>
#include <stdexcept>

#include "caf/actor_system.hpp"
#include "distribute/cluster/actor_host.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "distribute/cluster/shard_checkpoint.hpp"
#include "distribute/cluster/worker_services.hpp"
#include "distribute/cluster/cluster_net.hpp"
#include "nn/ps_fit.hpp"
#include "env.hpp"
#include "troupe/actors/cluster_tasks.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/distribute/multi_worker_strategy.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute {

// --- FunctionRegistry -------------------------------------------------------------------------

namespace {

void check_new_name(const std::map<std::string, RemoteFunction>& f, const std::map<std::string, DatasetFunction>& d,
                    const std::string& name, const char* what) {
  if (name.empty()) throw std::invalid_argument(std::string("FunctionRegistry: ") + what + " with an empty name");
  if (name.rfind("troupe.", 0) == 0) {
    throw std::invalid_argument("FunctionRegistry: " + base::quoted(name) +
                                " begins with \"troupe.\", which names troupe's own functions (choose another name)");
  }
  if (f.count(name) != 0 || d.count(name) != 0) {
    throw std::invalid_argument("FunctionRegistry: " + base::quoted(name) +
                                " is registered already (every name means one function)");
  }
}

// FunctionContext's updates carry their operation as its byte (its public header names no actors
// type): byte_of at the call, op_of where it reaches the shard client.
constexpr std::uint8_t byte_of(actors::update_op op) { return static_cast<std::uint8_t>(op); }

actors::update_op op_of(std::uint8_t byte) {
  const auto op = actors::update_op_of(byte);
  if (!op) throw std::invalid_argument("variable update: " + actors::unknown_update_op(byte));
  return *op;
}

}  // namespace

void FunctionRegistry::add(const std::string& name, RemoteFunction fn) {
  check_new_name(functions_, datasets_, name, "a function");
  if (!fn) throw std::invalid_argument("FunctionRegistry: function " + base::quoted(name) + " is empty");
  functions_.emplace(name, std::move(fn));
}

void FunctionRegistry::add_dataset(const std::string& name, DatasetFunction fn) {
  check_new_name(functions_, datasets_, name, "a dataset function");
  if (!fn) throw std::invalid_argument("FunctionRegistry: dataset function " + base::quoted(name) + " is empty");
  datasets_.emplace(name, std::move(fn));
}

void FunctionRegistry::add_builtin(const std::string& name, RemoteFunction fn) {
  functions_.insert_or_assign(name, std::move(fn));
}

void FunctionRegistry::add_actor(const std::string& type, ActorFactory factory) {
  if (type.empty()) throw std::invalid_argument("FunctionRegistry: an actor type with an empty name");
  if (type.rfind("troupe.", 0) == 0) {
    throw std::invalid_argument("FunctionRegistry: actor type " + base::quoted(type) +
                                " begins with \"troupe.\", which names troupe's own (choose another name)");
  }
  if (actors_.count(type) != 0) {
    throw std::invalid_argument("FunctionRegistry: actor type " + base::quoted(type) +
                                " is registered already (every name means one actor type)");
  }
  if (!factory) throw std::invalid_argument("FunctionRegistry: actor type " + base::quoted(type) + " has no factory");
  actors_.emplace(type, std::move(factory));
}

const ActorFactory* FunctionRegistry::find_actor(const std::string& type) const {
  auto it = actors_.find(type);
  return it == actors_.end() ? nullptr : &it->second;
}

std::vector<std::string> FunctionRegistry::actor_types() const {
  std::vector<std::string> out;
  for (const auto& a : actors_) out.push_back(a.first);
  return out;
}

const RemoteFunction* FunctionRegistry::find(const std::string& name) const {
  auto it = functions_.find(name);
  return it == functions_.end() ? nullptr : &it->second;
}

const DatasetFunction* FunctionRegistry::find_dataset(const std::string& name) const {
  auto it = datasets_.find(name);
  return it == datasets_.end() ? nullptr : &it->second;
}

std::vector<std::string> FunctionRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& f : functions_) out.push_back(f.first);
  for (const auto& d : datasets_) out.push_back(d.first);
  std::sort(out.begin(), out.end());
  return out;
}

void FunctionRegistry::load_module(const std::string& path) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw std::invalid_argument("FunctionRegistry: cannot load module " + base::quoted(path) + ": " +
                                (why != nullptr ? why : "unknown error"));
  }
  using entry = void (*)(FunctionRegistry*);
  auto fn = reinterpret_cast<entry>(::dlsym(handle, "troupe_register_functions"));
  if (fn == nullptr) {
    ::dlclose(handle);
    throw std::invalid_argument("FunctionRegistry: module " + base::quoted(path) +
                                " has no troupe_register_functions (define it with TROUPE_MODULE)");
  }
  fn(this);  // the library stays loaded: its functions are in the registry now
}

// --- FunctionContext --------------------------------------------------------------------------

FunctionContext::FunctionContext(detail::WorkerServices& services, std::vector<Argument> args)
    : services_(&services), args_(std::move(args)) {}

const Tensor& FunctionContext::arg(std::size_t i) const {
  if (i >= args_.size()) {
    throw std::out_of_range("FunctionContext::arg: argument " + std::to_string(i) + " of " +
                            std::to_string(args_.size()));
  }
  if (args_[i].iterator != 0) {
    throw std::invalid_argument("FunctionContext::arg: argument " + std::to_string(i) +
                                " is a per-worker iterator (read it with next(" + std::to_string(i) + "))");
  }
  return args_[i].tensor;
}

data::Element FunctionContext::next(std::size_t i) {
  if (i >= args_.size()) {
    throw std::out_of_range("FunctionContext::next: argument " + std::to_string(i) + " of " +
                            std::to_string(args_.size()));
  }
  if (args_[i].iterator == 0) {
    throw std::invalid_argument("FunctionContext::next: argument " + std::to_string(i) +
                                " is a tensor, not a per-worker iterator");
  }
  return services_->iterator(args_[i].iterator, args_[i].dataset_function).get_next();
}

const std::string& FunctionContext::task() const noexcept { return services_->task; }

Tensor FunctionContext::read_variable(const std::string& name) { return read_variables({name}).at(0); }

std::vector<Tensor> FunctionContext::read_variables(const std::vector<std::string>& names) {
  // Each variable's tensor is made once, at its registered shape and dtype, and every shard's
  // elements are read from the ps task's data connection straight into its rows.
  std::vector<Tensor> out;
  std::shared_ptr<actors::shard_client> client;
  std::vector<actors::shard_client::shard_read> shards;
  for (const auto& name : names) {
    auto [v, c] = services_->variable(name);
    client = c;
    Tensor t = Tensor::empty(v.shape, v.dtype);
    char* base = static_cast<char*>(t.raw_mutable_data());
    const std::size_t row_bytes = v.shape.empty() || v.shape[0] == 0 ? t.nbytes() : t.nbytes() / static_cast<std::size_t>(v.shape[0]);
    std::int64_t row = 0;
    for (const auto& s : v.shards) {
      const std::size_t n = static_cast<std::size_t>(s.rows) * row_bytes;
      if (static_cast<std::size_t>(row) * row_bytes + n > t.nbytes()) {
        throw std::invalid_argument("variable " + base::quoted(name) + ": its shards do not fit its shape");
      }
      shards.push_back({s.ps, s.key, base + static_cast<std::size_t>(row) * row_bytes, n, detail::wire_dtype(v.dtype)});
      row += s.rows;
    }
    out.push_back(std::move(t));
  }
  if (!shards.empty()) client->read_into(shards);
  return out;
}

void FunctionContext::update(const std::vector<std::string>& names, const std::vector<Tensor>& deltas,
                             std::uint8_t op) {
  if (names.size() != deltas.size()) {
    throw std::invalid_argument("variable update: " + std::to_string(names.size()) + " names and " +
                                std::to_string(deltas.size()) + " values (expected one value per name)");
  }
  // Every shard's rows are sent from where they lie in the value.
  std::vector<actors::shard_client::shard_write> updates;
  std::shared_ptr<actors::shard_client> client;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto& name = names[k];
    const auto& delta = deltas[k];
    auto [v, c] = services_->variable(name);
    client = c;
    if (delta.shape() != v.shape || delta.dtype() != v.dtype) {
      throw std::invalid_argument("update of variable " + base::quoted(name) + ": the value is a " +
                                  std::string(dtype_name(delta.dtype())) + " tensor of " +
                                  std::to_string(delta.rank()) + " dims, the variable " +
                                  std::string(dtype_name(v.dtype)) + " with " + std::to_string(v.shape.size()) +
                                  " dims (shapes must match)");
    }
    const char* base = static_cast<const char*>(delta.raw_data());
    const std::size_t row_bytes =
        v.shape.empty() || v.shape[0] == 0 ? delta.nbytes() : delta.nbytes() / static_cast<std::size_t>(v.shape[0]);
    std::int64_t row = 0;
    for (const auto& s : v.shards) {
      const std::size_t n = static_cast<std::size_t>(s.rows) * row_bytes;
      if (static_cast<std::size_t>(row) * row_bytes + n > delta.nbytes()) {
        throw std::invalid_argument("variable " + base::quoted(name) + ": its shards do not fit its shape");
      }
      updates.push_back({s.ps, s.key, op_of(op), base + static_cast<std::size_t>(row) * row_bytes, n,
                         detail::wire_dtype(v.dtype)});
      row += s.rows;
    }
  }
  // The deltas live until update_from returns: it sends from their storage.
  if (!updates.empty()) client->update_from(updates);
}

namespace {

// Where rows `ids` of a sharded variable lie: per shard (in the variable's order) its local row
// indices and, for each, the position in `ids`. An id outside the variable is std::out_of_range.
struct rows_by_shard {
  std::vector<std::vector<std::uint64_t>> rows;
  std::vector<std::vector<std::size_t>> positions;
};

rows_by_shard locate_rows(const ShardedVariable& v, const std::string& name, const std::vector<std::int64_t>& ids) {
  std::vector<std::int64_t> starts;  // each shard's first row; the shards lie along axis 0 in order
  std::int64_t total = 0;
  for (const auto& s : v.shards) {
    starts.push_back(total);
    total += s.rows;
  }
  rows_by_shard out;
  out.rows.resize(v.shards.size());
  out.positions.resize(v.shards.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= total) {
      throw std::out_of_range("variable " + base::quoted(name) + " has " + std::to_string(total) + " rows; id " +
                              std::to_string(id) + " (at " + std::to_string(i) + ") is outside them");
    }
    const auto k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), id) - starts.begin() - 1);
    out.rows[k].push_back(static_cast<std::uint64_t>(id - starts[k]));
    out.positions[k].push_back(i);
  }
  return out;
}

// The bytes of one row of a variable of `shape` and `dtype` (a scalar variable is one row).
std::size_t row_bytes_of(const Shape& shape, DType dtype) {
  std::size_t n = dtype_size(dtype);
  for (std::size_t d = 1; d < shape.size(); ++d) n *= static_cast<std::size_t>(shape[d]);
  return n;
}

Shape rows_shape(const Shape& shape, std::size_t count) {
  Shape out{static_cast<std::int64_t>(count)};
  for (std::size_t d = 1; d < shape.size(); ++d) out.push_back(shape[d]);
  return out;
}

}  // namespace

Tensor FunctionContext::embedding_lookup(const std::string& name, const std::vector<std::int64_t>& ids) {
  auto [v, client] = services_->variable(name);
  const auto where = locate_rows(v, name, ids);
  const std::size_t row_bytes = row_bytes_of(v.shape, v.dtype);
  Tensor out = Tensor::empty(rows_shape(v.shape, ids.size()), v.dtype);
  // Each shard's rows arrive in one block, then go to their places in the result.
  std::vector<std::vector<char>> blocks(v.shards.size());
  std::vector<actors::shard_client::shard_gather> gathers;
  for (std::size_t k = 0; k < v.shards.size(); ++k) {
    if (where.rows[k].empty()) continue;
    blocks[k].resize(where.rows[k].size() * row_bytes);
    gathers.push_back({v.shards[k].ps, v.shards[k].key, where.rows[k].data(), where.rows[k].size(), blocks[k].data(),
                       row_bytes, detail::wire_dtype(v.dtype)});
  }
  if (!gathers.empty()) client->gather_into(gathers);
  char* base = static_cast<char*>(out.raw_mutable_data());
  for (std::size_t k = 0; k < v.shards.size(); ++k) {
    for (std::size_t j = 0; j < where.positions[k].size(); ++j) {
      std::memcpy(base + where.positions[k][j] * row_bytes, blocks[k].data() + j * row_bytes, row_bytes);
    }
  }
  return out;
}

void FunctionContext::scatter(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates,
                              std::uint8_t op) {
  auto [v, client] = services_->variable(name);
  const Shape expected = rows_shape(v.shape, ids.size());
  if (updates.shape() != expected || updates.dtype() != v.dtype) {
    throw std::invalid_argument("scatter into variable " + base::quoted(name) + ": the updates are a " +
                                std::string(dtype_name(updates.dtype())) + " tensor of " +
                                std::to_string(updates.rank()) + " dims, expected " + std::string(dtype_name(v.dtype)) +
                                " with shape [" + std::to_string(ids.size()) + ", the variable's other dims] (one row per id)");
  }
  const auto where = locate_rows(v, name, ids);
  const std::size_t row_bytes = row_bytes_of(v.shape, v.dtype);
  const char* base = static_cast<const char*>(updates.raw_data());
  // Each shard's rows, in the order of its ids, one block each.
  std::vector<std::vector<char>> blocks(v.shards.size());
  std::vector<actors::shard_client::shard_scatter> scatters;
  for (std::size_t k = 0; k < v.shards.size(); ++k) {
    if (where.rows[k].empty()) continue;
    blocks[k].resize(where.rows[k].size() * row_bytes);
    for (std::size_t j = 0; j < where.positions[k].size(); ++j) {
      std::memcpy(blocks[k].data() + j * row_bytes, base + where.positions[k][j] * row_bytes, row_bytes);
    }
    scatters.push_back({v.shards[k].ps, v.shards[k].key, op_of(op), where.rows[k].data(), where.rows[k].size(),
                        blocks[k].data(), row_bytes, detail::wire_dtype(v.dtype)});
  }
  if (!scatters.empty()) client->scatter_from(scatters);
}

void FunctionContext::scatter_add(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates) {
  scatter(name, ids, updates, byte_of(actors::update_op::add));
}
void FunctionContext::scatter_sub(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates) {
  scatter(name, ids, updates, byte_of(actors::update_op::subtract));
}
void FunctionContext::scatter_update(const std::string& name, const std::vector<std::int64_t>& ids,
                                     const Tensor& updates) {
  scatter(name, ids, updates, byte_of(actors::update_op::assign));
}

void FunctionContext::assign_add(const std::string& name, const Tensor& delta) {
  update({name}, {delta}, byte_of(actors::update_op::add));
}
void FunctionContext::assign_sub(const std::string& name, const Tensor& delta) {
  update({name}, {delta}, byte_of(actors::update_op::subtract));
}
void FunctionContext::assign(const std::string& name, const Tensor& value) {
  update({name}, {value}, byte_of(actors::update_op::assign));
}
void FunctionContext::assign_sub(const std::vector<std::string>& names, const std::vector<Tensor>& deltas) {
  update(names, deltas, byte_of(actors::update_op::subtract));
}

// --- WorkerServices ---------------------------------------------------------------------------

namespace detail {

void WorkerServices::set_table(const std::string& blob) {
  VariableTable t = decode_table(blob);
  std::lock_guard<std::mutex> lock(mutex);
  bool same_ps = t.ps.size() == table.ps.size();
  for (std::size_t i = 0; same_ps && i < t.ps.size(); ++i) {
    same_ps = t.ps[i].host == table.ps[i].host && t.ps[i].port == table.ps[i].port;
  }
  if (stopping) return;
  if (!same_ps || !shards) {
    std::vector<actors::task_endpoint> ps;
    for (const auto& p : t.ps) ps.push_back(actors::task_endpoint{p.task, p.host, p.port});
    shards = std::make_shared<actors::shard_client>(*system, task, std::move(ps), credentials, peer_timeout);
  }
  table = std::move(t);
}

void WorkerServices::cancel() {
  std::lock_guard<std::mutex> lock(mutex);
  stopping = true;
  if (shards) shards->cancel(task + " is stopping (its chief left, or it was told to stop)");
}

std::pair<ShardedVariable, std::shared_ptr<actors::shard_client>> WorkerServices::variable(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& v : table.variables) {
    if (v.name == name) return {v, shards};
  }
  throw std::invalid_argument("variable " + base::quoted(name) + " is unknown on " + task + " (" +
                              std::to_string(table.variables.size()) +
                              " variables known; create it with ParameterServerStrategy::create_variable before "
                              "scheduling functions that use it)");
}

data::Iterator& WorkerServices::iterator(std::uint64_t id, const std::string& dataset_function) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = iterators.find(id);
  if (it != iterators.end()) return it->second;
  const DatasetFunction* fn = functions->find_dataset(dataset_function);
  if (fn == nullptr) {
    throw std::invalid_argument("dataset function " + base::quoted(dataset_function) + " is not registered on " +
                                task);
  }
  return iterators.emplace(id, (*fn)().make_iterator()).first->second;
}

}  // namespace detail

// --- Server ---------------------------------------------------------------------------------------


struct Server::Impl {
  Runtime* runtime = nullptr;
  std::string task;
  std::string host;
  ServerOptions options;
  FunctionRegistry functions;
  detail::WorkerServices services;
  std::shared_ptr<actors::control_credentials> credentials;
  std::unique_ptr<actors::task_server> server;
  std::mutex mutex;
  std::condition_variable stopped_cv;
  bool stopped = false;
  bool chief_seen = false;

  void log(const std::string& line) {
    if (options.log) {
      options.log(line);
    } else {
      std::cerr << "troupe: " + task + ": " + line + "\n" << std::flush;
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopped = true;
    }
    stopped_cv.notify_all();
  }
};

Server::Server(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry functions, ServerOptions options)
    : Server(runtime, resolver.cluster_spec(), resolver.task_type(), resolver.task_id(), std::move(functions),
             std::move(options)) {}

Server::Server(Runtime& runtime, const ClusterSpec& cluster, const std::string& task_type, int task_id,
               FunctionRegistry functions, ServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  if (task_type != "worker" && task_type != "ps") {
    throw std::invalid_argument("Server: task type " + base::quoted(task_type) +
                                " runs no Server (expected \"worker\" or \"ps\"; the chief runs the "
                                "ClusterCoordinator)");
  }
  const std::string address = cluster.task_address(task_type, task_id);  // names a missing task
  detail::require_token(detail::cluster_addresses(cluster), options.cluster_token, options.insecure, "Server",
                        "ServerOptions::insecure");
  s.runtime = &runtime;
  s.task = detail::task_name(task_type, task_id);
  std::uint16_t port = 0;
  std::tie(s.host, port) = detail::split_host_port(address, "Server");
  s.options = std::move(options);
  s.functions = std::move(functions);
  if (task_type == "worker") detail::add_builtin_functions(s.functions);
  s.credentials = actors::make_credentials(runtime.system(), s.options.cluster_token, "Server");
  s.services.system = &runtime.system();
  s.services.task = s.task;
  s.services.functions = &s.functions;
  s.services.credentials = s.credentials;
  s.services.peer_timeout = s.options.peer_timeout;

  actors::task_handlers h;
  Impl* self = &s;
  if (task_type == "worker") {
    h.call = [self](const std::string& name, const std::string& args) {
      const RemoteFunction* fn = self->functions.find(name);
      if (fn == nullptr) {
        std::string known;
        for (const auto& n : self->functions.names()) known += (known.empty() ? "" : ", ") + n;
        return actors::call_reply{false, "function " + base::quoted(name) + " is not registered on " + self->task +
                                             " (it has: " + (known.empty() ? "none" : known) + ")"};
      }
      try {
        FunctionContext ctx(self->services, detail::decode_arguments(args));
        return actors::call_reply{true, detail::encode_tensors((*fn)(ctx))};
      } catch (const std::exception& e) {
        return actors::call_reply{false, e.what()};
      }
    };
    h.cancel = [self] { self->services.cancel(); };
    h.table = [self](const std::string& blob) {
      try {
        self->services.set_table(blob);
      } catch (const std::exception& e) {
        self->log(std::string("refused a variable table: ") + e.what());
      }
    };
  } else {
    h.update = detail::update_in_place;
    h.layout = detail::shard_layout_of;
    h.combine = detail::combine_raw;
    h.apply = detail::apply_raw;
    h.save = detail::save_shard_file;
  }
  h.spawn_actor = [self](const std::string& type, const std::string& args) {
    return detail::make_actor(self->functions, self->task, type, args);
  };
  h.event = [self](const std::string& line) { self->log(line); };
  h.chief_came = [self] {
    {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->chief_seen = true;
    }
    self->stopped_cv.notify_all();
  };
  h.chief_gone = [self] {
    if (self->options.stop_with_chief) self->stop();
  };
  actors::task_server_options so;
  so.data_port = s.options.data_port;
  so.data_timeout = s.options.peer_timeout;
  s.server =
      std::make_unique<actors::task_server>(runtime.system(), s.task, s.host, port, s.credentials, std::move(h), so);
}

Server::~Server() {
  impl_->stop();
  impl_->server.reset();
}

std::string Server::target() const {
  const auto& h = impl_->host;
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(impl_->server->port());
}

const std::string& Server::task() const { return impl_->task; }

void Server::join() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->stopped_cv.wait(lock, [&] { return impl_->stopped; });
}

void Server::stop() { impl_->stop(); }

bool serve_if_worker_or_ps(Runtime& runtime, const ClusterResolver& resolver, FunctionRegistry functions,
                           ServerOptions options) {
  const auto type = resolver.task_type();
  if (type != "worker" && type != "ps") return false;
  options.stop_with_chief = true;
  const auto wait = options.peer_timeout;
  Server server(runtime, resolver, std::move(functions), std::move(options));
  {
    // A chief that never comes (it failed before connecting) must not leave this task behind.
    auto& s = *server.impl_;
    std::unique_lock<std::mutex> lock(s.mutex);
    if (!s.stopped_cv.wait_for(lock, wait, [&] { return s.chief_seen || s.stopped; })) {
      throw Error("Server: " + s.task + ": no chief connected within " + std::to_string(wait.count()) +
                  " ms (TROUPE_START_TIMEOUT_MS); is the chief running, with the same TF_CONFIG cluster and token?");
    }
  }
  server.join();
  // The task is over and the program returns from main next. Its shutdown waits for a function
  // still running (its waits on the ps tasks end at once, its own code does not): bounded, so that
  // a task does not outlive its cluster for a result nobody will take.
  std::thread([task = server.impl_->task] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::cerr << "troupe: " << task << ": still shutting down 5 s after its chief left (a function still runs?); exiting"
              << std::endl;
    std::_Exit(0);
  }).detach();
  return true;
}

}  // namespace troupe::distribute
