@0xc6b3f1e8a2d47e91;
# The frames of troupe's TCP data plane. A frame's tensor bytes travel as an external segment of
# the message: the sender references its buffer (no copy) and the receiver reads them in place.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

enum ScalarType { float32 @0; float64 @1; int32 @2; int64 @3; }

struct Hello {
  magic @0 :UInt32;        # 0x74727570 ("trup")
  version @1 :UInt32;      # protocol version; peers must agree
  rank @2 :UInt32;         # the sender's rank
  size @3 :UInt32;         # ranks in the ring, as the sender sees it
}

struct Chunk {
  sequence @0 :UInt64;     # collectives this ring has run, for matching frames to operations
  index @1 :UInt32;        # which chunk of the buffer
  type @2 :ScalarType;
  count @3 :UInt64;        # elements in data
  data @4 :Data;
  offset @5 :UInt64;       # the first element's index in the buffer (chunks travel in segments)
}
