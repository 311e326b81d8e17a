// One compile for several units of runtime/src (datasets, their readers, and the distributed
// input): the headers they share are parsed once. Each file keeps its own helpers in its anonymous
// namespace, so their names differ across the files of a group; a file included here is not listed
// in runtime/CMakeLists.txt.

#include "data/dataset.cpp"
#include "data/prefetch.cpp"
#include "data/readers.cpp"
#include "data/sources.cpp"
#include "data/transforms.cpp"
#include "distribute/input/input.cpp"
#include "distribute/input/file_split.cpp"
