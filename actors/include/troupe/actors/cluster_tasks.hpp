#pragma once

// The actors of a cluster of tasks (tf.distribute.Server and ParameterServerStrategy's
// ClusterCoordinator). Payloads are opaque byte strings here: the runtime encodes tensors and
// decodes them, checking every length, since everything a peer sends is hostile until its sender
// proved the cluster token (which the mutual TLS of the control plane does before BASP sees a byte).
//
// The protocol, numbered as it happens:
//   1. Every task's Server publishes a task agent at its own address; every connection, accepted or
//      made, goes through a control gate (TLS first with a token; control_gate.hpp).
//   2. The chief's dispatcher connects to every worker and ps agent (retrying, in a thread of its
//      own, so a worker that is down or refuses the token never holds up the others) and says
//      (hello, its task name); the agent monitors the sender and logs "connected".
//   3. The dispatcher sends each worker the variables' layout (table, blob), again whenever it
//      changes, then (call, id, function, args); the worker's agent (a scheduled actor) queues the
//      call for the task's function thread, which runs calls one at a time in arrival order and
//      answers (result, id, ok, payload) to the dispatcher in the agent's name. When the
//      coordinator raises a function's error it asks each worker (cancel): the agent drops the
//      calls of that dispatcher it has not started and answers their ids (8 bytes each).
//   4. A worker whose agent goes down has its calls in flight put back at the front of the queue
//      (at-least-once) and is tried again until it comes back; a ps agent that goes down fails the
//      coordinator, naming it.
//   5. Variable shards are actors on the ps tasks: (vnew, key, bytes) creates one, (vread, key)
//      answers its bytes, (vupdate, key, op, bytes) applies an update as it arrives (updates from
//      different workers are not ordered, as in TensorFlow).
//   5a. A shard's bytes also travel beside CAF: each ps task listens on a data port
//      (transport/bulk_channel.hpp) and answers (data) with its port and a fresh secret; a worker
//      connects there once per ps task, both sides prove the cluster token bound to that secret,
//      and reads and updates then carry the shard's raw elements, sent from the shard's storage and
//      read straight into the destination; gathers and scatters carry some rows by index (every
//      index checked against the shard's rows). A shard is one cell behind a reader-writer lock: a read
//      takes a reference to its bytes under the shared lock and sends them after releasing it; an
//      update is received whole into the connection's buffer and applied under the exclusive
//      lock, in place, or to a copy when a read still holds the bytes (copy on write). A read sees
//      a shard before or after an update, never in between, and a stalled reader holds up no
//      update (the shard actor's own reads and updates take the same lock).
//   5b. Heartbeats: the agent's answer to hello names its pulse, an actor apart from the agent's
//      thread. Every heartbeat_interval the dispatcher asks each pulse (beat, interval, missed);
//      a worker silent for more than missed intervals is lost as in 4 and taken back when it
//      answers again, a silent ps task fails the coordinator as in 4, and a pulse that hears no
//      beat from its chief for that long says the chief is gone (heartbeat_state's rules).
//   6. The dispatcher, when destroyed, says (leave) to every agent; a Server told to stop with its
//      chief then stops: its agent and pulse end at once, queued calls are dropped, and a function
//      still running has every wait on the ps tasks ended (shard_client::cancel). A worker it never reached (down at every try, up since) is told
//      (leave, its task name, the worker's) once, so that it does not wait for a chief until its
//      start timeout; an agent serving a chief, or named otherwise, ignores that.
//   7. Stalls: at each heartbeat check the dispatcher asks its closure_watch which worker has run
//      one closure longer than the stall warning bound and logs it; past the shutdown bound the
//      closure is put back as in 4 with that worker's others, the worker is asked (cancel) to drop
//      the calls it has not started, and it takes no closure until the stuck one returns.
//
// The parts, one header each: task_server.hpp (a task: its agent, ps shards and data port),
// dispatcher.hpp (the chief), shard_client.hpp (a worker's requests to the ps tasks); their rules
// as plain classes, dispatch_state.hpp, heartbeat_state.hpp and closure_watch.hpp; the shared vocabulary in
// cluster_task_types.hpp.

#include "troupe/actors/closure_watch.hpp"
#include "troupe/actors/cluster_task_types.hpp"
#include "troupe/actors/dispatch_state.hpp"
#include "troupe/actors/dispatcher.hpp"
#include "troupe/actors/heartbeat_state.hpp"
#include "troupe/actors/shard_client.hpp"
#include "troupe/actors/task_server.hpp"
