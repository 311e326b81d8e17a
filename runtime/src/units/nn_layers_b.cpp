// One compile for several units of runtime/src (layers, models built of them and their ops): the
// headers they share are parsed once. Each file keeps its own helpers in its anonymous namespace,
// so their names differ across the files of a group; a file included here is not listed in
// runtime/CMakeLists.txt.

#include "nn/activation.cpp"
#include "nn/attention.cpp"
#include "nn/position_embedding.cpp"
#include "nn/residual.cpp"
#include "nn/layer.cpp"
#include "nn/layer_registry.cpp"
#include "nn/sequential.cpp"
#include "nn/ops.cpp"
