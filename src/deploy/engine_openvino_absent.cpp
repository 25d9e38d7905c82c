// The OpenVINO entry points of a build without OpenVINO's runtime: compiled
// instead of engine_openvino.cpp, so no translation unit needs a define that
// would invalidate the shared torch precompiled header.
#include "deploy/engine.h"

#include "core/error.h"

namespace convnets::deploy {

bool openvino_available() { return false; }
std::string openvino_version() { return ""; }
std::unique_ptr<Engine> make_openvino_engine(EngineSpec) {
  throw Error("--engine openvino: this convnets was built without OpenVINO's runtime");
}

}  // namespace convnets::deploy
