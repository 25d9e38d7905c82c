# Writes OUT: a C++ map from recipe name (file stem) to its JSON text, for each RECIPE_DIR/*.json.
file(GLOB recipes ${RECIPE_DIR}/*.json)
list(SORT recipes)
set(body "")
foreach(path IN LISTS recipes)
  get_filename_component(name ${path} NAME_WE)
  file(READ ${path} text)
  set(body "${body}      {\"${name}\", R\"convnets_recipe(${text})convnets_recipe\"},\n")
endforeach()
file(WRITE ${OUT}.tmp "// Generated from recipes/*.json by cmake/embed_recipes.cmake; do not edit.
#include <map>
#include <string>

namespace convnets::train {
const std::map<std::string, std::string>& embedded_recipes() {
  static const std::map<std::string, std::string> recipes = {
${body}  };
  return recipes;
}
}  // namespace convnets::train
")
file(RENAME ${OUT}.tmp ${OUT})
