// One compile for several units of actors/src (a step's actors, the rendezvous and the control
// gate): the headers they share are parsed once. Each file keeps its own helpers in its anonymous
// namespace, so their names differ across the files of a group; a file included here is not listed
// in actors/CMakeLists.txt.

#include "../coordinator.cpp"
#include "../input_pipeline.cpp"
#include "../metrics_stream.cpp"
#include "../replica.cpp"
#include "../rendezvous.cpp"
#include "../elastic_join.cpp"
#include "../control_tls.cpp"
#include "../control_gate.cpp"
