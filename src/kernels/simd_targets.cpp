#include "mixkv/kernels/simd_targets.hpp"

#include <hwy/targets.h>

namespace mixkv::kernels {

std::vector<std::string> simd_targets() {
  std::vector<std::string> names;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets())
    names.emplace_back(hwy::TargetName(target));
  return names;
}

void for_each_simd_target(const std::function<void(const std::string&)>& fn) {
  struct Restore {
    // 0 lifts the mock: dispatch goes back to the best target the CPU has.
    ~Restore() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    fn(hwy::TargetName(target));
  }
}

}  // namespace mixkv::kernels
