// Compiles zero/sys/cuda/check.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/sys/cuda/check.cuh"

int main() { return 0; }
