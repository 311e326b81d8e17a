// One compile for several units of actors/src (the plain classes of the stall inspector, scheduling
// and liveness): the headers they share are parsed once. Each file keeps its own helpers in its
// anonymous namespace, so their names differ across the files of a group; a file included here is
// not listed in actors/CMakeLists.txt.

#include "../stall_inspector.cpp"
#include "../dispatch_state.cpp"
#include "../closure_watch.cpp"
#include "../heartbeat_state.cpp"
#include "../liveness_policy.cpp"
