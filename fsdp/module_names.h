// Modules are named by their dotted path from the root ("blocks.3.attn"; the
// root is ""), as named_modules() and the state dict spell them. FSDP's
// state tree, its plan and its state dicts reason about nesting by name.
#pragma once

#include <string>

namespace tessera::fsdp {

// Whether the module named `module_fqn` is `ancestor_fqn` or lies inside it.
inline bool is_inside(const std::string& module_fqn, const std::string& ancestor_fqn) {
  return ancestor_fqn.empty() || module_fqn == ancestor_fqn ||
         (module_fqn.size() > ancestor_fqn.size() && module_fqn.compare(0, ancestor_fqn.size(), ancestor_fqn) == 0 &&
          module_fqn[ancestor_fqn.size()] == '.');
}

// "blocks.3" + "weight" -> "blocks.3.weight"; the root's names stay bare.
inline std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace tessera::fsdp
