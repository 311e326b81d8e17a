// One compile for several units of runtime/src (the runtime, tensors and their storage, variables,
// options, the flight recorder, the CPU kernels' dispatch): the headers they share are parsed once.
// Each file keeps its own helpers in its anonymous namespace, so their names differ across the
// files of a group; a file included here is not listed in runtime/CMakeLists.txt.

#include "flight_recorder.cpp"
#include "options.cpp"
#include "runtime.cpp"
#include "storage.cpp"
#include "tensor.cpp"
#include "variable.cpp"
#include "cpu/dispatch.cpp"
#include "cpu/intra_op.cpp"
