#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::distribute {

/// An application's actor: state behind a mailbox, on any task of the cluster or in the spawner's
/// own process (docs/actors.md). It handles one message at a time, on a thread of its own, so its
/// state needs no lock. A message is a name and tensors (each travels as one block of its bytes,
/// never element by element); the answer is tensors, or the error the handler throws.
class Actor {
 public:
  virtual ~Actor() = default;
  /// Handles message `name` with `tensors` and returns the reply's tensors (a one-way send drops
  /// them). An exception is the reply's error: the requester gets its what() as troupe::Error.
  virtual std::vector<Tensor> receive(const std::string& name, const std::vector<Tensor>& tensors) = 0;
};

/// Makes an actor of a registered type from its constructor arguments (the tensors given to
/// ActorCluster::spawn). An exception refuses the spawn with its message.
using ActorFactory = std::function<std::unique_ptr<Actor>(const std::vector<Tensor>& args)>;

}  // namespace troupe::distribute
