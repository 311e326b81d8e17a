// One compile for several units of runtime/src (fit's loop and the callbacks): the headers they
// share are parsed once. Each file keeps its own helpers in its anonymous namespace, so their names
// differ across the files of a group; a file included here is not listed in runtime/CMakeLists.txt.

#include "nn/fit_loop.cpp"
#include "nn/fit_elastic.cpp"
#include "nn/epoch_end.cpp"
#include "nn/backup_and_restore.cpp"
#include "nn/callback.cpp"
#include "nn/callbacks.cpp"
#include "nn/tensorboard.cpp"
