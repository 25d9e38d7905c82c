#include "bench/http_client.h"

#include "core/error.h"
#include "core/json.h"
#include "kserve/messages.h"

#include <boost/asio/connect.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <cctype>
#include <cstdio>
#include <sstream>

namespace convnets::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Endpoint endpoint_of(const std::string& url, const std::string& flag) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos) throw Error(flag + " " + url + ": only http:// is spoken");
  if (const auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
    throw Error(flag + " " + url + ": expected http://HOST:PORT");
  }
  return {rest.substr(0, colon), rest.substr(colon + 1)};
}

Connection::Connection(Endpoint e) : e_(std::move(e)) {}

void Connection::connect() {
  socket_ = std::make_unique<tcp::socket>(io_);
  tcp::resolver resolver(io_);
  asio::connect(*socket_, resolver.resolve(e_.host, e_.port));
  socket_->set_option(tcp::no_delay(true));  // as the server: a request is one write, its answer one read
  buffer_.clear();
}

bool Connection::connected() const { return socket_ && socket_->is_open(); }

void Connection::close() {
  beast::error_code ignored;
  if (socket_) socket_->close(ignored);
}

HttpResponse Connection::send(const std::string& raw) {
  if (!connected()) connect();
  asio::write(*socket_, asio::buffer(raw));
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{1} << 30);
  http::read(*socket_, buffer_, parser);
  auto& res = parser.get();
  HttpResponse r;
  r.status = static_cast<int>(res.result_int());
  if (auto it = res.find("Inference-Header-Content-Length"); it != res.end()) {
    r.header_length = kserve::parse_header_length(std::string_view(it->value().data(), it->value().size()));
  }
  r.body = std::move(res.body());
  if (!res.keep_alive()) close();
  return r;
}

HttpResponse Connection::request(const std::string& method, const std::string& path, const std::string& body) {
  return send(method + " " + path + " HTTP/1.1\r\nHost: " + e_.host + "\r\nContent-Type: application/json\r\n" +
              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

nlohmann::json json_of(const HttpResponse& r, const std::string& what) {
  if (r.status != 200) throw Error(what + ": HTTP " + std::to_string(r.status) + " " + r.body);
  return parse_json(r.body, what);
}

std::string percent_encoded(const std::string& name) {
  std::string out;
  for (const unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

std::optional<ServerCounters> scrape(const std::string& metrics_url, const std::string& model) {
  if (metrics_url.empty()) return std::nullopt;
  try {
    const auto e = endpoint_of(metrics_url, "--metrics-url");
    const auto after_scheme = metrics_url.find("://");
    const auto slash = metrics_url.find('/', after_scheme == std::string::npos ? 0 : after_scheme + 3);
    const std::string path = slash == std::string::npos ? "/metrics" : metrics_url.substr(slash);
    Connection c(e);
    const auto r = c.request("GET", path);
    if (r.status != 200) return std::nullopt;
    ServerCounters s;
    std::istringstream in(r.body);
    const std::string success = "nv_inference_request_success{model=\"" + model + "\"";
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("process_cpu_seconds_total ", 0) == 0) s.cpu_s = std::stod(line.substr(26));
      if (line.rfind(success, 0) == 0) s.success += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace convnets::bench
