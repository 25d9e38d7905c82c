// A blocking HTTP/1.1 client for the load generators of bench/: one keep-alive connection a thread, the server's URL as perf_analyzer takes it, and its Prometheus counters read back.
#pragma once

#include <nlohmann/json.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace convnets::bench {

struct Endpoint {
  std::string host, port;
};

// http://HOST:PORT[/...] as `flag` gave it; Error for another scheme or no port.
Endpoint endpoint_of(const std::string& url, const std::string& flag);

struct HttpResponse {
  int status = 0;
  std::string body;
  std::optional<std::size_t> header_length;  // Inference-Header-Content-Length
};

// One keep-alive connection, blocking: what each client thread owns.
class Connection {
 public:
  explicit Connection(Endpoint e);
  void connect();
  bool connected() const;
  void close();
  // `raw`: a whole HTTP/1.1 request, headers and body, written as it is.
  HttpResponse send(const std::string& raw);
  HttpResponse request(const std::string& method, const std::string& path, const std::string& body = "");

 private:
  Endpoint e_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::ip::tcp::socket> socket_;
  boost::beast::flat_buffer buffer_;
};

// The body of a 200 answer as JSON; Error naming `what` and the status otherwise.
nlohmann::json json_of(const HttpResponse& r, const std::string& what);

// A model or region name as a URL path segment.
std::string percent_encoded(const std::string& name);

// The server's process CPU seconds and its successful requests of `model` (Triton's
// nv_inference_request_success), from its Prometheus text at `metrics_url`; none where nothing answered.
struct ServerCounters {
  double cpu_s = -1;
  double success = 0;
};
std::optional<ServerCounters> scrape(const std::string& metrics_url, const std::string& model);

}  // namespace convnets::bench
