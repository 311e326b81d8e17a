#include "distribute/strategies/step_agreement.hpp"

#include <utility>
#include <vector>

#include "distribute/collectives/worker_group.hpp"
#include "troupe/tensor.hpp"

namespace troupe::distribute::detail {

void encode_requests(const StepRequests& r, double* row) {
  // A stop carries its reason's code (< 2^31, exact in a double), so that every worker can tell
  // why the cluster stopped.
  row[0] = r.stop ? 1.0 + static_cast<double>(r.stop_code) : 0.0;
  row[1] = r.checkpoint ? 1.0 : 0.0;
  row[2] = r.pause ? (*r.pause ? 1.0 : 2.0) : 0.0;
  row[3] = r.learning_rate ? 1.0 : 0.0;
  row[4] = r.learning_rate.value_or(0.0);
  row[5] = static_cast<double>(r.joiners);
  row[6] = r.leave ? 1.0 : 0.0;
}

StepAgreement decide(const double* table, int workers, const StepRequests& mine, std::size_t stride) {
  StepAgreement out;
  int stopper = -1;
  for (int w = 0; w < workers; ++w) {
    const double* r = table + static_cast<std::size_t>(w) * stride;
    if (r[0] != 0 && stopper < 0) {
      stopper = w;
      out.stop_code = static_cast<std::uint32_t>(r[0] - 1.0);
    }
    if (r[1] != 0) out.checkpoint = true;
    if (r[2] != 0 && !out.pause) out.pause = r[2] == 1.0;
    if (r[3] != 0 && !out.learning_rate) out.learning_rate = r[4];
    if (w == 0 && r[5] > 0) out.admit = true;  // only the chief admits
    if (r[6] != 0) out.leaving.push_back(w);
  }
  if (stopper >= 0) {
    out.stop = true;
    out.stop_reason = mine.stop ? mine.stop_reason : "stop requested by worker " + std::to_string(stopper);
  }
  return out;
}

StepAgreement agree_alone(StepRequests mine) {
  StepAgreement out;
  out.stop = mine.stop;
  out.stop_reason = std::move(mine.stop_reason);
  out.stop_code = mine.stop_code;
  out.checkpoint = mine.checkpoint;
  out.pause = mine.pause;
  out.learning_rate = mine.learning_rate;
  out.admit = mine.joiners > 0;
  if (mine.leave) out.leaving.push_back(0);
  return out;
}

StepAgreement agree_now(StepRequests mine, WorkerGroup& group) {
  if (group.size() == 1) return agree_alone(std::move(mine));
  std::vector<double> row(request_fields);
  encode_requests(mine, row.data());
  const Tensor table = group.concat(Tensor::from_vector(row, {1, static_cast<std::int64_t>(request_fields)}), 0);
  return decide(table.to_vector<double>().data(), group.size(), mine, request_fields);
}

}  // namespace troupe::distribute::detail
