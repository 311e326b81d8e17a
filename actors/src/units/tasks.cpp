// One compile for several units of actors/src (the cluster tasks: their agents, servers, shards and
// the chief's dispatcher): the headers they share are parsed once. Each file keeps its own helpers
// in its anonymous namespace, so their names differ across the files of a group; a file included
// here is not listed in actors/CMakeLists.txt.

#include "../task_common.cpp"
#include "../ps_shards.cpp"
#include "../task_agent.cpp"
#include "../task_server.cpp"
#include "../shard_router.cpp"
#include "../dispatch_actor.cpp"
#include "../dispatcher.cpp"
#include "../shard_client.cpp"
