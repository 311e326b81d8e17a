@0xc6b3f1e8a2d47e91;
# The frames of troupe's TCP data plane. A frame's tensor bytes travel as an external segment of
# the message: the sender references its buffer (no copy) and the receiver reads them in place.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

# float16 and bfloat16: the wire formats of compressed float32 all-reduces (CommunicationOptions::compression).
enum ScalarType { float32 @0; float64 @1; int32 @2; int64 @3; uint8 @4; float16 @5; bfloat16 @6; }

# Which collective a frame belongs to (protocol version 3; allReduceBlock since version 4). Frames
# of version 2 had no kind: they read as allReduce, the only collective then.
enum Collective {
  allReduce @0;
  broadcast @1;         # a segment of the root's bytes, passed down the chain
  allGather @2;         # a segment of one rank's block
  broadcastClose @3;    # no data: the rank before the root tells the root which broadcast it
                        # takes part in, so that the root checks it too and no frame is left over
  allReduceBlock @4;    # a small all-reduce (more than 2 ranks): one rank's whole buffer, passed
                        # both ways around the ring; root names that rank, total its bytes
}

# The proof of a connection (version 5), three hellos: the connecting rank's (its nonce), the
# accepting rank's (its nonce and proof), the connecting rank's again (its proof); since version 6
# a fourth, the accepting rank's acknowledgement (neither nonce nor proof). A proof is
# HMAC-SHA256 under the cluster token over both nonces, both ranks, the ring size, the protocol
# version, the side that proves and the cluster's incarnation (see ring_connect.hpp).
struct Hello {
  magic @0 :UInt32;        # 0x74727570 ("trup")
  version @1 :UInt32;      # protocol version; peers must agree
  rank @2 :UInt32;         # the sender's rank
  size @3 :UInt32;         # ranks in the ring, as the sender sees it
  nonce @4 :Data;          # 16 fresh random bytes of the sender's (its first hello)
  proof @5 :Data;          # 32 bytes of HMAC-SHA256 (the accepting rank's hello, the last one)
}

struct Chunk {
  sequence @0 :UInt64;     # the collective's number within its step (version 5), from 0
  index @1 :UInt32;        # which chunk of the buffer (all-gather: the rank whose block it is)
  type @2 :ScalarType;
  count @3 :UInt64;        # elements in data
  data @4 :Data;
  offset @5 :UInt64;       # the first element's index in the buffer (chunks travel in segments)
  kind @6 :Collective;
  root @7 :UInt32;         # broadcast: the root; all-reduce block: the rank whose buffer it is
  total @8 :UInt64;        # broadcast: bytes of the whole buffer; all-gather and all-reduce block:
                           # of the whole block
  step @9 :UInt64;         # the training step the collective belongs to (version 5): the runtime's
                           # count of Strategy::run calls, 0 before the first
  key @10 :UInt64;         # the collective's name, when its caller gave one (version 6; 0: none)
}
