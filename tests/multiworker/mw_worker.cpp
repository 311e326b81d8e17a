// One worker of the multi-worker tests: run by run_cluster.sh in N processes with TF_CONFIG set
// (or the Slurm or mpirun variables, with MW_RESOLVER=slurm|mpi).
// Usage: mw_worker collectives | die | hang | skip | checkpoint | train | model | join | idle | compressed
//        | input | outside | steer | preempt
// Once the cluster formed it prints "replicas <R> workers <W> task <type>:<index>". Prints
// "OK <rank>" and exits 0 when every check holds; prints "FAIL ..." and exits 1 when one does not;
// prints "ERROR <message>" and exits 3 when the strategy throws.
// MW_TIMEOUT_MS sets CommunicationOptions::timeout, MW_BYTES_PER_PACK bytes_per_pack,
// MW_COMPRESSION (none, fp16, bf16) compression; MW_INPUT (data, off, file, uneven, fail) the input
// scenario of mode input.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <troupe/troupe.hpp>

#include "distribute/collectives/collectives.hpp"
#include "troupe/kernels/half_kernels.hpp"


#include "mw_modes.hpp"

using namespace troupe;
using namespace troupe::distribute;
using namespace mw;

namespace mw {

// This worker's rank, from its task alone: the chief is rank 0 and the workers follow in index
// order (TensorFlow's order of a cluster spec: chief, then worker).
int expected_rank(const ClusterResolver& resolver) {
  if (resolver.task_type() == "chief") return 0;
  const ClusterSpec spec = resolver.cluster_spec();
  return (spec.has_job("chief") ? spec.num_tasks("chief") : 0) + resolver.task_id();
}

}  // namespace mw

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    Runtime rt;
    CommunicationOptions options;
    if (const char* t = std::getenv("MW_TIMEOUT_MS")) options.timeout = std::chrono::milliseconds(std::atoi(t));
    if (const char* b = std::getenv("MW_BYTES_PER_PACK")) options.bytes_per_pack = std::strtoull(b, nullptr, 10);
    if (const char* c = std::getenv("MW_COMPRESSION")) {
      const std::string name = c;
      options.compression = name == "fp16" ? Compression::fp16 : name == "bf16" ? Compression::bf16 : Compression::none;
    }
    std::shared_ptr<ClusterResolver> resolver;
    const std::string which = std::getenv("MW_RESOLVER") ? std::getenv("MW_RESOLVER") : "tf_config";
    if (which == "slurm") {
      resolver = std::make_shared<SlurmClusterResolver>(std::atoi(std::getenv("MW_PORT_BASE")));
    } else if (which == "mpi") {
      resolver = std::make_shared<MpiClusterResolver>();
    } else {
      resolver = std::make_shared<TFConfigClusterResolver>();
    }
    MultiWorkerMirroredStrategy s(rt, options, resolver);
    const int n = s.num_replicas_in_sync();
    std::cout << "replicas " << n << " workers " << n / s.num_local_replicas() << " task "
              << s.cluster_resolver()->task_type() << ":" << s.cluster_resolver()->task_id() << std::endl;
    const int rank = expected_rank(*s.cluster_resolver());
    int rc = 0;
    if (mode == "collectives") {
      rc = collectives(s);
    } else if (mode == "die") {
      // Every worker all-reduces once; then worker MW_DYING_TASK (1 unless set) dies while the
      // others are in the next one.
      const char* dying = std::getenv("MW_DYING_TASK");
      const int victim = dying != nullptr ? std::atoi(dying) : 1;
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      if (s.cluster_resolver()->task_id() == victim) {
        std::cout << "dying" << std::endl;
        kill(getpid(), SIGKILL);
      }
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      std::cout << "FAIL the collective with a dead worker returned\n";
      rc = 1;
    } else if (mode == "hang") {
      // Worker MW_STOPPING_TASK (1 unless set) stops (as a hung process would) after the first
      // collective; the others must fail (by MW_TIMEOUT_MS, or the cluster watch) and exit.
      const char* stopping = std::getenv("MW_STOPPING_TASK");
      const int victim = stopping != nullptr ? std::atoi(stopping) : 1;
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      if (s.cluster_resolver()->task_id() == victim) {
        std::cout << "stopping" << std::endl;
        raise(SIGSTOP);
      }
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({100})); });
      std::cout << "FAIL the collective with a hung worker returned\n";
      rc = 1;
    } else if (mode == "skip") {
      // Every step all-reduces twice; task 1 skips the second all-reduce of step 2, so that its
      // step 3 meets the others' step 2: every worker must fail naming both steps and numbers.
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 4; ++step) {
        s.run([&] {
          auto* ctx = get_replica_context();
          ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, step, DType::f32));
          if (!(task == 1 && step == 2)) ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 10 * step, DType::f32));
        });
      }
      std::cout << "FAIL every step returned although worker 1 skipped a collective\n";
      rc = 1;
    } else if (mode == "stall") {
      // Six steps of one 1 MiB all-reduce; at step MW_STALL_STEP (3 unless set) worker 1 stops
      // itself (SIGSTOP) in compute (after 1.2 s of it), before the step's all-reduce, as a hung
      // process would: the chief's stall inspector must name it while the others wait;
      // run_cluster.sh continues it.
      const char* at_env = std::getenv("MW_STALL_STEP");
      const int at = at_env != nullptr ? std::atoi(at_env) : 3;
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 6; ++step) {
        s.run([&] {
          if (task == 1 && step == at) {
            // Some compute first, so that a heartbeat tells the chief where it is.
            std::this_thread::sleep_for(std::chrono::milliseconds(1200));
            std::cout << "stopping in step " << step << std::endl;
            raise(SIGSTOP);
          }
          // The steps after the stall take a while, so that the chief sees it end.
          if (step > at) std::this_thread::sleep_for(std::chrono::milliseconds(500));
          const Tensor sum = get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({262144}, 1.0f));
          if (sum.to_vector<float>()[0] != static_cast<float>(n)) throw std::runtime_error("stall: a wrong sum");
        });
      }
      std::cout << "trained 6 steps" << std::endl;
    } else if (mode == "silent-link") {
      // Five steps of one 1 MiB all-reduce; step 3's values are 777, which silent_link_shim
      // (preloaded into worker 0 by run_cluster.sh) takes as the moment its link stops forwarding.
      for (int step = 1; step <= 5; ++step) {
        s.run([&] {
          get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({262144}, step == 3 ? 777.0f : 1.0f));
        });
      }
      std::cout << "FAIL every step returned although a ring link stopped forwarding\n";
      rc = 1;
    } else if (mode == "mismatch") {
      // Every step all-reduces twice; in step 2 worker 1's second all-reduce has another dtype
      // (MW_MISMATCH=dtype: float64) or size (MW_MISMATCH=size: 8 elements instead of 4).
      const char* what_env = std::getenv("MW_MISMATCH");
      const std::string what = what_env != nullptr ? what_env : "dtype";
      const int task = s.cluster_resolver()->task_id();
      for (int step = 1; step <= 4; ++step) {
        s.run([&] {
          auto* ctx = get_replica_context();
          ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, step, DType::f32));
          if (task == 1 && step == 2) {
            ctx->all_reduce(ReduceOp::sum, what == "size" ? Tensor::full({8}, 20, DType::f32) : Tensor::full({4}, 20, DType::f64));
          } else {
            ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 10 * step, DType::f32));
          }
        });
      }
      std::cout << "FAIL every step returned although worker 1's tensor differed\n";
      rc = 1;
    } else if (mode == "tamper") {
      // Every worker all-reduces 12345 in every element, five times. run_cluster.sh preloads
      // tamper_shim into worker 0, which flips a bit of the first 12345 it sends: no worker may
      // finish with the altered sum.
      for (int k = 0; k < 5; ++k) {
        s.run([&] {
          const Tensor sum = get_replica_context()->all_reduce(ReduceOp::sum, Tensor::full({100}, 12345, DType::f32));
          if (sum.to_vector<float>() != std::vector<float>(100, 12345.0f * float(n))) {
            throw std::runtime_error("tamper: the all_reduce returned a wrong sum");
          }
        });
      }
      std::cout << "FAIL every all_reduce returned although a frame was altered\n";
      rc = 1;
    } else if (mode == "bucket-skip") {
      // Every worker's local replica 0 starts a gradient bucket that local replica 1 never starts;
      // both then all-reduce, whose merge waits for the started buckets first. The merge must
      // fail at once, naming replica 1 and the bucket, instead of waiting for it forever.
      s.run([] {
        auto* ctx = get_replica_context();
        auto& collectives = distribute::detail::collectives_of(*ctx);
        const int r = ctx->local_replica_index();
        collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({8}, 1.0f)});
        if (r == 0) collectives.start_all_reduce(r, ReduceOp::sum, {Tensor::full({8}, 2.0f)});
        ctx->all_reduce(ReduceOp::sum, Tensor::full({4}, 1.0f));
      });
      std::cout << "FAIL the step returned although replica 1 skipped a bucket\n";
      rc = 1;
    } else if (mode == "checkpoint") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = checkpoint(s, dir ? dir : "/tmp/troupe-mw-ckpt");
    } else if (mode == "preempt") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = preempt(s, dir ? dir : "/tmp/troupe-mw-preempt");
    } else if (mode == "train" || mode == "train-cnn") {
      rc = train(s, mode == "train-cnn");
    } else if (mode == "model" || mode == "model-fit") {
      rc = model_train(s, mode == "model-fit");
    } else if (mode == "idle") {
      // The cluster watch alone for MW_IDLE_MS (what bench/control_plane_cost.sh measures).
      const char* idle = std::getenv("MW_IDLE_MS");
      std::this_thread::sleep_for(std::chrono::milliseconds(idle != nullptr ? std::atoi(idle) : 1000));
      s.run([] { get_replica_context()->all_reduce(ReduceOp::sum, Tensor::zeros({1})); });
    } else if (mode == "outside") {
      const char* dir = std::getenv("MW_CKPT_DIR");
      rc = outside(s, dir ? dir : "/tmp/troupe-mw-outside");
    } else if (mode == "input") {
      const char* which = std::getenv("MW_INPUT");
      rc = input(s, which ? which : "data");
    } else if (mode == "compressed") {
      rc = compressed(s, options.compression);
    } else if (mode == "steer") {
      rc = steer(s);
    } else if (mode == "join") {
      std::cout << "joined " << s.num_replicas_in_sync() << "\n";
    }
    if (rc == 0) std::cout << "OK " << rank << "\n";
    return rc;
  } catch (const std::exception& e) {
    std::cout << "ERROR " << e.what() << std::endl;
    return 3;
  }
}
