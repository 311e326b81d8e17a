#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/distribute/cross_device_ops.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/runtime.hpp"

namespace troupe::distribute {

/// Synchronous training with the variables on one device and the computation mirrored over the
/// local replicas (tf.distribute.experimental.CentralStorageStrategy). Replicas run as under
/// MirroredStrategy: a replica actor per compute device, collectives through shared memory. A
/// variable created in its scope has one component, on the parameter device, which every replica
/// reads; a write in replica context is a collective that every replica makes, applied once for
/// all of them (on_write aggregation decides the value as under MirroredStrategy; assign_local
/// takes the first replica's value, which every replica computed alike). on_read variables keep a
/// value per replica, as in TensorFlow. Training gives the weights MirroredStrategy gives.
class CentralStorageStrategy : public Strategy {
 public:
  /// `compute_devices`: the replicas' devices, as MirroredStrategy takes them ("CPU:0", "CPU:1",
  /// "GPU:0"...; empty means every GPU, else CPU:0). `parameter_device`: where the variables live;
  /// empty means the one compute device when there is one, else the CPU (TensorFlow's default).
  /// An unknown, repeated or absent device throws std::invalid_argument naming it.
  explicit CentralStorageStrategy(Runtime& runtime, std::vector<std::string> compute_devices = {},
                                  std::string parameter_device = "",
                                  std::shared_ptr<CrossDeviceOps> cross_device_ops = nullptr);
  ~CentralStorageStrategy() override;

  /// The device every variable of this strategy lives on.
  const Device& parameter_device() const;
};

}  // namespace troupe::distribute
