// Devices described to cuDNN for planning without them (its DeviceProperties JSON), and what its refusals there mean: shared by the deviceless plan tests.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace convnets::test {

// An NVIDIA H100 80GB HBM3 (SXM), as cuDNN's DeviceProperties::serialize writes one (its JSON keys): compute
// capability 9.0, 132 SMs, 50 MiB of L2, 227 KiB of opt-in shared memory per block, the CUDA 13.0 driver; the
// device tool's H100 (KINDS.md: 132 multiprocessors, 50 MB of L2, 81,559 MiB).
constexpr const char* kH100 =
    R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536, )"
    R"("multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152, )"
    R"("maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536, )"
    R"("maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9008, )"
    R"("isTccDriver": 0, "supportCoopLaunch": 1, "totalGlobalMem": 85031714816, "smClockRateKHz": 1980000, )"
    R"("memClockRateKHz": 2619000, "l2CacheSize": 52428800, "cudaDeviceId": 0, "deviceVer": 900, )"
    R"("driverVer": 13000, "deviceName": "NVIDIA H100 80GB HBM3"})";

// What cuDNN said of a graph it could not plan without a GPU, line by line: the refusals that are the graph's own
// (its shape, pattern or types), leaving out those of a machine without a driver (a runtime-compiled engine cannot
// load NVRTC's compiler here) and of engines for other architectures (sm7x's).
inline std::vector<std::string> graph_refusals(const std::string& why) {
  std::vector<std::string> out;
  std::istringstream in(why);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Warning: CUDNN_STATUS_", 0) != 0) continue;
    const auto status = line.substr(9, line.find(';') - 9);
    if (status == "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING" ||
        status == "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH" || status == "CUDNN_STATUS_NOT_SUPPORTED") {
      continue;  // the last: the generic line each of the others ends with
    }
    out.push_back(line);
  }
  return out;
}

}  // namespace convnets::test
