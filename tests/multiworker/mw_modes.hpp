#pragma once
// What the modes of mw_worker share (mw_worker.cpp has the usage): every mode runs on a
// MultiWorkerMirroredStrategy that has formed its cluster, prints "FAIL ..." for each check that
// does not hold (counted in failures), and returns 0 when every one held, else 1.

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

namespace mw {

/// The checks that failed in this process.
inline int failures = 0;

/// Counts and prints a failed check when `got` is not `want`.
template <class A, class B>
void expect_eq(const A& got, const B& want, const std::string& what) {
  if (!(got == want)) {
    std::cout << "FAIL " << what << "\n";
    ++failures;
  }
}

/// This worker's rank, from its task alone: the chief is rank 0 and the workers follow in index
/// order (TensorFlow's order of a cluster spec: chief, then worker).
int expected_rank(const troupe::distribute::ClusterResolver& resolver);

/// FNV-1a over the bits of every tensor, in order.
std::uint64_t hash_bits(const std::vector<troupe::Tensor>& tensors);

// The modes (mw_collectives.cpp, mw_training.cpp, mw_input.cpp): each described at its definition.
int collectives(troupe::distribute::MultiWorkerMirroredStrategy& s);
int compressed(troupe::distribute::MultiWorkerMirroredStrategy& s, troupe::distribute::Compression compression);
int checkpoint(troupe::distribute::MultiWorkerMirroredStrategy& s, const std::string& dir);
int preempt(troupe::distribute::MultiWorkerMirroredStrategy& s, const std::string& dir);
int train(troupe::distribute::MultiWorkerMirroredStrategy& s, bool cnn);
int outside(troupe::distribute::MultiWorkerMirroredStrategy& s, const std::string& dir);
int steer(troupe::distribute::MultiWorkerMirroredStrategy& s);
int model_train(troupe::distribute::MultiWorkerMirroredStrategy& s, bool via_fit);
int input(troupe::distribute::MultiWorkerMirroredStrategy& s, const std::string& which);

}  // namespace mw
