#pragma once

// The data connections of the ps tasks: a variable shard's bytes beside the control plane, sent
// from the shard's storage and read straight into the destination tensor.
//
// The protocol, numbered as it happens:
//   1. A ps task listens on a data port (bulk_listener) and hands out the port and a fresh random
//      secret over the control plane, which only peers that proved the cluster token reach.
//   2. A worker connects (bulk_stream::connect) and both sides run ring_connect's proof (three
//      hellos, HMAC-SHA256 under the cluster token over both nonces, and the listener's
//      acknowledgement), with the secret as the
//      incarnation: without a token the secret alone keeps strangers out. A connection that fails
//      the proof, or does not finish it in time, is refused and logged with its address before a
//      request is read; nothing it claims is allocated (a hello is at most 64 words).
//   3. Requests, answered one at a time in order: a 24-byte header (magic, kind, op, dtype, key
//      length, byte count), the key, and for an update, a gather or a scatter the bytes themselves
//      (a gather's row indices; a scatter's row indices, then its rows). The receiver checks the
//      header (magic, kind, a key of at most bulk_max_key bytes) and the byte count against the
//      shard's registered dtype and size (a gather's and a scatter's: whole indices, or indices
//      and rows) before it reads a byte of the data, and every row index against the shard's rows.
//   4. Every request is answered by a 16-byte header (magic, status, byte count), then the shard's
//      bytes (a read), the rows asked for in the order asked (a gather), nothing (an update or a
//      scatter), or the error's text (at most bulk_max_error bytes).
//      A reply whose byte count is not what the requester expects is an error naming the peer.
//   5. With a cluster token every request and every reply is followed by a 16-byte integrity tag
//      (AES-256-GCM as a MAC, the proof's frame key, the message's number in the nonce), checked
//      once its last byte is read: a message altered, replayed or reordered on the way fails,
//      naming the peer, and the connection is dropped.
// Every wait has a bound: a peer that stalls mid-frame for longer than the timeout, closes early or
// sends a malformed header is a std::runtime_error naming it, and its connection is dropped.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/transport/ring_connect.hpp"

struct iovec;

namespace troupe::transport {

/// A value's bytes at `at` (unaligned), as the data connections' headers carry them: the host's
/// byte order, little-endian on every platform troupe builds for.
template <class T>
void put_value(unsigned char* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
/// The value whose bytes are at `at` (unaligned): put_value's inverse.
template <class T>
T get_value(const unsigned char* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

/// One request on a data connection. A read asks for the whole shard and an update sends it
/// whole; a gather asks for some rows (its bytes: that many 8-byte row indices) and a scatter
/// changes some (its bytes: the row indices, then the rows, in the same order). An apply sends an
/// optimizer's parameters then a gradient for the whole shard, and an apply to rows the parameters,
/// the row indices, then the rows' gradients: the receiver updates the shard with its own slots.
struct bulk_request {
  enum : std::uint8_t { read = 1, update = 2, gather = 3, scatter = 4, apply = 5, apply_rows = 6 };
  std::uint8_t kind = read;
  std::uint8_t op = 0;     ///< an update's operation (its meaning is the receiver's)
  std::uint8_t dtype = 0;  ///< the element type the sender expects (checked by the receiver)
  std::string key;
  std::uint64_t bytes = 0;  ///< an update: the bytes that follow; a read: the bytes expected
};

/// The longest key, and the longest error text, a data connection carries.
constexpr std::size_t bulk_max_key = 1024;
constexpr std::size_t bulk_max_error = 4096;

/// One proven data connection, either side; owns its socket. Blocking, every wait bounded by the
/// timeout (time without progress), except a listener's wait for the next request.
class bulk_stream {
 public:
  /// Connects to `ep` (retrying while nobody listens yet) and proves the connection, all within
  /// `timeout` (at most 10 s); a listener that refuses it before acknowledging the proof (pushed
  /// out by a flood of connections that do not prove themselves) is tried again within that bound.
  /// `name` names the peer in every error ("ps task /job:ps/replica:0/task:0").
  /// With a token, `hashing` says where its large messages' tags are hashed (tag_hashing; the
  /// default, automatic, is in line here: bench/README.md, "Hashing beside on the data connections").
  static std::unique_ptr<bulk_stream> connect(const endpoint& ep, const ring_auth& auth,
                                              std::chrono::milliseconds timeout, std::string name,
                                              tag_hashing hashing = tag_hashing::automatic);
  /// Takes a proven socket (the listener's side).
  bulk_stream(int fd, std::chrono::milliseconds timeout, std::string name);
  ~bulk_stream();
  bulk_stream(const bulk_stream&) = delete;
  bulk_stream& operator=(const bulk_stream&) = delete;

  const std::string& name() const noexcept { return name_; }

  /// Sends a request: its header, its key, then (all but a read) `r.bytes` bytes: the first
  /// `r.bytes - more_n` from `data`, the rest from `more`.
  void send_request(const bulk_request& r, const void* data, const void* more = nullptr, std::size_t more_n = 0);
  /// The next request, waiting as long as it takes (until the peer closes: nullopt, or shutdown());
  /// a malformed header throws naming the peer. An update's bytes are left for receive().
  std::optional<bulk_request> receive_request();
  /// Answers a request with `n` bytes from `data` (n may be 0).
  void send_reply(const void* data, std::size_t n);
  /// Answers a request with an error.
  void send_error(const std::string& text);
  /// Reads a reply's header: ok with exactly `expected` bytes to follow (read them with receive()),
  /// or throws the peer's error, or an error naming the peer when the count differs.
  void receive_reply(std::uint64_t expected);
  /// Reads exactly `n` bytes into `into`; throws naming the peer when it closes or stalls.
  void receive(void* into, std::size_t n);
  /// Wakes whatever waits on this connection; it is closed for both directions.
  void shutdown() noexcept;

  /// From now on every request and every reply carries an integrity tag under `key` (the proof's
  /// frame key; frames::frame_mac): `connecting` names this side of the connection. A message whose
  /// tag does not match is a std::runtime_error naming the peer. With tag_hashing::beside the
  /// bytes of a message of 64 KiB and more are hashed on a thread of the connection's own while
  /// this one writes or reads them (automatic and in_line: on this thread).
  void tag_messages(const std::vector<std::uint8_t>& key, bool connecting,
                    tag_hashing hashing = tag_hashing::automatic);

  /// Messages of a framing of the caller's own (the application actors' data connections,
  /// actors/src/app_data.hpp), with the same proof, bounds and integrity tags.
  /// Waits at most `wait_ms` (negative: as long as it takes) for the next message's first byte;
  /// false when none came (a closed peer counts as a byte: receive_header says so).
  bool wait_message(int wait_ms);
  /// Reads the next message's header of `n` bytes; false when the peer closed (or reset) its
  /// connection before sending a byte of it. Then expect_body() says how many bytes follow.
  bool receive_header(void* into, std::size_t n);
  /// The message's `n` more bytes, read with receive(); its tag is checked once the last is read
  /// (at once when n is 0).
  void expect_body(std::uint64_t n);
  /// Sends one message made of the `parts` (at most 1000), followed by its tag when tagged. The
  /// caller serializes its sends; a send and a receive may run at once on two threads.
  void send_message(const iovec* parts, int n);

 private:
  void send_all(const void* header, std::size_t header_n, const void* a, std::size_t an, const void* b,
                std::size_t bn, const void* c, std::size_t cn);
  void write_all(iovec* iov, int parts);
  void read_exact(void* into, std::size_t n);
  // With tags: the incoming message's bytes so far join its tag; `left` bytes of it are still to
  // come (receive()), and its tag is read and checked once none are.
  void start_message(const void* header, std::size_t n);
  void add_to_message(const void* data, std::size_t n);
  void end_message_when_read();
  int fd_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::shared_ptr<frames::frame_mac> out_mac_;
  std::shared_ptr<frames::frame_mac> in_mac_;
  std::uint64_t in_left_ = 0;
};

/// Accepts data connections on host:port (port 0: a free one; a host name is resolved to its IPv4
/// address) and proves each on a thread of its own; a proven one is handed to `serve` on that
/// thread, which returns when the peer is gone. Connections that fail the proof are refused and
/// logged on stderr with their address, `owner` naming the listener. At most `max_connections`
/// prove themselves at once: a newer one pushes out the oldest still proving itself (a stranger
/// that says nothing keeps its place only until newer ones come; a worker pushed out tries again,
/// see bulk_stream::connect); proven connections are never pushed out. Destruction stops
/// accepting, shuts every connection down and joins its threads.
class bulk_listener {
 public:
  bulk_listener(const std::string& host, std::uint16_t port, ring_auth auth, std::chrono::milliseconds timeout,
                std::string owner, std::function<void(bulk_stream&)> serve, std::size_t max_connections = 64,
                tag_hashing hashing = tag_hashing::automatic);
  ~bulk_listener();
  bulk_listener(const bulk_listener&) = delete;
  bulk_listener& operator=(const bulk_listener&) = delete;

  /// The port it listens on.
  std::uint16_t port() const noexcept;
  /// Connections refused so far (failed or unfinished proofs, pushed out, too many open at once).
  std::uint64_t refused() const noexcept;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

/// The protocol version both sides of a data connection prove.
constexpr std::uint32_t bulk_protocol_version = 0x70730001;

}  // namespace troupe::transport
