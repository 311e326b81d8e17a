#include "troupe/distribute/mirrored_strategy.hpp"
#include "troupe/distribute/central_storage_strategy.hpp"

#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/mirrored_backend.hpp"
#include "distribute/strategies/context_state.hpp"
#include "troupe/actors/coordinator.hpp"
#include "troupe/errors.hpp"
#include "troupe/transport/shm_group.hpp"

namespace troupe::distribute {
namespace {

std::vector<Device> resolve_devices(const char* who, const std::vector<std::string>& specs) {
  std::vector<Device> devices;
  const int gpus = Runtime::gpu_count();
  if (specs.empty()) {
    // Every GPU the CUDA runtime reports, else the host CPU.
    for (int g = 0; g < gpus; ++g) devices.emplace_back(Device::Type::gpu, g);
    if (devices.empty()) devices.push_back(Device{});
    return devices;
  }
  std::set<std::string> seen;
  for (const std::string& spec : specs) {
    Device d;
    try {
      d = Device::parse(spec);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(who) + ": " + e.what());
    }
    if (!seen.insert(d.to_string()).second) {
      throw std::invalid_argument(std::string(who) + ": device " + d.to_string() +
                                  " is listed twice; each replica needs its own device");
    }
    if (d.job() && *d.job() != "localhost") {
      throw std::invalid_argument(std::string(who) + ": device " + d.to_string() +
                                  " belongs to another job; list local devices (\"CPU:0\") or use "
                                  "MultiWorkerMirroredStrategy");
    }
    if (d.is_gpu()) {
      if (gpus == 0) {
        throw std::invalid_argument(std::string(who) + ": " + d.to_string() +
                                    " was requested but this machine has no GPU (the CUDA runtime reports none); "
                                    "use CPU devices such as \"CPU:0\"");
      }
      if (d.index() >= gpus) {
        throw std::invalid_argument(std::string(who) + ": " + d.to_string() + " was requested but only " +
                                    std::to_string(gpus) + " GPU(s) exist (GPU:0..GPU:" + std::to_string(gpus - 1) +
                                    ")");
      }
    }
    if (!devices.empty() && devices[0].is_gpu() != d.is_gpu()) {
      throw std::invalid_argument(std::string(who) + ": " + devices[0].to_string() + " and " + d.to_string() +
                                  " mix CPU and GPU replicas; list only GPUs or only CPUs");
    }
    devices.push_back(Device(d.type(), d.index()));
  }
  return devices;
}

// MirroredStrategy's replicas with the variables on one device.
class CentralStorageBackend final : public detail::MirroredBackend {
 public:
  CentralStorageBackend(Runtime& runtime, std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> ops,
                        Device parameter_device)
      : MirroredBackend(runtime, std::move(devices), std::move(ops)), parameter_device_(std::move(parameter_device)) {}
  const Device* variable_device() const override { return &parameter_device_; }

 private:
  Device parameter_device_;
};

// TensorFlow's default parameter device: the one compute device, else the CPU.
Device resolve_parameter_device(const std::vector<Device>& compute, const std::string& spec) {
  const char* who = "CentralStorageStrategy";
  if (spec.empty()) return compute.size() == 1 ? compute[0] : Device{};
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(who) + ": parameter device: " + e.what());
  }
  if (d.job() && *d.job() != "localhost") {
    throw std::invalid_argument(std::string(who) + ": parameter device " + d.to_string() +
                                " belongs to another job; name a device of this process (\"CPU:0\", \"GPU:0\")");
  }
  if (d.is_gpu()) {
    const int gpus = Runtime::gpu_count();
    if (d.index() >= gpus) {
      throw std::invalid_argument(std::string(who) + ": parameter device " + d.to_string() + " was requested but " +
                                  (gpus == 0 ? std::string("this machine has no GPU; use \"CPU:0\"")
                                             : "only " + std::to_string(gpus) + " GPU(s) exist"));
    }
    return Device(d.type(), d.index());
  }
  return Device{};  // every CPU device is the host's memory
}

std::shared_ptr<CrossDeviceOps> checked_ops(const char* who, const std::vector<Device>& devices,
                                            std::shared_ptr<CrossDeviceOps> ops);

std::unique_ptr<detail::StrategyBackend> make_central_backend(Runtime& runtime, const std::vector<std::string>& specs,
                                                              const std::string& parameter_device,
                                                              std::shared_ptr<CrossDeviceOps> ops) {
  std::vector<Device> devices = resolve_devices("CentralStorageStrategy", specs);
  Device parameters = resolve_parameter_device(devices, parameter_device);
  ops = checked_ops("CentralStorageStrategy", devices, std::move(ops));
  return std::make_unique<CentralStorageBackend>(runtime, std::move(devices), std::move(ops), std::move(parameters));
}

std::shared_ptr<CrossDeviceOps> checked_ops(const char* who, const std::vector<Device>& devices,
                                            std::shared_ptr<CrossDeviceOps> ops) {
  // TensorFlow's defaults: NCCL between GPUs, a reduction on one device between CPU replicas.
  if (!ops) {
    ops = devices[0].is_gpu() ? std::shared_ptr<CrossDeviceOps>(std::make_shared<NcclAllReduce>())
                              : std::make_shared<ReductionToOneDevice>();
  }
  if (!ops->supports(devices)) {
    throw std::invalid_argument(std::string(who) + ": " + ops->name() + " cannot serve replicas on " +
                                devices[0].to_string() +
                                (ops->name() == "NcclAllReduce"
                                     ? " (NCCL needs GPU devices; use ReductionToOneDevice or HierarchicalCopyAllReduce)"
                                     : ""));
  }
  return ops;
}

std::unique_ptr<detail::StrategyBackend> make_backend(const char* who, Runtime& runtime,
                                                      const std::vector<std::string>& specs,
                                                      std::shared_ptr<CrossDeviceOps> ops) {
  std::vector<Device> devices = resolve_devices(who, specs);
  ops = checked_ops(who, devices, std::move(ops));
  return std::make_unique<detail::MirroredBackend>(runtime, std::move(devices), std::move(ops));
}

}  // namespace

MirroredStrategy::MirroredStrategy(Runtime& runtime, std::vector<std::string> devices,
                                   std::shared_ptr<CrossDeviceOps> cross_device_ops)
    : Strategy(make_backend("MirroredStrategy", runtime, devices, std::move(cross_device_ops))) {}

MirroredStrategy::~MirroredStrategy() = default;

OneDeviceStrategy::OneDeviceStrategy(Runtime& runtime, std::string device)
    : Strategy(make_backend("OneDeviceStrategy", runtime, {std::move(device)}, nullptr)) {}

OneDeviceStrategy::~OneDeviceStrategy() = default;

CentralStorageStrategy::CentralStorageStrategy(Runtime& runtime, std::vector<std::string> compute_devices,
                                               std::string parameter_device,
                                               std::shared_ptr<CrossDeviceOps> cross_device_ops)
    : Strategy(make_central_backend(runtime, compute_devices, parameter_device, std::move(cross_device_ops))) {}

CentralStorageStrategy::~CentralStorageStrategy() = default;

const Device& CentralStorageStrategy::parameter_device() const {
  return *const_cast<CentralStorageStrategy*>(this)->backend().variable_device();
}

}  // namespace troupe::distribute
