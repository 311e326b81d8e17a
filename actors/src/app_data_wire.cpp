#include "app_data_wire.hpp"

#include <sys/uio.h>

#include <stdexcept>

namespace troupe::actors::data_wire {

namespace {

// Checks a record's header before a byte of its name or payload is read: its kind for this side
// (`to_host`), its status, its lengths.
void check_record(const unsigned char* h, bool to_host, const std::string& who, std::size_t* name_n,
                  std::uint64_t* payload_n) {
  const std::uint8_t kind = h[0];
  const std::uint8_t status = h[1];
  *name_n = transport::get_value<std::uint16_t>(h + 2);
  *payload_n = transport::get_value<std::uint64_t>(h + 24);
  const auto bad = [&](const std::string& what) {
    return std::runtime_error(who + " sent a malformed actor message: " + what);
  };
  if (to_host) {
    if (kind != request && kind != send && kind != stop) throw bad("kind " + std::to_string(kind));
    if (status > ask_ack) throw bad("status " + std::to_string(status));
    if (*name_n > app_message_limits::max_name_bytes) {
      throw bad("a name of " + std::to_string(*name_n) + " bytes (at most " +
                std::to_string(app_message_limits::max_name_bytes) + ")");
    }
    if (*payload_n > app_message_limits::max_payload_bytes) {
      throw bad("a payload of " + std::to_string(*payload_n) + " bytes (at most " +
                std::to_string(app_message_limits::max_payload_bytes) + ")");
    }
    if (kind == stop && (*name_n != 0 || *payload_n != 0)) throw bad("a stop that carries bytes");
    return;
  }
  if (kind != reply && kind != ack) throw bad("kind " + std::to_string(kind));
  if (*name_n != 0) throw bad("a reply with a name");
  if (kind == ack && (status != ok || *payload_n != 0)) throw bad("an acknowledgement that carries bytes");
  if (status > refused) throw bad("status " + std::to_string(status));
  const std::uint64_t most = status == ok ? app_message_limits::max_payload_bytes : max_error_bytes;
  if (*payload_n > most) {
    throw bad("a reply of " + std::to_string(*payload_n) + " bytes (at most " + std::to_string(most) + ")");
  }
}

}  // namespace

out_record make_record(std::uint8_t kind, std::uint8_t status, std::uint64_t number, std::uint64_t actor,
                       std::string name, std::string payload, const std::string* ref) {
  out_record r;
  r.name = std::move(name);
  r.owned = std::move(payload);
  r.ref = ref;
  r.head[0] = kind;
  r.head[1] = status;
  transport::put_value<std::uint16_t>(r.head + 2, static_cast<std::uint16_t>(r.name.size()));
  transport::put_value<std::uint64_t>(r.head + 8, number);
  transport::put_value<std::uint64_t>(r.head + 16, actor);
  transport::put_value<std::uint64_t>(r.head + 24, static_cast<std::uint64_t>(r.payload().size()));
  return r;
}

// Writes the records in frames (each at most max_records, closed once frame_target_bytes full),
// each with one writev from where the bytes are.
void write_records(transport::bulk_stream& s, const std::vector<out_record>& records) {
  std::vector<iovec> iov;
  iov.reserve(3 * max_records + 1);
  std::size_t i = 0;
  while (i < records.size()) {
    unsigned char fh[frame_header_bytes] = {};
    iov.clear();
    iov.push_back(iovec{fh, sizeof fh});
    std::uint64_t body = 0;
    std::uint32_t n = 0;
    while (i < records.size() && n < max_records && (n == 0 || body < frame_target_bytes)) {
      const auto& r = records[i++];
      iov.push_back(iovec{const_cast<unsigned char*>(r.head), record_header_bytes});
      if (!r.name.empty()) iov.push_back(iovec{const_cast<char*>(r.name.data()), r.name.size()});
      const std::string& p = r.payload();
      if (!p.empty()) iov.push_back(iovec{const_cast<char*>(p.data()), p.size()});
      body += record_header_bytes + r.name.size() + p.size();
      ++n;
    }
    transport::put_value<std::uint32_t>(fh, frame_magic);
    transport::put_value<std::uint32_t>(fh + 4, n);
    transport::put_value<std::uint64_t>(fh + 8, body);
    s.send_message(iov.data(), static_cast<int>(iov.size()));
  }
}

// Reads the next frame's records (its tag checked, when tagged, before this returns); false when
// the peer closed its connection before a frame began. A malformed frame throws naming the peer.
bool read_frame(transport::bulk_stream& s, bool to_host, std::vector<in_record>& out, std::vector<char>& scratch) {
  unsigned char fh[frame_header_bytes];
  if (!s.receive_header(fh, sizeof fh)) return false;
  const std::string& who = s.name();
  const auto magic = transport::get_value<std::uint32_t>(fh);
  const auto n = transport::get_value<std::uint32_t>(fh + 4);
  const auto body = transport::get_value<std::uint64_t>(fh + 8);
  if (magic != frame_magic) {
    throw std::runtime_error(who + " sent a frame that is not troupe's actor data (magic " + std::to_string(magic) + ")");
  }
  const std::uint64_t most = app_message_limits::max_payload_bytes +
                             std::uint64_t{n} * (record_header_bytes + app_message_limits::max_name_bytes) +
                             frame_target_bytes;
  if (n == 0 || n > max_records || body < std::uint64_t{n} * record_header_bytes || body > most) {
    throw std::runtime_error(who + " sent an actor frame of " + std::to_string(n) + " records in " +
                             std::to_string(body) + " bytes (1.." + std::to_string(max_records) +
                             " records, at most " + std::to_string(most) + " bytes)");
  }
  s.expect_body(body);
  out.resize(n);
  std::uint64_t left = body;
  const auto overrun = [&] {
    return std::runtime_error(who + " sent an actor frame whose records overrun its " + std::to_string(body) + " bytes");
  };
  if (body <= small_body) {
    scratch.resize(static_cast<std::size_t>(body));
    s.receive(scratch.data(), scratch.size());  // the tag is checked here
    const auto* at = reinterpret_cast<const unsigned char*>(scratch.data());
    for (auto& r : out) {
      if (left < record_header_bytes) throw overrun();
      std::size_t name_n = 0;
      std::uint64_t payload_n = 0;
      check_record(at, to_host, who, &name_n, &payload_n);
      r.kind = at[0];
      r.status = at[1];
      r.number = transport::get_value<std::uint64_t>(at + 8);
      r.actor = transport::get_value<std::uint64_t>(at + 16);
      at += record_header_bytes;
      left -= record_header_bytes;
      if (name_n + payload_n > left) throw overrun();
      r.name.assign(reinterpret_cast<const char*>(at), name_n);
      at += name_n;
      r.payload.assign(reinterpret_cast<const char*>(at), static_cast<std::size_t>(payload_n));
      at += payload_n;
      left -= name_n + payload_n;
    }
  } else {
    // Large: each record's bytes are read straight into its strings; the records are handed on
    // only once the whole frame (and its tag) is in.
    for (auto& r : out) {
      if (left < record_header_bytes) throw overrun();
      unsigned char h[record_header_bytes];
      s.receive(h, sizeof h);
      left -= record_header_bytes;
      std::size_t name_n = 0;
      std::uint64_t payload_n = 0;
      check_record(h, to_host, who, &name_n, &payload_n);
      if (name_n + payload_n > left) throw overrun();
      r.kind = h[0];
      r.status = h[1];
      r.number = transport::get_value<std::uint64_t>(h + 8);
      r.actor = transport::get_value<std::uint64_t>(h + 16);
      r.name.resize(name_n);
      s.receive(r.name.data(), name_n);
      r.payload.resize(static_cast<std::size_t>(payload_n));
      s.receive(r.payload.data(), r.payload.size());
      left -= name_n + payload_n;
    }
  }
  if (left != 0) {
    throw std::runtime_error(who + " sent an actor frame with " + std::to_string(left) + " bytes beyond its records");
  }
  return true;
}

}  // namespace troupe::actors::data_wire
