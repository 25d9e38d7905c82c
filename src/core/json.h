// JSON in and out for every parser and writer: depth-limited parsing that names the source, and output that stays valid for any bytes.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace convnets {

// Deeper than any file convnets reads (a GPUNet definition or a safetensors
// header is 3 levels, a checkpoint's metadata about 5) and far below the
// nesting that exhausts a thread's stack when a document is copied or freed.
constexpr int kMaxJsonDepth = 64;

// Parses `text` (from `source`: a path or flag, named in every error). Throws
// convnets::Error for invalid JSON and for nesting deeper than `max_depth`,
// refused while parsing, before the structure is built.
nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);
// The whole file at `path` (JSON or not: an ONNX graph too); `what` names it
// in the SystemError ("cannot open the ONNX file: PATH: ...").
std::string read_file(const std::string& path, const std::string& what);
// The whole file at `path`, parsed as above; `what` says what the file is for
// in the error ("GPUNet definition", "recipe").
nlohmann::json read_json_file(const std::string& path, const std::string& what, int max_depth = kMaxJsonDepth);

// Linux file names are bytes: a byte that is not part of valid UTF-8 becomes
// the four characters \xNN (Python's "backslashreplace"), valid UTF-8 passes
// unchanged, so a name in JSON or HTML shows what the file system holds.
std::string utf8_escaped(std::string_view bytes);

// JSON text of `j` with utf8_escaped applied to every key and string: never
// throws for a non-UTF-8 file name, unlike nlohmann's dump().
std::string dump_json(const nlohmann::json& j, int indent = -1);
std::string dump_json(const nlohmann::ordered_json& j, int indent = -1);

}  // namespace convnets
