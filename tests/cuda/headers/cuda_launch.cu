// Compiles zero/sys/cuda/launch.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/sys/cuda/launch.cuh"

int main() { return 0; }
