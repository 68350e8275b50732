// Compiles zero/comm/backends/nccl.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/comm/backends/nccl.cuh"

int main() { return 0; }
