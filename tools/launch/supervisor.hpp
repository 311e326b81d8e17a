#pragma once
// Starts the local workers and watches them until every one has exited.
//
// 1. Each worker is forked into its own process group, so that one kill reaches every process a
//    worker starts, and a terminal's Ctrl-C reaches the launcher alone, which forwards it once.
//    It gets TF_CONFIG (and TROUPE_DEVICES_PER_WORKER), stdin from /dev/null, and its stdout and
//    stderr go into two pipes. A pipe closed on exec tells the launcher whether exec worked.
// 2. One poll() loop waits on those pipes, on a self-pipe the signal handlers write to (SIGCHLD,
//    SIGINT, SIGTERM, SIGHUP) and on the timers (--timeout, the grace period).
// 3. When a worker's main process exits, whatever it left in its process group is killed before
//    it is reaped (while its pid, the group id, cannot be reused). The first worker to fail stops
//    the others: SIGTERM to each group, SIGKILL to those still there after the grace period.
//    SIGINT, SIGTERM and SIGHUP are forwarded to every group the same way; a second one kills.
// 4. The launcher returns once every worker is reaped and its pipes are drained (bounded, in case
//    a process that left the group still holds one open).
// 5. With --max-restarts N, a launch that ended with a failure (not a signal to the launcher, the
//    timeout, or a program that could not start) is started again, every worker with fresh
//    ports, after a backoff that doubles each time; the launcher says why, and after N restarts
//    it returns the last failure's status. A worker that exits with status 75 was preempted and
//    saved a checkpoint (PreemptionCheckpointHandler); it is restarted the same way. Workers
//    find the number of restarts so far in TROUPE_RESTART_COUNT (0 in the first run). With --ps,
//    a lost ps task is restarted alone on its same address instead while the others run on
//    (ps_restart.hpp); such restarts count against --max-restarts too.
// 6. With --elastic --host-discovery-script, host_discovery's results wake the poll loop too: the
//    loop adds workers (joining the running cluster) and removes them to match (host_discovery.hpp).
// 7. A worker of the start that exits with status 98 could not listen on its address: another
//    process took the port between the launcher's pick and the worker's bind. When the launcher
//    picked the ports (no --port-base, no --hosts), every worker is stopped and the same start is
//    made again on fresh ports, at most 3 times, said in one line naming the worker and its port;
//    neither a restart of --max-restarts nor a failure. Otherwise it is a failure naming the port.
// If the launcher itself dies, each worker's main process gets SIGKILL (Linux's parent-death
// signal).

#include <string>
#include <vector>

#include "launch/launch_options.hpp"

namespace troupe::launch {

/// Starts options.num_workers copies of options.program, worker i with TF_CONFIG naming
/// `addresses` and index i, and supervises them as described above. Returns the launcher's exit
/// status: 0 when every worker succeeded, else the status of the first to fail (128+signal), 124
/// on timeout, 128+signal when the launcher got a signal, 127 when exec failed, 1 when a worker
/// could not be started; 98 (a worker's) when a port stayed taken. With options.max_restarts, the status of the last launch. Messages go to stderr, prefixed "troupe-launch: ".
int supervise(const launch_options& options, const std::vector<std::string>& addresses);

/// The conventional name of a signal, "SIGTERM"; "signal N" when it has none here.
std::string signal_name(int signal_number);

/// A duration in seconds as the launcher's messages write it: "2.5".
std::string seconds_text(double seconds);

}  // namespace troupe::launch
