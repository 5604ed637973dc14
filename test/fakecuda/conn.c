/*
 * The device connection: this process's link to fakecuda-devd, its
 * /dev/nvidia* equivalent (CRIU cannot dump a process holding it, because its
 * peer is outside the dumped tree), and the device arenas (G.arena, one memfd
 * per device) that devd hands over at HELLO and that every window maps.
 * G.conn_lock serializes messages; it nests inside G.lock.  A request waits
 * for its response; a one-way message (conn_send) does not, and devd
 * processes it before any later message of this connection.  The restore
 * thread uses conn_rpc_unlocked on a descriptor of its own making.
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
	if (fkw_recv(fd, r, fkw_resp_len(q->op), fds, maxfds, &nfds) < 0)
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

CUresult conn_send(const struct fkw_req *q, int sendfd)
{
	int err;

	pthread_mutex_lock(&G.conn_lock);
	err = G.conn < 0 ? -1 : fkw_send(G.conn, q, sizeof(*q), sendfd >= 0 ? &sendfd : NULL, sendfd >= 0);
	pthread_mutex_unlock(&G.conn_lock);
	return err ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
}

/*
 * Connects and says hello; fills the device table and arenas (close-on-exec).
 * No allocation: the restore thread calls it.
 */
CUresult conn_open(int *fdp, struct fk_devices *dev, struct fk_arena *arenas)
{
	struct fkw_req q;
	struct fkw_resp r;
	CUresult res;
	int fd = fkw_connect(G.sockpath), i, afd[FKW_MAX_DEV];

	if (fd < 0)
		return CUDA_ERROR_NO_DEVICE;
	memset(&q, 0, sizeof(q));
	q.op = FKW_HELLO;
	q.n = FKW_VERSION;
	q.pid = getpid();
	res = conn_rpc_unlocked(fd, &q, -1, &r, afd, FKW_MAX_DEV);
	if (res == CUDA_SUCCESS && r.nfds != r.n) {
		for (i = 0; i < (int)r.nfds; i++)
			close(afd[i]);
		res = CUDA_ERROR_OPERATING_SYSTEM;
	}
	if (res != CUDA_SUCCESS) {
		close(fd);
		return res == CUDA_ERROR_DEVICE_UNAVAILABLE ? CUDA_ERROR_NO_DEVICE : res;
	}
	arena_reset(arenas, FKW_MAX_DEV);
	for (i = 0; i < (int)r.n; i++)
		arenas[i].fd = afd[i];
	dev->n = (int)r.n;
	dev->mc_gran = r.mc_gran;
	dev->mc_rec_gran = r.mc_rec_gran;
	memcpy(dev->phys, r.u.devs, sizeof(dev->phys));
	*fdp = fd;
	return CUDA_SUCCESS;
}

/*
 * Drops the connection and the arenas, mappings included (native
 * checkpoint, a forked child): with them go every devd reference of the
 * process, and nothing of device memory is left for CRIU to dump.  Only
 * system calls: the restore thread calls it.
 */
void conn_close_all(void)
{
	if (G.conn >= 0)
		close(G.conn);
	G.conn = -1;
	arena_drop(G.arena, FKW_MAX_DEV);
}

/* One-way: the caller validated the reference against its own tables. */
void conn_drop(int kind, uint64_t id)
{
	struct fkw_req q;

	memset(&q, 0, sizeof(q));
	q.op = FKW_DROP;
	q.kind = (uint32_t)kind;
	q.id = id;
	conn_send(&q, -1);
}
