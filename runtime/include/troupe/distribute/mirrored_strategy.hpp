#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {

/// Synchronous training on several devices of one process (tf.distribute.MirroredStrategy). Each
/// device gets a replica actor with its own thread; a coordinator actor sends it each step and
/// gathers the results; the replicas' collectives run through shared memory.
class MirroredStrategy : public Strategy {
 public:
  /// `devices`: "CPU:0", "CPU:1", "GPU:0"...; empty means every GPU, else CPU:0. An unknown,
  /// repeated or absent device (a GPU on a machine without one) throws std::invalid_argument.
  /// `cross_device_ops`: what reduce() uses; nullptr picks NcclAllReduce on GPUs and
  /// ReductionToOneDevice on CPUs.
  explicit MirroredStrategy(Runtime& runtime, std::vector<std::string> devices = {},
                            std::shared_ptr<CrossDeviceOps> cross_device_ops = nullptr);
  ~MirroredStrategy() override;
};

/// Everything on one device (tf.distribute.OneDeviceStrategy): one replica with its own actor.
class OneDeviceStrategy : public Strategy {
 public:
  OneDeviceStrategy(Runtime& runtime, std::string device);
  ~OneDeviceStrategy() override;
};

}  // namespace troupe::distribute
