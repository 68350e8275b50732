// Compiles the device engine in fp32: stages 0-3, SGD and AdamW, on comm::cuda_threads (and comm::nccl where NCCL is found).
#include "instantiate.cuh"

ZERO_INSTANTIATE_DEVICE_ENGINES(zero::precision::fp32)

int main() { return 0; }
