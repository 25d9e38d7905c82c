#include "models/gpunet.h"

namespace convnets {
namespace {

// One constructor per layer type, arguments in the order of DLE's JSON fields.
GpunetLayer head(std::int64_t in, std::int64_t out, const char* act = "") {
  GpunetLayer l;
  l.layer_type = "head";
  l.num_in_channels = in;
  l.num_out_channels = out;
  l.act = act;
  return l;
}

GpunetLayer head_large(std::int64_t in, std::int64_t out) {
  auto l = head(in, out);
  l.layer_type = "head_large";
  return l;
}

GpunetLayer block(const char* type, std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride,
                  std::int64_t stage) {
  auto l = head(in, out);
  l.layer_type = type;
  l.kernel_size = k;
  l.stride = stride;
  l.stage = stage;
  return l;
}

GpunetLayer conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, const char* act,
                 std::int64_t stage) {
  auto l = block("conv", in, out, k, stride, stage);
  l.act = act;
  return l;
}

GpunetLayer irb(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, double expansion,
                const char* act, bool se, std::int64_t stage) {
  auto l = conv(in, out, k, stride, act, stage);
  l.layer_type = "irb";
  l.expansion = expansion;
  l.use_se = se;
  return l;
}

GpunetLayer fused(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, double expansion,
                  const char* act, bool se, std::int64_t stage) {
  auto l = irb(in, out, k, stride, expansion, act, se, stage);
  l.layer_type = "fused_irb";
  return l;
}

// The distill builder's irb: integer expansion, grouped 1x1 convs, no act/SE fields.
GpunetLayer dirb(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t expansion,
                 std::int64_t groups, std::int64_t stage) {
  auto l = block("irb", in, out, k, stride, stage);
  l.expansion = static_cast<double>(expansion);
  l.groups = groups;
  return l;
}

GpunetLayer tail(std::int64_t in, std::int64_t out, std::int64_t classes) {
  auto l = head(in, out);
  l.layer_type = "tail";
  l.num_classes = classes;
  return l;
}

GpunetVariant variant(const char* name, const char* description, const char* file, int resolution, bool distill,
                      std::vector<GpunetLayer> layers, double crop_pct = 1.0) {
  return {name, description, file, GpunetDefinition{resolution, distill, std::move(layers)}, crop_pct};
}

GpunetVariant gpunet_0() {
  return variant("gpunet-0", "GPUNet-0 (Wang et al. 2022; 0.65 ms class on GV100)", "0.65ms.json", 320, false,
                 {head(3, 32),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 32, 3, 1, "relu", 1),
                  fused(32, 32, 3, 2, 5, "relu", false, 2),
                  fused(32, 32, 3, 1, 5, "relu", false, 2),
                  fused(32, 64, 3, 2, 5, "relu", false, 3),
                  fused(64, 64, 3, 1, 5, "relu", false, 3),
                  fused(64, 64, 3, 1, 5, "relu", false, 3),
                  irb(64, 256, 3, 2, 5, "swish", false, 4),
                  irb(256, 256, 3, 1, 5, "swish", false, 4),
                  irb(256, 256, 3, 1, 5, "swish", false, 4),
                  irb(256, 704, 3, 2, 5, "relu", true, 6),
                  irb(704, 704, 3, 1, 5, "relu", true, 6),
                  tail(704, 1280, 1000)});
}

GpunetVariant gpunet_1() {
  return variant("gpunet-1", "GPUNet-1 (0.85 ms class on GV100)", "0.85ms.json", 288, false,
                 {head(3, 24),
                  conv(24, 24, 3, 1, "relu", 1),
                  fused(24, 64, 3, 2, 4, "swish", false, 2),
                  fused(64, 64, 3, 1, 4, "swish", false, 2),
                  fused(64, 96, 3, 2, 4, "swish", false, 3),
                  fused(96, 96, 3, 1, 4, "swish", false, 3),
                  irb(96, 160, 3, 2, 2, "swish", true, 4),
                  irb(160, 288, 3, 1, 5, "relu", false, 5),
                  irb(288, 288, 3, 1, 5, "relu", false, 5),
                  irb(288, 288, 3, 1, 5, "relu", false, 5),
                  irb(288, 288, 3, 1, 5, "relu", false, 5),
                  irb(288, 448, 3, 2, 4, "relu", true, 6),
                  irb(448, 448, 3, 1, 4, "relu", true, 6),
                  irb(448, 448, 3, 1, 4, "relu", true, 6),
                  irb(448, 448, 3, 1, 4, "relu", true, 6),
                  tail(448, 1280, 1000)});
}

GpunetVariant gpunet_2() {
  return variant("gpunet-2", "GPUNet-2 (1.75 ms class on GV100)", "1.75ms.json", 384, false,
                 {head(3, 32),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 32, 3, 1, "relu", 1),
                  fused(32, 32, 5, 2, 6, "swish", true, 2),
                  fused(32, 112, 3, 2, 3, "swish", false, 3),
                  fused(112, 112, 3, 1, 3, "swish", false, 3),
                  fused(112, 112, 3, 1, 3, "swish", false, 3),
                  irb(112, 144, 3, 2, 6, "swish", false, 4),
                  irb(144, 144, 3, 1, 6, "swish", false, 4),
                  irb(144, 144, 3, 1, 6, "swish", false, 4),
                  irb(144, 144, 3, 1, 6, "swish", false, 4),
                  irb(144, 144, 3, 1, 6, "swish", false, 4),
                  irb(144, 144, 3, 1, 6, "swish", false, 4),
                  irb(144, 160, 5, 1, 3, "relu", false, 5),
                  irb(160, 160, 5, 1, 3, "relu", false, 5),
                  irb(160, 160, 5, 1, 3, "relu", false, 5),
                  irb(160, 160, 5, 1, 3, "relu", false, 5),
                  irb(160, 224, 3, 2, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 224, 3, 1, 3, "swish", true, 6),
                  irb(224, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  irb(832, 832, 5, 1, 2, "relu", false, 7),
                  tail(832, 1280, 1000)});
}

// The P models ship as "-D" files but use the distill=false builder.
GpunetVariant gpunet_p0() {
  return variant("gpunet-p0", "GPUNet-P0 (0.5 ms class on GV100, distill=false)", "0.5ms-D.json", 224, false,
                 {head(3, 32, "relu"),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 64, 3, 2, "relu", 2),
                  irb(64, 96, 3, 2, 8, "relu", false, 3),
                  irb(96, 96, 3, 1, 7.67, "relu", false, 3),
                  irb(96, 96, 3, 1, 7.67, "relu", false, 3),
                  irb(96, 256, 3, 2, 7.67, "relu", false, 4),
                  irb(256, 256, 5, 1, 4.25, "relu", false, 4),
                  irb(256, 256, 3, 1, 4.75, "relu", false, 4),
                  irb(256, 704, 3, 2, 8, "relu", false, 5),
                  irb(704, 704, 5, 1, 3.82, "relu", false, 5),
                  irb(704, 704, 3, 1, 3.36, "relu", false, 5),
                  irb(704, 704, 3, 1, 2.55, "relu", false, 5),
                  irb(704, 704, 3, 2, 5.73, "relu", false, 6),
                  tail(704, 1984, 1000)},
                 0.875);
}

GpunetVariant gpunet_p1() {
  return variant("gpunet-p1", "GPUNet-P1 (0.8 ms class on GV100, distill=false)", "0.8ms-D.json", 224, false,
                 {head(3, 32, "relu"),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 32, 3, 1, "relu", 1),
                  conv(32, 64, 5, 2, "relu", 2),
                  irb(64, 64, 3, 1, 8, "relu", false, 2),
                  irb(64, 64, 3, 1, 8, "relu", false, 2),
                  irb(64, 96, 5, 2, 8, "relu", false, 3),
                  irb(96, 96, 5, 1, 8, "relu", false, 3),
                  irb(96, 256, 5, 2, 8, "relu", false, 4),
                  irb(256, 256, 5, 1, 7.5, "relu", false, 4),
                  irb(256, 256, 3, 1, 7.88, "relu", false, 4),
                  irb(256, 704, 5, 2, 7.88, "relu", false, 5),
                  irb(704, 704, 5, 1, 8, "relu", false, 5),
                  irb(704, 704, 3, 1, 7.41, "relu", false, 5),
                  irb(704, 704, 5, 1, 8, "relu", false, 5),
                  irb(704, 704, 5, 2, 7.95, "relu", false, 6),
                  tail(704, 1984, 1000)},
                 0.875);
}

GpunetVariant gpunet_d1() {
  return variant("gpunet-d1", "GPUNet-D1 (1.25 ms class on GV100, distill=true)", "1.25ms-D.json", 456, true,
                 {head(3, 33),
                  dirb(33, 33, 3, 1, 1, 1, 0),
                  dirb(33, 44, 3, 2, 3, 1, 1),
                  dirb(44, 44, 5, 1, 4, 1, 1),
                  dirb(44, 44, 3, 1, 3, 1, 1),
                  dirb(44, 67, 5, 2, 4, 1, 2),
                  dirb(67, 67, 5, 1, 4, 1, 2),
                  dirb(67, 67, 3, 1, 6, 1, 2),
                  dirb(67, 67, 5, 1, 3, 1, 2),
                  dirb(67, 134, 7, 2, 6, 1, 3),
                  dirb(134, 134, 5, 1, 6, 1, 3),
                  dirb(134, 134, 3, 1, 3, 1, 3),
                  dirb(134, 134, 5, 1, 4, 1, 3),
                  dirb(134, 190, 3, 1, 6, 1, 3),
                  dirb(190, 190, 5, 1, 6, 1, 3),
                  dirb(190, 190, 7, 1, 6, 1, 3),
                  dirb(190, 190, 3, 1, 4, 1, 3),
                  dirb(190, 268, 3, 2, 6, 1, 4),
                  dirb(268, 268, 3, 1, 6, 1, 4),
                  dirb(268, 268, 5, 1, 6, 1, 4),
                  dirb(268, 268, 3, 1, 3, 1, 4),
                  dirb(268, 268, 3, 1, 3, 1, 4),
                  dirb(268, 268, 3, 1, 3, 1, 4),
                  tail(268, 1984, 1000)});
}

GpunetVariant gpunet_d2() {
  return variant("gpunet-d2", "GPUNet-D2 (2.25 ms class on GV100, distill=true)", "2.25ms-D.json", 528, true,
                 {head_large(3, 48),
                  dirb(48, 48, 3, 1, 1, 1, 0),
                  dirb(48, 64, 3, 2, 3, 1, 1),
                  dirb(64, 64, 5, 1, 4, 1, 1),
                  dirb(64, 64, 3, 1, 3, 1, 1),
                  dirb(64, 96, 5, 2, 4, 1, 2),
                  dirb(96, 96, 5, 1, 4, 1, 2),
                  dirb(96, 96, 3, 1, 6, 1, 2),
                  dirb(96, 96, 5, 1, 3, 1, 2),
                  dirb(96, 192, 7, 2, 6, 1, 3),
                  dirb(192, 192, 5, 1, 6, 1, 3),
                  dirb(192, 192, 3, 1, 3, 1, 3),
                  dirb(192, 192, 5, 1, 4, 1, 3),
                  dirb(192, 192, 5, 1, 4, 1, 3),
                  dirb(192, 272, 3, 1, 6, 1, 3),
                  dirb(272, 272, 5, 1, 6, 1, 3),
                  dirb(272, 272, 7, 1, 6, 1, 3),
                  dirb(272, 272, 5, 1, 6, 1, 3),
                  dirb(272, 272, 3, 1, 4, 1, 3),
                  dirb(272, 384, 3, 2, 6, 1, 4),
                  dirb(384, 384, 3, 1, 6, 1, 4),
                  dirb(384, 384, 5, 1, 6, 1, 4),
                  dirb(384, 384, 3, 1, 3, 1, 4),
                  dirb(384, 384, 3, 1, 3, 1, 4),
                  dirb(384, 384, 3, 1, 3, 1, 4),
                  dirb(384, 384, 3, 1, 3, 1, 4),
                  tail(384, 1984, 1000)});
}

std::vector<GpunetVariant> make_variants() {
  return {gpunet_0(), gpunet_1(), gpunet_2(), gpunet_p0(), gpunet_p1(), gpunet_d1(), gpunet_d2()};
}

}  // namespace

const std::vector<GpunetVariant>& gpunet_variants() {
  static const std::vector<GpunetVariant> variants = make_variants();
  return variants;
}

}  // namespace convnets
