// The KServe v2 / Triton HTTP bodies (kserve/messages.h): requests as tritonclient writes them, refusals with their
// statuses, and responses a client reads back; and the inputs they name in shared memory.
#include "kserve/messages.h"
#include "serve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

using namespace convnets::kserve;
using convnets::serve::SharedMemoryRegions;

namespace {

// What tritonclient's HTTP client sends: the JSON, then each binary input's bytes in input order.
std::string with_binary(const std::string& json, const std::string& bytes, std::optional<std::size_t>& header) {
  header = json.size();
  return json + bytes;
}

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

std::string bytes_element(const std::string& e) {
  const auto n = static_cast<std::uint32_t>(e.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + e;
}

int status_of(const std::string& body, std::optional<std::size_t> header = std::nullopt, const Limits& limits = {}) {
  try {
    (void)parse_infer_request(body, header, limits);
  } catch (const ProtocolError& e) {
    return e.status();
  }
  return 200;
}

std::string message_of(const std::string& body, std::optional<std::size_t> header = std::nullopt) {
  try {
    (void)parse_infer_request(body, header);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KServe, JsonTensorsFlatOrNestedGiveThePackedElements) {
  const auto flat = parse_infer_request(
      R"({"id":"r1","inputs":[{"name":"input","shape":[2,2],"datatype":"FP32","data":[1,2.5,-3,4]}],)"
      R"("outputs":[{"name":"logits","parameters":{"classification":3}}]})",
      std::nullopt);
  ASSERT_EQ(flat.inputs.size(), 1u);
  EXPECT_EQ(flat.id, "r1");
  EXPECT_EQ(flat.inputs[0].shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(flat.inputs[0].data, floats({1, 2.5f, -3, 4}));
  ASSERT_EQ(flat.outputs.size(), 1u);
  EXPECT_EQ(flat.outputs[0].classification, 3);
  EXPECT_FALSE(flat.outputs[0].binary);
  const auto nested = parse_infer_request(
      R"({"inputs":[{"name":"input","shape":[2,2],"datatype":"FP32","data":[[1,2.5],[-3,4]]}]})", std::nullopt);
  EXPECT_EQ(nested.inputs[0].data, flat.inputs[0].data);
  const auto ints = parse_infer_request(
      R"({"inputs":[{"name":"x","shape":[3],"datatype":"UINT8","data":[0,128,255]},)"
      R"({"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]},)"
      R"({"name":"s","shape":[1],"datatype":"BYTES","data":["hello"]}]})",
      std::nullopt);
  EXPECT_EQ(ints.inputs[0].data, std::string("\x00\x80\xff", 3));
  EXPECT_EQ(ints.inputs[1].data, std::string("\x01\x00", 2));
  EXPECT_EQ(ints.inputs[2].elements, std::vector<std::string>{"hello"});
}

TEST(KServe, BinaryTensorsFollowTheJsonInInputOrder) {
  // Two JPEG-sized BYTES elements (as the encoded-image input carries them), then an FP32 tensor.
  const std::string image_a(1000, '\xd8'), image_b("\xff\xd8\x00tail", 7);
  const std::string images = bytes_element(image_a) + bytes_element(image_b);
  const std::string tensor = floats({0.5f, -1.0f});
  const std::string json = R"({"inputs":[{"name":"image","shape":[2,1],"datatype":"BYTES","parameters":{"binary_data_size":)" +
                           std::to_string(images.size()) +
                           R"(}},{"name":"t","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}],)"
                           R"("parameters":{"binary_data_output":true,"timeout":250000}})";
  std::optional<std::size_t> header;
  const std::string body = with_binary(json, images + tensor, header);
  const auto r = parse_infer_request(body, header);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[0].elements, (std::vector<std::string>{image_a, image_b}));
  EXPECT_EQ(r.inputs[1].data, tensor);
  EXPECT_TRUE(r.binary_data_output);
  EXPECT_EQ(r.timeout_us, 250000);
  // The header length is the JSON's. One byte more takes a binary byte into the JSON, which its parser refuses.
  // One byte less, where the JSON's last byte is whitespace, still parses: that byte is then counted as binary
  // data, one more than the inputs declare, and the binary accounting (not the parser) says so.
  EXPECT_NE(message_of(body, *header + 1).find("failed to parse the request JSON"), std::string::npos)
      << message_of(body, *header + 1);
  std::optional<std::size_t> spaced_header;
  const std::string spaced = with_binary(
      R"({"inputs":[{"name":"t","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]} )", tensor,
      spaced_header);
  ASSERT_EQ(status_of(spaced, spaced_header), 200) << message_of(spaced, spaced_header);
  EXPECT_NE(message_of(spaced, *spaced_header - 1).find("1 bytes of binary data after the last input's"),
            std::string::npos)
      << message_of(spaced, *spaced_header - 1);
  EXPECT_EQ(status_of(body + "x", header), 400);
  EXPECT_NE(message_of(body + "x", header).find("1 bytes of binary data after the last input's"), std::string::npos);
  EXPECT_NE(message_of(body.substr(0, body.size() - 3), header).find("binary_data_size 8 is past the 5 bytes"),
            std::string::npos);
}

TEST(KServe, MalformedAndInconsistentRequestsAreRefusedByName) {
  const std::pair<std::string, std::string> cases[] = {
      {"{", "failed to parse the request JSON"},
      {"[]", "must be a JSON object"},
      {R"({"inputs":[]})", "the request has no inputs"},
      {R"({"inputs":[{"name":"x","shape":[2],"datatype":"FP33","data":[1,2]}]})", "input 'x': unknown datatype 'FP33'"},
      {R"({"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]})",
       "input 'x': \"data\" holds 2 elements, the shape 3"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1,2]}]})", "more than the shape's 1 elements"},
      {R"({"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":["a","b"]}]})",
       "input 'x': FP32 data must be numbers, got string"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[256]}]})", "256 is out of range"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[1.5]}]})", "expected integers, got number"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP16","data":[1]}]})", "FP16 data has no JSON form"},
      {R"({"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[]}]})", "integers of 0 or more"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]})",
       "binary_data_size without an Inference-Header-Content-Length header"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]})",
       "input 'x' appears twice"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"outputs":[{"name":"y","parameters":{"classification":"3"}}]})",
       "output 'y': parameter \"classification\" must be an integer"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e300]}]})", "1e+300 is out of FP32's range"},
      // Nested data nests as the shape does; four values in rows of 3 and 1 are not a 2 x 2 tensor.
      {R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2,3],[4]]}]})",
       "nested \"data\" does not follow the shape [2,2] at depth 1"},
      {R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],3,4]}]})", "does not follow the shape"},
      {R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,[3,4]]}]})", "mixes arrays and values"},
  };
  for (const auto& [body, message] : cases) {
    EXPECT_EQ(status_of(body), 400) << body;
    EXPECT_NE(message_of(body).find(message), std::string::npos) << body << "\n -> " << message_of(body);
  }
}

TEST(KServe, SizeLimitsAnswer413BeforeAnythingIsAllocated) {
  Limits small;
  small.max_body_bytes = 100;
  EXPECT_EQ(status_of(std::string(101, ' '), std::nullopt, small), 413);
  // A shape declaring 2^62 elements is refused from its numbers, with no data behind it.
  EXPECT_EQ(status_of(R"({"inputs":[{"name":"x","shape":[2147483648,2147483648],"datatype":"FP32","data":[]}]})"), 413);
  EXPECT_EQ(status_of(R"({"inputs":[{"name":"x","shape":[1,1,1,1,1,1,1,1,1],"datatype":"FP32","data":[1]}]})"), 413);
  // Nesting is bounded while parsing (core/json.h): a bracket bomb is a 400, not a stack overflow.
  const std::string bomb = R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":)" + std::string(100000, '[') +
                           "1" + std::string(100000, ']') + "}]}";
  EXPECT_EQ(status_of(bomb), 400);
  // A BYTES element claiming more than the body holds.
  const std::string json = R"({"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":8}}]})";
  std::optional<std::size_t> header;
  const std::string body = with_binary(json, std::string("\xff\xff\xff\x7f" "abcd", 8), header);
  EXPECT_NE(message_of(body, header).find("element 0 claims 2147483647 bytes, 4 remain"), std::string::npos);
  EXPECT_EQ(parse_header_length("123"), 123u);
  EXPECT_THROW(parse_header_length("12x"), ProtocolError);
  EXPECT_THROW(parse_header_length(""), ProtocolError);
}

TEST(KServe, ResponsesReadBackAsJsonOrBinary) {
  InferResponse r;
  r.model_name = "resnet50";
  r.model_version = "1";
  r.id = "r1";
  Tensor logits;
  logits.name = "logits";
  logits.datatype = DataType::Fp32;
  logits.shape = {1, 3};
  logits.data = floats({0.25f, -1.5f, 3.0f});
  Tensor classes;
  classes.name = "logits";
  classes.datatype = DataType::Bytes;
  classes.shape = {1, 2};
  classes.elements = {"3.000000:2:tench", "0.250000:0:goldfish"};
  r.outputs = {logits, classes};
  r.binary = {false, false};
  std::optional<std::size_t> header = 7;
  const auto text = write_infer_response(r, header);
  EXPECT_FALSE(header);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model_name"], "resnet50");
  EXPECT_EQ(j["id"], "r1");
  EXPECT_EQ(j["outputs"][0]["data"], (nlohmann::json{0.25, -1.5, 3.0}));
  EXPECT_EQ(j["outputs"][0]["shape"], (nlohmann::json{1, 3}));
  EXPECT_EQ(j["outputs"][1]["data"][0], "3.000000:2:tench");
  // Binary: the JSON says how many bytes follow; they are the tensor's, then the BYTES elements with lengths.
  r.binary = {true, true};
  const auto body = write_infer_response(r, header);
  ASSERT_TRUE(header);
  const auto head = nlohmann::json::parse(body.substr(0, *header));
  EXPECT_FALSE(head["outputs"][0].contains("data"));
  EXPECT_EQ(head["outputs"][0]["parameters"]["binary_data_size"], 12);
  EXPECT_EQ(body.substr(*header, 12), logits.data);
  EXPECT_EQ(body.substr(*header + 12), bytes_element(classes.elements[0]) + bytes_element(classes.elements[1]));
  // A binary output with no elements still makes a binary body: the header length is the whole JSON.
  InferResponse empty;
  empty.model_name = "m";
  Tensor none;
  none.name = "logits";
  none.shape = {0, 10};
  empty.outputs = {none};
  empty.binary = {true};
  const auto bare = write_infer_response(empty, header);
  ASSERT_TRUE(header);
  EXPECT_EQ(*header, bare.size());
  EXPECT_EQ(nlohmann::json::parse(bare)["outputs"][0]["parameters"]["binary_data_size"], 0);
  EXPECT_EQ(nlohmann::json::parse(error_body("model 'x' is not served"))["error"], "model 'x' is not served");
}

// The client's direction (bench serve's): what write_infer_request writes, parse_infer_request reads back as it
// was; what write_infer_response writes, read_infer_response reads back, binary or JSON, FP16 among them.
TEST(KServe, TheClientsRequestsAndResponsesReadBackAsWritten) {
  InferRequest q;
  q.id = "q7";
  q.timeout_us = 2500;
  Tensor image;
  image.name = "input";
  image.datatype = DataType::Fp32;
  image.shape = {1, 2};
  image.data = floats({1.5f, -2.0f});
  Tensor jpeg;
  jpeg.name = "INPUT";
  jpeg.datatype = DataType::Bytes;
  jpeg.shape = {1, 1};
  jpeg.elements = {std::string("\xff\xd8\x00 bytes", 9)};
  Tensor shm;
  shm.name = "pixels";
  shm.datatype = DataType::UInt8;
  shm.shape = {1, 4};
  shm.shared_memory = SharedMemoryRef{"in", 64, 4};
  q.inputs = {image, jpeg, shm};
  q.outputs = {{"logits", true, 0}, {"classes", false, 3}};
  std::optional<std::size_t> header;
  const auto body = write_infer_request(q, header);
  ASSERT_TRUE(header);
  const auto back = parse_infer_request(body, header);
  EXPECT_EQ(back.id, "q7");
  EXPECT_EQ(back.timeout_us, 2500);
  ASSERT_EQ(back.inputs.size(), 3u);
  EXPECT_EQ(back.inputs[0].data, image.data);
  EXPECT_EQ(back.inputs[0].shape, image.shape);
  EXPECT_EQ(back.inputs[1].elements, jpeg.elements);
  ASSERT_TRUE(back.inputs[2].shared_memory);
  EXPECT_EQ((back.inputs[2].shared_memory->region), "in");
  EXPECT_EQ(back.inputs[2].shared_memory->offset, 64u);
  EXPECT_EQ(back.inputs[2].shared_memory->byte_size, 4u);
  ASSERT_EQ(back.outputs.size(), 2u);
  EXPECT_TRUE(back.outputs[0].binary);
  EXPECT_FALSE(back.outputs[1].binary);
  EXPECT_EQ(back.outputs[1].classification, 3);

  InferResponse r;
  r.model_name = "m";
  r.model_version = "1";
  Tensor half;  // 1.0, -2.5, 65504, 2^-24 (the least subnormal)
  half.name = "h";
  half.datatype = DataType::Fp16;
  half.shape = {4};
  half.data = std::string("\x00\x3c\x00\xc1\xff\x7b\x01\x00", 8);
  Tensor counts;
  counts.name = "n";
  counts.datatype = DataType::Int64;
  counts.shape = {2};
  counts.data = std::string("\x05\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff", 16);
  r.outputs = {half, counts, image};
  for (const std::vector<bool>& binary : {std::vector<bool>{false, false, false}, std::vector<bool>{true, false, true}}) {
    r.binary = binary;
    const auto text = write_infer_response(r, header);
    const auto read = read_infer_response(text, header);
    EXPECT_EQ(read.model_name, "m");
    ASSERT_EQ(read.outputs.size(), 3u);
    EXPECT_EQ(read.binary, binary);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(read.outputs[i].data, r.outputs[i].data) << "output " << i << (binary[i] ? " binary" : " JSON");
    }
    EXPECT_EQ(tensor_values(read.outputs[0]), (std::vector<double>{1.0, -2.5, 65504.0, std::ldexp(1.0, -24)}));
    EXPECT_EQ(tensor_values(read.outputs[1]), (std::vector<double>{5.0, -1.0}));
  }
  // What a server answers on failure, and bodies that do not add up, are refused by name.
  EXPECT_THROW(read_infer_response(error_body("model 'x' is not found"), std::nullopt), ProtocolError);
  EXPECT_THROW(read_infer_response(R"({"outputs":[{"name":"a","datatype":"FP32","shape":[2],)"
                                   R"("parameters":{"binary_data_size":8}}]})",
                                   std::nullopt),
               ProtocolError);
}

// Triton's system shared memory (serve/shared_memory.h): a request is bound to its regions when it comes, and reads
// them when a worker takes it up. The client may unregister the region and unlink its object in between (it has
// its answer coming, as far as it knows): the bytes the request was sent with are what it reads.
TEST(SharedMemory, ARequestWaitingForAWorkerReadsTheRegionItWasSentWithThroughAnUnregisterAndUnlink) {
  const std::string key = "/convnets-unit-" + std::to_string(::getpid());
  const std::string values = floats({1.5f, -2.0f, 3.25f, 4.0f});
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, values.data(), values.size(), 16), static_cast<ssize_t>(values.size()));
  SharedMemoryRegions regions;
  regions.add("in", key, 16, values.size());
  auto request = parse_infer_request(R"({"inputs":[{"name":"input","shape":[4],"datatype":"FP32",
      "parameters":{"shared_memory_region":"in","shared_memory_byte_size":16}}]})",
                                     std::nullopt);
  const auto bound = regions.bind(request);
  regions.remove("in");
  ASSERT_EQ(shm_unlink(key.c_str()), 0);
  ::close(fd);
  EXPECT_EQ(regions.status("").size(), 0u);
  regions.read(request, bound);
  EXPECT_EQ(request.inputs.at(0).data, values);
  // A request that comes after the unregister is refused, naming the region.
  auto later = request;
  later.inputs.at(0).shared_memory = SharedMemoryRef{"in", 0, 16};
  try {
    (void)regions.bind(later);
    ADD_FAILURE() << "a request bound to an unregistered region";
  } catch (const ProtocolError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("input 'input': shared memory region 'in' is not registered"),
              std::string::npos)
        << e.what();
  }
}
