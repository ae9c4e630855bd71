// Lab probe (session 29): how many clusters of 1 / 2 / 4 / 8 blocks the device keeps resident at once for a block
// shaped like the thin kernel's at 16 rows (512 threads, ~200-220 KiB of dynamic shared memory, one block per SM).
// The cluster-summed K slices (reverted, b734e97) launched min(blocks per slice, this) clusters.
//   nvcc -arch=sm_90a -o /tmp/cluster_occupancy benchmarks/lab/cluster_occupancy.cu && /tmp/cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>

__global__ void probe_kernel(float* out) {
  extern __shared__ float smem[];
  smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (out) out[threadIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("SMs %d\n", sms);
  for (int smem : {100 * 1024, 200 * 1024, 220 * 1024}) {
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (unsigned cluster : {1u, 2u, 4u, 8u}) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(cluster);
      cfg.blockDim = dim3(512);
      cfg.dynamicSmemBytes = smem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = cluster;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int n = -1;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void*)probe_kernel, &cfg);
      printf("smem %d KiB, cluster %u: %d clusters resident (%d blocks of %d SMs)%s%s\n", smem / 1024, cluster, n,
             n * (int)cluster, sms, e ? " error " : "", e ? cudaGetErrorString(e) : "");
    }
  }
  return 0;
}
