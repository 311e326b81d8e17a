#pragma once

// The frames of the actor data connections, both sides (app_actors.hpp, steps 5 to 8). A frame: a
// 16-byte header (magic, record count, body bytes), then its records, each a 32-byte header (kind,
// status, name bytes, request number, the actor's number on its host, payload bytes), its name,
// its payload; with a token, one tag per frame. Internal to actors/.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/app_actors.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace troupe::actors::data_wire {

constexpr std::uint32_t frame_magic = 0x66636174;  // "tacf"
constexpr std::size_t frame_header_bytes = 16;
constexpr std::size_t record_header_bytes = 32;
constexpr std::size_t max_records = 256;                    // in one frame
constexpr std::size_t frame_target_bytes = std::size_t{1} << 20;  // a frame closes once this full
constexpr std::size_t max_error_bytes = 64 * 1024;          // an error's text
constexpr std::size_t small_body = 256 * 1024;              // read whole, then parsed
enum : std::uint8_t { request = 1, send = 2, stop = 3, reply = 4, ack = 5 };
enum : std::uint8_t { ok = 0, failed = 1, refused = 2 };    // a reply's status
constexpr std::uint8_t ask_ack = 1;                         // a send's status: acknowledge it

// One record to write; its payload is its own or the caller's (who keeps it until written).
struct out_record {
  unsigned char head[record_header_bytes] = {};
  std::string name;
  std::string owned;
  const std::string* ref = nullptr;
  const std::string& payload() const { return ref ? *ref : owned; }
};

// A record of `kind`; `ref`, when given, is the payload (kept by the caller until written).
out_record make_record(std::uint8_t kind, std::uint8_t status, std::uint64_t number, std::uint64_t actor,
                       std::string name, std::string payload, const std::string* ref = nullptr);

// Writes the records in frames (each at most max_records, closed once frame_target_bytes full),
// each with one writev from where the bytes are.
void write_records(transport::bulk_stream& s, const std::vector<out_record>& records);

struct in_record {
  std::uint8_t kind = 0;
  std::uint8_t status = 0;
  std::uint64_t number = 0;
  std::uint64_t actor = 0;
  std::string name;
  std::string payload;
};

// Reads the next frame's records (its tag checked, when tagged, before this returns); false when
// the peer closed its connection before a frame began. A malformed frame throws naming the peer.
// `to_host`: the frame goes to a task's data port (requests, sends, stops), else to a spawner.
bool read_frame(transport::bulk_stream& s, bool to_host, std::vector<in_record>& out, std::vector<char>& scratch);

// The host's side of one data connection: the replies its actors wrote and not sent yet, and
// where they go. A reply is written by the actor's thread that made it.
struct host_conn {
  std::mutex write_mutex;
  transport::bulk_stream* stream = nullptr;  // null once its reader ended
  std::mutex out_mutex;
  std::vector<out_record> out;

  void add(out_record r) {
    std::lock_guard<std::mutex> lock(out_mutex);
    out.push_back(std::move(r));
  }
  std::size_t waiting() {
    std::lock_guard<std::mutex> lock(out_mutex);
    return out.size();
  }
  void flush() {
    std::lock_guard<std::mutex> lock(write_mutex);
    std::vector<out_record> batch;
    {
      std::lock_guard<std::mutex> o(out_mutex);
      batch.swap(out);
    }
    if (batch.empty() || stream == nullptr) return;
    try {
      write_records(*stream, batch);
    } catch (const std::exception&) {
      stream->shutdown();  // its reader ends the connection
    }
  }
};

// What one connection's messages to one actor count: those handed to it and not handled yet (its
// replies are written once none are left), and the one-way ones it handled (acknowledged).
struct conn_counts {
  std::atomic<std::uint64_t> queued{0};
  std::uint64_t received = 0;  // the actor's thread only
};

}  // namespace troupe::actors::data_wire
