#include "serve/http_front.h"

#include "core/error.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace convnets::serve {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

bool same_name(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

constexpr std::size_t kHeaderLimit = 64 * 1024;

}  // namespace

bool HttpRequest::has_header(const std::string& name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return same_name(h.first, name); });
}

std::string HttpRequest::header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (same_name(k, name)) return v;
  }
  return "";
}

class Session;

struct HttpFront::Impl {
  HttpFrontOptions o;
  Precheck precheck;
  Handler handler;
  ErrorBody error_body;
  // Declared before the io_context: the sessions its queue still owns when it is destroyed end after it has gone
  // through them, and they reach these.
  std::atomic<bool> stopped{false};
  std::atomic<int> open{0};
  std::atomic<std::uint64_t> held{0};
  std::mutex sessions_mutex;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry{ioc};
  bool accepting = false;  // an accept outstanding (the loop's own state)

  void accept();
  // Level 1: a connection a deadline or a limit ended; 2: an idle one the keep-alive timeout ended too.
  void log(const std::string& peer, const std::string& why, int level = 1) const {
    if (o.log_verbose >= level) {
      std::fprintf(stderr, "convnets serve: closed the connection from %s: %s\n", peer.c_str(), why.c_str());
    }
  }
  HttpResponse refusal(int status, const std::string& message) const {
    return HttpResponse::json_error(status, error_body(message), /*close=*/true);
  }
};

// One connection: wait for a request's first byte (idle deadline), read its headers (header deadline), ask the
// precheck, read its body (body deadline, the held-bytes budget), hand it on, write the answer, and again while
// both sides keep it alive. Its own steps run on the event loop; only the reply comes from elsewhere.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpFront::Impl& f, tcp::socket socket) : f_(f), stream_(std::move(socket)), body_timer_(f.ioc) {
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    peer_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Session() {
    release();
    {
      std::lock_guard<std::mutex> lock(f_.sessions_mutex);
      f_.sessions.erase(this);
    }
    // A connection's end makes room for one more: the acceptor resumes if the bound had paused it.
    if (f_.open.fetch_sub(1) == f_.o.max_connections && !f_.stopped) net::post(f_.ioc, [&f = f_] { f.accept(); });
  }

  void start() { next_request(); }

  // From the loop, at stop().
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

 private:
  void next_request() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    // Set once the precheck has seen the headers: a declared length over it is the precheck's 413 to give, with
    // the route's own limit named.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    if (buffer_.size() > 0) return read_header();  // the next request came with the last one
    stream_.expires_after(std::chrono::seconds(f_.o.idle_timeout_s));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      if (ec) {
        if (ec == beast::error::timeout) {
          self->f_.log(self->peer_, "idle for " + std::to_string(self->f_.o.idle_timeout_s) + " s (--idle-timeout-s)", 2);
        }
        return self->close();
      }
      self->buffer_.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    stream_.expires_after(std::chrono::seconds(f_.o.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (ec == beast::error::timeout) {
      f_.log(peer_, "its headers were not complete " + std::to_string(f_.o.header_timeout_s) +
                        " s after their first byte (--header-timeout-s)");
      return close();
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset) return close();
    if (ec == http::error::header_limit) return answer(f_.refusal(431, "the request's headers exceed 64 KiB"));
    if (ec == http::error::bad_content_length) return answer(f_.refusal(400, "the Content-Length is not a byte count"));
    if (ec) return answer(f_.refusal(400, "a malformed HTTP request: " + ec.message()));
    const auto& h = parser_->get();
    keep_alive_ = h.keep_alive();
    request_ = request_of_header();
    if (auto refused = f_.precheck(request_)) {
      refused->close = true;  // its body, unread, would be taken for the next request
      return answer(std::move(*refused));
    }
    parser_->body_limit(f_.o.max_body_bytes);
    const auto declared = parser_->content_length();
    const std::uint64_t need = declared ? *declared : parser_->chunked() ? f_.o.max_body_bytes : 0;
    if (need > 0) {
      if (f_.held.fetch_add(need) + need > f_.o.max_held_bytes) {
        f_.held.fetch_sub(need);
        return answer(f_.refusal(503, "the server holds " + std::to_string(f_.held.load()) +
                                          " bytes of request bodies already (4 x " + f_.o.body_limit_flag + "): try again"));
      }
      reserved_ = need;
    }
    const bool expects = same_name(std::string(h[http::field::expect]), "100-continue");
    if (expects && !parser_->is_done()) {
      auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      stream_.expires_after(std::chrono::seconds(f_.o.body_timeout_s));
      return http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
        if (ec) return self->close();
        self->read_body();
      });
    }
    read_body();
  }

  // The body's deadline is a timer of its own, not the stream's: the stream's would close the socket that must
  // still carry the 408.
  void read_body() {
    if (parser_->is_done()) return dispatch();
    stream_.expires_never();
    reading_body_ = true, body_late_ = false;
    body_timer_.expires_after(std::chrono::seconds(f_.o.body_timeout_s));
    body_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->reading_body_) return;
      self->body_late_ = true;
      self->stream_.cancel();
    });
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      auto& f = self->f_;
      self->reading_body_ = false;
      self->body_timer_.cancel();
      if (self->body_late_) {
        f.log(self->peer_, "its body was not complete " + std::to_string(f.o.body_timeout_s) + " s after its headers (" +
                               f.o.body_timeout_flag + ")");
        // The socket the timeout closed cannot carry a 408: a fresh deadline on what is left of it.
        return self->answer(f.refusal(408, "the request body was not received within " +
                                               std::to_string(f.o.body_timeout_s) + " s (" + f.o.body_timeout_flag + ")"));
      }
      if (ec == http::error::body_limit) {
        return self->answer(f.refusal(413, "the request body exceeds the limit of " + std::to_string(f.o.max_body_bytes) +
                                               " bytes (" + f.o.body_limit_flag + ")"));
      }
      if (ec) return self->close();
      self->dispatch();
    });
  }

  void dispatch() {
    HttpRequest r = std::move(request_);
    r.body = std::move(parser_->get().body());
    stream_.expires_never();
    auto& ioc = f_.ioc;
    HttpFront::Reply reply = [self = shared_from_this(), &ioc](HttpResponse res) {
      net::post(ioc, [self, res = std::move(res)]() mutable { self->answer(std::move(res)); });
    };
    try {
      f_.handler(std::move(r), std::move(reply));
    } catch (const std::exception& e) {
      answer(f_.refusal(500, e.what()));
    }
  }

  HttpRequest request_of_header() const {
    const auto& h = parser_->get();
    HttpRequest r;
    r.method = std::string(h.method_string());
    const std::string target(h.target());
    r.path = target.substr(0, target.find('?'));
    for (const auto& field : h) r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    return r;
  }

  void answer(HttpResponse r) {
    release();
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), 11);
    res->set(http::field::server, "convnets");
    if (!r.content_type.empty()) res->set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive_ && !r.close);
    res->prepare_payload();
    // A client that does not read its answer is given the idle deadline to, then closed.
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(std::max(f_.o.idle_timeout_s, 1)));
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      if (!res->keep_alive()) return self->linger();
      self->next_request();
    });
  }

  // The end of a connection whose client may still be sending (a body refused from its headers): our side shut,
  // what it sends read and dropped until it closes too, for 2 s at most. Closed at once, the unread bytes would make
  // the kernel answer with a reset, which can discard the answer before the client reads it.
  void linger() {
    if (linger_until_ == Clock::time_point{}) {
      linger_until_ = Clock::now() + std::chrono::seconds(2);
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    const auto left = linger_until_ - Clock::now();
    if (left <= Clock::duration::zero()) return close();
    buffer_.consume(buffer_.size());
    stream_.expires_after(left);
    stream_.async_read_some(buffer_.prepare(65536), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->linger();
    });
  }

  void release() {
    if (reserved_ > 0) f_.held.fetch_sub(reserved_);
    reserved_ = 0;
    request_.context.reset();  // a refused or unfinished request's: a batch must not wait for its body
  }

  using Clock = std::chrono::steady_clock;
  HttpFront::Impl& f_;
  beast::tcp_stream stream_;
  net::steady_timer body_timer_;
  bool reading_body_ = false, body_late_ = false;
  Clock::time_point linger_until_{};
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_;
  HttpRequest request_;  // the request whose headers were read, made once and handed on with its body
  bool keep_alive_ = false;
  std::uint64_t reserved_ = 0;
};

void HttpFront::Impl::accept() {
  if (stopped || accepting || open >= o.max_connections || !acceptor.is_open()) return;
  accepting = true;
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    accepting = false;
    if (stopped || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: the backlog holds the client a moment while one frees.
      std::fprintf(stderr, "convnets serve: accepting a connection failed (%s); retrying in 100 ms\n", ec.message().c_str());
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    ++open;
    auto s = std::make_shared<Session>(*this, std::move(socket));
    {
      std::lock_guard<std::mutex> lock(sessions_mutex);
      sessions.emplace(s.get(), s);
    }
    s->start();
    accept();
  });
}

HttpFront::HttpFront(HttpFrontOptions options, Precheck precheck, Handler handler, ErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  impl_->precheck = std::move(precheck);
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
}

HttpFront::~HttpFront() {
  impl_->stopped = true;  // the sessions its io_context still owns end without resuming the acceptor
}

int HttpFront::bind(int port, const std::string& flag) {
  auto& f = *impl_;
  beast::error_code ec;
  tcp::resolver resolver(f.ioc);
  const auto found = resolver.resolve(f.o.host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) {
    throw Error(flag + " " + std::to_string(port) + ": cannot listen on " + f.o.host + " (--host): " + ec.message());
  }
  const tcp::endpoint at = found.begin()->endpoint();
  f.acceptor.open(at.protocol(), ec);
  // SO_REUSEADDR alone: a restart binds at once, and a port another server holds is refused (SO_REUSEPORT would
  // let a forgotten server split the clients with this one).
  if (!ec) f.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) f.acceptor.bind(at, ec);
  // A burst of connections (a thousand clients at once) waits in the backlog rather than see SYNs dropped.
  if (!ec) f.acceptor.listen(std::max<int>(SOMAXCONN, f.o.max_connections), ec);
  if (ec) {
    beast::error_code ignored;
    f.acceptor.close(ignored);
    throw Error(flag + " " + std::to_string(port) + ": cannot listen on " + f.o.host + ":" + std::to_string(port) +
                    " (" + ec.message() + ": in use, or --host is not an address of this machine)",
                "pick another port, or 0 for a free one");
  }
  return f.acceptor.local_endpoint().port();
}

void HttpFront::run() {
  auto& f = *impl_;
  auto guard = net::make_work_guard(f.ioc);
  net::post(f.ioc, [&f] { f.accept(); });
  f.ioc.run();
}

void HttpFront::stop() {
  auto& f = *impl_;
  f.stopped = true;
  net::post(f.ioc, [&f] {
    beast::error_code ignored;
    f.acceptor.close(ignored);
    f.retry.cancel();
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard<std::mutex> lock(f.sessions_mutex);
      for (auto& [p, w] : f.sessions) {
        if (auto s = w.lock()) live.push_back(std::move(s));
      }
    }
    for (auto& s : live) s->close();
    f.ioc.stop();
  });
}

int HttpFront::open_connections() const { return impl_->open.load(); }

}  // namespace convnets::serve
