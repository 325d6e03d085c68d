/* The subset of ROCm 6's hip_runtime_api.h that the stand-in libamdhip64.so exports, with
 * HIP's names, signatures and values, for C test programs. hipDeviceProp_tR0600 is declared
 * up to multiProcessorCount and padded to more than its real size. */
#ifndef HIP_STAND_IN_H
#define HIP_STAND_IN_H
#include <stddef.h>
#include <stdint.h>

typedef int hipError_t;
#define hipSuccess 0
#define hipErrorInvalidValue 1
#define hipErrorOutOfMemory 2

typedef void *hipStream_t;
typedef void *hipMemPool_t;
typedef void *hipArray_t;
typedef void *hipMemGenericAllocationHandle_t;

typedef struct { size_t width, height, depth; } hipExtent;
typedef struct { void *ptr; size_t pitch, xsize, ysize; } hipPitchedPtr;
typedef struct { int x, y, z, w; int f; } hipChannelFormatDesc;
typedef struct { int type; int id; } hipMemLocation;
typedef struct {
  int type; int requestedHandleType; hipMemLocation location; void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; } allocFlags;
} hipMemAllocationProp;
typedef struct {
  int allocType; int handleTypes; hipMemLocation location; void *win32SecurityAttributes;
  size_t maxSize; unsigned char reserved[56];
} hipMemPoolProps;

typedef void *hipMipmappedArray_t;
typedef void *hipGraph_t;
typedef void *hipGraphNode_t;
typedef struct { size_t Width, Height; int Format; unsigned int NumChannels; } HIP_ARRAY_DESCRIPTOR;
typedef struct {
  size_t Width, Height, Depth; int Format; unsigned int NumChannels; unsigned int Flags;
} HIP_ARRAY3D_DESCRIPTOR;
typedef struct {
  hipMemPoolProps poolProps; const void *accessDescs; size_t accessDescCount; size_t bytesize; void *dptr;
} hipMemAllocNodeParams;
#define HIP_AD_FORMAT_FLOAT 0x20
#define hipErrorNotSupported 801

typedef struct {
  char name[256]; char uuid[16]; char luid[8]; unsigned int luidDeviceNodeMask;
  size_t totalGlobalMem; size_t sharedMemPerBlock; int regsPerBlock; int warpSize; size_t memPitch;
  int maxThreadsPerBlock; int maxThreadsDim[3]; int maxGridSize[3]; int clockRate; size_t totalConstMem;
  int major; int minor; size_t textureAlignment; size_t texturePitchAlignment; int deviceOverlap;
  int multiProcessorCount;
  char rest[2048];
} hipDeviceProp_tR0600;
#define hipGetDeviceProperties hipGetDevicePropertiesR0600
#define hipDeviceProp_t hipDeviceProp_tR0600

#define hipDeviceAttributeMultiprocessorCount 63
#define hipDeviceAttributeTotalGlobalMem 84

hipError_t hipInit(unsigned int flags);
hipError_t hipGetDeviceCount(int *count);
hipError_t hipSetDevice(int device);
/* A kernel of gridX*gridY*gridZ blocks on the current device (no code runs): the caller
 * waits blocks x FAKE_HIP_BLOCK_NS; the engine time goes to FAKE_AMDGPU_DRIVER_SOCKET. */
hipError_t hipModuleLaunchKernel(void *f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                 unsigned blockX, unsigned blockY, unsigned blockZ,
                                 unsigned sharedBytes, void *stream, void **params,
                                 void **extra);
hipError_t hipGetDevice(int *device);
hipError_t hipDeviceTotalMem(size_t *bytes, int device);
hipError_t hipDeviceGetAttribute(int *value, int attribute, int device);
hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *props, int device);
hipError_t hipMemGetInfo(size_t *free, size_t *total);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags);
hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags);
hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream);
hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream);
hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
hipError_t hipMalloc3D(hipPitchedPtr *pitched, hipExtent extent);
hipError_t hipFree(void *ptr);
hipError_t hipFreeAsync(void *ptr, hipStream_t stream);
hipError_t hipMallocArray(hipArray_t *array, const hipChannelFormatDesc *desc, size_t width, size_t height, unsigned int flags);
hipError_t hipMalloc3DArray(hipArray_t *array, const hipChannelFormatDesc *desc, hipExtent extent, unsigned int flags);
hipError_t hipFreeArray(hipArray_t array);
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop, unsigned long long flags);
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle);
hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int device);
hipError_t hipMemPoolCreate(hipMemPool_t *pool, const hipMemPoolProps *props);
hipError_t hipMemAllocPitch(void **dptr, size_t *pitch, size_t widthInBytes, size_t height, unsigned int elementSizeBytes);
hipError_t hipArrayCreate(hipArray_t *pHandle, const HIP_ARRAY_DESCRIPTOR *pAllocateArray);
hipError_t hipArray3DCreate(hipArray_t *array, const HIP_ARRAY3D_DESCRIPTOR *pAllocateArray);
hipError_t hipArrayDestroy(hipArray_t array);
hipError_t hipMallocMipmappedArray(hipMipmappedArray_t *mipmappedArray, const hipChannelFormatDesc *desc, hipExtent extent, unsigned int numLevels, unsigned int flags);
hipError_t hipFreeMipmappedArray(hipMipmappedArray_t mipmappedArray);
hipError_t hipMipmappedArrayCreate(hipMipmappedArray_t *pHandle, HIP_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels);
hipError_t hipMipmappedArrayDestroy(hipMipmappedArray_t hMipmappedArray);
hipError_t hipGraphAddMemAllocNode(hipGraphNode_t *pGraphNode, hipGraph_t graph, const hipGraphNode_t *pDependencies, size_t numDependencies, hipMemAllocNodeParams *pNodeParams);
hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags, int *symbolStatus);
#endif
