// nn::ModuleList: an ordered list of child modules named "0", "1", ...
// (GPT's "blocks"), so their parameters get names like "blocks.3.attn.qkv.weight".
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace tessera::nn {

class ModuleList : public Module {
 public:
  ModuleList();

  // Registers `module` under the next index; returns it.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    append(module);
    return module;
  }
  int64_t size() const { return static_cast<int64_t>(items_.size()); }
  Module& operator[](int64_t index) const;  // throws when out of range
  const std::vector<std::shared_ptr<Module>>& items() const { return items_; }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 protected:
  explicit ModuleList(std::string type_name);

 private:
  void append(std::shared_ptr<Module> module);
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace tessera::nn
