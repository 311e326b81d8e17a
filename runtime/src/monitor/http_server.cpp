#include "monitor/http_server.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <deque>
#include <future>
#include <list>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <pthread.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace troupe::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::size_t max_header_bytes = 8 * 1024;
constexpr std::size_t max_body_bytes = 4 * 1024;
constexpr std::size_t max_queued_events = 64;  // a stream that falls this far behind is closed
constexpr std::size_t max_streams = 32;
constexpr auto request_timeout = std::chrono::seconds(10);

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 &&
               hex_digit(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Compares without stopping at the first difference, so the time taken says nothing of the token.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

std::string query_value(const std::string& query, const std::string& name) {
  std::size_t pos = 0;
  while (pos <= query.size()) {
    std::size_t end = query.find('&', pos);
    if (end == std::string::npos) end = query.size();
    const std::string part = query.substr(pos, end - pos);
    const std::size_t eq = part.find('=');
    const std::string key = percent_decode(part.substr(0, eq));
    if (key == name) return eq == std::string::npos ? std::string() : percent_decode(part.substr(eq + 1));
    pos = end + 1;
  }
  return {};
}

// One server-sent-event stream: events wait in a bounded queue and are written one at a time.
struct event_stream : std::enable_shared_from_this<event_stream> {
  explicit event_stream(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::deque<std::shared_ptr<const std::string>> queue;
  bool writing = false;
  bool closed = false;

  void send(std::shared_ptr<const std::string> data) {
    if (closed) return;
    if (queue.size() >= max_queued_events) {
      close();
      return;
    }
    queue.push_back(std::move(data));
    if (!writing) write_next();
  }
  void write_next() {
    if (queue.empty() || closed) {
      writing = false;
      return;
    }
    writing = true;
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(*queue.front()), [self](beast::error_code ec, std::size_t) {
      self->queue.pop_front();
      if (ec) {
        self->close();
        return;
      }
      self->write_next();
    });
  }
  void close() {
    if (closed) return;
    closed = true;
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
};

struct HttpServer::impl : std::enable_shared_from_this<HttpServer::impl> {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::string token;
  std::vector<std::string> open_paths;
  Handler handler;
  std::list<std::shared_ptr<event_stream>> streams;  // touched on the io thread only
  std::atomic<std::size_t> open_streams{0};          // streams.size(), for other threads
  std::list<std::weak_ptr<beast::tcp_stream>> requests;  // connections reading or answering (io thread)
  std::thread thread;
  std::string address;
  int port = 0;

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      } else {
        self->serve(std::move(socket));
      }
      self->accept();
    });
  }

  // One request per connection.
  struct connection {
    explicit connection(tcp::socket s) : stream(std::move(s)) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    http::request_parser<http::string_body> parser;
    http::response<http::string_body> response;
  };

  void serve(tcp::socket socket) {
    auto c = std::make_shared<connection>(std::move(socket));
    requests.remove_if([](const std::weak_ptr<beast::tcp_stream>& w) { return w.expired(); });
    requests.push_back(std::shared_ptr<beast::tcp_stream>(c, &c->stream));
    c->parser.header_limit(max_header_bytes);
    c->parser.body_limit(max_body_bytes);
    c->stream.expires_after(request_timeout);
    auto self = shared_from_this();
    http::async_read(c->stream, c->buffer, c->parser, [self, c](beast::error_code ec, std::size_t) {
      if (ec) {
        beast::error_code ignored;
        c->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
        return;
      }
      self->answer(c);
    });
  }

  // Without a token the page is trusted for being on this machine, so another site must not be
  // able to use the browser against it: the Host must name this server (a DNS-rebound name does
  // not), and a POST from a page must come from this server's own origin.
  std::string refuse_foreign(const http::request<http::string_body>& req) const {
    const std::string host(req[http::field::host]);
    if (token.empty()) {
      const std::string p = ":" + std::to_string(port);
      if (host != "127.0.0.1" + p && host != "localhost" + p && host != "[::1]" + p && host != address + p &&
          host != "[" + address + "]" + p) {
        return "this dashboard answers requests for 127.0.0.1" + p + " or localhost" + p + " only";
      }
    }
    const auto origin = req[http::field::origin];
    if (req.method() == http::verb::post && !origin.empty() && std::string(origin) != "http://" + host) {
      return "a page of another site may not steer this training";
    }
    return {};
  }

  bool authorised(const http::request<http::string_body>& req, const HttpRequest& r) const {
    if (token.empty()) return true;
    if (r.method == "GET" && std::find(open_paths.begin(), open_paths.end(), r.path) != open_paths.end()) return true;
    const std::string& query = r.query;
    if (same_secret(query_value(query, "token"), token)) return true;
    const auto auth = req[http::field::authorization];
    const std::string bearer = "Bearer ";
    return auth.size() > bearer.size() && auth.substr(0, bearer.size()) == bearer &&
           same_secret(std::string(auth.substr(bearer.size())), token);
  }

  void answer(const std::shared_ptr<connection>& c) {
    const auto& req = c->parser.get();
    const std::string target(req.target());
    const std::size_t q = target.find('?');
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.path = target.substr(0, q);
    r.query = q == std::string::npos ? std::string() : target.substr(q + 1);
    HttpResponse out;
    const std::string foreign = refuse_foreign(req);
    if (req.count(http::field::host) > 1) {
      // Which of two Hosts counts is a guess each reader makes its own way (RFC 9112 answers 400):
      // the check above read the first, a proxy before it may have read another.
      out = {400, "application/json",
             "{\"error\":\"a request names one Host; this one has " + std::to_string(req.count(http::field::host)) +
                 " Host headers\"}"};
    } else if (!foreign.empty()) {
      out = {403, "application/json", "{\"error\":\"" + foreign + "\"}"};
    } else if (!authorised(req, r)) {
      out = {401, "application/json",
             "{\"error\":\"this dashboard needs its token: open it with ?token=TOKEN or send Authorization: Bearer "
             "TOKEN\"}"};
    } else if (r.method == "GET" && r.path == "/api/events") {
      open_stream(c);
      return;
    } else {
      try {
        out = handler(r);
      } catch (...) {
        out = {500, "application/json", "{\"error\":\"the trainer could not answer this request\"}"};
      }
    }
    c->response.version(11);
    c->response.result(static_cast<http::status>(out.status));
    c->response.set(http::field::server, "troupe");
    c->response.set(http::field::content_type, out.content_type);
    c->response.set(http::field::cache_control, "no-store");
    if (!out.allow.empty()) c->response.set(http::field::allow, out.allow);
    c->response.keep_alive(false);
    c->response.body() = std::move(out.body);
    c->response.prepare_payload();
    c->stream.expires_after(request_timeout);
    http::async_write(c->stream, c->response, [c](beast::error_code, std::size_t) {
      beast::error_code ignored;
      c->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  void open_stream(const std::shared_ptr<connection>& c) {
    c->stream.expires_never();
    streams.remove_if([](const std::shared_ptr<event_stream>& s) { return s->closed; });
    auto s = std::make_shared<event_stream>(c->stream.release_socket());
    if (streams.size() >= max_streams) {
      s->send(std::make_shared<const std::string>(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
      return;
    }
    s->send(std::make_shared<const std::string>(
        "HTTP/1.1 200 OK\r\nServer: troupe\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
        "Connection: keep-alive\r\n\r\n: troupe metrics\n\n"));
    streams.push_back(std::move(s));
    open_streams = streams.size();
  }
};

HttpServer::HttpServer(const std::string& address, int port, std::string token, Handler handler,
                       std::vector<std::string> open_paths)
    : impl_(std::make_shared<impl>()) {
  impl_->token = std::move(token);
  impl_->open_paths = std::move(open_paths);
  impl_->handler = std::move(handler);
  beast::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) throw std::invalid_argument("dashboard: \"" + address + "\" is not an IP address (e.g. 127.0.0.1)");
  if (port < 0 || port > 65535) {
    throw std::invalid_argument("dashboard: port " + std::to_string(port) + " is out of range (expected 0..65535)");
  }
  const tcp::endpoint endpoint(addr, static_cast<unsigned short>(port));
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error("dashboard: cannot listen on " + address + ":" + std::to_string(port) + ": " +
                             ec.message() + " (choose another --dashboard-port, or 0 for any free one)");
  }
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->address = address;
  impl_->accept();
  auto state = impl_;
  impl_->thread = std::thread([state] {
    pthread_setname_np(pthread_self(), "troupe-http");  // a profile tells its time from training's
    try {
      state->io.run();
    } catch (...) {
      // A handler that throws ends the server, never the process.
    }
  });
}

HttpServer::~HttpServer() {
  auto state = impl_;
  asio::post(state->io, [state] {
    beast::error_code ignored;
    state->acceptor.close(ignored);
    for (auto& s : state->streams) s->close();
    state->streams.clear();
    for (auto& w : state->requests) {
      if (auto r = w.lock()) r->close();
    }
    state->requests.clear();
    state->io.stop();
  });
  if (state->thread.joinable()) state->thread.join();
  // The handlers of the operations just aborted hold the state: run them so that it is freed.
  state->io.restart();
  state->io.run_for(std::chrono::seconds(1));
}

int HttpServer::port() const noexcept { return impl_->port; }

void HttpServer::push(std::string data) {
  // One SSE event: "data: <line>\n\n" (the JSON has no newline).
  auto event = std::make_shared<const std::string>("data: " + data + "\n\n");
  auto state = impl_;
  asio::post(state->io, [state, event] {
    for (auto& s : state->streams) s->send(event);
    state->streams.remove_if([](const std::shared_ptr<event_stream>& s) { return s->closed; });
    state->open_streams = state->streams.size();
  });
}

void HttpServer::drain(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto state = impl_;
  while (std::chrono::steady_clock::now() < deadline) {
    auto idle = std::make_shared<std::promise<bool>>();
    std::future<bool> answer = idle->get_future();
    asio::post(state->io, [state, idle] {
      bool all_written = true;
      for (auto& s : state->streams) all_written = all_written && (s->closed || s->queue.empty());
      idle->set_value(all_written);
    });
    if (answer.wait_until(deadline) != std::future_status::ready || answer.get()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool HttpServer::has_listeners() const noexcept { return impl_->open_streams.load(std::memory_order_relaxed) > 0; }

}  // namespace troupe::detail
