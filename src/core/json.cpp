#include "core/json.h"

#include "core/error.h"

#include <fstream>
#include <sstream>

namespace convnets {
namespace {

// Length of the valid UTF-8 sequence at `s[i]`, or 0 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xbf) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

template <typename Json>
Json escaped_copy(const Json& j) {
  if (j.is_string()) return utf8_escaped(j.template get_ref<const std::string&>());
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& v : j) out.push_back(escaped_copy(v));
    return out;
  }
  if (j.is_object()) {
    Json out = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[utf8_escaped(it.key())] = escaped_copy(it.value());
    return out;
  }
  return j;
}

// The copy is made only when some string needs it: dumps of large, clean
// documents (a run's resolved config, bench results) cost what they did.
template <typename Json>
bool all_valid(const Json& j) {
  if (j.is_string()) return valid_utf8(j.template get_ref<const std::string&>());
  if (j.is_array() || j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (j.is_object() && !valid_utf8(it.key())) return false;
      if (!all_valid(it.value())) return false;
    }
  }
  return true;
}

template <typename Json>
std::string dump(const Json& j, int indent) {
  return all_valid(j) ? j.dump(indent) : escaped_copy(j).dump(indent);
}

}  // namespace

std::string utf8_escaped(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t n = utf8_sequence(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      static const char* hex = "0123456789abcdef";
      const auto c = static_cast<unsigned char>(bytes[i++]);
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string dump_json(const nlohmann::json& j, int indent) { return dump(j, indent); }
std::string dump_json(const nlohmann::ordered_json& j, int indent) { return dump(j, indent); }

nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth) {
  // nlohmann's callback sees each value's depth as it is parsed; throwing
  // from it stops the parse before a deeper level is allocated.
  const auto limit = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (depth >= max_depth && (event == nlohmann::json::parse_event_t::object_start ||
                               event == nlohmann::json::parse_event_t::array_start)) {
      throw Error(utf8_escaped(source) + ": JSON nested deeper than " + std::to_string(max_depth) +
                      " levels; expected a shallow document",
                  "the file is damaged or not the file convnets expects here");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit);
  } catch (const nlohmann::json::exception& e) {
    throw Error(utf8_escaped(source) + ": not valid JSON (" + e.what() + ")");
  }
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot open " + what, path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw SystemError("cannot read " + what, path);
  return text.str();
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, int max_depth) {
  return parse_json(read_file(path, what), path, max_depth);
}

}  // namespace convnets
