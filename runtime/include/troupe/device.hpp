#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace troupe {

/// A device a replica runs on: "CPU:0", "GPU:1", or TensorFlow's long form
/// "/job:worker/replica:0/task:1/device:CPU:0". CPU devices are logical: CPU:0..CPU:k are
/// k+1 replica threads sharing the host.
class Device {
 public:
  enum class Type { cpu, gpu };

  /// CPU:0.
  Device() = default;
  Device(Type type, int index) : type_(type), index_(index) {}

  /// Parses "CPU:0", "gpu:1", "/device:GPU:0", "/cpu:0" or the full
  /// "/job:J/replica:R/task:T/device:TYPE:I" (any prefix of the job/replica/task part).
  /// Anything else throws std::invalid_argument saying what was expected.
  static Device parse(std::string_view spec);

  Type type() const noexcept { return type_; }
  int index() const noexcept { return index_; }
  bool is_gpu() const noexcept { return type_ == Type::gpu; }
  const std::optional<std::string>& job() const noexcept { return job_; }
  std::optional<int> replica() const noexcept { return replica_; }
  std::optional<int> task() const noexcept { return task_; }

  /// The same device placed in a job: "/job:J/replica:R/task:T/device:TYPE:I".
  Device with_job(std::string job, int replica, int task) const;

  /// "CPU:0" for a local device, the long form when a job is set.
  std::string to_string() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type_ == b.type_ && a.index_ == b.index_ && a.job_ == b.job_ &&
           a.replica_ == b.replica_ && a.task_ == b.task_;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }

 private:
  Type type_ = Type::cpu;
  int index_ = 0;
  std::optional<std::string> job_;
  std::optional<int> replica_;
  std::optional<int> task_;
};

}  // namespace troupe
