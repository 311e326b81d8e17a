// One compile for several units of runtime/src (layers): the headers they share are parsed once.
// Each file keeps its own helpers in its anonymous namespace, so their names differ across the
// files of a group; a file included here is not listed in runtime/CMakeLists.txt.

#include "nn/dense.cpp"
#include "nn/conv.cpp"
#include "nn/pooling.cpp"
#include "nn/flatten.cpp"
#include "nn/embedding.cpp"
#include "nn/dropout.cpp"
#include "nn/normalization.cpp"
#include "nn/batch_normalization.cpp"
