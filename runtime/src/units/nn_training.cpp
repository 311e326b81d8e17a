// One compile for several units of runtime/src (losses, optimizers, metrics, Model, saving): the
// headers they share are parsed once. Each file keeps its own helpers in its anonymous namespace,
// so their names differ across the files of a group; a file included here is not listed in
// runtime/CMakeLists.txt.

#include "nn/loss_scale_optimizer.cpp"
#include "nn/losses.cpp"
#include "nn/mixed_precision.cpp"
#include "nn/optimizers.cpp"
#include "nn/metrics.cpp"
#include "nn/model.cpp"
#include "nn/datasets.cpp"
#include "nn/saving.cpp"
