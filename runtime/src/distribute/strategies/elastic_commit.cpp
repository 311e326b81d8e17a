#include "distribute/strategies/elastic_commit.hpp"

#include <cstring>
#include <stdexcept>

namespace troupe::distribute::detail {

void CommittedState::track(const std::map<std::string, Variable>& variables) {
  if (commits_ > 0) throw std::logic_error("CommittedState::track: variables are tracked before the first commit");
  for (const auto& [name, variable] : variables) {
    for (const auto& tracked : variables_) {
      if (tracked.first == name) {
        throw std::invalid_argument("CommittedState::track: variable \"" + name + "\" is tracked already");
      }
    }
    variables_.emplace_back(name, variable);
  }
}

void CommittedState::track_rng(const std::string& name, std::mt19937_64& engine) {
  if (commits_ > 0) throw std::logic_error("CommittedState::track_rng: engines are tracked before the first commit");
  engines_.emplace_back(name, &engine);
}

void CommittedState::commit(const CommitPosition& at) {
  // The slot of the same step when there is one, else the older (an empty one first).
  Slot* slot = nullptr;
  for (Slot& s : slots_) {
    if (s.at && s.at->step == at.step) slot = &s;
  }
  if (slot == nullptr) {
    slot = &slots_[0];
    for (Slot& s : slots_) {
      if (!s.at) {
        slot = &s;
        break;
      }
      if (slot->at && s.at->step < slot->at->step) slot = &s;
    }
  }
  slot->at.reset();  // a commit that fails half way holds nothing
  const bool first = slot->values.size() != variables_.size();
  if (first) slot->values.assign(variables_.size(), Tensor());
  for (std::size_t i = 0; i < variables_.size(); ++i) {
    const auto& [name, variable] = variables_[i];
    // The components of a mirrored variable are bit-identical: the first stands for all.
    Tensor value = variable.components().front();
    if (value.is_gpu()) value = value.to(Device());
    Tensor& kept = slot->values[i];
    if (first) {
      kept = Tensor::empty(value.shape(), value.dtype(), Device());
    } else if (kept.shape() != value.shape() || kept.dtype() != value.dtype()) {
      throw std::logic_error("CommittedState::commit: variable \"" + name + "\" changed its shape or dtype since the "
                             "first commit");
    }
    if (value.nbytes() > 0) std::memcpy(kept.raw_mutable_data(), value.raw_data(), value.nbytes());
  }
  slot->engines.clear();
  for (const auto& [name, engine] : engines_) slot->engines.push_back(*engine);
  slot->at = at;
  ++commits_;
}

std::vector<std::int64_t> CommittedState::steps() const {
  std::vector<std::int64_t> out;
  for (const Slot& s : slots_) {
    if (s.at) out.push_back(s.at->step);
  }
  if (out.size() == 2 && out[0] > out[1]) std::swap(out[0], out[1]);
  return out;
}

bool CommittedState::holds(std::int64_t step) const {
  for (const Slot& s : slots_) {
    if (s.at && s.at->step == step) return true;
  }
  return false;
}

CommitPosition CommittedState::restore(std::int64_t step) {
  for (Slot& s : slots_) {
    if (!s.at || s.at->step != step) continue;
    for (std::size_t i = 0; i < variables_.size(); ++i) {
      // A fresh copy: the slot's buffer is written again by the next commit, and a variable may
      // keep the storage it is assigned.
      const Tensor& kept = s.values[i];
      Tensor copy = Tensor::empty(kept.shape(), kept.dtype(), Device());
      if (kept.nbytes() > 0) std::memcpy(copy.raw_mutable_data(), kept.raw_data(), kept.nbytes());
      variables_[i].second.assign(copy);
    }
    for (std::size_t e = 0; e < engines_.size(); ++e) *engines_[e].second = s.engines[e];
    return *s.at;
  }
  std::string held;
  for (std::int64_t h : steps()) held += (held.empty() ? "" : ", ") + std::to_string(h);
  throw std::out_of_range("CommittedState::restore: no commit of step " + std::to_string(step) + " is held (held: " +
                          (held.empty() ? std::string("none") : held) + ")");
}

std::size_t CommittedState::bytes() const noexcept {
  std::size_t total = 0;
  for (const auto& [name, variable] : variables_) {
    total += static_cast<std::size_t>(shape_num_elements(variable.shape())) * dtype_size(variable.dtype());
  }
  return total;
}

}  // namespace troupe::distribute::detail
