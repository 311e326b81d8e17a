#include "troupe/gradient_tape.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "tape.hpp"

namespace troupe {
namespace {
bool is_float(DType d) { return d == DType::f32 || d == DType::f64; }
}  // namespace

namespace detail {

// What the recording hooks need of a tape.
struct TapeRecorder {
  std::uint64_t id = 0;
  std::uint64_t next_index = 0;
  TapeRecorder* outer = nullptr;
};

namespace {

// The innermost recording tape of this thread (tapes belong to the thread that made them, like
// the replica context); null while none records or while a gradient is computed.
thread_local TapeRecorder* current = nullptr;
std::atomic<std::uint64_t> next_tape_id{1};


bool followed(const Tensor* t) {
  const auto& n = TapeAccess::node(*t);
  return n != nullptr && n->tape == current->id;
}

}  // namespace

bool recording(std::initializer_list<const Tensor*> inputs) {
  if (current == nullptr) return false;
  for (const Tensor* t : inputs) {
    if (followed(t)) return true;
  }
  return false;
}

void record(Tensor& out, std::vector<Tensor> inputs, backward_fn backward) {
  if (current == nullptr) return;
  auto node = std::make_shared<TapeNode>();
  node->tape = current->id;
  node->index = current->next_index++;
  node->inputs = std::move(inputs);
  node->backward = std::move(backward);
  TapeAccess::set(out, std::move(node));
}

Tensor untaped(const Tensor& t) {
  Tensor out = t;
  TapeAccess::set(out, nullptr);
  return out;
}

Tensor watched_read(const Tensor& value, const void* variable) {
  if (current == nullptr || !is_float(value.dtype())) return value;
  Tensor out = untaped(value);
  auto node = std::make_shared<TapeNode>();
  node->tape = current->id;
  node->index = current->next_index++;
  node->variable = variable;
  TapeAccess::set(out, std::move(node));
  return out;
}

}  // namespace detail

struct GradientTape::Impl {
  detail::TapeRecorder recorder;
  bool persistent = false;
  bool used = false;
};

GradientTape::GradientTape(bool persistent) : impl_(std::make_unique<Impl>()) {
  impl_->recorder.id = detail::next_tape_id.fetch_add(1, std::memory_order_relaxed);
  impl_->persistent = persistent;
  impl_->recorder.outer = detail::current;
  detail::current = &impl_->recorder;
}

GradientTape::~GradientTape() {
  // Innermost first; a tape left while a gradient runs (current null) restores nothing.
  if (detail::current == &impl_->recorder) detail::current = impl_->recorder.outer;
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Variable>& sources) {
  if (impl_->used && !impl_->persistent) {
    throw std::logic_error(
        "GradientTape::gradient: this tape already computed gradients (make it with persistent = true to ask again)");
  }
  if (!is_float(target.dtype())) {
    throw std::invalid_argument("GradientTape::gradient: the target is " + std::string(dtype_name(target.dtype())) +
                                " (expected float32 or float64)");
  }
  impl_->used = true;
  // Nothing the backward functions compute is recorded.
  detail::TapeRecorder* saved = detail::current;
  detail::current = nullptr;
  struct restore {
    detail::TapeRecorder* saved;
    ~restore() { detail::current = saved; }
  } restore_current{saved};

  using detail::TapeAccess;
  using detail::TapeNode;
  // The nodes of this tape the target depends on, latest first: every node comes after its inputs.
  std::vector<TapeNode*> order;
  std::unordered_set<TapeNode*> seen;
  std::vector<TapeNode*> stack;
  if (const auto& root = TapeAccess::node(target); root != nullptr && root->tape == impl_->recorder.id) {
    stack.push_back(root.get());
    seen.insert(root.get());
  }
  while (!stack.empty()) {
    TapeNode* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const Tensor& in : n->inputs) {
      const auto& m = TapeAccess::node(in);
      if (m != nullptr && m->tape == impl_->recorder.id && seen.insert(m.get()).second) stack.push_back(m.get());
    }
  }
  std::sort(order.begin(), order.end(), [](const TapeNode* a, const TapeNode* b) { return a->index > b->index; });

  std::unordered_map<TapeNode*, Tensor> grads;
  std::map<const void*, Tensor> by_variable;
  auto add_to = [](auto& map, auto key, const Tensor& g) {
    auto [it, fresh] = map.emplace(key, g);
    if (!fresh) it->second = it->second + g;
  };
  if (!order.empty()) grads.emplace(order.front(), Tensor::full(target.shape(), 1, target.dtype(), target.device()));
  for (TapeNode* n : order) {
    auto it = grads.find(n);
    if (it == grads.end()) continue;
    const Tensor g = std::move(it->second);
    grads.erase(it);
    if (n->variable != nullptr) {
      add_to(by_variable, n->variable, g);
      continue;
    }
    const std::vector<Tensor> in_grads = n->backward(g);
    for (std::size_t i = 0; i < n->inputs.size() && i < in_grads.size(); ++i) {
      const auto& m = TapeAccess::node(n->inputs[i]);
      if (m == nullptr || m->tape != impl_->recorder.id) continue;
      add_to(grads, m.get(), in_grads[i]);
    }
  }

  std::vector<Tensor> out;
  out.reserve(sources.size());
  for (const Variable& v : sources) {
    auto it = by_variable.find(&v.name());
    out.push_back(it != by_variable.end() ? detail::untaped(it->second) : Tensor::zeros(v.shape(), v.dtype()));
  }
  return out;
}

Tensor GradientTape::gradient(const Tensor& target, const Variable& source) { return gradient(target, std::vector<Variable>{source})[0]; }

}  // namespace troupe
