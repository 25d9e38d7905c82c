// Devices described to cuDNN for planning without them (its DeviceProperties JSON), shared by the deviceless plan tests.
#pragma once

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

}  // namespace convnets::test
