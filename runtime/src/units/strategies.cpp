// One compile for several units of runtime/src (the strategies and their contexts): the headers
// they share are parsed once. Each file keeps its own helpers in its anonymous namespace, so their
// names differ across the files of a group; a file included here is not listed in
// runtime/CMakeLists.txt.

#include "distribute/strategies/context.cpp"
#include "distribute/strategies/mirrored_strategy.cpp"
#include "distribute/strategies/multi_worker_strategy.cpp"
#include "distribute/strategies/elastic_commit.cpp"
#include "distribute/strategies/preemption.cpp"
#include "distribute/strategies/reduce_op.cpp"
#include "distribute/strategies/step_agreement.cpp"
#include "distribute/strategies/strategy.cpp"
