#include "serve/http_routes.h"

#include "core/error.h"
#include "core/json.h"
#include "serve/http_front.h"
#include "serve/restricted_api.h"
#include "serve/server_options.h"
#include "serve/serving_core.h"

#include <nlohmann/json.hpp>

#include <any>
#include <optional>
#include <regex>
#include <thread>

namespace convnets::serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::uint64_t kSmallBody = 64 * 1024;     // any body but an infer request's
constexpr std::size_t kInlineParseBytes = 16 * 1024;  // parsed on the event loop; larger on a worker

// A path segment as the client named it: tritonclient quote()s model and region names into the URL (a space is
// %20). A '%' not followed by two hex digits stays as it is. An optional segment the path lacks (an unmatched
// group) is "".
std::string percent_decoded(const std::string& segment) {
  const auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (std::size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && hex(segment[i + 1]) >= 0 && hex(segment[i + 2]) >= 0) {
      out += static_cast<char>(hex(segment[i + 1]) * 16 + hex(segment[i + 2]));
      i += 2;
    } else {
      out += segment[i];
    }
  }
  return out;
}

// Triton's load parameters carry a file's bytes as base64 (RFC 4648, padding optional). Throws Error on a character
// outside the alphabet.
std::string base64_decoded(const std::string& text, const std::string& what) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned bits = 0;
  int held = 0;
  for (const char c : text) {
    int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+' ? 62 : c == '/' ? 63 : -1;
    if (c == '=') break;
    if (v < 0) throw Error(what + ": not base64 (a '" + utf8_escaped(std::string(1, c)) + "' in it)");
    bits = (bits << 6) | static_cast<unsigned>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out += static_cast<char>((bits >> held) & 0xFF);
    }
  }
  return out;
}

// A load request's body: {"parameters": {"config": "JSON text", "file:PATH": "base64"}}, each value a string.
LoadRequest load_request_of(const std::string& body, const std::string& name) {
  LoadRequest r;
  if (body.empty()) return r;
  const auto j = parse_json(body, "the load request for model " + in_quotes(name));
  if (!j.is_object()) throw ProtocolError(400, "load request for model " + in_quotes(name) + ": expected a JSON object");
  if (!j.contains("parameters")) return r;
  const auto& p = j["parameters"];
  if (!p.is_object()) throw ProtocolError(400, "load request for model " + in_quotes(name) + ": 'parameters' must be an object");
  for (const auto& [key, v] : p.items()) {
    if (!v.is_string()) {
      throw ProtocolError(400, "load parameter '" + utf8_escaped(key) + "' must be a JSON string, got " + v.type_name());
    }
    if (key == "config") {
      r.has_config = true;
      r.config = v.get<std::string>();
    } else if (key.rfind("file:", 0) == 0) {
      try {
        r.files.emplace_back(key, base64_decoded(v.get<std::string>(), "load parameter '" + key + "'"));
      } catch (const Error& e) {
        throw ProtocolError(400, e.what());
      }
    } else {
      throw ProtocolError(400, "unrecognized load parameter '" + utf8_escaped(key) + "' (config and file:PATH are)");
    }
  }
  return r;
}

const std::string kModelRoute = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

const std::regex& infer_route() {
  static const std::regex route(kModelRoute + "/infer");
  return route;
}

HttpResponse error_response(int status, const std::string& message, bool close = false) {
  return HttpResponse::json_error(status, error_body(message), close);
}

HttpResponse json_response(std::string body) {
  HttpResponse r;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

HttpResponse status_response(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

HttpResponse metrics_response(std::string text) {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(text);
  return r;
}

}  // namespace

struct HttpService::Impl {
  Impl(ServingCore& c, const ServerOptions& o) : core(c), options(o) {}

  // A request refused from its headers alone, before any of its body is read: the response, or none. Only infer
  // takes a large or chunked body; the other routes' bodies are small and declared.
  std::optional<HttpResponse> refusal(const HttpRequest& req) const {
    // First, as Triton checks it first: a stranger learns nothing from a restricted route, not even its limits.
    if (const auto group = options.http_restricted.any() ? http_api_group(req.path) : std::nullopt) {
      std::string value;
      const auto why = options.http_restricted.refusal(*group, [&](const std::string& key) -> const std::string* {
        if (!req.has_header(key)) return nullptr;
        value = req.header(key);
        return &value;
      });
      if (!why.empty()) return error_response(403, why);
    }
    const auto encoding = req.header("Content-Encoding");
    if (!encoding.empty() && encoding != "identity") {
      return error_response(415, "Content-Encoding " + utf8_escaped(encoding) +
                                     " is not accepted: send the body uncompressed");
    }
    if (req.header("Content-Type").rfind("multipart/", 0) == 0) {
      return error_response(415, "multipart bodies are not accepted: send the KServe v2 JSON, or its binary tensor "
                                 "extension");
    }
    const auto ends = [&](const std::string& tail) {
      return req.path.size() > tail.size() && req.path.compare(req.path.size() - tail.size(), tail.size(), tail) == 0;
    };
    // A load's body may carry the model's files (Triton's file override), as large as an inference request.
    const bool infer = req.method == "POST" && (ends("/infer") || ends("/load"));
    const bool chunked = req.has_header("Transfer-Encoding");
    if (req.has_header("Content-Length")) {
      const auto text = req.header("Content-Length");
      const std::uint64_t length = std::stoull(text);  // the parser took it as a byte count already
      const std::uint64_t limit = infer ? options.limits.max_body_bytes : kSmallBody;
      if (length > limit) {
        return error_response(413, "the request body of " + text + " bytes exceeds the limit of " +
                                       std::to_string(limit) + (infer ? " (--max-request-bytes)" : " for " + req.path));
      }
    } else if (!infer && (chunked || req.method == "POST" || req.method == "PUT" || req.method == "PATCH")) {
      return error_response(411, req.method + " " + utf8_escaped(req.path) + " needs a Content-Length (at most " +
                                     std::to_string(kSmallBody) + " bytes)");
    }
    return std::nullopt;
  }

  // From the headers: the refusal, or none and, for an inference request naming a served model, the model's
  // announcement from now on (taken over by the admission once the body is read).
  std::optional<HttpResponse> precheck(HttpRequest& req) const {
    auto refused = refusal(req);
    std::smatch m;
    if (!refused && req.method == "POST" && std::regex_match(req.path, m, infer_route())) {
      req.context = core.expect(percent_decoded(m[1]), percent_decoded(m[2]));
    }
    return refused;
  }

  // The model a path names, or the 404 answer.
  std::optional<std::string> model_of(const std::smatch& m, HttpResponse& refused) const {
    const std::string name = percent_decoded(m[1]);
    if (auto missing = core.find_model(name, percent_decoded(m[2]));
        !missing.empty()) {
      refused = error_response(404, missing);
      return std::nullopt;
    }
    return name;
  }

  // On the event loop: the small answers at once, inference and model control handed on to the core.
  void route(HttpRequest r, HttpFront::Reply reply) {
    try {
      dispatch(std::move(r), reply);
    } catch (const Error& e) {  // a body that is not JSON; a model unloaded between its lookup and its answer
      reply(error_response(http_status_of(e), e.what()));
    }
  }

  void dispatch(HttpRequest r, const HttpFront::Reply& reply) {
    static const std::regex model_route(kModelRoute), ready_route(kModelRoute + "/ready"),
        config_route(kModelRoute + "/config"),
        shm_route(R"(/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister))"),
        control_route(R"(/v2/repository(?:/([^/]+))?/models/([^/]+)/(load|unload))");
    const auto& p = r.path;
    std::smatch m;
    HttpResponse refused;
    if (r.method == "GET") {
      if (p == "/v2/health/live") return reply(status_response(200));
      if (p == "/v2/health/ready") return reply(status_response(core.ready() ? 200 : 503));
      if (p == "/v2") return reply(json_response(core.server_metadata()));
      if (std::regex_match(p, m, ready_route)) {
        return reply(model_of(m, refused) ? status_response(core.ready() ? 200 : 503) : refused);
      }
      if (std::regex_match(p, m, config_route)) {
        const auto name = model_of(m, refused);
        return reply(name ? json_response(core.model_config(*name)) : refused);
      }
      if (std::regex_match(p, m, model_route)) {
        const auto name = model_of(m, refused);
        return reply(name ? json_response(core.model_metadata(*name)) : refused);
      }
      if (p == "/metrics" && options.metrics_port < 0) return reply(metrics_response(metrics()));
      if (std::regex_match(p, m, shm_route) && m[2] == "status") {
        return reply(shared_memory_call(percent_decoded(m[1]), "status", ""));
      }
    } else if (r.method == "POST") {
      if (p == "/v2/repository/index") return reply(repository_index(r.body));
      if (std::regex_match(p, m, infer_route())) {
        return infer(percent_decoded(m[1]), percent_decoded(m[2]), std::move(r), reply);
      }
      if (std::regex_match(p, m, control_route)) return model_control(m, std::move(r.body), reply);
      if (std::regex_match(p, m, shm_route) && m[2] != "status") {
        return reply(shared_memory_call(percent_decoded(m[1]), m[2].str(), r.body));
      }
    }
    reply(error_response(404, "no such endpoint: " + utf8_escaped(r.method + " " + p)));
  }

  // {"ready": true} lists only the models ready now.
  HttpResponse repository_index(const std::string& body) const {
    bool ready_only = false;
    if (!body.empty()) {
      const auto j = parse_json(body, "the repository index request");
      if (j.is_object() && j.contains("ready")) {
        if (!j["ready"].is_boolean()) return error_response(400, "Invalid value for 'ready': expected a boolean");
        ready_only = j["ready"].get<bool>();
      }
    }
    return json_response(core.repository_index(ready_only));
  }

  // POST /v2/repository/models/NAME/load and /unload: answered once the core has done it (a load takes seconds, on
  // the core's control thread; this loop goes on meanwhile). 200 with an empty JSON body, as Triton.
  void model_control(const std::smatch& m, std::string body, const HttpFront::Reply& reply) {
    if (m[1].matched) return reply(error_response(501, "'repository_name' specification is not supported"));
    const std::string name = percent_decoded(m[2]);
    auto answer = [reply](ControlResult r) {
      if (r.status != 200) return reply(error_response(r.status, r.message));
      auto ok = json_response("");
      reply(std::move(ok));
    };
    if (m[3] == "unload") return core.unload_model(name, answer);  // its parameters (unload_dependents) change nothing here
    // The body (the model's files, base64) is decoded off the loop.
    core.offload([this, name, body = std::move(body), answer] {
      LoadRequest request;
      try {
        request = load_request_of(body, name);
      } catch (const Error& e) {
        return answer({http_status_of(e), e.what()});
      }
      core.load_model(name, std::move(request), answer);
    });
  }

  // Admitted on the loop; the body parsed there when small (tens of microseconds), else on a worker, so that no
  // copy of megabytes holds the other connections' reads and writes. The answer is written as the request asked
  // (JSON, or Triton's binary tensors).
  void infer(const std::string& name, const std::string& version, HttpRequest r, HttpFront::Reply reply) {
    ServingCore::Arrival arrival;
    if (auto* expected = std::any_cast<ServingCore::Arrival>(&r.context)) arrival = std::move(*expected);
    r.context.reset();
    ServingCore::Admission admitted;
    try {
      admitted = core.admit(name, version, std::move(arrival));
    } catch (const ProtocolError& e) {
      // A server shutting down ends the connection too, so that the client's next request goes elsewhere.
      return reply(error_response(e.status(), e.what(), e.status() == 503));
    }
    auto req = std::make_shared<HttpRequest>(std::move(r));
    auto read = [req, &o = options] {
      std::optional<std::size_t> header_length;
      if (req->has_header("Inference-Header-Content-Length")) {
        header_length = parse_header_length(req->header("Inference-Header-Content-Length"));
      }
      // A JSON tree costs about 16 bytes per number it holds: large tensors come as binary data, as tritonclient sends.
      const std::size_t json = header_length ? std::min(*header_length, req->body.size()) : req->body.size();
      if (json > o.max_json_bytes) {
        throw ProtocolError(413, "the request's JSON is " + std::to_string(json) + " bytes, over --max-json-bytes " +
                                     std::to_string(o.max_json_bytes) + ": send tensors as Triton's binary data");
      }
      auto parsed = parse_infer_request(req->body, header_length, o.limits);
      req->body.clear();
      req->body.shrink_to_fit();
      return parsed;
    };
    auto done = [reply](int status, const std::string& error, InferResponse response) {
      if (status != 200) return reply(error_response(status, error));
      HttpResponse res;
      std::optional<std::size_t> out_header;
      res.body = write_infer_response(response, out_header);
      if (out_header) {
        res.headers.emplace_back("Inference-Header-Content-Length", std::to_string(*out_header));
        res.content_type = "application/octet-stream";
      } else {
        res.content_type = "application/json";
      }
      reply(std::move(res));
    };
    if (req->body.size() <= kInlineParseBytes) return core.infer(admitted, read, done);
    core.offload([this, admitted, read, done] { core.infer(admitted, read, done); });
  }

  // Triton's system shared-memory routes: GET .../status, POST .../register {"key", "offset", "byte_size"} and
  // .../unregister, each for one region (`name`) or, without /region/NAME, for all (register needs a name).
  HttpResponse shared_memory_call(const std::string& name, const std::string& what, const std::string& body) {
    auto& regions = core.shared_memory();
    try {
      if (what == "status") {
        Json list = Json::array();
        for (const auto& s : regions.status(name)) {
          list.push_back({{"name", s.name}, {"key", s.key}, {"offset", s.offset}, {"byte_size", s.byte_size}});
        }
        return json_response(dump_json(list));
      }
      if (what == "unregister") {
        regions.remove(name);
        return status_response(200);
      }
      if (name.empty()) return error_response(404, "no such endpoint: POST /v2/systemsharedmemory/register (name a region)");
      const auto j = parse_json(body, "the register request for shared memory region " + in_quotes(name));
      const auto field = [&](const char* key) -> const nlohmann::json* {
        return j.is_object() && j.contains(key) ? &j[key] : nullptr;
      };
      const auto* key = field("key");
      const auto* size = field("byte_size");
      const auto* offset = field("offset");
      if (!key || !key->is_string() || !size || !size->is_number_unsigned() || (offset && !offset->is_number_unsigned())) {
        return error_response(400, "register shared memory region " + in_quotes(name) +
                                       ": expected {\"key\": string, \"byte_size\": integer, \"offset\": integer}");
      }
      regions.add(name, key->get<std::string>(), offset ? offset->get<std::uint64_t>() : 0, size->get<std::uint64_t>());
      return status_response(200);
    } catch (const Error& e) {
      return error_response(http_status_of(e), e.what());
    }
  }

  std::string metrics() const { return core.metrics(http ? http->open_connections() : 0); }

  ServingCore& core;
  const ServerOptions& options;
  std::unique_ptr<HttpFront> http, metrics_front;
  std::thread metrics_thread;
};

HttpService::HttpService(ServingCore& core, const ServerOptions& o) : impl_(std::make_unique<Impl>(core, o)) {
  HttpFrontOptions f;
  f.host = o.host;
  f.max_connections = o.max_connections;
  f.idle_timeout_s = o.idle_timeout_s;
  f.header_timeout_s = o.header_timeout_s;
  f.body_timeout_s = o.body_timeout_s;
  f.max_body_bytes = o.limits.max_body_bytes;
  // The bodies held at once are bounded too, not only each: a thousand connections may each send the largest.
  f.max_held_bytes = 4 * o.limits.max_body_bytes;
  f.log_verbose = o.log_verbose;
  auto* impl = impl_.get();
  impl->http = std::make_unique<HttpFront>(
      f, [impl](HttpRequest& r) { return impl->precheck(r); },
      [impl](HttpRequest r, HttpFront::Reply reply) { impl->route(std::move(r), std::move(reply)); }, error_body);
  if (o.metrics_port >= 0) {
    f.max_connections = 64;
    f.max_body_bytes = kSmallBody;
    f.max_held_bytes = 64 * kSmallBody;
    impl->metrics_front = std::make_unique<HttpFront>(
        f, [](HttpRequest&) { return std::optional<HttpResponse>{}; },
        [impl](HttpRequest r, HttpFront::Reply reply) {
          if (r.method == "GET" && r.path == "/metrics") return reply(metrics_response(impl->metrics()));
          reply(error_response(404, "no such endpoint: " + utf8_escaped(r.method + " " + r.path)));
        },
        error_body);
  }
}

HttpService::~HttpService() {
  stop();
  if (impl_->metrics_thread.joinable()) impl_->metrics_thread.join();
}

std::pair<int, int> HttpService::bind() {
  const int port = impl_->http->bind(impl_->options.http_port, "--port");
  const int mport = impl_->metrics_front ? impl_->metrics_front->bind(impl_->options.metrics_port, "--metrics-port") : -1;
  return {port, mport};
}

void HttpService::run() {
  if (impl_->metrics_front) impl_->metrics_thread = std::thread([this] { impl_->metrics_front->run(); });
  impl_->http->run();
  if (impl_->metrics_front) impl_->metrics_front->stop();
  if (impl_->metrics_thread.joinable()) impl_->metrics_thread.join();
}

void HttpService::stop() {
  impl_->http->stop();
  if (impl_->metrics_front) impl_->metrics_front->stop();
}

}  // namespace convnets::serve
