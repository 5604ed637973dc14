/*
 * facts-workload.c - the processes of the native-checkpoint table in
 * docs/driver-facts.md ('Native checkpoint of sharing processes'),
 * written only against cuda.h so that the same binary runs on NVIDIA's
 * driver and on the fake one (test/fakecuda). facts.sh drives it and
 * checkpoints it with fakecuda-ckpt; comparing the two outputs is how the
 * fake driver's faithfulness is checked.
 *
 *   facts-workload private                   64 MiB cuMemAlloc + 4 MiB POSIX-capable VMM, never shared
 *   facts-workload vmm-export SOCK [keep]    POSIX-FD VMM allocation exported to one importer
 *   facts-workload vmm-import SOCK           imports it, maps it, closes the FD
 *   facts-workload ipc-export FILE           cuMemAlloc + cuIpcGetMemHandle written to FILE
 *   facts-workload ipc-import FILE           cuIpcOpenMemHandle of it
 *
 * Each prints "ready" once set up, then reads commands on stdin:
 *   verify   copy every buffer back, check the pattern at the same addresses, print "ok" or "bad ..."
 *   quit     exit
 */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wl.h"

#define MIB (1ull << 20)

static void die(const char *what, CUresult r)
{
	const char *name = "?";

	cuGetErrorName(r, &name);
	printf("error %s %s\n", what, name);
	fflush(stdout);
	exit(2);
}

#define CK(call)                        \
	do {                            \
		CUresult r_ = (call);   \
		if (r_ != CUDA_SUCCESS) \
			die(#call, r_); \
	} while (0)

struct buf {
	CUdeviceptr va;
	size_t size;
	uint32_t seed;
};

static struct buf bufs[4];
static int nbufs;

static void pattern(uint32_t *h, size_t words, uint32_t seed)
{
	for (size_t i = 0; i < words; i++)
		h[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

static void fill(CUdeviceptr va, size_t size, uint32_t seed)
{
	uint32_t *h = malloc(size);

	pattern(h, size / 4, seed);
	CK(cuMemcpyHtoD(va, h, size));
	free(h);
	bufs[nbufs++] = (struct buf){va, size, seed};
}

static int verify(void)
{
	for (int i = 0; i < nbufs; i++) {
		size_t words = bufs[i].size / 4;
		uint32_t *h = malloc(bufs[i].size), *want = malloc(bufs[i].size);
		CUresult r = cuMemcpyDtoH(h, bufs[i].va, bufs[i].size);
		if (r != CUDA_SUCCESS) {
			const char *name = "?";
			cuGetErrorName(r, &name);
			printf("bad copy of buffer %d at %#llx: %s\n", i, (unsigned long long)bufs[i].va, name);
			return 1;
		}
		pattern(want, words, bufs[i].seed);
		for (size_t w = 0; w < words; w++) {
			if (h[w] != want[w]) {
				printf("bad byte at buffer %d offset %zu\n", i, w * 4);
				return 1;
			}
		}
		free(h);
		free(want);
	}
	printf("ok %d buffers\n", nbufs);
	return 0;
}

static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h, size_t size, CUdevice dev)
{
	CUdeviceptr va;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemMap(va, size, 0, h, 0));
	CK(cuMemSetAccess(va, size, &acc, 1));
	return va;
}

static CUmemGenericAllocationHandle vmm_create(size_t size, CUdevice dev, int posix)
{
	CUmemAllocationProp p = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				 .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
				 .requestedHandleTypes =
					 posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE};
	CUmemGenericAllocationHandle h;

	CK(cuMemCreate(&h, size, &p, 0));
	return h;
}

static int unix_socket(const char *path, int listening)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int s = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (listening) {
		unlink(path);
		if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
			return -1;
		return s;
	}
	for (int i = 0; i < 200; i++) {
		if (!connect(s, (struct sockaddr *)&a, sizeof(a)))
			return s;
		usleep(50000);
	}
	return -1;
}

/* One byte and a descriptor, through the workload library (test/workloads/wl.c). */
static void send_fd(int s, int fd)
{
	if (wl_send(s, "F", 1, fd))
		exit(3);
}

static int recv_fd(int s)
{
	char c;
	int fd = wl_recv_fd(s, &c, 1);

	if (fd < 0)
		exit(3);
	return fd;
}

int main(int argc, char **argv)
{
	const char *role = argc > 1 ? argv[1] : "";
	CUdevice dev;
	CUcontext ctx;
	char line[64];

	setvbuf(stdout, NULL, _IOLBF, 0);
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));

	if (!strcmp(role, "private")) {
		CUdeviceptr p;
		CK(cuMemAlloc(&p, 64 * MIB));
		fill(p, 64 * MIB, 0x11);
		CUmemGenericAllocationHandle h = vmm_create(4 * MIB, dev, 1);
		fill(vmm_map(h, 4 * MIB, dev), 4 * MIB, 0x22);
	} else if (!strcmp(role, "vmm-export") && argc > 2) {
		CUmemGenericAllocationHandle h = vmm_create(32 * MIB, dev, 1);
		CUdeviceptr va = vmm_map(h, 32 * MIB, dev);
		int fd, ls = unix_socket(argv[2], 1), s;
		fill(va, 32 * MIB, 0x33);
		CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		printf("listening\n");
		s = accept(ls, NULL, NULL);
		send_fd(s, fd);
		close(s);
		close(ls);
		if (argc < 4 || strcmp(argv[3], "keep"))
			close(fd);
	} else if (!strcmp(role, "vmm-import") && argc > 2) {
		int s = unix_socket(argv[2], 0), fd;
		CUmemGenericAllocationHandle h;
		if (s < 0)
			die("connect", CUDA_ERROR_UNKNOWN);
		fd = recv_fd(s);
		close(s);
		CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(fd);
		bufs[nbufs++] = (struct buf){vmm_map(h, 32 * MIB, dev), 32 * MIB, 0x33};
	} else if (!strcmp(role, "ipc-export") && argc > 2) {
		CUdeviceptr p;
		CUipcMemHandle ih;
		CK(cuMemAlloc(&p, 32 * MIB));
		fill(p, 32 * MIB, 0x44);
		CK(cuIpcGetMemHandle(&ih, p));
		FILE *f = fopen(argv[2], "wb");
		fwrite(&ih, sizeof(ih), 1, f);
		fclose(f);
	} else if (!strcmp(role, "ipc-import") && argc > 2) {
		CUipcMemHandle ih;
		CUdeviceptr p;
		FILE *f = fopen(argv[2], "rb");
		if (!f || fread(&ih, sizeof(ih), 1, f) != 1)
			die("read ipc handle", CUDA_ERROR_UNKNOWN);
		fclose(f);
		CK(cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
		bufs[nbufs++] = (struct buf){p, 32 * MIB, 0x44};
	} else {
		fprintf(stderr, "usage: facts-workload private|vmm-export SOCK [keep]|vmm-import SOCK|"
				"ipc-export FILE|ipc-import FILE\n");
		return 64;
	}
	if (verify())
		return 1;
	printf("ready\n");
	while (fgets(line, sizeof(line), stdin)) {
		if (!strncmp(line, "verify", 6))
			verify();
		else if (!strncmp(line, "quit", 4))
			break;
	}
	return 0;
}
