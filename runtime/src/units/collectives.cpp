// One compile for several units of runtime/src (the replica collectives): the headers they share
// are parsed once. Each file keeps its own helpers in its anonymous namespace, so their names
// differ across the files of a group; a file included here is not listed in runtime/CMakeLists.txt.

#include "distribute/collectives/collectives.cpp"
#include "distribute/collectives/cross_device_ops.cpp"
#include "distribute/collectives/gradient_buckets.cpp"
#include "distribute/collectives/hierarchical_collectives.cpp"
#include "distribute/collectives/worker_group.cpp"
