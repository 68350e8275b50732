// Compiles zero/comm/nccl.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/comm/nccl.cuh"

int main() { return 0; }
