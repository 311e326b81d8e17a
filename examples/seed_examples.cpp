// The examples of tf.distribute's documentation, run on troupe: MirroredStrategy over CPU
// replicas in one process. Usage: seed_examples [replicas] [--strategy mirrored|central_storage]
// (default 4 and mirrored; seed_examples --help)

#include <iostream>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;

using namespace troupe;
using namespace troupe::distribute;

namespace {

std::vector<std::string> cpus(int n) {
  std::vector<std::string> devices;
  for (int i = 0; i < n; ++i) devices.push_back("CPU:" + std::to_string(i));
  return devices;
}

template <class T>
std::string join(const std::vector<T>& values) {
  std::string out = "(";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += values[i].to_string();
  }
  return out + ")";
}

}  // namespace

// Every example under strategy S: MirroredStrategy, or CentralStorageStrategy, which must print
// the same values (its replicas compute as MirroredStrategy's do; only variables live elsewhere).
template <class S>
void run_examples(Runtime& rt, int replicas) {
  {
    std::cout << "1. gather, two replicas, each holding [[1], [2]]\n";
    S s(rt, {"CPU:0", "CPU:1"});
    auto v = s.experimental_distribute_values_from_function(
        [](const ValueContext&) { return Tensor::from_vector<int>({1, 2}, {2, 1}); });
    Tensor g = s.gather(v, 0);
    std::cout << "   " << g.to_string() << "  shape " << shape_to_string(g.shape()) << "\n";
  }
  {
    std::cout << "2. gather, four replicas, each reshape(range(6), [1, 2, 3])\n";
    S s(rt, cpus(4));
    auto v = s.experimental_distribute_values_from_function(
        [](const ValueContext&) { return Tensor::range(6, DType::i32).reshape({1, 2, 3}); });
    for (int axis = 0; axis < 3; ++axis) {
      Tensor g = s.gather(v, axis);
      std::cout << "   axis " << axis << ": shape " << shape_to_string(g.shape());
      if (axis == 2) std::cout << "  " << g.to_string();
      std::cout << "\n";
    }
  }
  {
    std::cout << "3. reduce of replica ids, two replicas\n";
    S s(rt, {"CPU:0", "CPU:1"});
    auto ids = s.run([] { return Tensor::scalar<int>(get_replica_context()->replica_id_in_sync_group()); });
    const Tensor total = s.reduce(ReduceOp::sum, ids, std::nullopt);
    std::cout << "   " << total.item<int>() << "\n";
  }
  {
    std::cout << "4. reduce axis semantics: [0, 1, 2, 3] and [4, 5, 6, 7]\n";
    S s(rt, {"CPU:0", "CPU:1"});
    auto v = s.experimental_distribute_values_from_function([](const ValueContext& c) {
      return Tensor::range(4, DType::f32) + Scalar(4 * c.replica_id_in_sync_group);
    });
    std::cout << "   reduce(\"SUM\", v, None) -> " << s.reduce("SUM", v, std::nullopt).to_string() << "\n";
    std::cout << "   reduce(\"SUM\", v, 0)    -> " << s.reduce("SUM", v, 0).to_string() << "\n";
    auto partial = s.experimental_distribute_values_from_function([](const ValueContext& c) {
      return c.replica_id_in_sync_group == 0 ? Tensor::from_vector<float>({0, 1, 2, 3})
                                             : Tensor::from_vector<float>({4, 5});
    });
    std::cout << "   last partial batch [0, 1, 2, 3] and [4, 5]: reduce(MEAN, v, 0) -> "
              << s.reduce(ReduceOp::mean, partial, 0).to_string() << "\n";
    try {
      s.reduce(ReduceOp::sum, partial, std::nullopt);
    } catch (const std::invalid_argument& e) {
      std::cout << "   reduce(SUM, v, None) on them -> invalid_argument: " << e.what() << "\n";
    }
  }
  S s(rt, cpus(replicas));
  std::cout << "Examples 5-8 on " << replicas << " replicas:\n";
  {
    auto r = s.run([](const Tensor& x) { return x * 2.0f; }, Tensor::scalar<float>(3.0f));
    std::cout << "5. run with a plain argument 3.0, fn x*2 -> " << join(s.experimental_local_results(r)) << "\n";
  }
  {
    auto n = s.experimental_distribute_values_from_function(
        [](const ValueContext& c) { return Tensor::scalar<int>(c.num_replicas_in_sync); });
    auto r = s.run([](const Tensor& x) { return x * 2; }, n);
    std::cout << "6. distributed values num_replicas_in_sync, fn x*2 -> " << join(s.experimental_local_results(r))
              << "\n";
  }
  {
    auto r = s.run([](const Tensor& x) { return get_replica_context()->all_reduce(ReduceOp::sum, x); },
                   s.experimental_distribute_values_from_function(
                       [](const ValueContext& c) { return Tensor::scalar<int>(c.replica_id_in_sync_group); }));
    std::cout << "7. all_reduce(SUM) of replica ids -> " << join(s.experimental_local_results(r)) << "\n";
  }
  {
    const std::vector<double> host = [&] {
      std::vector<double> v;
      for (int i = 0; i < replicas + 1; ++i) v.push_back(static_cast<double>(replicas + 1 - i));
      return v;
    }();
    auto v = s.experimental_distribute_values_from_function(
        [&](const ValueContext& c) { return Tensor::scalar<double>(host[static_cast<std::size_t>(c.replica_id_in_sync_group)]); });
    std::cout << "8. values from a host array indexed by replica id -> " << join(s.experimental_local_results(v))
              << "\n";
  }
}

int main(int argc, char** argv) {
  int replicas = 4;
  std::string strategy = "mirrored";
  CLI::App app{"The examples of tf.distribute's documentation on MirroredStrategy over CPU replicas.",
               "seed_examples"};
  troupe::examples::show_defaults(app);
  app.add_option("replicas", replicas, "CPU replicas for examples 5-8")->check(in_range(1, 1024));
  app.add_option("--strategy", strategy, "the strategy every example runs under")
      ->check(CLI::IsMember({"mirrored", "central_storage"}));
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime rt;
    if (strategy == "central_storage") {
      run_examples<CentralStorageStrategy>(rt, replicas);
    } else {
      run_examples<MirroredStrategy>(rt, replicas);
    }
    return 0;
  });
}
