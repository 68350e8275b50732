// Compiles the device engine in bf16: stages 0-3, SGD and AdamW, on comm::cuda_threads (and comm::nccl where NCCL is found).
#include "instantiate.cuh"

ZERO_INSTANTIATE_DEVICE_ENGINES(zero::precision::bf16)

int main() { return 0; }
