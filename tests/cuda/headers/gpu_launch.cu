// Compiles zero/gpu/launch.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/gpu/launch.cuh"

int main() { return 0; }
