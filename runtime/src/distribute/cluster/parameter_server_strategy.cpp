#include "troupe/distribute/parameter_server_strategy.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "caf/actor_system.hpp"
#include "distribute/cluster/cluster_net.hpp"
#include "distribute/cluster/ps_access.hpp"
#include "distribute/cluster/remote_wire.hpp"
#include "distribute/collectives/collectives.hpp"
#include "distribute/collectives/worker_group.hpp"
#include "distribute/strategies/context_state.hpp"
#include "distribute/strategies/one_replica_backend.hpp"
#include "env.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/actors/cluster_tasks.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/errors.hpp"

namespace troupe::distribute {

// --- partitioners -----------------------------------------------------------------------------

namespace {

std::int64_t total_bytes(const Shape& shape, DType dtype) {
  std::int64_t n = static_cast<std::int64_t>(dtype_size(dtype));
  for (auto d : shape) n *= d;
  return n;
}

std::vector<int> along_axis0(const Shape& shape, std::int64_t shards) {
  if (shape.empty()) return {};
  std::vector<int> out(shape.size(), 1);
  out[0] = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(shards, shape[0])));
  return out;
}

}  // namespace

FixedShardsPartitioner::FixedShardsPartitioner(int num_shards) : num_shards_(num_shards) {
  if (num_shards < 1) {
    throw std::invalid_argument("FixedShardsPartitioner: num_shards " + std::to_string(num_shards) +
                                " (expected 1 or more)");
  }
}

std::vector<int> FixedShardsPartitioner::operator()(const Shape& shape, DType) const {
  return along_axis0(shape, num_shards_);
}

MinSizePartitioner::MinSizePartitioner(std::int64_t min_shard_bytes, int max_shards)
    : min_shard_bytes_(min_shard_bytes), max_shards_(max_shards) {
  if (min_shard_bytes < 1 || max_shards < 1) {
    throw std::invalid_argument("MinSizePartitioner: min_shard_bytes " + std::to_string(min_shard_bytes) +
                                ", max_shards " + std::to_string(max_shards) + " (expected both 1 or more)");
  }
}

std::vector<int> MinSizePartitioner::operator()(const Shape& shape, DType dtype) const {
  const std::int64_t fit = total_bytes(shape, dtype) / min_shard_bytes_;
  return along_axis0(shape, std::min<std::int64_t>(max_shards_, std::max<std::int64_t>(1, fit)));
}

MaxSizePartitioner::MaxSizePartitioner(std::int64_t max_shard_bytes, int max_shards)
    : max_shard_bytes_(max_shard_bytes), max_shards_(max_shards) {
  if (max_shard_bytes < 1 || max_shards < 0) {
    throw std::invalid_argument("MaxSizePartitioner: max_shard_bytes " + std::to_string(max_shard_bytes) +
                                ", max_shards " + std::to_string(max_shards) +
                                " (expected max_shard_bytes 1 or more, max_shards 0 for no limit or more)");
  }
}

std::vector<int> MaxSizePartitioner::operator()(const Shape& shape, DType dtype) const {
  const std::int64_t bytes = total_bytes(shape, dtype);
  std::int64_t n = (bytes + max_shard_bytes_ - 1) / max_shard_bytes_;
  if (max_shards_ > 0) n = std::min<std::int64_t>(n, max_shards_);
  return along_axis0(shape, n);
}

// --- state ------------------------------------------------------------------------------------

namespace detail {

struct CoordinatorState;

struct RemoteValueState {
  std::weak_ptr<CoordinatorState> owner;  // whose failures end a wait
  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  std::vector<Tensor> value;
  std::string error;  // set: the function failed, or was cancelled
  bool cancelled = false;
};

struct CoordinatorState {
  ClusterCoordinatorOptions options;
  bool configured = false;  // a ClusterCoordinator set the options
  std::vector<std::string> workers;  // task names
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t next_id = 1;
  std::uint64_t scheduled = 0;
  std::uint64_t done = 0;       // ran to the end, with a value or an error
  std::uint64_t cancelled = 0;  // never ran: cancelled after another function failed
  std::uint64_t next_iterator = 1;
  struct Pending {
    std::string function;
    std::shared_ptr<RemoteValueState> value;
  };
  std::unordered_map<std::uint64_t, Pending> pending;
  std::optional<std::string> first_error;  // a function's, since the last join
  std::optional<std::string> ps_lost;      // for good: without the ps there is nothing to train
  // With ClusterCoordinatorOptions::ps_restart_wait: ps tasks lost and awaited, losses so far, and
  // the ps tasks reached again whose shards are to be made again (PsAccess::take_restarted_ps).
  std::set<int> ps_awaited;
  std::uint64_t ps_losses = 0;
  std::uint64_t ps_restarts = 0;
  std::vector<int> ps_restarted;
  // Sees each function's result (and the index of the worker that ran it) as it arrives; set by
  // Model::fit (PsAccess::on_result), read under the mutex.
  std::function<void(int, const std::vector<Tensor>&)> on_result;
  std::unique_ptr<actors::dispatcher> dispatcher;

  void finished(actors::closure_outcome o) {
    std::shared_ptr<RemoteValueState> value;
    std::string function;
    int worker = -1;
    std::function<void(int, const std::vector<Tensor>&)> hook;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = pending.find(o.id);
      if (it == pending.end()) return;
      value = std::move(it->second.value);
      function = std::move(it->second.function);
      pending.erase(it);
      const auto w = std::find(workers.begin(), workers.end(), o.worker);
      if (!o.cancelled && w != workers.end()) worker = static_cast<int>(w - workers.begin());
      hook = on_result;
    }
    std::vector<Tensor> result;
    std::string error;
    if (o.cancelled) {
      error = cancelled_message(function);
    } else if (o.ok) {
      try {
        result = decode_tensors(o.payload);
      } catch (const std::exception& e) {
        error = "function " + base::quoted(function) + " on " + o.worker + " sent results troupe cannot read: " +
                e.what();
      }
    } else {
      error = "function " + base::quoted(function) + " failed on " + o.worker + ": " + o.payload;
    }
    if (!error.empty() && !o.cancelled) {
      // Pending before the RemoteValue is ready: whoever saw it fail then sees schedule raise it.
      std::lock_guard<std::mutex> lock(mutex);
      if (!first_error) first_error = error;
    }
    if (hook && error.empty() && worker >= 0) hook(worker, result);  // before fetch can take it
    {
      std::lock_guard<std::mutex> lock(value->mutex);
      value->ready = true;
      value->value = std::move(result);
      value->error = error;
      value->cancelled = o.cancelled;
    }
    value->cv.notify_all();
    bool wake = !error.empty();
    {
      // Counted once the RemoteValue is ready: whoever saw every function end sees every value.
      std::lock_guard<std::mutex> lock(mutex);
      ++(o.cancelled ? cancelled : done);
      wake = wake || finished() == scheduled;
    }
    if (wake) cv.notify_all();
  }

  static std::string cancelled_message(const std::string& function) {
    return "function " + base::quoted(function) +
           " was cancelled: another function failed before it ran (schedule it again)";
  }

  // Functions that ended, run or cancelled (with the mutex held).
  std::uint64_t finished() const { return done + cancelled; }

  void ps_down(int p) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ps_awaited.insert(p);
      ++ps_losses;
    }
    cv.notify_all();
  }

  void ps_back(int p) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ps_awaited.erase(p);
      ps_restarted.push_back(p);
      ++ps_restarts;
    }
    cv.notify_all();
  }

  void lost_ps(const std::string& task, const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!ps_lost) ps_lost = "ClusterCoordinator: ps task " + task + " is lost: " + reason;
    }
    cv.notify_all();
  }
};

struct PsState {
  Runtime* runtime = nullptr;
  ClusterSpec spec;
  ServerOptions options;
  std::shared_ptr<Partitioner> partitioner;
  std::shared_ptr<actors::control_credentials> credentials;
  VariableTable table;
  int next_ps = 0;  // round-robin placement over the ps tasks
  std::shared_ptr<CoordinatorState> coordinator;
  std::string checkpoint_directory;  // the last sharded CheckpointManager's (under mutex)
  mutable std::mutex mutex;
};

}  // namespace detail

namespace detail {
namespace {

bool taken(const PsState& s, const std::string& name) {
  return std::any_of(s.table.variables.begin(), s.table.variables.end(),
                     [&](const ShardedVariable& v) { return v.name == name; });
}

// Creates the shards of a new variable on the ps tasks (s.mutex held).
ShardedVariable create_sharded(PsState& s, const std::string& name, const Tensor& initial_value, const char* who) {
  if (name.empty()) throw std::invalid_argument(std::string(who) + ": the name is empty");
  if (taken(s, name)) {
    throw std::invalid_argument(std::string(who) + ": variable " + base::quoted(name) +
                                " exists already (the workers reach variables by name: give each its own)");
  }
  if (initial_value.rank() == 0 || initial_value.shape()[0] == 0) {
    throw std::invalid_argument(std::string(who) + ": variable " + base::quoted(name) +
                                " needs at least one row along axis 0 (shards split it; reshape a scalar to {1})");
  }
  const std::int64_t rows = initial_value.shape()[0];
  int n = 1;
  if (s.partitioner) {
    auto parts = (*s.partitioner)(initial_value.shape(), initial_value.dtype());
    for (std::size_t a = 1; a < parts.size(); ++a) {
      if (parts[a] != 1) {
        throw std::invalid_argument("ParameterServerStrategy: the partitioner split axis " + std::to_string(a) +
                                    " of " + base::quoted(name) + "; only axis 0 can be split");
      }
    }
    n = parts.empty() ? 1 : parts[0];
    if (n < 1 || n > rows) {
      throw std::invalid_argument("ParameterServerStrategy: the partitioner made " + std::to_string(n) +
                                  " shards of " + base::quoted(name) + " with " + std::to_string(rows) + " rows");
    }
  }
  ShardedVariable v;
  v.name = name;
  v.shape = initial_value.shape();
  v.dtype = initial_value.dtype();
  std::int64_t row = 0;
  const int num_ps = static_cast<int>(s.table.ps.size());
  int next_ps = s.next_ps;
  std::vector<actors::dispatcher::shard_op> creations;
  for (int i = 0; i < n; ++i) {
    // As TensorFlow splits: the first rows % n shards take one row more.
    const std::int64_t r = rows / n + (i < rows % n ? 1 : 0);
    ShardedVariable::Shard shard{next_ps, r, name + "/part_" + std::to_string(i)};
    next_ps = (next_ps + 1) % num_ps;
    creations.push_back(
        {shard.ps, shard.key, actors::update_op::assign, encode_tensor(rows_of(initial_value, row, r))});
    row += r;
    v.shards.push_back(std::move(shard));
  }
  s.coordinator->dispatcher->create_shards(std::move(creations), s.options.peer_timeout);
  s.next_ps = next_ps;
  s.table.variables.push_back(v);
  s.coordinator->dispatcher->set_table(encode_table(s.table));
  return v;
}

Tensor read_sharded(PsState& s, const ShardedVariable& v) {
  std::vector<actors::dispatcher::shard_op> reads;
  for (const auto& shard : v.shards) reads.push_back({shard.ps, shard.key, actors::update_op::assign, {}});
  std::vector<Tensor> pieces;
  for (const auto& bytes : s.coordinator->dispatcher->read_shards(reads, s.options.peer_timeout)) {
    pieces.push_back(decode_tensor(bytes));
  }
  return join_rows(pieces, v.shape, v.dtype);
}

// A Variable made in the strategy's scope: its shards on the ps tasks.
class PsVariable final : public RemoteVariable {
 public:
  PsVariable(std::weak_ptr<PsState> state, ShardedVariable sharded, Shape shape)
      : state_(std::move(state)), sharded_(std::move(sharded)), shape_(std::move(shape)) {}

  const std::string& name() const override { return sharded_.name; }

  Tensor read() override {
    Tensor t = read_sharded(*strategy_state(), sharded_);
    return t.shape() == shape_ ? t : t.reshape(shape_);
  }

  void write(int op, const Tensor& value) override {
    auto s = strategy_state();
    const Tensor rows = value.shape() == sharded_.shape ? value : value.reshape(sharded_.shape);
    const auto kind = op >= 0 && op <= 0xff ? actors::update_op_of(static_cast<std::uint8_t>(op)) : std::nullopt;
    if (!kind) throw std::invalid_argument("variable " + sharded_.name + ": update operation " + std::to_string(op) +
                                           " is unknown (expected 0 assign, 1 add or 2 subtract)");
    std::int64_t row = 0;
    std::vector<actors::dispatcher::shard_op> updates;
    for (const auto& shard : sharded_.shards) {
      updates.push_back({shard.ps, shard.key, *kind, encode_tensor(rows_of(rows, row, shard.rows))});
      row += shard.rows;
    }
    s->coordinator->dispatcher->update_shards(std::move(updates), s->options.peer_timeout);
  }

 private:
  std::shared_ptr<PsState> strategy_state() const {
    auto s = state_.lock();
    if (!s) {
      throw std::logic_error("Variable " + base::quoted(sharded_.name) +
                             ": its ParameterServerStrategy was destroyed (its values lived on the ps tasks)");
    }
    return s;
  }

  std::weak_ptr<PsState> state_;
  ShardedVariable sharded_;
  Shape shape_;
};

}  // namespace

// The chief's side of a ParameterServerStrategy as a Strategy: one replica on CPU:0, as in
// TensorFlow, and variables made in scope live on the ps tasks.
class PsBackend final : public OneReplicaBackend {
 public:
  std::weak_ptr<PsState> state;  // set once the strategy made it

  void execute(Strategy& strategy, const std::function<void(int)>& fn) override {
    if (!warned_.exchange(true)) {
      // TensorFlow 2.21 logs the same warning and runs the function on the coordinator.
      const std::string line =
          "a ParameterServerStrategy method (run) was called without ClusterCoordinator::schedule: it runs on "
          "the chief, reading and writing the variables on the ps tasks, which can be slow; schedule functions "
          "to run them on the workers";
      auto s = state.lock();
      if (s && s->options.log) {
        s->options.log(line);
      } else {
        std::cerr << "troupe: " << line << std::endl;
      }
    }
    OneReplicaBackend::execute(strategy, fn);
  }

  // The chief's runtime: what a Monitor runs its metrics stream in.
  Runtime* runtime() override {
    auto s = state.lock();
    return s ? s->runtime : nullptr;
  }

  std::shared_ptr<RemoteVariable> make_remote_variable(const std::string& name, const Tensor& initial_value) override {
    auto s = state.lock();
    if (!s) throw std::logic_error("ParameterServerStrategy: variable created while the strategy is destroyed");
    std::lock_guard<std::mutex> lock(s->mutex);
    // TensorFlow's default name, and any name made unique (the workers reach variables by name;
    // each unnamed Dense layer made in the scope asks for "kernel").
    const std::string base = name.empty() ? "Variable" : name;
    std::string n = base;
    for (int k = 1; taken(*s, n); ++k) n = base + "_" + std::to_string(k);
    const Tensor rows = initial_value.rank() == 0 ? initial_value.reshape({1}) : initial_value;
    auto sharded = create_sharded(*s, n, rows, "Variable in ParameterServerStrategy's scope");
    return std::make_shared<PsVariable>(s, std::move(sharded), initial_value.shape());
  }

 private:
  std::atomic<bool> warned_{false};
};

}  // namespace detail

// --- ParameterServerStrategy ------------------------------------------------------------------

namespace {

std::vector<actors::task_endpoint> endpoints(const ClusterSpec& spec, const std::string& job) {
  std::vector<actors::task_endpoint> out;
  if (!spec.has_job(job)) return out;
  for (int i = 0; i < spec.num_tasks(job); ++i) {
    auto [host, port] = detail::split_host_port(spec.task_address(job, i), "ParameterServerStrategy");
    out.push_back(actors::task_endpoint{detail::task_name(job, i), host, port});
  }
  return out;
}

}  // namespace

ParameterServerStrategy::ParameterServerStrategy(Runtime& runtime, std::shared_ptr<ClusterResolver> resolver,
                                                 std::shared_ptr<Partitioner> partitioner, ServerOptions options)
    : Strategy(std::make_unique<detail::PsBackend>()),
      resolver_(std::move(resolver)),
      state_(std::make_shared<detail::PsState>()) {
  if (!resolver_) throw std::invalid_argument("ParameterServerStrategy: the cluster resolver is null");
  auto& s = *state_;
  s.runtime = &runtime;
  s.spec = resolver_->cluster_spec();
  if (!s.spec.has_job("ps") || !s.spec.has_job("worker")) {
    throw std::invalid_argument("ParameterServerStrategy: the cluster needs \"ps\" and \"worker\" jobs (it has: " +
                                [&] {
                                  std::string j;
                                  for (const auto& n : s.spec.jobs()) j += (j.empty() ? "" : ", ") + n;
                                  return j;
                                }() +
                                ")");
  }
  detail::require_token(detail::cluster_addresses(s.spec), options.cluster_token, options.insecure,
                        "ParameterServerStrategy", "ServerOptions::insecure");
  s.options = std::move(options);
  s.partitioner = std::move(partitioner);
  s.credentials = actors::make_credentials(runtime.system(), s.options.cluster_token, "ParameterServerStrategy");
  for (const auto& p : endpoints(s.spec, "ps")) s.table.ps.push_back(detail::VariableTable::Ps{p.task, p.host, p.port});

  auto c = std::make_shared<detail::CoordinatorState>();
  c->workers.clear();
  for (const auto& w : endpoints(s.spec, "worker")) c->workers.push_back(w.task);
  actors::dispatcher_options d;
  d.task = detail::task_name(resolver_->task_type(), resolver_->task_id());
  d.workers = endpoints(s.spec, "worker");
  d.ps = endpoints(s.spec, "ps");
  d.credentials = s.credentials;
  d.ps_timeout = s.options.peer_timeout;
  std::weak_ptr<detail::CoordinatorState> weak = c;
  auto log = s.options.log ? s.options.log : [](const std::string& line) { std::cerr << "troupe: " << line << std::endl; };
  c->dispatcher = std::make_unique<actors::dispatcher>(
      runtime.system(), std::move(d),
      [weak](actors::closure_outcome o) {
        if (auto c = weak.lock()) c->finished(std::move(o));
      },
      [weak](const std::string& task, const std::string& reason) {
        if (auto c = weak.lock()) c->lost_ps(task, reason);
      },
      log,
      [weak](int p, const std::string&, const std::string&) {
        if (auto c = weak.lock()) c->ps_down(p);
      },
      [weak](int p, const std::string&) {
        if (auto c = weak.lock()) c->ps_back(p);
      });
  s.coordinator = std::move(c);
  static_cast<detail::PsBackend&>(backend()).state = state_;
}

ParameterServerStrategy::~ParameterServerStrategy() {
  if (state_->coordinator) state_->coordinator->dispatcher.reset();  // tells every task the chief leaves
}

actors::dispatcher& detail::PsAccess::dispatcher(ParameterServerStrategy& s) { return *s.state_->coordinator->dispatcher; }

std::chrono::milliseconds detail::PsAccess::timeout(ParameterServerStrategy& s) { return s.state_->options.peer_timeout; }

void detail::PsAccess::on_result(ParameterServerStrategy& s,
                                 std::function<void(int, const std::vector<Tensor>&)> hook) {
  auto& c = *s.state_->coordinator;
  std::lock_guard<std::mutex> lock(c.mutex);
  c.on_result = std::move(hook);
}

std::chrono::milliseconds detail::PsAccess::ps_restart_wait(ParameterServerStrategy& s) {
  auto& c = *s.state_->coordinator;
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.configured ? c.options.ps_restart_wait : std::chrono::milliseconds(0);
}

std::uint64_t detail::PsAccess::ps_losses(ParameterServerStrategy& s) {
  auto& c = *s.state_->coordinator;
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.ps_losses;
}

std::optional<std::vector<int>> detail::PsAccess::await_ps_restart(ParameterServerStrategy& s, std::uint64_t seen,
                                                                   std::chrono::milliseconds settle) {
  auto& c = *s.state_->coordinator;
  std::unique_lock<std::mutex> lock(c.mutex);
  if (!c.cv.wait_for(lock, settle, [&] { return c.ps_losses > seen || c.ps_lost.has_value(); })) return std::nullopt;
  // The connector gives up on an awaited ps task after the wait (and says so through ps_lost);
  // the bound here only keeps a wedged connector from hanging fit.
  const auto bound = std::chrono::steady_clock::now() + c.options.ps_restart_wait + std::chrono::seconds(30);
  while (!c.ps_lost && !c.ps_awaited.empty()) {
    if (c.cv.wait_until(lock, bound) == std::cv_status::timeout) {
      throw Error("ClusterCoordinator: ps task(s) lost and not reached again within " +
                  std::to_string(c.options.ps_restart_wait.count() / 1000) + " s");
    }
  }
  if (c.ps_lost) throw Error(*c.ps_lost);
  std::vector<int> back = std::move(c.ps_restarted);
  c.ps_restarted.clear();
  return back;
}

void detail::PsAccess::remake_shards(ParameterServerStrategy& s, const std::vector<int>& ps) {
  auto& st = *s.state_;
  std::vector<actors::dispatcher::shard_op> creations;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    for (const auto& v : st.table.variables) {
      for (const auto& shard : v.shards) {
        if (std::find(ps.begin(), ps.end(), shard.ps) == ps.end()) continue;
        Shape shape = v.shape;
        shape[0] = shard.rows;
        creations.push_back(
            {shard.ps, shard.key, actors::update_op::assign, encode_tensor(Tensor::zeros(shape, v.dtype))});
      }
    }
  }
  st.coordinator->dispatcher->create_shards(std::move(creations), st.options.peer_timeout);
}

void detail::PsAccess::set_checkpoint_directory(ParameterServerStrategy& s, const std::string& directory) {
  std::lock_guard<std::mutex> lock(s.state_->mutex);
  s.state_->checkpoint_directory = directory;
}

std::string detail::PsAccess::checkpoint_directory(ParameterServerStrategy& s) {
  std::lock_guard<std::mutex> lock(s.state_->mutex);
  return s.state_->checkpoint_directory;
}

void detail::PsAccess::log(ParameterServerStrategy& s, const std::string& line) {
  if (s.state_->options.log) {
    s.state_->options.log(line);
  } else {
    std::cerr << "troupe: " << line << std::endl;
  }
}

int ParameterServerStrategy::num_workers() const { return state_->spec.num_tasks("worker"); }
int ParameterServerStrategy::num_ps() const { return state_->spec.num_tasks("ps"); }

ShardedVariable ParameterServerStrategy::create_variable(const std::string& name, const Tensor& initial_value) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return detail::create_sharded(*state_, name, initial_value, "ParameterServerStrategy::create_variable");
}

Tensor ParameterServerStrategy::read_variable(const std::string& name) const {
  auto& s = *state_;
  ShardedVariable v;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = std::find_if(s.table.variables.begin(), s.table.variables.end(),
                           [&](const ShardedVariable& x) { return x.name == name; });
    if (it == s.table.variables.end()) {
      throw std::invalid_argument("ParameterServerStrategy::read_variable: no variable " + base::quoted(name));
    }
    v = *it;
  }
  return detail::read_sharded(s, v);
}

std::vector<ShardedVariable> ParameterServerStrategy::variables() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->table.variables;
}

// --- RemoteValue, PerWorkerDataset --------------------------------------------------------------

std::vector<Tensor> RemoteValue::fetch() const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  while (!state_->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return state_->ready; })) {
    // A lost ps task fails every wait: the function may never finish without it.
    if (auto owner = state_->owner.lock()) {
      lock.unlock();
      {
        std::lock_guard<std::mutex> g(owner->mutex);
        if (owner->ps_lost) throw Error(*owner->ps_lost);
      }
      lock.lock();
    }
  }
  if (state_->cancelled) throw Cancelled(state_->error);
  if (!state_->error.empty()) throw Error(state_->error);
  return state_->value;
}

bool RemoteValue::is_ready() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->ready;
}

PerWorkerIterator PerWorkerDataset::make_iterator() {
  std::lock_guard<std::mutex> lock(owner_->mutex);
  return PerWorkerIterator{owner_->next_iterator++, dataset_function_};
}

// --- ClusterCoordinator -----------------------------------------------------------------------

ClusterCoordinator::ClusterCoordinator(ParameterServerStrategy& strategy, ClusterCoordinatorOptions options)
    : state_(strategy.state_->coordinator) {
  troupe::detail::check_coordinator_options(options);
  state_->options = options;
  state_->configured = true;
  state_->dispatcher->configure(options.closures_per_worker, options.reconnect_interval);
  state_->dispatcher->set_heartbeat(actors::liveness_policy{options.heartbeat_interval, options.missed_heartbeats});
  state_->dispatcher->set_stall(actors::closure_watch_options{options.stall_warning, options.stall_shutdown});
  state_->dispatcher->set_ps_restart_wait(options.ps_restart_wait);
}

ClusterCoordinator::~ClusterCoordinator() = default;

std::unique_ptr<ClusterCoordinator> ClusterCoordinator::attach(ParameterServerStrategy& strategy) {
  if (!strategy.state_->coordinator->configured) return std::make_unique<ClusterCoordinator>(strategy);
  return std::unique_ptr<ClusterCoordinator>(new ClusterCoordinator(strategy.state_->coordinator));
}

namespace {

[[noreturn]] void raise_function_error(detail::CoordinatorState& s, std::unique_lock<std::mutex>& lock) {
  // TensorFlow's rules (ClosureQueue._raise_if_error): the first error since the last raise is
  // raised once; raising it cancels every function still queued (their RemoteValues fail with
  // troupe::Cancelled) after the functions in flight finished. Errors of those are dropped.
  const std::string error = std::move(*s.first_error);
  s.first_error.reset();
  lock.unlock();
  s.dispatcher->cancel_queued();
  struct Resume {
    actors::dispatcher* d;
    ~Resume() { d->resume(); }
  } resume{s.dispatcher.get()};
  lock.lock();
  auto since = std::chrono::steady_clock::now();  // when the last worker was seen up
  while (s.finished() != s.scheduled && !s.ps_lost) {
    s.cv.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    if (s.dispatcher->workers_up() > 0) {
      since = now;
    } else if (now - since > s.options.no_worker_timeout) {
      break;  // what is in flight may never finish; the error says enough
    }
  }
  s.first_error.reset();
  throw Error("ClusterCoordinator: " + error);
}

void raise_if_failed(detail::CoordinatorState& s, std::unique_lock<std::mutex>& lock) {
  if (s.ps_lost) throw Error(*s.ps_lost);
  if (s.first_error) raise_function_error(s, lock);
}

}  // namespace

RemoteValue ClusterCoordinator::schedule_arguments(const std::string& function, std::vector<ScheduleArgument> args) {
  if (function.empty()) throw std::invalid_argument("ClusterCoordinator::schedule: the function name is empty");
  std::vector<FunctionContext::Argument> wire;
  wire.reserve(args.size());
  for (auto& a : args) {
    FunctionContext::Argument w;
    if (a.iterator.id != 0) {
      w.iterator = a.iterator.id;
      w.dataset_function = a.iterator.dataset_function;
    } else {
      w.tensor = std::move(a.tensor);
    }
    wire.push_back(std::move(w));
  }
  auto value = std::make_shared<detail::RemoteValueState>();
  value->owner = state_;
  std::uint64_t id = 0;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    id = state_->next_id++;
    ++state_->scheduled;
    if (state_->first_error) {
      // As TensorFlow's ClosureQueue.put: the function is queued, then the pending error is
      // raised, which cancels it with everything else still queued.
      ++state_->cancelled;
      value->ready = true;
      value->cancelled = true;
      value->error = detail::CoordinatorState::cancelled_message(function);
      raise_function_error(*state_, lock);
    }
    state_->pending.emplace(id, detail::CoordinatorState::Pending{function, value});
  }
  state_->dispatcher->schedule(id, function, detail::encode_arguments(wire));
  return RemoteValue(std::move(value));
}

void ClusterCoordinator::join() {
  auto& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  auto since = std::chrono::steady_clock::now();  // when the last worker was seen up
  for (;;) {
    raise_if_failed(s, lock);
    if (s.finished() == s.scheduled) return;
    s.cv.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    if (s.dispatcher->workers_up() > 0) {
      since = now;
    } else if (now - since > s.options.no_worker_timeout) {
      std::string names;
      for (const auto& w : s.workers) names += (names.empty() ? "" : ", ") + w;
      throw Error("ClusterCoordinator: no worker has been reachable for " +
                  std::to_string(s.options.no_worker_timeout.count()) + " ms while " +
                  std::to_string(s.scheduled - s.finished()) + " function(s) wait (workers: " + names + ")");
    }
  }
}

bool ClusterCoordinator::done() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  raise_if_failed(*state_, lock);
  return state_->finished() == state_->scheduled;
}

PerWorkerDataset ClusterCoordinator::create_per_worker_dataset(const std::string& dataset_function) {
  if (dataset_function.empty()) {
    throw std::invalid_argument("ClusterCoordinator::create_per_worker_dataset: the dataset function name is empty");
  }
  return PerWorkerDataset(dataset_function, state_);
}

std::uint64_t ClusterCoordinator::closures_done() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}
std::uint64_t ClusterCoordinator::closures_cancelled() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->cancelled;
}
std::uint64_t ClusterCoordinator::closures_retried() const { return state_->dispatcher->retried(); }
std::uint64_t ClusterCoordinator::workers_lost() const { return state_->dispatcher->workers_lost(); }
std::uint64_t ClusterCoordinator::ps_tasks_restarted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->ps_restarts;
}

}  // namespace troupe::distribute
