#include "cli/fork_server.h"

#include "core/process_exit.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <stdio_ext.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace convnets::cli {
namespace {

bool read_line(std::string& pending, std::string& line) {
  for (;;) {
    if (const auto end = pending.find('\n'); end != std::string::npos) {
      line = pending.substr(0, end);
      pending.erase(0, end + 1);
      return true;
    }
    char buf[65536];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending.append(buf, static_cast<std::size_t>(n));
  }
}

void reply(const nlohmann::json& j) {
  const std::string text = j.dump() + '\n';
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::_Exit(1);  // the client is gone
    done += static_cast<std::size_t>(n);
  }
}

// Paths, arguments and variables are bytes, which JSON strings cannot hold: the
// client sends each byte as the code point of the same value (Latin-1), here
// 1- or 2-byte UTF-8 sequences.
std::string bytes(const nlohmann::json& j) {
  const auto text = j.get<std::string>();
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if ((c == 0xC2 || c == 0xC3) && i + 1 < text.size()) {
      out += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++i]) & 0x3F));
    } else {
      throw std::runtime_error("a string holds a character above U+00FF: expected bytes as Latin-1");
    }
  }
  return out;
}

std::vector<std::string> bytes_list(const nlohmann::json& j) {
  std::vector<std::string> out;
  for (const auto& item : j) out.push_back(bytes(item));
  return out;
}

// In the child: nothing may return to the server's loop.
[[noreturn]] void become(const nlohmann::json& request, int (*run)(int, char**)) {
  const auto redirect = [](const std::string& path, int flags, int fd) {
    const int opened = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (opened < 0 || ::dup2(opened, fd) < 0) {
      const std::string message = "convnets --fork-server: " + path + ": " + std::strerror(errno) + '\n';
      (void)!::write(STDERR_FILENO, message.data(), message.size());
      std::_Exit(127);
    }
    ::close(opened);
  };
  redirect(bytes(request.at("stderr")), O_WRONLY | O_CREAT | O_TRUNC, STDERR_FILENO);
  redirect(bytes(request.at("stdout")), O_WRONLY | O_CREAT | O_TRUNC, STDOUT_FILENO);
  redirect(bytes(request.at("stdin")), O_RDONLY, STDIN_FILENO);
  // stdio's buffers were the server's (empty: it reads and writes the raw descriptors), and its flags too.
  __fpurge(stdin);
  std::clearerr(stdin);
  if (const auto cwd = bytes(request.at("cwd")); ::chdir(cwd.c_str()) != 0) {
    std::fprintf(stderr, "convnets --fork-server: cd %s: %s\n", cwd.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  ::clearenv();
  for (const auto& [name, value] : request.at("env").items()) {
    ::setenv(bytes(nlohmann::json(name)).c_str(), bytes(value).c_str(), 1);
  }
  std::vector<std::string> args = bytes_list(request.at("argv"));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int code = run(static_cast<int>(args.size()), argv.data());
  std::exit(finish(code));  // finish() does not return but in sanitizer builds, which tear down as exit() does
}

}  // namespace

int serve_forks(int (*run)(int, char**)) {
  std::string pending, line;
  while (read_line(pending, line)) {
    nlohmann::json request;
    try {
      request = nlohmann::json::parse(line);
      for (const char* key : {"argv", "env", "cwd", "stdin", "stdout", "stderr"}) {
        if (!request.contains(key)) throw std::runtime_error(std::string("no \"") + key + "\"");
      }
      if (!request["argv"].is_array() || request["argv"].empty()) throw std::runtime_error("\"argv\" is empty");
      (void)bytes_list(request["argv"]);
      for (const auto& [name, value] : request["env"].items()) (void)bytes(nlohmann::json(name)), (void)bytes(value);
      for (const char* key : {"cwd", "stdin", "stdout", "stderr"}) (void)bytes(request[key]);
    } catch (const std::exception& e) {
      reply({{"error", std::string("bad request: ") + e.what()}});
      continue;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      reply({{"error", std::string("fork: ") + std::strerror(errno)}});
      continue;
    }
    if (pid == 0) become(request, run);
    reply({{"pid", pid}});
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) {
        status = -1;
        break;
      }
    }
    const int returncode = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    reply({{"returncode", returncode}});
  }
  return 0;
}

}  // namespace convnets::cli
