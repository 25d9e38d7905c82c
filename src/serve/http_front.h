// convnets serve's HTTP/1.1 front end on Boost.Beast/Asio: one event loop owns every socket (an idle keep-alive connection costs a descriptor, no thread and no polling), deadlines for a request's first byte, its headers and its body, a bound on the sockets open at once and on the request bodies held; handlers answer from any thread.
#pragma once

#include <any>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace convnets::serve {

struct HttpRequest {
  std::string method, path;  // the path without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // What the precheck attached from the headers (a model's announcement), handed to the handler with the body;
  // released as soon as the request is refused or its connection ends without it.
  std::any context;
  bool has_header(const std::string& name) const;
  std::string header(const std::string& name) const;  // case-insensitive; "" when absent
};

struct HttpResponse {
  int status = 200;
  std::string content_type, body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // the connection ends after it

  // An error: `json_body` as application/json.
  static HttpResponse json_error(int status, std::string json_body, bool close) {
    HttpResponse r;
    r.status = status;
    r.content_type = "application/json";
    r.body = std::move(json_body);
    r.close = close;
    return r;
  }
};

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  int max_connections = 1024;      // sockets open at once; past it new ones wait in the listen backlog
  int idle_timeout_s = 5;          // a kept-alive connection with no next request this long is closed
  int header_timeout_s = 10;       // a request's headers must be complete this long after its first byte
  int body_timeout_s = 30;         // its body this long after its headers (else 408, and the connection ends)
  std::uint64_t max_body_bytes = std::uint64_t{64} << 20;  // any body, declared or chunked (else 413)
  std::uint64_t max_held_bytes = std::uint64_t{256} << 20;  // request bodies held at once (else 503)
  std::string body_limit_flag = "--max-request-bytes";     // named in the 413
  std::string body_timeout_flag = "--body-timeout-s";      // named in the 408
  int log_verbose = 0;             // 1: a line on stderr for each connection a deadline or a limit ends
};

// Makes the JSON error body ({"error": message}) of a refusal: the server's own format.
using ErrorBody = std::function<std::string(const std::string& message)>;

class HttpFront {
 public:
  // Callable once, from any thread: the response is written on the event loop.
  using Reply = std::function<void(HttpResponse)>;
  // The request's headers alone (body empty), before any of its body is read: a refusal answered at once (the
  // connection then ends: its body, unread, would be taken for the next request), or none, and then it may set the
  // request's context.
  using Precheck = std::function<std::optional<HttpResponse>(HttpRequest&)>;
  // The whole request. Runs on the event loop: anything slower than a few microseconds must be handed on.
  using Handler = std::function<void(HttpRequest, Reply)>;

  HttpFront(HttpFrontOptions options, Precheck precheck, Handler handler, ErrorBody error_body);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Listens on options.host:port (0: a free port) and returns the port; an Error naming `flag` if it cannot.
  int bind(int port, const std::string& flag);
  // Serves on the calling thread, the one event loop (the handlers' work runs elsewhere), until stop().
  void run();
  // From any thread, before or during run(): stops accepting, closes every connection, and run() returns.
  void stop();
  int open_connections() const;

 private:
  friend class Session;  // a connection's state, in http_front.cpp
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace convnets::serve
