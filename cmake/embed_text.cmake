# Writes OUT: a C++ function NAME() returning the text of the file IN, so data the executable needs travels inside it.
file(READ ${IN} text)
file(WRITE ${OUT}.tmp "// Generated from ${IN} by cmake/embed_text.cmake; do not edit.
#include <string>

namespace convnets {
const std::string& ${NAME}() {
  static const std::string text = R\"convnets_text(${text})convnets_text\";
  return text;
}
}  // namespace convnets
")
file(RENAME ${OUT}.tmp ${OUT})
