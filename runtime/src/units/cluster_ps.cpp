// One compile for several units of runtime/src (ParameterServerStrategy, Server and sharded
// checkpoints): the headers they share are parsed once. Each file keeps its own helpers in its
// anonymous namespace, so their names differ across the files of a group; a file included here is
// not listed in runtime/CMakeLists.txt.

#include "distribute/cluster/parameter_server_strategy.cpp"
#include "distribute/cluster/remote_wire.cpp"
#include "distribute/cluster/server.cpp"
#include "distribute/cluster/sharded_checkpoint.cpp"
#include "distribute/cluster/sharded_manifest.cpp"
