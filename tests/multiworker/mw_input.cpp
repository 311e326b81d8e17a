// mw_worker's mode input: datasets across workers under every AutoShardPolicy, uneven ones, a failing one.
#include "mw_modes.hpp"

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

using namespace troupe;
using namespace troupe::distribute;

namespace mw {

namespace {

// Every step all-reduces its rows (so a worker that stopped early would leave the others waiting
// in that collective), and every element's ids are counted on the worker that got them. Returns
// the steps run; `rows` gets the rows of every step summed over the cluster, `local` the ids this
// worker saw.
template <class Ids>
int consume(MultiWorkerMirroredStrategy& s, const DistributedDataset& dist, std::int64_t& rows,
            std::vector<std::int64_t>& local, Ids ids) {
  int steps = 0;
  for (const PerReplica<data::Element>& x : dist) {
    auto global = s.run([](const data::Element& e) {
      return get_replica_context()->all_reduce(ReduceOp::sum, Tensor::scalar<std::int64_t>(e[0].shape()[0]));
    }, x);
    const Tensor step_rows = s.experimental_local_results(global)[0];
    rows += step_rows.item<std::int64_t>();
    for (const data::Element& e : x.values()) {
      for (std::int64_t id : ids(e)) {
        if (id < 0 || id >= static_cast<std::int64_t>(local.size())) {
          std::cout << "FAIL id " << id << " outside the data\n";
          ++failures;
          continue;
        }
        ++local[static_cast<std::size_t>(id)];
      }
    }
    ++steps;
  }
  return steps;
}

// How often each id was seen over the whole cluster.
std::vector<std::int64_t> cluster_counts(MultiWorkerMirroredStrategy& s, const std::vector<std::int64_t>& local) {
  const Tensor mine = Tensor::from_vector(local, {static_cast<std::int64_t>(local.size())});
  const int per_worker = s.num_local_replicas();
  auto parts = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    return c.replica_id_in_sync_group % per_worker == 0 ? mine : Tensor::zeros(mine.shape(), DType::i64);
  });
  return s.reduce(ReduceOp::sum, parts, std::nullopt).to_vector<std::int64_t>();
}

}  // namespace

// Input across workers. data, off, file: experimental_distribute_dataset of 6 CSV files of 3..8
// rows (ids 0..32) batched by 4, under AutoShardPolicy DATA, OFF or FILE; every worker writes the
// same files into a directory of its own, as if on a shared file system. DATA and FILE: every id
// is seen once over the cluster; OFF: once per worker; FILE: a worker sees only the ids of its
// own files (w, w + W, ...). uneven: distribute_datasets_from_function where worker w's dataset
// holds 11, 4, 0 or 7 ids (by rank) batched by 2 per replica: every worker runs as many steps as
// the worker with most data, the others get empty batches (dtype int64, shape [0]) meanwhile, and
// every id is seen once; uneven-replica: the same with a pipeline per replica (11, 4, 0, 7, 5, 2,
// 9, 1 ids by pipeline). fail: worker 1's input fails. Prints "input steps <N>".
int input(MultiWorkerMirroredStrategy& s, const std::string& which) {
  const int local = s.num_local_replicas();
  const int workers = s.num_replicas_in_sync() / local;
  const int rank = expected_rank(*s.cluster_resolver());
  std::int64_t rows = 0;
  int steps = 0;
  std::vector<std::int64_t> counts;
  if (which == "fail") {
    // Worker 1's dataset fails at its third element; worker 0's holds five. Both must stop at
    // that step: worker 1 with the cause, worker 0 naming worker 1.
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const int me = ctx.input_pipeline_id;
      return data::Dataset::range(5).map([me](const data::Element& e) {
        if (me == 1 && e[0].item<std::int64_t>() == 2) throw std::runtime_error("bad record 2 in worker 1's shard");
        return e;
      }).batch(1);
    });
    std::vector<std::int64_t> local_ids(5, 0);
    steps = consume(s, dist, rows, local_ids, [](const data::Element& e) { return e[0].to_vector<std::int64_t>(); });
    std::cout << "FAIL the pass ended after " << steps << " steps although worker 1 failed to read\n";
    return 1;
  }
  if (which == "fit") {
    // Model::fit over distribute_datasets_from_function with 12, 5 or 0 samples per worker (by
    // rank), 2 per replica per step, for 2 epochs: every worker takes every step, the samples
    // counted are the cluster's, and every worker ends with the same weights.
    const std::vector<std::int64_t> sizes{12, 5, 0, 7};
    std::int64_t total = 0, most_steps = 0;
    for (int w = 0; w < workers; ++w) {
      total += sizes[static_cast<std::size_t>(w)];
      most_steps = std::max(most_steps, ((sizes[static_cast<std::size_t>(w)] + 1) / 2 + local - 1) / local);
    }
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
    model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const std::int64_t n = sizes[static_cast<std::size_t>(ctx.input_pipeline_id)];
      std::vector<float> x, y;
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(ctx.input_pipeline_id * 100 + i) / 50.0f;
        x.insert(x.end(), {v, 1.0f - v, 0.5f});
        y.push_back(2.0f * v - 1.0f);
      }
      return data::Dataset::from_tensor_slices({Tensor::from_vector(x, {n, 3}), Tensor::from_vector(y, {n, 1})})
          .batch(ctx.get_per_replica_batch_size(2 * ctx.num_replicas_in_sync));
    });
    nn::FitOptions quiet;
    quiet.verbose = 0;
    const nn::History history = model.fit(dist, 2, -1, quiet);
    expect_eq(history.steps, 2 * most_steps, "fit took the steps of the worker with most data");
    expect_eq(history.samples, 2 * total, "fit counted the samples of every worker");
    std::vector<Tensor> weights;
    for (const Variable& v : model.trainable_variables()) weights.push_back(s.experimental_local_results(v).front());
    std::cout << "fit weights " << hash_bits(weights) << "\n";
    steps = static_cast<int>(history.steps);
    std::cout << "input steps " << steps << "\n";
    return failures == 0 ? 0 : 1;
  }
  if (which == "fit-data") {
    // Model::fit over experimental_distribute_dataset (AutoShardPolicy DATA) of 25 samples batched
    // by 10, for 2 epochs: a global batch that the replicas do not split evenly (2 workers of 2
    // replicas: 3, 3, 2, 2 rows) and a last batch of 5 rows (3, 2, 0, 0: worker 1 gets none).
    // Every worker takes every step (one with no rows too), counts the cluster's samples, and
    // ends with the weights of the same fit in one process with one replica.
    const std::int64_t n = 25, batch = 10;
    std::vector<float> x, y;
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i) / 10.0f;
      x.insert(x.end(), {v, 1.0f - v, 0.5f});
      y.push_back(2.0f * v - 1.0f);
    }
    const data::Dataset samples =
        data::Dataset::from_tensor_slices({Tensor::from_vector(x, {n, 3}), Tensor::from_vector(y, {n, 1})}).batch(batch);
    nn::FitOptions quiet;
    quiet.verbose = 0;
    std::vector<float> expected;
    {
      nn::Model alone(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
      alone.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
      alone.fit(samples, 2, -1, quiet);
      for (const Variable& v : alone.trainable_variables()) {
        for (float w : v.value().to_vector<float>()) expected.push_back(w);
      }
    }
    auto scope = s.scope();
    nn::Model model(nn::Sequential({nn::Dense(3, 1, nn::Activation::none, 9)}));
    model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::mean_squared_error());
    InputOptions options;
    options.auto_shard_policy = AutoShardPolicy::data;
    const nn::History history = model.fit(s.experimental_distribute_dataset(samples, options), 2, -1, quiet);
    expect_eq(history.steps, std::int64_t{2 * 3}, "fit took every global batch's step on every worker");
    expect_eq(history.samples, 2 * n, "fit counted each global batch's rows once (" + std::to_string(history.samples) + ")");
    std::vector<Tensor> weights;
    std::vector<float> got;
    for (const Variable& v : model.trainable_variables()) {
      weights.push_back(s.experimental_local_results(v).front());
      for (float w : weights.back().to_vector<float>()) got.push_back(w);
    }
    expect_eq(got.size(), expected.size(), "as many weights as the model in one process");
    for (std::size_t i = 0; i < got.size() && i < expected.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > 1e-5f * (1.0f + std::abs(expected[i]))) {
        std::cout << "FAIL weight " << i << " is " << got[i] << ", in one process " << expected[i] << "\n";
        ++failures;
      }
    }
    std::cout << "fit weights " << hash_bits(weights) << "\n";
    std::cout << "input steps " << history.steps << "\n";
    return failures == 0 ? 0 : 1;
  }
  if (which == "uneven" || which == "uneven-replica") {
    // One pipeline per worker, or (uneven-replica) per replica, each with its own number of ids.
    const bool per_replica = which == "uneven-replica";
    const std::vector<std::int64_t> sizes{11, 4, 0, 7, 5, 2, 9, 1};
    const int pipelines = per_replica ? workers * local : workers;
    std::int64_t total = 0, most_steps = 0;
    std::vector<std::int64_t> offset;
    for (int p = 0; p < pipelines; ++p) {
      offset.push_back(total);
      total += sizes[static_cast<std::size_t>(p)];
      const std::int64_t batches = (sizes[static_cast<std::size_t>(p)] + 1) / 2;
      most_steps = std::max(most_steps, per_replica ? batches : (batches + local - 1) / local);
    }
    InputOptions options;
    if (per_replica) options.experimental_replication_mode = InputReplicationMode::per_replica;
    auto dist = s.distribute_datasets_from_function([&](const InputContext& ctx) {
      const std::int64_t n = sizes[static_cast<std::size_t>(ctx.input_pipeline_id)];
      return data::Dataset::from_tensor_slices({Tensor::range(n) + Scalar(offset[static_cast<std::size_t>(ctx.input_pipeline_id)])})
          .batch(ctx.get_per_replica_batch_size(2 * ctx.num_replicas_in_sync));
    }, options);
    std::vector<std::int64_t> local_ids(static_cast<std::size_t>(total), 0);
    int empties = 0;
    steps = consume(s, dist, rows, local_ids, [&](const data::Element& e) {
      if (e[0].dtype() != DType::i64 || e[0].rank() != 1) {
        std::cout << "FAIL an element of dtype " << dtype_name(e[0].dtype()) << " shape " << shape_to_string(e[0].shape()) << "\n";
        ++failures;
      }
      if (e[0].shape()[0] == 0) ++empties;
      return e[0].to_vector<std::int64_t>();
    });
    expect_eq(steps, static_cast<int>(most_steps), "as many steps as the worker with most data");
    expect_eq(rows, total, "every row counted once over the steps");
    if (!per_replica && sizes[static_cast<std::size_t>(rank)] == 0) {
      expect_eq(empties, steps * local, "a worker without data gets empty batches");
    }
    counts = cluster_counts(s, local_ids);
    expect_eq(counts, std::vector<std::int64_t>(static_cast<std::size_t>(total), 1), "every id seen once");
  } else {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("troupe-mw-input-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::vector<std::string> paths;
    std::vector<int> file_of;
    int id = 0;
    for (int f = 0; f < 6; ++f) {
      paths.push_back((dir / ("part-" + std::to_string(f) + ".csv")).string());
      std::ofstream out(paths.back());
      out << "id\n";
      for (int k = 0; k < 3 + f; ++k, ++id) {
        out << id << "\n";
        file_of.push_back(f);
      }
    }
    InputOptions options;
    options.auto_shard_policy = which == "off" ? AutoShardPolicy::off : which == "file" ? AutoShardPolicy::file : AutoShardPolicy::data;
    auto dist = s.experimental_distribute_dataset(data::csv_files_dataset(paths).batch(4), options);
    std::vector<std::int64_t> local_ids(static_cast<std::size_t>(id), 0);
    steps = consume(s, dist, rows, local_ids, [](const data::Element& e) {
      std::vector<std::int64_t> out;
      for (float v : e[0].to_vector<float>()) out.push_back(static_cast<std::int64_t>(v));
      return out;
    });
    std::filesystem::remove_all(dir);
    const std::int64_t copies = which == "off" ? workers : 1;
    expect_eq(rows, copies * id, "the steps' rows over the cluster");
    counts = cluster_counts(s, local_ids);
    expect_eq(counts, std::vector<std::int64_t>(static_cast<std::size_t>(id), copies), "how often each id was seen");
    if (which == "file") {
      for (int i = 0; i < id; ++i) {
        const bool mine = file_of[static_cast<std::size_t>(i)] % workers == rank;
        expect_eq(local_ids[static_cast<std::size_t>(i)], std::int64_t{mine ? 1 : 0},
                  "id " + std::to_string(i) + " of file " + std::to_string(file_of[static_cast<std::size_t>(i)]) +
                      (mine ? " read here" : " not read here"));
      }
    }
  }
  std::cout << "input steps " << steps << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace mw
