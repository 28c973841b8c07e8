// The process-wide save-point observer.
#include "checkpoint/save_points.h"

#include <mutex>

namespace tessera::checkpoint {

namespace {

std::mutex& observer_mutex() {
  static std::mutex mutex;
  return mutex;
}

SavePointObserver& observer() {
  static SavePointObserver instance;
  return instance;
}

}  // namespace

void set_save_point_observer(SavePointObserver new_observer) {
  std::lock_guard lock(observer_mutex());
  observer() = std::move(new_observer);
}

void reach_save_point(std::string_view point) {
  SavePointObserver current;
  {
    std::lock_guard lock(observer_mutex());
    current = observer();
  }
  if (current) current(point);
}

}  // namespace tessera::checkpoint
