#pragma once
// The dashboard's HTTP server (Boost.Beast on one thread of its own): plain requests go to a
// handler, and GET /api/events is a server-sent-event stream that push() writes to. Every request
// must carry the token when one is set (query `token=` or `Authorization: Bearer`), but a GET of
// one of the open paths (the page's script library and icon, which a browser fetches without the
// page's query); requests are
// bounded (8 KiB of headers, 4 KiB of body, 10 s to arrive), and one connection serves one request.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::detail {

struct HttpRequest {
  std::string method;  ///< "GET", "POST", ...
  std::string path;    ///< without the query
  std::string query;   ///< after '?', undecoded
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int status_code, std::string type, std::string text, std::string allowed = {})
      : status(status_code), content_type(std::move(type)), body(std::move(text)), allow(std::move(allowed)) {}
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  ///< the Allow header of a 405 ("POST"); "" for none
};

/// The value of `name` in a query string ("a=1&b=2"), percent-decoded; "" when absent.
std::string query_value(const std::string& query, const std::string& name);

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  /// Binds address:port (0: any free port) and starts serving; throws std::runtime_error naming
  /// the address when it cannot bind. `open_paths`: paths a GET may fetch without the token (the
  /// same bytes for everyone: nothing about the run).
  HttpServer(const std::string& address, int port, std::string token, Handler handler,
             std::vector<std::string> open_paths = {});
  /// Closes every connection and joins the server's thread.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The port it listens on.
  int port() const noexcept;
  /// Sends `data` as one event to every open /api/events stream (from any thread).
  void push(std::string data);
  /// Waits (at most `timeout`) until every event pushed so far is written to its open streams.
  void drain(std::chrono::milliseconds timeout);
  /// Whether an /api/events stream is open (from any thread; a stream that just closed may
  /// count until the next push).
  bool has_listeners() const noexcept;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::detail
