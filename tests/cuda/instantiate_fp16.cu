// Compiles the device engine in fp16: every stage and optimizer of zero/catalog.hpp, on comm::cuda_threads (and comm::nccl where NCCL is found).
#include "instantiate.cuh"

ZERO_INSTANTIATE_DEVICE_ENGINES(zero::precision::fp16)

int main() { return 0; }
