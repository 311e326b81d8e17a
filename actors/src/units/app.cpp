// One compile for several units of actors/src (the actors an application spawns: their frames,
// the hosted side and the spawner's data connections): the headers they share are parsed once.
// Each file keeps its own helpers in its anonymous namespace, so their names differ across the
// files of a group; a file included here is not listed in actors/CMakeLists.txt.

#include "../app_data_wire.cpp"
#include "../app_data_link.cpp"
#include "../app_host.cpp"
