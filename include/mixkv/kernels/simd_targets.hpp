// The instruction sets the Highway kernels (attention, matrix products) were compiled for and this
// CPU can run, and a testing aid that runs code with the kernels dispatched to each in turn, so
// tests check every path a user's CPU might take, not only the best one of the test machine.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mixkv::kernels {

// Highway's names ("AVX3", "AVX2", "EMU128", ...), best first.
std::vector<std::string> simd_targets();

// Calls fn(name) once per simd_targets() entry with every kernel dispatched to that instruction
// set, then restores the normal choice (also when fn throws). For tests: not thread-safe, and no
// kernel may run on another thread meanwhile.
void for_each_simd_target(const std::function<void(const std::string&)>& fn);

}  // namespace mixkv::kernels
