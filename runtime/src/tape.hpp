#pragma once

// Private to runtime/src: how operations record themselves on the calling thread's GradientTape
// (gradient_tape.cpp). An operation computes its result as usual, then, when recording() says a
// tape follows one of its inputs, attaches a node holding the inputs and a function from the
// gradient of the result to the gradients of the inputs.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::detail {

/// Gradients of the inputs (an empty Tensor() for one that has none) from the result's gradient.
using backward_fn = std::function<std::vector<Tensor>(const Tensor& grad)>;

struct TapeNode {
  std::uint64_t tape = 0;       // the recording tape's id
  std::uint64_t index = 0;      // order of recording on that tape
  std::vector<Tensor> inputs;   // what the operation read (with their own nodes)
  backward_fn backward;         // null for a variable read
  const void* variable = nullptr;  // a variable read: the variable's identity
};

struct TapeAccess {
  static const std::shared_ptr<TapeNode>& node(const Tensor& t) { return t.tape_node_; }
  static void set(Tensor& t, std::shared_ptr<TapeNode> n) { t.tape_node_ = std::move(n); }
};

/// True when a tape records on this thread and follows one of `inputs`.
bool recording(std::initializer_list<const Tensor*> inputs);
/// The same for a list of tensors.
bool recording(const std::vector<Tensor>& inputs);
/// True when a tape records on this thread (whatever it follows).
bool tape_active();

/// Nothing is recorded on this thread while one lives: an operation made of recorded operations
/// (a layer) records itself as one node instead.
class PauseRecording {
 public:
  PauseRecording();
  ~PauseRecording();
  PauseRecording(const PauseRecording&) = delete;
  PauseRecording& operator=(const PauseRecording&) = delete;

 private:
  void* saved_;
};

/// Attaches a node for the operation that made `out` from `inputs`.
void record(Tensor& out, std::vector<Tensor> inputs, backward_fn backward);

/// `t` without its node: what a backward function may keep of its operands and result (a node
/// that held its own result would keep itself alive).
Tensor untaped(const Tensor& t);

/// A variable's value as read while a tape records (a watched leaf), else `value` unchanged.
Tensor watched_read(const Tensor& value, const void* variable);

}  // namespace troupe::detail
