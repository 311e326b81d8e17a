// An application that uses an installed troupe through its CMake package.
#include <iostream>

#include <troupe/troupe.hpp>

int main() {
  troupe::Runtime rt;
  troupe::distribute::MirroredStrategy s(rt, {"CPU:0", "CPU:1", "CPU:2"});
  auto ones = s.run([] {
    auto* ctx = troupe::distribute::get_replica_context();
    return ctx->all_reduce(troupe::distribute::ReduceOp::sum, troupe::Tensor::scalar<int>(ctx->replica_id_in_sync_group() + 1));
  });
  std::cout << "sum over 3 replicas: " << s.experimental_local_results(ones)[0].item<int>() << "\n";
  return 0;
}
