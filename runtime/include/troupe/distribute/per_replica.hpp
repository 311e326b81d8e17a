#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe::distribute {

/// One value per local replica (tf.distribute's PerReplica / DistributedValues). Returned by
/// Strategy::run and experimental_distribute_values_from_function; passed to run, each replica's
/// function receives its own component.
template <class T>
class PerReplica {
 public:
  static_assert(!std::is_same_v<T, bool>, "PerReplica<bool> would sit on std::vector<bool>; return an int instead");
  using value_type = T;

  PerReplica() = default;
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  /// Number of components: the number of local replicas.
  int num_replicas() const noexcept { return static_cast<int>(values_.size()); }
  /// The component of replica `replica` (std::out_of_range when there is none).
  const T& operator[](int replica) const { return values_.at(index(replica)); }
  T& operator[](int replica) { return values_.at(index(replica)); }
  /// Every component, in replica order.
  const std::vector<T>& values() const noexcept { return values_; }
  auto begin() const noexcept { return values_.begin(); }
  auto end() const noexcept { return values_.end(); }

  /// "PerReplica{0: [0], 1: [2]}" for components that have to_string() or are arithmetic.
  std::string to_string() const {
    std::ostringstream out;
    out << "PerReplica{";
    for (std::size_t i = 0; i < values_.size(); ++i) {
      if (i) out << ", ";
      out << i << ": ";
      if constexpr (std::is_arithmetic_v<T>) {
        out << values_[i];
      } else {
        out << values_[i].to_string();
      }
    }
    out << "}";
    return out.str();
  }

 private:
  std::size_t index(int replica) const {
    if (replica < 0 || static_cast<std::size_t>(replica) >= values_.size()) {
      throw std::out_of_range("PerReplica: replica " + std::to_string(replica) + " out of range (expected 0.." +
                              std::to_string(static_cast<long>(values_.size()) - 1) + ")");
    }
    return static_cast<std::size_t>(replica);
  }

  std::vector<T> values_;
};

template <class T>
struct is_per_replica : std::false_type {};
template <class T>
struct is_per_replica<PerReplica<T>> : std::true_type {};
template <class T>
inline constexpr bool is_per_replica_v = is_per_replica<std::decay_t<T>>::value;

}  // namespace troupe::distribute
