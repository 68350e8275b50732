// Compiles zero/sys/cuda/context.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/sys/cuda/context.cuh"

int main() { return 0; }
