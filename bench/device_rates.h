// Transfer rates the benches' floors are stated at, measured on the GPU at hand.
#pragma once

namespace dhs {

// Device-to-device copy rate, GB/s of bytes read + written (4 GiB, the best of 10): the HBM
// read ceiling the benches compare against.
double measure_copy_gbps();
// Pinned host memory to HBM, GB/s (256 MiB cudaMemcpyAsync, the best of 5): the PCIe rate.
double measure_h2d_gbps();

}  // namespace dhs
