#include "ps_shards.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "protocol.hpp"
#include "task_common.hpp"

namespace troupe::actors {

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, std::shared_ptr<shard_cell> cell,
                          std::shared_ptr<const task_handlers> handlers) {
  self->state.cell = std::move(cell);
  return {
      [=](vread_atom) -> std::string {
        auto& c = *self->state.cell;
        std::shared_ptr<std::string> bytes;
        {
          std::shared_lock<std::shared_mutex> lock(c.mutex);
          bytes = c.value;
        }
        return *bytes;
      },
      [=](vupdate_atom, std::uint8_t op, const std::string& delta) -> caf::result<bool> {
        if (!handlers->update) return runtime_error("this task holds no variables");
        const auto kind = update_op_of(op);
        if (!kind) return runtime_error(unknown_update_op(op));
        auto& c = *self->state.cell;
        try {
          std::unique_lock<std::shared_mutex> lock(c.mutex);
          auto& bytes = c.writable();
          if (auto bad = handlers->update(bytes, *kind, delta)) return runtime_error(*bad);
          if (handlers->layout) {
            if (auto l = handlers->layout(bytes)) c.layout = *l;
          }
        } catch (const std::exception& e) {
          return runtime_error(e.what());
        }
        return true;
      },
  };
}

namespace {

// Reads and drops the `n` bytes of a refused request, so that the answer reaches the sender in
// order; false (the connection ends) for a count beyond any shard.
bool drain(transport::bulk_stream& s, std::uint64_t n) {
  if (n > (std::uint64_t{1} << 32)) return false;
  char sink[65536];
  for (std::uint64_t left = n; left > 0;) {
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(left, sizeof sink));
    s.receive(sink, k);
    left -= k;
  }
  return true;
}

bool same_rows(const shard_layout& a, const shard_layout& b) {
  return a.dtype == b.dtype && a.nbytes == b.nbytes && a.rows == b.rows && a.offset == b.offset;
}

// A gather or a scatter on one shard (5a of the walkthrough): some rows, by index. Its size is
// checked against the shard's rows before a byte is read or allocated, and every index against
// the rows it has. False: the connection ends.
bool serve_rows(transport::bulk_stream& s, const transport::bulk_request& r, const std::shared_ptr<shard_cell>& cell,
                std::string bad, std::vector<char>& buffer, std::vector<char>& reply, const task_handlers& h,
                const std::string& task, shard_traffic& traffic) {
  const bool gather = r.kind == transport::bulk_request::gather;
  const std::string what = "variable shard '" + r.key.substr(0, 64) + "' on " + task;
  shard_layout layout;
  if (bad.empty()) {
    std::shared_lock<std::shared_mutex> lock(cell->mutex);
    layout = cell->layout;
  }
  const std::size_t row_bytes = layout.rows == 0 ? 0 : layout.nbytes / layout.rows;
  const std::size_t unit = gather ? 8 : 8 + row_bytes;  // one index, or one index and its row
  if (bad.empty() && (layout.dtype != r.dtype || row_bytes == 0)) {
    bad = what + " holds elements of type " + std::to_string(layout.dtype) + " in " + std::to_string(layout.rows) +
          " rows, the request says type " + std::to_string(r.dtype);
  }
  if (bad.empty() && (r.bytes % unit != 0 || r.bytes > (std::uint64_t{1} << 32))) {
    bad = what + ": a " + (gather ? "gather" : "scatter") + " of " + std::to_string(r.bytes) +
          " bytes is not a whole number of " + (gather ? "8-byte row indices" : "row indices and rows of " +
          std::to_string(row_bytes) + " bytes") + " (at most 4 GiB)";
  }
  const auto op = update_op_of(r.op);
  if (bad.empty() && !gather && !op) bad = what + ": " + unknown_update_op(r.op);
  const std::size_t count = bad.empty() ? static_cast<std::size_t>(r.bytes / unit) : 0;
  if (bad.empty() && gather && count * row_bytes > (std::size_t{1} << 32)) {
    bad = what + ": a gather of " + std::to_string(count) + " rows of " + std::to_string(row_bytes) +
          " bytes answers more than 4 GiB (ask for fewer rows at a time)";
  }
  if (!bad.empty()) {
    if (!drain(s, r.bytes)) {
      s.send_error(bad);
      return false;
    }
    s.send_error(bad);
    return true;
  }
  const auto n = static_cast<std::size_t>(r.bytes);
  if (buffer.size() < n) buffer.resize(n);
  s.receive(buffer.data(), n);
  // Row index i, in the host's byte order as every field here (the buffer need not be aligned).
  const auto row = [&](std::size_t i) {
    std::uint64_t v;
    std::memcpy(&v, buffer.data() + i * 8, 8);
    return v;
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (row(i) >= layout.rows) {
      s.send_error(what + " has " + std::to_string(layout.rows) + " rows; the request names row " +
                   std::to_string(row(i)) + " (index " + std::to_string(i) + ")");
      return true;
    }
  }
  if (gather) {
    // From a reference to the bytes taken under the shared lock, as a read does: an update meanwhile
    // goes to a copy.
    std::shared_ptr<const std::string> bytes;
    {
      std::shared_lock<std::shared_mutex> lock(cell->mutex);
      bytes = cell->value;
      if (!same_rows(cell->layout, layout)) {
        bytes = nullptr;
      }
    }
    if (!bytes) {
      s.send_error(what + " was created again with another shape meanwhile");
      return true;
    }
    if (reply.size() < count * row_bytes) reply.resize(count * row_bytes);
    const char* base = bytes->data() + layout.offset;
    for (std::size_t i = 0; i < count; ++i) std::memcpy(reply.data() + i * row_bytes, base + row(i) * row_bytes, row_bytes);
    s.send_reply(reply.data(), count * row_bytes);
    traffic.bytes_out += count * row_bytes;
    return true;
  }
  // A scatter: every row applied in order under the exclusive lock (a row named twice is applied
  // twice: additions add up, the last assignment wins).
  std::optional<std::string> failed;
  {
    std::unique_lock<std::shared_mutex> lock(cell->mutex);
    if (!same_rows(cell->layout, layout)) {
      failed = what + " was created again with another shape meanwhile";
    } else {
      char* base = cell->writable().data() + layout.offset;
      const char* from = buffer.data() + count * 8;
      for (std::size_t i = 0; i < count && !failed; ++i) {
        failed = h.combine(base + row(i) * row_bytes, from + i * row_bytes, row_bytes, r.dtype, *op);
      }
    }
  }
  if (failed) {
    s.send_error(*failed);
  } else {
    s.send_reply(nullptr, 0);
    ++traffic.updates;
  }
  return true;
}

// An optimizer update of one shard (5a of the walkthrough): the optimizer's parameters, then a
// gradient for the whole shard (apply) or row indices and their gradients (apply_rows). Sizes are
// checked before a byte is read or allocated, the parameters and every row index before anything
// is applied; the shard's slots are made (zeros) by its first optimizer update, and a later update
// of another kind is refused. False: the connection ends.
bool serve_apply(transport::bulk_stream& s, const transport::bulk_request& r, const std::shared_ptr<shard_cell>& cell,
                 std::string bad, std::vector<char>& buffer, const task_handlers& h, const std::string& task,
                 shard_traffic& traffic) {
  const bool rows = r.kind == transport::bulk_request::apply_rows;
  const std::string what = "variable shard '" + r.key.substr(0, 64) + "' on " + task;
  shard_layout layout;
  if (bad.empty()) {
    std::shared_lock<std::shared_mutex> lock(cell->mutex);
    layout = cell->layout;
  }
  if (bad.empty() && !h.apply) bad = task + " applies no optimizer updates";
  const std::size_t row_bytes = layout.rows == 0 ? 0 : layout.nbytes / layout.rows;
  if (bad.empty() && (layout.dtype != r.dtype || row_bytes == 0)) {
    bad = what + " holds elements of type " + std::to_string(layout.dtype) + " in " + std::to_string(layout.rows) +
          " rows, the request says type " + std::to_string(r.dtype);
  }
  const std::uint64_t body = r.bytes < apply_params_bytes ? 0 : r.bytes - apply_params_bytes;
  if (bad.empty() && r.bytes < apply_params_bytes) {
    bad = what + ": an optimizer update of " + std::to_string(r.bytes) + " bytes is shorter than its " +
          std::to_string(apply_params_bytes) + " bytes of parameters";
  }
  if (bad.empty() && !rows && body != layout.nbytes) {
    bad = what + " holds " + std::to_string(layout.nbytes) + " bytes, the optimizer update's gradient has " +
          std::to_string(body) + " (the variable was created again with another shape?)";
  }
  if (bad.empty() && rows && (body % (8 + row_bytes) != 0 || body > (std::uint64_t{1} << 32))) {
    bad = what + ": an optimizer update of " + std::to_string(body) + " bytes of rows is not a whole number of " +
          "row indices and rows of " + std::to_string(row_bytes) + " bytes (at most 4 GiB)";
  }
  if (!bad.empty()) {
    const bool drained = drain(s, r.bytes);
    s.send_error(bad);
    return drained;
  }
  const auto n = static_cast<std::size_t>(r.bytes);
  if (buffer.size() < n) buffer.resize(n);
  s.receive(buffer.data(), n);
  std::string error;
  const auto params = decode_apply_params(reinterpret_cast<const unsigned char*>(buffer.data()), &error);
  if (!params) {
    s.send_error(what + ": " + error);
    return true;
  }
  if (r.op != static_cast<std::uint8_t>(params->kind)) {
    s.send_error(what + ": the request's optimizer " + std::to_string(r.op) + " is not its parameters' " +
                 std::to_string(static_cast<int>(params->kind)));
    return true;
  }
  const char* grads = buffer.data() + apply_params_bytes;
  const std::size_t count = rows ? static_cast<std::size_t>(body / (8 + row_bytes)) : 0;
  const auto row = [&](std::size_t i) {
    std::uint64_t v;
    std::memcpy(&v, grads + i * 8, 8);
    return v;
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (row(i) >= layout.rows) {
      s.send_error(what + " has " + std::to_string(layout.rows) + " rows; the optimizer update names row " +
                   std::to_string(row(i)) + " (index " + std::to_string(i) + ")");
      return true;
    }
  }
  std::optional<std::string> failed;
  {
    std::unique_lock<std::shared_mutex> lock(cell->mutex);
    const int nslots = slot_count(params->kind);
    if (!same_rows(cell->layout, layout)) {
      failed = what + " was created again with another shape meanwhile";
    } else if (cell->slot_kind && *cell->slot_kind != params->kind) {
      failed = what + " keeps the slots of " + shard_optimizer_name(*cell->slot_kind) + "; an update by " +
               shard_optimizer_name(params->kind) + " cannot use them (one optimizer per variable)";
    } else {
      if (!cell->slot_kind) {
        cell->slots.assign(static_cast<std::size_t>(nslots), std::string(layout.nbytes, '\0'));
        cell->slot_kind = params->kind;
      }
      const std::int64_t step = ++cell->applied;
      char* base = cell->writable().data() + layout.offset;
      char* slots[2] = {nullptr, nullptr};
      for (int k = 0; k < nslots; ++k) slots[k] = cell->slots[static_cast<std::size_t>(k)].data();
      if (!rows) {
        failed = h.apply(base, slots, grads, layout.nbytes, r.dtype, *params, step);
      } else {
        const char* from = grads + count * 8;
        for (std::size_t i = 0; i < count && !failed; ++i) {
          const std::size_t at = row(i) * row_bytes;
          char* row_slots[2] = {slots[0] != nullptr ? slots[0] + at : nullptr,
                                slots[1] != nullptr ? slots[1] + at : nullptr};
          failed = h.apply(base + at, row_slots, from + i * row_bytes, row_bytes, r.dtype, *params, step);
        }
      }
    }
  }
  if (failed) {
    s.send_error(*failed);
  } else {
    s.send_reply(nullptr, 0);
    ++traffic.updates;
  }
  return true;
}

}  // namespace

void serve_shards(transport::bulk_stream& s, shard_store& store, const task_handlers& h, const std::string& task) {
  std::vector<char> buffer;  // an update's bytes, kept for the next (no page faults once grown)
  std::vector<char> reply;   // a gather's rows, kept likewise
  while (auto r = s.receive_request()) {
    store.traffic.bytes_in += r->bytes;
    auto cell = store.find(r->key);
    auto mismatch = [&](const shard_layout& l) -> std::string {
      if (l.dtype == r->dtype && l.nbytes == r->bytes) return {};
      return "variable shard '" + r->key.substr(0, 64) + "' on " + task + " holds " + std::to_string(l.nbytes) +
             " bytes of element type " + std::to_string(l.dtype) + ", the request says " + std::to_string(r->bytes) +
             " bytes of type " + std::to_string(r->dtype) + " (the variable was created again with another shape?)";
    };
    std::string bad;
    if (!cell) bad = "no variable shard '" + r->key.substr(0, 64) + "' on " + task;
    if (r->kind == transport::bulk_request::gather || r->kind == transport::bulk_request::scatter) {
      if (!serve_rows(s, *r, cell, std::move(bad), buffer, reply, h, task, store.traffic)) return;
      continue;
    }
    if (r->kind == transport::bulk_request::apply || r->kind == transport::bulk_request::apply_rows) {
      if (!serve_apply(s, *r, cell, std::move(bad), buffer, h, task, store.traffic)) return;
      continue;
    }
    if (r->kind == transport::bulk_request::read) {
      if (bad.empty()) {
        std::shared_ptr<const std::string> bytes;
        shard_layout layout;
        {
          std::shared_lock<std::shared_mutex> lock(cell->mutex);
          bytes = cell->value;
          layout = cell->layout;
        }
        bad = mismatch(layout);
        if (bad.empty()) {
          s.send_reply(bytes->data() + layout.offset, layout.nbytes);
          store.traffic.bytes_out += layout.nbytes;
          continue;
        }
      }
      s.send_error(bad);
      continue;
    }
    // An update: its size is checked against the shard before a byte of it is read or allocated.
    const auto op = update_op_of(r->op);
    if (bad.empty()) {
      std::shared_lock<std::shared_mutex> lock(cell->mutex);
      bad = mismatch(cell->layout);
    }
    if (bad.empty() && !op) {
      bad = "variable shard '" + r->key.substr(0, 64) + "' on " + task + ": " + unknown_update_op(r->op);
    }
    if (!bad.empty()) {
      // Its bytes are read and dropped, so that the answer reaches the sender in order; a count
      // beyond any shard ends the connection instead.
      const bool drained = drain(s, r->bytes);
      s.send_error(bad);
      if (!drained) return;
      continue;
    }
    const auto n = static_cast<std::size_t>(r->bytes);
    if (buffer.size() < n) buffer.resize(n);
    s.receive(buffer.data(), n);
    std::optional<std::string> failed;
    {
      std::unique_lock<std::shared_mutex> lock(cell->mutex);
      failed = mismatch(cell->layout).empty()
                   ? h.combine(cell->writable().data() + cell->layout.offset, buffer.data(), n, r->dtype, *op)
                   : std::optional<std::string>(mismatch(cell->layout));
    }
    if (failed) {
      s.send_error(*failed);
    } else {
      s.send_reply(nullptr, 0);
      ++store.traffic.updates;
    }
  }
}

}  // namespace troupe::actors
