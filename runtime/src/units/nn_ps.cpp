// One compile for several units of runtime/src (fit under ParameterServerStrategy and the sidecar
// evaluator): the headers they share are parsed once. Each file keeps its own helpers in its
// anonymous namespace, so their names differ across the files of a group; a file included here is
// not listed in runtime/CMakeLists.txt.

#include "nn/ps_fit_loop.cpp"
#include "nn/ps_fit_recovery.cpp"
#include "nn/ps_fit_step.cpp"
#include "nn/sidecar_evaluator.cpp"
