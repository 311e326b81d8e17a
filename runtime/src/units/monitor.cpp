// One compile for several units of runtime/src (the Monitor and its dashboard's server (the assets
// are compiled alone: they have flags of their own)): the headers they share are parsed once. Each
// file keeps its own helpers in its anonymous namespace, so their names differ across the files of
// a group; a file included here is not listed in runtime/CMakeLists.txt.

#include "monitor/actors_view.cpp"
#include "monitor/app_values.cpp"
#include "monitor/fit_callback.cpp"
#include "monitor/http_server.cpp"
#include "monitor/monitor.cpp"
#include "monitor/routes.cpp"
#include "monitor/step_exchange.cpp"
#include "monitor/trace_writer.cpp"
