// ImageNet-1k's class names in the standard synset order (torchvision's list, data/imagenet1k_classes.txt): what a 1000-class model that carries no names of its own prints.
#pragma once

#include <string>
#include <vector>

namespace convnets {

const std::vector<std::string>& imagenet1k_class_names();

}  // namespace convnets
