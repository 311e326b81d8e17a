// One compile for several units of actors/src (the plain classes of the cluster's rules and
// boards): the headers they share are parsed once. Each file keeps its own helpers in its anonymous
// namespace, so their names differ across the files of a group; a file included here is not listed
// in actors/CMakeLists.txt.

#include "../rendezvous_state.cpp"
#include "../membership_state.cpp"
#include "../cluster_health.cpp"
#include "../ps_cluster_board.cpp"
#include "../actor_board.cpp"
#include "../worker_report.cpp"
