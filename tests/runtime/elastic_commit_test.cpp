// An elastic cluster's in-memory commit: the variables, the random engines and the position,
// kept twice and restored bit for bit.
#include <doctest/doctest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "distribute/strategies/elastic_commit.hpp"
#include "distribute/strategies/step_agreement.hpp"
#include "test_util.hpp"
#include "troupe/troupe.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe;
using namespace troupe::distribute;
using troupe::testing::message_of;
namespace dd = troupe::distribute::detail;

namespace {

dd::CommitPosition at_step(std::int64_t step) {
  dd::CommitPosition p;
  p.step = step;
  p.epoch = step / 10;
  p.step_in_epoch = step % 10;
  p.iterator_position = step % 10 + 1;
  p.input_passes = step / 10;
  return p;
}

}  // namespace

TEST_CASE("elastic commit: a restore brings back the variables, the engines and the position of its step") {
  Variable w(Tensor::from_vector<float>({0.5f, -1.25f, 3.0f}), "w");
  Variable it(Tensor::scalar<std::int64_t>(7), "adam/iterations");
  std::mt19937_64 engine(42);
  dd::CommittedState state;
  state.track({{"w", w}, {"adam/iterations", it}});
  state.track_rng("shuffle", engine);
  CHECK(state.bytes() == 3 * sizeof(float) + sizeof(std::int64_t));
  CHECK(state.steps().empty());

  state.commit(at_step(12));
  const std::uint64_t next_draw = std::mt19937_64(engine)();
  // Training goes on past the commit.
  w.assign(Tensor::from_vector<float>({9.0f, 9.0f, 9.0f}));
  it.assign(Tensor::scalar<std::int64_t>(8));
  engine();
  engine();
  CHECK(state.holds(12));
  CHECK_FALSE(state.holds(13));

  const dd::CommitPosition p = state.restore(12);
  CHECK(p.step == 12);
  CHECK(p.epoch == 1);
  CHECK(p.step_in_epoch == 2);
  CHECK(p.iterator_position == 3);
  CHECK(p.input_passes == 1);
  CHECK(w.value().to_vector<float>() == std::vector<float>{0.5f, -1.25f, 3.0f});
  CHECK(it.value().item<std::int64_t>() == 7);
  CHECK(engine() == next_draw);
  CHECK(state.commits() == 1);
}

TEST_CASE("elastic commit: the last two commits are kept, an older step is an error naming those held") {
  Variable w(Tensor::scalar<float>(0.0f), "w");
  dd::CommittedState state;
  state.track({{"w", w}});
  for (int step = 1; step <= 3; ++step) {
    w.assign(Tensor::scalar<float>(static_cast<float>(step)));
    state.commit(at_step(step));
  }
  CHECK(state.steps() == std::vector<std::int64_t>{2, 3});
  CHECK(message_of([&] { state.restore(1); }) == "CommittedState::restore: no commit of step 1 is held (held: 2, 3)");
  CHECK_THROWS_AS(state.restore(1), std::out_of_range);
  CHECK(state.restore(2).step == 2);
  CHECK(w.value().item<float>() == 2.0f);
  CHECK(state.restore(3).step == 3);
  CHECK(w.value().item<float>() == 3.0f);
  // Committing a step held again replaces that commit, not the other.
  w.assign(Tensor::scalar<float>(30.0f));
  state.commit(at_step(3));
  CHECK(state.steps() == std::vector<std::int64_t>{2, 3});
  state.restore(2);
  CHECK(w.value().item<float>() == 2.0f);
  state.restore(3);
  CHECK(w.value().item<float>() == 30.0f);
  // A restored value is the variable's own: the next commits do not change it.
  w.assign_add(Tensor::scalar<float>(1.0f));
  state.commit(at_step(4));
  w.assign(Tensor::scalar<float>(-5.0f));
  state.commit(at_step(5));
  CHECK(state.steps() == std::vector<std::int64_t>{4, 5});
  state.restore(4);
  CHECK(w.value().item<float>() == 31.0f);
  dd::CommittedState empty;
  CHECK(message_of([&] { empty.restore(0); }) == "CommittedState::restore: no commit of step 0 is held (held: none)");
}

TEST_CASE("elastic commit: a name tracked twice is refused, and tracking after a commit is an error") {
  Variable w(Tensor::scalar<float>(0.0f), "w");
  dd::CommittedState state;
  state.track({{"w", w}});
  CHECK(message_of([&] { state.track({{"w", w}}); }) == "CommittedState::track: variable \"w\" is tracked already");
  state.commit(at_step(0));
  CHECK_THROWS_AS(state.track({{"v", w}}), std::logic_error);
}

TEST_CASE("elastic commit: a mirrored variable is restored into every replica's component") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  Variable w(Tensor::from_vector<float>({1.0f, 2.0f}), "w");
  dd::CommittedState state;
  state.track({{"w", w}});
  state.commit(at_step(4));
  w.assign(Tensor::from_vector<float>({-1.0f, -2.0f}));
  state.restore(4);
  for (const Tensor& c : w.components()) CHECK(c.to_vector<float>() == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("step agreement: every worker reads who asks to leave from the same table, a stop in any row beside it") {
  const std::size_t stride = dd::request_fields;
  std::vector<double> table(3 * stride, 0.0);
  dd::StepRequests chief;
  chief.joiners = 1;
  dd::StepRequests leaver;
  leaver.leave = true;
  dd::encode_requests(chief, table.data());
  dd::encode_requests(leaver, table.data() + 2 * stride);
  const dd::StepAgreement a = dd::decide(table.data(), 3, dd::StepRequests{}, stride);
  CHECK(a.leaving == std::vector<int>{2});
  CHECK(a.admit);
  CHECK_FALSE(a.stop);
  // Rank 1 asks too, and rank 2 stops: both read, and the stop stands beside the leave.
  dd::StepRequests both;
  both.leave = true;
  dd::encode_requests(both, table.data() + stride);
  dd::StepRequests stop;
  stop.stop = true;
  stop.stop_code = 3;
  stop.leave = true;
  dd::encode_requests(stop, table.data() + 2 * stride);
  const dd::StepAgreement b = dd::decide(table.data(), 3, dd::StepRequests{}, stride);
  CHECK(b.leaving == std::vector<int>{1, 2});
  CHECK(b.stop);
  CHECK(b.stop_code == 3);
  // Nobody asks: nobody leaves.
  const std::vector<double> quiet(3 * stride, 0.0);
  CHECK(dd::decide(quiet.data(), 3, dd::StepRequests{}, stride).leaving.empty());
}

}  // namespace TROUPE_TEST_FILE
