#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace troupe {

/// Base of troupe's own exceptions (timeouts, failed steps, lost peers). Callers' mistakes are
/// reported with the standard exceptions instead (std::invalid_argument, std::out_of_range).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A step failed because the function of one replica threw. what() names the replica and keeps
/// the original message; cause() is the original exception, for callers that want to rethrow it.
class ReplicaError : public Error {
 public:
  ReplicaError(int replica, std::string message, std::exception_ptr cause)
      : Error(std::move(message)), replica_(replica), cause_(std::move(cause)) {}
  /// The replica whose function failed first (the lowest id among the original failures).
  int replica() const noexcept { return replica_; }
  /// The exception that replica's function threw.
  const std::exception_ptr& cause() const noexcept { return cause_; }

 private:
  int replica_;
  std::exception_ptr cause_;
};

/// A collective was abandoned because another participant failed or left; what() names it.
class CollectiveAborted : public Error {
 public:
  using Error::Error;
};

/// A scheduled function never ran: it was cancelled (tf.errors.CancelledError), e.g. because
/// another function failed before it (ClusterCoordinator); what() names it.
class Cancelled : public Error {
 public:
  using Error::Error;
};

/// The end of a sequence was reached (an iterator's get_next past its last element).
class OutOfRange : public Error {
 public:
  using Error::Error;
};

}  // namespace troupe
