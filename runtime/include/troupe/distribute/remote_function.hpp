#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/data/dataset.hpp"
#include "troupe/distribute/actor.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute {

class FunctionRegistry;
namespace detail {
struct WorkerServices;
void add_builtin_functions(FunctionRegistry& registry);
}

/// An optimizer that the ps tasks apply themselves (Keras's optimizers, their names and defaults):
/// a worker sends only gradients, one message per shard, and each shard's ps task updates it with
/// the optimizer's slots kept beside it (made as zeros by the shard's first update). Adam's bias
/// correction counts the updates that shard has had (its step t), as the variable's own updates
/// when functions run asynchronously. The arithmetic is nn::SGD's and nn::Adam's, element for
/// element: one worker applying gradients gives the bits that optimizer gives in one process.
/// A variable takes updates of one optimizer: another kind later is an error naming both.
struct ShardOptimizer {
  enum class Kind { sgd, momentum, adam, adamw };
  /// tf.keras.optimizers.SGD: w -= lr·g, or with momentum > 0 the velocity v = momentum·v - lr·g
  /// and w += v (nesterov: w += momentum·v - lr·g). Ranges as nn::SGD's (std::invalid_argument).
  static ShardOptimizer sgd(float learning_rate = 0.01f, float momentum = 0.0f, bool nesterov = false);
  /// tf.keras.optimizers.Adam.
  static ShardOptimizer adam(float learning_rate = 0.001f, float beta_1 = 0.9f, float beta_2 = 0.999f,
                             float epsilon = 1e-7f);
  /// tf.keras.optimizers.AdamW: Adam after the decoupled decay w -= w·weight_decay·learning_rate.
  static ShardOptimizer adamw(float learning_rate = 0.001f, float weight_decay = 0.004f, float beta_1 = 0.9f,
                              float beta_2 = 0.999f, float epsilon = 1e-7f);

  Kind kind = Kind::sgd;
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;
  float beta_1 = 0.9f;
  float beta_2 = 0.999f;
  float epsilon = 1e-7f;
  float weight_decay = 0.0f;
};

/// What a function scheduled by a ClusterCoordinator sees on the worker that runs it: its
/// arguments (tensors and per-worker iterators, in the order given to schedule) and the
/// variables of the ParameterServerStrategy, which live on the ps tasks.
class FunctionContext {
 public:
  /// Arguments given to schedule.
  std::size_t num_args() const noexcept { return args_.size(); }
  /// Argument i, a tensor; std::out_of_range past the end, std::invalid_argument when it is a
  /// per-worker iterator.
  const Tensor& arg(std::size_t i) const;
  /// Argument i, a per-worker iterator (from create_per_worker_dataset): this worker's next
  /// element; at the end troupe::OutOfRange.
  data::Element next(std::size_t i);

  /// A variable of the strategy, its shards read from the ps tasks and joined along axis 0; an
  /// unknown name is std::invalid_argument naming it.
  Tensor read_variable(const std::string& name);
  /// Several variables, every shard's read in flight at once (one round trip, not one per shard).
  std::vector<Tensor> read_variables(const std::vector<std::string>& names);
  /// Subtracts deltas[i] from variable names[i] for every i, all updates in flight at once (what
  /// an SGD step sends: learning rate x gradient); waits until every ps task applied them.
  void assign_sub(const std::vector<std::string>& names, const std::vector<Tensor>& deltas);
  /// Updates a variable on the ps tasks, each shard with its rows of `delta` (the variable's shape
  /// and dtype), applied there as it arrives: updates from different workers are not ordered.
  void assign_add(const std::string& name, const Tensor& delta);
  void assign_sub(const std::string& name, const Tensor& delta);
  void assign(const std::string& name, const Tensor& value);
  /// Rows `ids` of a variable, in that order (tf.nn.embedding_lookup on a sharded variable): a
  /// tensor of shape [ids.size(), the variable's other dimensions]; only those rows travel, each
  /// from the ps task that holds it. An id outside the variable's rows is std::out_of_range naming
  /// the variable, the id and its row count.
  Tensor embedding_lookup(const std::string& name, const std::vector<std::int64_t>& ids);
  /// Adds `updates` (shape [ids.size(), the variable's other dimensions], its dtype) to rows `ids`
  /// of a variable on the ps tasks (tf.Variable.scatter_add); a row named twice gets both.
  void scatter_add(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates);
  /// Subtracts them (tf.Variable.scatter_sub: an SGD step on the rows a batch used).
  void scatter_sub(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates);
  /// Sets them (tf.Variable.scatter_update); of a row named twice the last wins.
  void scatter_update(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates);

  /// Applies gradients[i] (variable names[i]'s shape and dtype, float32 or float64) to every
  /// variable with `optimizer`, on the ps tasks: one message per shard, all in flight at once;
  /// waits until every ps task applied them (Optimizer.apply_gradients for variables that live on
  /// ps tasks). Updates from different workers are applied as they arrive, not ordered.
  void apply_gradients(const ShardOptimizer& optimizer, const std::vector<std::string>& names,
                       const std::vector<Tensor>& gradients);
  /// The sparse form, for an embedding: gradient rows `gradients` (shape [ids.size(), the
  /// variable's other dimensions]) for rows `ids`. Only those rows and their slots change (a row
  /// named twice gets the sum of its gradients, in the order given, as one update), each shard's
  /// rows in one message.
  void apply_gradients(const ShardOptimizer& optimizer, const std::string& name, const std::vector<std::int64_t>& ids,
                       const Tensor& gradients);

  /// The task running the function: "/job:worker/replica:0/task:1".
  const std::string& task() const noexcept;

  struct Argument {
    Tensor tensor;
    std::uint64_t iterator = 0;     ///< non-zero: a per-worker iterator
    std::string dataset_function;   ///< the dataset function of that iterator
  };
  FunctionContext(detail::WorkerServices& services, std::vector<Argument> args);

 private:
  void update(const std::vector<std::string>& names, const std::vector<Tensor>& deltas, std::uint8_t op);
  void scatter(const std::string& name, const std::vector<std::int64_t>& ids, const Tensor& updates, std::uint8_t op);
  detail::WorkerServices* services_;
  std::vector<Argument> args_;
};

/// A function that runs on a worker: C++ closures cannot travel, so workers find it by name.
using RemoteFunction = std::function<std::vector<Tensor>(FunctionContext&)>;
/// A function that makes a worker's dataset, for ClusterCoordinator::create_per_worker_dataset.
using DatasetFunction = std::function<data::Dataset()>;

/// The functions a process can run for a ClusterCoordinator, by name. A value: a Server holds the
/// one it was given; nothing is global. The same name must mean the same function in every
/// process (they link the same code, or load the same module). Names beginning with "troupe."
/// are troupe's own: a worker's Server adds its built-in functions ("troupe.fit.train_step", what
/// Model::fit schedules under ParameterServerStrategy) to the registry it was given.
class FunctionRegistry {
 public:
  /// Adds a function; an empty or already registered name, or one beginning with "troupe.", is
  /// std::invalid_argument.
  void add(const std::string& name, RemoteFunction fn);
  /// Adds a dataset function, under the same rules (one name space with functions).
  void add_dataset(const std::string& name, DatasetFunction fn);

  /// Adds an actor type (docs/actors.md) that ActorCluster::spawn names, here or on a task whose
  /// Server (or troupe-worker --module) registered it. Actor types have their own name space,
  /// under the same rules: an empty or already registered name, one beginning with "troupe.", or
  /// an empty factory is std::invalid_argument.
  void add_actor(const std::string& type, ActorFactory factory);
  /// The actor type's factory, or nullptr.
  const ActorFactory* find_actor(const std::string& type) const;
  /// Every actor type, sorted.
  std::vector<std::string> actor_types() const;

  /// The function, or nullptr.
  const RemoteFunction* find(const std::string& name) const;
  const DatasetFunction* find_dataset(const std::string& name) const;
  /// Every name, sorted.
  std::vector<std::string> names() const;

  /// Loads a shared library with dlopen and calls its entry point, troupe_register_functions
  /// (defined by TROUPE_MODULE), with this registry. The library stays loaded for the process.
  /// A file that does not load or lacks the entry point is std::invalid_argument naming it.
  void load_module(const std::string& path);

 private:
  friend void detail::add_builtin_functions(FunctionRegistry& registry);
  void add_builtin(const std::string& name, RemoteFunction fn);
  std::map<std::string, RemoteFunction> functions_;
  std::map<std::string, DatasetFunction> datasets_;
  std::map<std::string, ActorFactory> actors_;
};

}  // namespace troupe::distribute

/// Defines a module's entry point: TROUPE_MODULE(registry) { registry.add("step", ...); } (and
/// registry.add_actor("trial", ...) for actor types).
/// Build the module as a shared library linking troupe::troupe; troupe-worker --module loads it.
#define TROUPE_MODULE(registry)                                                                   \
  static void troupe_module_body(::troupe::distribute::FunctionRegistry& registry);               \
  extern "C" __attribute__((visibility("default"))) void troupe_register_functions(              \
      ::troupe::distribute::FunctionRegistry* r) {                                                \
    troupe_module_body(*r);                                                                       \
  }                                                                                               \
  static void troupe_module_body(::troupe::distribute::FunctionRegistry& registry)
