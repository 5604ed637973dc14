/*
 * The device connection: this process's link to fakecuda-devd, its
 * /dev/nvidia* equivalent (CRIU cannot dump a process holding it, because its
 * peer is outside the dumped tree).  One request at a time per connection:
 * G.conn_lock serializes requests; it nests inside G.lock.  The restore thread
 * uses conn_rpc_unlocked on a descriptor of its own making.
 */
#include <string.h>
#include <unistd.h>

#include "fake.h"

CUresult conn_rpc_unlocked(int fd, const struct fkw_req *q, int sendfd, struct fkw_resp *r, int *fds, int maxfds)
{
	int nfds = 0, i;

	if (fd < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (fkw_send(fd, q, sizeof(*q), sendfd >= 0 ? &sendfd : NULL, sendfd >= 0) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (fkw_recv(fd, r, sizeof(*r), fds, maxfds, &nfds) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if ((int)r->nfds != nfds || r->result != CUDA_SUCCESS) {
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		if (r->result == CUDA_SUCCESS)
			return CUDA_ERROR_OPERATING_SYSTEM; /* out of descriptors */
	}
	return (CUresult)r->result;
}

CUresult conn_rpc(const struct fkw_req *q, int sendfd, struct fkw_resp *r, int *fds, int maxfds)
{
	CUresult res;

	pthread_mutex_lock(&G.conn_lock);
	res = conn_rpc_unlocked(G.conn, q, sendfd, r, fds, maxfds);
	pthread_mutex_unlock(&G.conn_lock);
	return res;
}

/* Connects and says hello; fills the device table.  No allocation: the restore thread calls it. */
CUresult conn_open(int *fdp, struct fk_devices *dev)
{
	struct fkw_req q;
	struct fkw_resp r;
	CUresult res;
	int fd = fkw_connect(G.sockpath);

	if (fd < 0)
		return CUDA_ERROR_NO_DEVICE;
	memset(&q, 0, sizeof(q));
	q.op = FKW_HELLO;
	q.n = FKW_VERSION;
	q.pid = getpid();
	res = conn_rpc_unlocked(fd, &q, -1, &r, NULL, 0);
	if (res != CUDA_SUCCESS) {
		close(fd);
		return res == CUDA_ERROR_DEVICE_UNAVAILABLE ? CUDA_ERROR_NO_DEVICE : res;
	}
	dev->n = (int)r.n;
	dev->mc_gran = r.mc_gran;
	dev->mc_rec_gran = r.mc_rec_gran;
	memcpy(dev->phys, r.u.devs, sizeof(dev->phys));
	*fdp = fd;
	return CUDA_SUCCESS;
}

void conn_drop(int kind, uint64_t id)
{
	struct fkw_req q;
	struct fkw_resp r;

	memset(&q, 0, sizeof(q));
	q.op = FKW_DROP;
	q.kind = (uint32_t)kind;
	q.id = id;
	conn_rpc(&q, -1, &r, NULL, 0);
}
