#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::distribute {

/// Environment variables as name -> value: what the resolvers read, when given a snapshot instead
/// of the process environment (launchers, tests).
using EnvironmentMap = std::map<std::string, std::string>;

/// The tasks of a cluster, like tf.train.ClusterSpec: job name ("chief", "worker", "ps", "evaluator")
/// -> ordered "host:port" addresses, task i of a job at index i. A value type.
class ClusterSpec {
 public:
  using JobMap = std::map<std::string, std::vector<std::string>>;

  /// Stands for a task whose address is learnt later, at rendezvous (see MpiClusterResolver).
  static constexpr std::string_view pending_address = "pending";

  /// The empty cluster.
  ClusterSpec() = default;
  /// Checks that no job name is empty, no job is empty, every address is "host:port" (port
  /// 1..65535; IPv6 hosts in brackets) or pending_address, and no address is listed twice;
  /// a violation throws std::invalid_argument naming the task and the value. A single job with a
  /// single task needs the map spelled out, ClusterSpec(ClusterSpec::JobMap{{"worker", {"h:1"}}}),
  /// since that braced list alone would also match the copy constructor.
  explicit ClusterSpec(JobMap jobs);

  /// The job names, sorted.
  std::vector<std::string> jobs() const;
  /// Whether the cluster has a job of that name.
  bool has_job(const std::string& job) const;
  /// The addresses of a job's tasks, in task order; an unknown job throws std::invalid_argument.
  const std::vector<std::string>& task_addresses(const std::string& job) const;
  /// Tasks in a job; an unknown job throws std::invalid_argument.
  int num_tasks(const std::string& job) const;
  /// The address of one task; an unknown job throws std::invalid_argument, an index outside the
  /// job std::out_of_range.
  const std::string& task_address(const std::string& job, int index) const;
  /// Replaces one task's address (a pending one, once rendezvous has learnt it), with the
  /// constructor's checks.
  void set_task_address(const std::string& job, int index, std::string address);

  /// Whether the cluster has no jobs.
  bool empty() const { return jobs_.empty(); }
  /// Whether every address is known (none is pending_address).
  bool is_complete() const;
  /// Tasks that train: the chief (if any) and the workers. Evaluators and ps tasks do not take part.
  int num_training_tasks() const;
  /// A training task's rank among the training tasks: the chief is 0 and worker i is i + 1 when
  /// there is a chief, else worker i is i. Other jobs throw std::invalid_argument.
  int id_in_cluster(const std::string& job, int index) const;

  /// job -> addresses.
  const JobMap& as_map() const { return jobs_; }
  /// The cluster as TF_CONFIG's "cluster" value: {"chief": ["host:port"], "worker": [...]}.
  std::string as_json() const;

  friend bool operator==(const ClusterSpec& a, const ClusterSpec& b) { return a.jobs_ == b.jobs_; }
  friend bool operator!=(const ClusterSpec& a, const ClusterSpec& b) { return !(a == b); }

 private:
  JobMap jobs_;
};

/// Who is who in a multi-worker job: the cluster's tasks and which of them this process is, like
/// tf.distribute.cluster_resolver.ClusterResolver. MultiWorkerMirroredStrategy reads one.
class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  /// Every task of the cluster.
  virtual ClusterSpec cluster_spec() const = 0;
  /// This process's job: "chief", "worker", "ps" or "evaluator".
  virtual std::string task_type() const = 0;
  /// This process's index in its job.
  virtual int task_id() const = 0;
  /// Accelerators this task uses, by kind: {"GPU": Runtime::gpu_count()} unless the resolver was
  /// told otherwise. No GPUs ({"GPU": 0} or {}) means the strategy runs on the CPU.
  virtual std::map<std::string, int> num_accelerators() const;
  /// The protocol peers speak, when the configuration names one ("grpc" in TF_CONFIG).
  virtual std::optional<std::string> rpc_layer() const { return std::nullopt; }
  /// The environment the cluster runs in, when the configuration says ("cloud" from Kubeflow).
  virtual std::string environment() const { return {}; }

  /// The address of the task that coordinates the cluster: the chief's, or worker 0's when there
  /// is no chief. Every worker contacts it at rendezvous.
  std::string coordinator_address() const;
  /// coordinator_address() prefixed with "<rpc_layer>://" when there is an rpc_layer. Unlike
  /// TensorFlow, whose master() defaults to the calling task's own address, this is always the
  /// coordinator's: troupe has no per-task session target.
  std::string master() const;
  /// This task's own address; "" for an evaluator that is not listed in the cluster.
  std::string task_address() const;

 protected:
  ClusterResolver() = default;
  ClusterResolver(const ClusterResolver&) = default;
  ClusterResolver& operator=(const ClusterResolver&) = default;
};

/// Reads TF_CONFIG, as Kubeflow's training operator sets it:
///   {"cluster": {"chief": ["job-chief-0.ns.svc:2222"],
///                "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]},
///    "task": {"type": "worker", "index": 1}, "environment": "cloud", "rpc_layer": "grpc"}
/// Jobs: at most one "chief", "worker", at most one "evaluator" (which need not be listed:
/// it evaluates checkpoints and takes no part in training), and "ps" (parameter servers: they hold
/// the variables of a ParameterServerStrategy). "environment" and "rpc_layer" are optional. Every mistake throws
/// std::invalid_argument saying what to fix.
class TFConfigClusterResolver : public ClusterResolver {
 public:
  /// Reads the TF_CONFIG environment variable; unset or empty throws std::invalid_argument.
  TFConfigClusterResolver();
  /// Parses tf_config_json, the value TF_CONFIG would hold.
  explicit TFConfigClusterResolver(const std::string& tf_config_json);

  ClusterSpec cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::optional<std::string> rpc_layer() const override { return rpc_layer_; }
  std::string environment() const override { return environment_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::optional<std::string> rpc_layer_;
  std::string environment_;
};

/// A resolver from values the caller already has, like TensorFlow's SimpleClusterResolver.
class SimpleClusterResolver : public ClusterResolver {
 public:
  /// The cluster must not be empty and must list task_type with a task task_id, unless task_type
  /// is "evaluator"; else std::invalid_argument. num_accelerators is returned as given ({} means
  /// none: the CPU).
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id,
                        std::map<std::string, int> num_accelerators = {},
                        std::optional<std::string> rpc_layer = std::nullopt);

  ClusterSpec cluster_spec() const override { return spec_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::map<std::string, int> num_accelerators() const override { return num_accelerators_; }
  std::optional<std::string> rpc_layer() const override { return rpc_layer_; }

 private:
  ClusterSpec spec_;
  std::string task_type_;
  int task_id_;
  std::map<std::string, int> num_accelerators_;
  std::optional<std::string> rpc_layer_;
};

/// For programs started by srun: every task is a "worker" (task_id = SLURM_PROCID) listening on
/// its node at port_base + its index among the tasks on that node. Tasks fill nodes in block
/// order, as srun's default distribution places them. It reads
///   SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS),
///   SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST, SLURM_NODELIST): "node[01-03,07],gpu-a[1-2]",
///   SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE): "2(x3),1"; when neither is set, the
///   tasks must divide evenly among the nodes.
/// Missing variables, malformed host lists and counts that disagree throw std::invalid_argument.
class SlurmClusterResolver : public ClusterResolver {
 public:
  /// Reads the process environment.
  explicit SlurmClusterResolver(int port_base = 8888);
  /// Reads a snapshot of the environment.
  explicit SlurmClusterResolver(const EnvironmentMap& environment, int port_base = 8888);

  ClusterSpec cluster_spec() const override { return spec_; }
  std::string task_type() const override { return "worker"; }
  int task_id() const override { return task_id_; }

  /// Expands Slurm's host-list syntax: "node[01-03,07],gpu-a[1-2]" -> node01, node02, node03,
  /// node07, gpu-a1, gpu-a2 (zero padding kept; several brackets in one name multiply out).
  /// A malformed list throws std::invalid_argument quoting it.
  static std::vector<std::string> expand_hostlist(std::string_view hostlist);
  /// Expands Slurm's tasks-per-node syntax: "2(x3),1" -> {2, 2, 2, 1}.
  static std::vector<int> expand_tasks_per_node(std::string_view tasks_per_node);

 private:
  ClusterSpec spec_;
  int task_id_ = 0;
};

/// For programs started by mpirun (Open MPI: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE; MPICH and
/// Intel MPI: PMI_RANK/PMI_SIZE). Every rank is a "worker" with task_id = its rank. mpirun tells a
/// process only its rank and the world size, not where its peers listen, so what is known up
/// front is the coordinator's address, which rank 0 listens on: the cluster spec lists it for
/// worker 0 and ClusterSpec::pending_address for every other rank. Those are learnt at
/// rendezvous, when each worker reports its endpoint to the coordinator.
class MpiClusterResolver : public ClusterResolver {
 public:
  /// Reads the process environment. coordinator_address "" means TROUPE_COORDINATOR="host:port".
  explicit MpiClusterResolver(std::string coordinator_address = {});
  /// Reads a snapshot of the environment.
  explicit MpiClusterResolver(const EnvironmentMap& environment, std::string coordinator_address = {});

  ClusterSpec cluster_spec() const override { return spec_; }
  std::string task_type() const override { return "worker"; }
  int task_id() const override { return rank_; }
  /// Processes in the MPI world.
  int world_size() const { return spec_.num_tasks("worker"); }

 private:
  ClusterSpec spec_;
  int rank_ = 0;
};

}  // namespace troupe::distribute
