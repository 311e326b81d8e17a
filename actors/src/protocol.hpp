#pragma once

// The messages of actors/: between the coordinator and its replica actors, and between the
// cluster agents of a rendezvous. Internal to actors/.

#include <chrono>
#include <cstdint>
#include <string>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "caf/all.hpp"
#include "troupe/actors/rendezvous.hpp"
#include "troupe/actors/rendezvous_state.hpp"

// Rendezvous errors are caf::errors of category "rendezvous" (10 characters, an atom's limit).
CAF_ERROR_CODE_ENUM(troupe::actors::rendezvous_errc, "rendezvous")

namespace troupe::actors {

/// One step for every replica: the function, and a slot per replica for what it threw.
struct step_task {
  std::uint64_t step = 0;
  const std::function<void(int)>* fn = nullptr;   // owned by the caller of run_step, which waits
  std::vector<std::exception_ptr> errors;         // replica r writes only errors[r]
};

using step_task_ptr = std::shared_ptr<step_task>;

using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

/// The body of a replica actor: a detached blocking actor that runs step messages until told to
/// stop. Answers (done_atom, step, replica) to the sender of each step.
void replica_actor(caf::blocking_actor* self, int replica, std::chrono::microseconds spin, int pause_spins,
                   std::string thread_name, const void* owner);

/// The coordinator whose replica runs on the calling thread, or nullptr.
const void* replica_thread_owner();

/// Spins until the actor's mailbox has a message or the budget is spent.
void spin_on_mailbox(caf::blocking_actor* self, std::chrono::microseconds spin, int pause_spins);

// The rendezvous and the cluster watch (rendezvous.hpp has the walkthrough):
//   worker -> chief's agent: (nonce) -> string; (join, version, rank, nonce, proof, devices,
//     data host, data port) -> vector<member> or a caf::error of category "rendezvous";
//     (beat, rank, watcher, cpu percent, rss bytes, lines total, lines, phase, step, collective,
//     op, dtype, bytes, phase ms, ring peer, ring idle ms, ring sent, ring received): the beat,
//     the worker_report and the
//     worker_position beside it, flat as the join is; (bye, rank); (fault, rank, what) -> bool: a
//     member found the workers out of step or a ring link tampered with, and the agent tells
//     every other watcher (gone, rank, what)
//   chief -> its own agent: (await) -> vector<member> or the error; (tick, interval); (check);
//     (expire)
//   agent -> every watcher: (gone, rank, reason); (alive) every interval, the chief's heartbeat
// The join keeps flat fields with the version first, so a worker of another protocol version is
// still understood well enough to be told so.
using nonce_atom = caf::atom_constant<caf::atom("nonce")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using await_atom = caf::atom_constant<caf::atom("await")>;
using expire_atom = caf::atom_constant<caf::atom("expire")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;
using check_atom = caf::atom_constant<caf::atom("check")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
using fault_atom = caf::atom_constant<caf::atom("fault")>;
// The chief's program ends (its own watch, to its agent, then the agent to every watcher):
// (leaving) -> bool from the agent once every watcher answered (leaving) -> (), before the chief's
// connections close.
using leaving_atom = caf::atom_constant<caf::atom("leaving")>;
// Joining a running elastic cluster (rendezvous.hpp, join_cluster):
//   joiner -> chief's agent: (nonce) -> string; (enlist, version, task, nonce, proof, devices,
//     data host, data port) -> join_answer or a caf::error of category "rendezvous", answered at
//     the cluster's next step boundary
//   chief -> its own agent (refused from any other node): (admit, keys, table, ids, generation,
//     incarnation, changes, max workers) -> vector<int32> (the joiners' watch ids); (refuse, key, why)
using enlist_atom = caf::atom_constant<caf::atom("enlist")>;
using admit_atom = caf::atom_constant<caf::atom("admit")>;
using refuse_atom = caf::atom_constant<caf::atom("refuse")>;

// The tasks of a cluster (cluster_tasks.hpp has the walkthrough):
//   dispatcher -> task agent: (hello, task, watched actor) -> (task, pulse); (table, blob);
//     (call, id, function, args); (leave)
//   dispatcher -> pulse: (beat, interval ms, missed) -> bool
//   task agent -> dispatcher: (result, id, ok, payload)
//   anyone -> ps agent: (vnew, key, bytes) -> bool; (vread, key) -> bytes; (vupdate, key, op, bytes)
//     -> bool; (data) -> (port, secret) of its data connections (bulk_channel.hpp); (vslots, key)
//     -> the number of optimizer slots the shard keeps (0 before its first optimizer update)
//   chief's dispatch actor -> ps agent: (pstats) -> (shards, bytes held, updates, bytes in, bytes
//     out), asked at every heartbeat for the dashboard (ps_cluster_board)
//   chief's dispatch actor -> ps agent (refused from anyone else): (ckptsave, directory, file, step)
//     -> (file bytes, XXH64); (ckptload, key, elements, slots, applied, optimizer or 255) -> bool
//   inside the chief, to its dispatch actor: (sched, id, function, args); (wup, worker, agent);
//     (table, blob); (leave) -> bool; (cancel) -> bool; (resume); (hbset, interval ms, missed);
//     (stallset, warning ms, shutdown ms); (ckptsave, ps, directory, file, step, timeout ms);
//     (ckptload, ps, key, elements, slots, applied, optimizer, timeout ms): relayed to the ps agent;
//     from the connector, a lost ps task reached again after its restart: (psup, ps, agent, pulse)
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using call_atom = caf::atom_constant<caf::atom("call")>;
using result_atom = caf::atom_constant<caf::atom("result")>;
using table_atom = caf::atom_constant<caf::atom("table")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using vnew_atom = caf::atom_constant<caf::atom("vnew")>;
using vread_atom = caf::atom_constant<caf::atom("vread")>;
using vupdate_atom = caf::atom_constant<caf::atom("vupdate")>;
using vslots_atom = caf::atom_constant<caf::atom("vslots")>;
using sched_atom = caf::atom_constant<caf::atom("sched")>;
using wup_atom = caf::atom_constant<caf::atom("wup")>;
using window_atom = caf::atom_constant<caf::atom("window")>;
using watch_ps_atom = caf::atom_constant<caf::atom("watchps")>;
using psup_atom = caf::atom_constant<caf::atom("psup")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using hbset_atom = caf::atom_constant<caf::atom("hbset")>;
using stallset_atom = caf::atom_constant<caf::atom("stallset")>;
using ckptsave_atom = caf::atom_constant<caf::atom("ckptsave")>;
using ckptload_atom = caf::atom_constant<caf::atom("ckptload")>;
using data_atom = caf::atom_constant<caf::atom("data")>;
using reach_atom = caf::atom_constant<caf::atom("reach")>;
using pstats_atom = caf::atom_constant<caf::atom("pstats")>;

// Actors an application spawns (app_actors.hpp has the walkthrough):
//   spawner -> task agent: (aspawn, spawner task, watch, type, args) -> actor; (aping) -> bool
//   anyone -> hosted actor: (amsg, token, name, payload), answered to its sender with
//     (areply, token, ok, payload or the actor's error text): plain messages, no CAF request, so
//     that no request schedules a timeout on CAF's clock; the sender keeps the deadline
//   inside the spawner, to its supervisor: (awatch, actor, id, type, task, agent or null)
//   inside the spawner, to its requester: (areq, token, timeout ms), the deadline of a request
//     sent as it (completed by the token's callback, or by the supervisor once the actor is down);
//     (atick) when its earliest deadline is due
//   inside the spawner, to a synchronous caller's blocking actor: (adown, token, why),
//     its request ended without a reply (the actor went down, or the client ended)
//   spawner's requester -> hosted actor: (asendv, ack, names, payloads), a batch of one-way
//     messages; every send_window::ack_every-th of them (counted by the hosted actor) is
//     acknowledged with (asent, count so far) to the requester, which opens the sender's window
//     that far; (aflush, actor) rings the requester to send an actor's batch
//   a task's actor data port (its reader thread) -> hosted actor: (afast, job), a message that
//     came over a data connection; the actor writes its reply back on that connection
//   inside the spawner, a data connection that failed -> its supervisor: (alost, task, why, ids):
//     the actors it carried are down
using aspawn_atom = caf::atom_constant<caf::atom("aspawn")>;
using aping_atom = caf::atom_constant<caf::atom("aping")>;
using amsg_atom = caf::atom_constant<caf::atom("amsg")>;
using awatch_atom = caf::atom_constant<caf::atom("awatch")>;
using areq_atom = caf::atom_constant<caf::atom("areq")>;
using asendv_atom = caf::atom_constant<caf::atom("asendv")>;
using aflush_atom = caf::atom_constant<caf::atom("aflush")>;
using asent_atom = caf::atom_constant<caf::atom("asent")>;
using areply_atom = caf::atom_constant<caf::atom("areply")>;
using adown_atom = caf::atom_constant<caf::atom("adown")>;
using atick_atom = caf::atom_constant<caf::atom("atick")>;
using afast_atom = caf::atom_constant<caf::atom("afast")>;
using alost_atom = caf::atom_constant<caf::atom("alost")>;

/// A member travels field by field; add_rendezvous_types announces it and the peer table.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member& x) {
  return f(caf::meta::type_name("troupe::actors::member"), x.rank, x.task, x.data_host, x.data_port, x.devices,
           x.collective_id, x.incarnation);
}

/// A join_answer travels field by field too.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_answer& x) {
  return f(caf::meta::type_name("troupe::actors::join_answer"), x.table, x.watch_ids, x.generation, x.incarnation,
           x.rank, x.changes, x.max_workers);
}

/// A rendezvous_error as it travels: its code in the "rendezvous" category, its message as the
/// context.
inline caf::error to_caf_error(const rendezvous_error& e) { return caf::make_error(e.code, e.message); }

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::step_task_ptr)
