@0xff1a0ab7c6ca90ec;
# The body of a troupe checkpoint file (see transport/include/troupe/transport/checkpoint_file.hpp
# for the whole layout). Segment 0 holds this structure; each tensor chunk is a segment of its own
# that the writer references in place, so saving copies no tensor bytes.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire::ckpt");

enum ElementType { float32 @0; float64 @1; int32 @2; int64 @3; float16 @4; bfloat16 @5; }

struct Tensor {
  name @0 :Text;
  elementType @1 :ElementType;
  shape @2 :List(Int64);
  byteSize @3 :UInt64;     # element count x element size; the chunks' sizes add up to it
  checksum @4 :UInt64;     # XXH64 (seed 0) of the tensor's bytes, the chunks in order
  chunks @5 :List(Data);   # the bytes; a Data holds at most 512 MiB, so big tensors take several
}

struct Checkpoint {
  step @0 :Int64;
  tensors @1 :List(Tensor);
}
