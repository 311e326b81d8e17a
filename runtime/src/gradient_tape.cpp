#include "troupe/gradient_tape.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "distribute/collectives/collectives.hpp"
#include "distribute/strategies/context_state.hpp"
#include "tape.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"

namespace troupe {
namespace {
bool is_float(DType d) { return dtype_is_floating(d); }
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

bool recording(const std::vector<Tensor>& inputs) {
  if (current == nullptr) return false;
  for (const Tensor& t : inputs) {
    if (followed(&t)) return true;
  }
  return false;
}

bool tape_active() { return current != nullptr; }

PauseRecording::PauseRecording() : saved_(current) { current = nullptr; }
PauseRecording::~PauseRecording() { current = static_cast<TapeRecorder*>(saved_); }

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
  // Told each source's gradient as soon as it is final (the all-reducing gradient).
  std::function<void(std::size_t source, const Tensor& gradient)> on_final;
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
                                " (expected float32 or float64, or float16 or bfloat16)");
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
  // A variable's gradient is final once its last read (the first recorded) has been passed.
  std::map<const void*, std::size_t> reads_left;
  std::map<const void*, std::vector<std::size_t>> sources_of;
  std::vector<bool> told(sources.size(), false);
  const auto& on_final = impl_->on_final;
  if (on_final) {
    for (const TapeNode* n : order) {
      if (n->variable != nullptr) ++reads_left[n->variable];
    }
    for (std::size_t i = 0; i < sources.size(); ++i) sources_of[&sources[i].name()].push_back(i);
  }
  for (TapeNode* n : order) {
    auto it = grads.find(n);
    if (n->variable != nullptr) {
      if (it != grads.end()) {
        add_to(by_variable, n->variable, it->second);
        grads.erase(it);
      }
      if (on_final && --reads_left[n->variable] == 0) {
        auto found = by_variable.find(n->variable);
        for (std::size_t i : sources_of[n->variable]) {
          told[i] = true;
          on_final(i, found != by_variable.end() ? detail::untaped(found->second)
                                                 : Tensor::zeros(sources[i].shape(), sources[i].dtype()));
        }
      }
      continue;
    }
    if (it == grads.end()) continue;
    const Tensor g = std::move(it->second);
    grads.erase(it);
    const std::vector<Tensor> in_grads = n->backward(g);
    for (std::size_t i = 0; i < n->inputs.size() && i < in_grads.size(); ++i) {
      const auto& m = TapeAccess::node(n->inputs[i]);
      if (m == nullptr || m->tape != impl_->recorder.id) continue;
      add_to(grads, m.get(), in_grads[i]);
    }
  }

  std::vector<Tensor> out;
  out.reserve(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const Variable& v = sources[i];
    auto it = by_variable.find(&v.name());
    out.push_back(it != by_variable.end() ? detail::untaped(it->second) : Tensor::zeros(v.shape(), v.dtype()));
    if (on_final && !told[i]) on_final(i, out.back());  // the target does not depend on it
  }
  return out;
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Variable>& sources,
                                           distribute::ReduceOp all_reduce) {
  distribute::ReplicaContext* ctx = distribute::detail::installed_replica_context();
  if (ctx == nullptr || ctx->num_replicas_in_sync() <= 1) return gradient(target, sources);
  const std::size_t bucket_bytes = ctx->strategy().backend().gradient_bucket_bytes();
  if (bucket_bytes == 0) return ctx->all_reduce(all_reduce, gradient(target, sources));
  // Buckets in the order the gradients become final (the same on every replica: the same
  // recording), each started once it holds bucket_bytes.
  distribute::detail::ReplicaCollectives& collectives = distribute::detail::collectives_of(*ctx);
  const int local = ctx->local_replica_index();
  std::vector<std::vector<std::size_t>> members;
  std::vector<std::size_t> handles;
  std::vector<std::size_t> current;
  std::vector<Tensor> values;
  std::size_t filled = 0;
  auto flush = [&] {
    if (current.empty()) return;
    handles.push_back(collectives.start_all_reduce(local, all_reduce, std::move(values)));
    members.push_back(std::move(current));
    current.clear();
    values.clear();
    filled = 0;
  };
  impl_->on_final = [&](std::size_t source, const Tensor& g) {
    if (!current.empty() && filled + g.nbytes() > bucket_bytes) flush();
    current.push_back(source);
    values.push_back(g);
    filled += g.nbytes();
    if (filled >= bucket_bytes) flush();
  };
  struct forget {
    Impl& impl;
    ~forget() { impl.on_final = nullptr; }
  } forget_hook{*impl_};
  std::vector<Tensor> out = gradient(target, sources);
  flush();
  std::chrono::steady_clock::time_point all_started{};
  for (std::size_t b = 0; b < handles.size(); ++b) {
    std::vector<Tensor> sums = collectives.wait_all_reduce(local, handles[b], all_started);
    for (std::size_t k = 0; k < sums.size(); ++k) out[members[b][k]] = std::move(sums[k]);
  }
  return out;
}

Tensor GradientTape::gradient(const Tensor& target, const Variable& source) { return gradient(target, std::vector<Variable>{source})[0]; }

}  // namespace troupe
