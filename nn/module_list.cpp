// nn::ModuleList: children registered under their index.
#include "nn/module_list.h"

#include <string>

namespace tessera::nn {

ModuleList::ModuleList() : ModuleList("ModuleList") {}

ModuleList::ModuleList(std::string type_name) : Module(std::move(type_name)) {}

void ModuleList::append(std::shared_ptr<Module> module) {
  register_module(std::to_string(items_.size()), module);
  items_.push_back(std::move(module));
}

Module& ModuleList::operator[](int64_t index) const {
  TESSERA_CHECK(index >= 0 && index < size(), "ModuleList: index {} is out of range for {} modules", index, size());
  return *items_[static_cast<size_t>(index)];
}

}  // namespace tessera::nn
