// One compile for several units of runtime/src (the tensor's neighbours: checkpoints, tf.config,
// devices, the tape, 16-bit types, the log): the headers they share are parsed once. Each file
// keeps its own helpers in its anonymous namespace, so their names differ across the files of a
// group; a file included here is not listed in runtime/CMakeLists.txt.

#include "checkpoint.cpp"
#include "config.cpp"
#include "device.cpp"
#include "gradient_tape.cpp"
#include "half.cpp"
#include "log.cpp"
