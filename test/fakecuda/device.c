/*
 * Devices as the application sees them: ordinals, attributes, names, UUIDs,
 * memory totals, peer capability.  Ordinal -> physical (devd) device mapping
 * lives in G.dev.ord2phys; it is the identity until a checkpoint restore
 * remaps GPUs by UUID.  Reads G.dev under G.lock (the restore thread changes it
 * only while the gate is closed).
 */
#include <stdlib.h>
#include <string.h>

#include "fake.h"

CUresult dev_check(CUdevice d)
{
	return d >= 0 && d < G.dev.n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

int dev_phys(int ord)
{
	return G.dev.ord2phys[ord];
}

int dev_ord_of_phys(int phys)
{
	for (int i = 0; i < G.dev.n; i++)
		if (G.dev.ord2phys[i] == phys)
			return i;
	return -1;
}

static int env_flag(const char *name)
{
	const char *v = getenv(name);

	return v && *v && strcmp(v, "0");
}

int fk_fabric(void)
{
	return env_flag("FAKECUDA_FABRIC");
}

static CUresult device_get(CUdevice *device, int ordinal)
{
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= G.dev.n)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	FK_CALL("cuDeviceGet", device_get(device, ordinal));
}

static CUresult device_count(int *count)
{
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = G.dev.n;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	FK_CALL("cuDeviceGetCount", device_count(count));
}

static CUresult device_attr(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	int v;

	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
		v = 1024;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
		v = 1024;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
		v = 64;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
		v = 2147483647;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
		v = 65535;
		break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
		v = 32;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		v = 132;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		v = 9;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		v = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		v = 0x18 + dev_phys(dev);
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		v = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
		v = -1;
		break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
		v = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
		v = !env_flag("FAKECUDA_NO_MULTICAST");
		break;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
		v = fk_fabric();
		break;
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
		v = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
		v = 1980000;
		break;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
		v = 6144;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
		v = 49152;
		break;
	default:
		v = 0;
		break;
	}
	*pi = v;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	FK_CALL("cuDeviceGetAttribute", device_attr(pi, attrib, dev));
}

static CUresult device_name(char *name, int len, CUdevice dev)
{
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	strncpy(name, G.dev.phys[dev_phys(dev)].name, (size_t)len - 1);
	name[len - 1] = 0;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	FK_CALL("cuDeviceGetName", device_name(name, len, dev));
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	memcpy(uuid->bytes, G.dev.phys[dev_phys(dev)].uuid, 16);
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	FK_CALL("cuDeviceGetUuid", device_uuid(uuid, dev));
}

FK_API CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev)
{
	FK_CALL("cuDeviceGetUuid", device_uuid(uuid, dev));
}

static CUresult device_total(size_t *bytes, CUdevice dev)
{
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = G.dev.phys[dev_phys(dev)].total;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	FK_CALL("cuDeviceTotalMem", device_total(bytes, dev));
}

static CUresult can_access_peer(int *can, CUdevice dev, CUdevice peer)
{
	if (!can)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev) || dev_check(peer))
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer && !env_flag("FAKECUDA_NO_PEER");
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	FK_CALL("cuDeviceCanAccessPeer", can_access_peer(canAccessPeer, dev, peerDev));
}

static CUresult mem_get_info(size_t *free_, size_t *total)
{
	struct fk_ctx *c;
	struct fkw_req q = {.op = FKW_MEMINFO};
	struct fkw_resp r;
	CUresult res = ctx_require(&c);

	if (res)
		return res;
	if (!free_ || !total)
		return CUDA_ERROR_INVALID_VALUE;
	q.dev = (uint32_t)dev_phys(c->ord);
	res = conn_rpc(&q, &r, NULL, 0);
	if (res)
		return res;
	*free_ = r.size;
	*total = r.size2;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
	FK_CALL("cuMemGetInfo", mem_get_info(free, total));
}
