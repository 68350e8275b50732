// Compiles the device engine in fp16: stages 0-3, SGD and AdamW, on comm::cuda_threads (and comm::nccl where NCCL is found).
#include "instantiate.cuh"

ZERO_INSTANTIATE_DEVICE_ENGINES(zero::precision::fp16)

int main() { return 0; }
