// One compile for several units of runtime/src (the actors an application spawns, and the cluster's
// names and resolvers): the headers they share are parsed once. Each file keeps its own helpers in
// its anonymous namespace, so their names differ across the files of a group; a file included here
// is not listed in runtime/CMakeLists.txt.

#include "distribute/cluster/actor_cluster.cpp"
#include "distribute/cluster/actor_placement.cpp"
#include "distribute/cluster/actor_restart.cpp"
#include "distribute/cluster/cluster_net.cpp"
#include "distribute/cluster/cluster_resolver.cpp"
