/*
 * The device connection: this process's link to fakecuda-devd, its
 * /dev/nvidia* equivalent (CRIU cannot dump a process holding it, because its
 * peer is outside the dumped tree), the device arenas (G.arena, arena.c) that
 * devd hands over at HELLO, and the queue of one-way messages.
 *
 * G.conn_lock serializes messages and protects the queue; it nests inside
 * G.lock (the worker kick comes after it is released).  A request waits for its
 * response; a one-way message does not, and devd processes it before any
 * later message of this connection.  The restore thread uses
 * conn_rpc_unlocked on a descriptor of its own making, and flushes the queue
 * without the lock only while the API gate is closed (see conn_flush_gated).
 *
 * The queue.  Every one-way message wakes devd on the other CPU (~15 us), so
 * FKW_DROP and FKW_IMPORT_REF are queued here and sent in batches: several
 * records on one sendmsg, with the IMPORT_REF descriptors attached to it.  A
 * batch goes out
 *   - before any synchronous request, on the same sendmsg (so devd sees the
 *     queued messages first: cuMemGetInfo in the releasing process is exact),
 *   - before a FKW_EXPORT, which is never delayed (below),
 *   - when the queue is full,
 *   - within 1 ms of its oldest record, by the worker thread (so that
 *     other processes polling devd see a release about as soon as before),
 *   - at native lock and checkpoint (before the connection closes),
 *   - at fork (the prepare handler; the child discards its copy).
 * What is still queued when the process exits is moot: the hangup drops
 * every reference of the connection anyway, queued IMPORT_REFs included.
 *
 * Why a queued IMPORT_REF is safe (devd.c do_import_ref has the argument for
 * one in flight): the importer's handle exists before devd takes its
 * reference, so the export must stay alive until then.  An export FD keeps
 * its object alive while any copy of the application's end is open, and the
 * application may close its copy as soon as the import returns.  So the queue
 * holds its own copy (dup) of the export FD, attached to the batch when it is
 * sent and closed only after sendmsg returned: from the import to devd's
 * processing of the record, some copy is always open (ours, then the one in
 * flight, which devd closes after taking the reference).  Our DROP of the same
 * object is queued behind the IMPORT_REF, so it cannot overtake it.
 *
 * Why FKW_EXPORT is not delayed: the export FD is returned to the
 * application, which may pass it on and _exit at once.  devd must hold the
 * export reference (or have the EXPORT queued on the socket, ahead of the
 * hangup) by then, or an importer's IMPORT_REF could find the object gone.
 * Once sendmsg returned, the record is in the socket: devd handles it before
 * the hangup.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fake.h"

#define FK_QMAX 512

/* The worker sends a batch at most this old (FAKECUDA_FLUSH_US, default 1 ms;
 * tests lengthen it to prove the other flush points). */
static int64_t flush_ns = 1000000;

void conn_setup(void)
{
	const char *v = getenv("FAKECUDA_FLUSH_US");

	if (v && *v)
		flush_ns = (int64_t)strtoll(v, NULL, 10) * 1000;
}

/* G.conn_lock (or the closed gate, for the restore thread). */
static struct {
	struct fkw_req rec[FK_QMAX];
	int nrec;
	int fd[FKW_MAX_FDS]; /* ours: closed once the batch is sent */
	int nfd;
} oq;
static atomic_llong oq_since; /* when the oldest queued record was queued, 0: empty */

/* Sends the queue, then extra (if any), on one sendmsg; empties the queue. */
static int flush_locked(int fd, const struct fkw_req *extra, int extra_fd)
{
	struct iovec iov[2] = {
		{.iov_base = oq.rec, .iov_len = sizeof(oq.rec[0]) * (size_t)oq.nrec},
		{.iov_base = (void *)extra, .iov_len = extra ? sizeof(*extra) : 0},
	};
	int err = 0;

	if (extra_fd >= 0)
		oq.fd[oq.nfd++] = extra_fd; /* a slot was kept free for it */
	if (fd < 0)
		err = -ENOTCONN;
	else if (oq.nrec || extra)
		err = fkw_sendv(fd, iov, 2, oq.fd, oq.nfd);
	if (extra_fd >= 0)
		oq.nfd--; /* the caller owns it */
	for (int i = 0; i < oq.nfd; i++)
		close(oq.fd[i]);
	oq.nrec = 0;
	oq.nfd = 0;
	atomic_store(&oq_since, 0);
	return err;
}

static int conn_recv_resp(int fd, const struct fkw_req *q, struct fkw_resp *r, int *fds, int maxfds, int *nfds)
{
	return fkw_recv(fd, r, fkw_resp_len(q->op), fds, maxfds, nfds) < 0 ? -1 : 0;
}

static CUresult conn_check_resp(struct fkw_resp *r, int *fds, int nfds)
{
	if ((int)r->nfds != nfds || r->result != CUDA_SUCCESS) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (r->result == CUDA_SUCCESS)
			return CUDA_ERROR_OPERATING_SYSTEM; /* out of descriptors */
	}
	return (CUresult)r->result;
}

CUresult conn_rpc_unlocked(int fd, const struct fkw_req *q, struct fkw_resp *r, int *fds, int maxfds)
{
	int nfds = 0;

	if (fd < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (fkw_send(fd, q, sizeof(*q), NULL, 0) < 0)
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	return conn_recv_resp(fd, q, r, fds, maxfds, &nfds) ? CUDA_ERROR_DEVICE_UNAVAILABLE
							    : conn_check_resp(r, fds, nfds);
}

CUresult conn_rpc(const struct fkw_req *q, struct fkw_resp *r, int *fds, int maxfds)
{
	CUresult res;
	int nfds = 0;

	pthread_mutex_lock(&G.conn_lock);
	/* the queued one-way messages and the request: one sendmsg, one wakeup */
	if (flush_locked(G.conn, q, -1) < 0 || conn_recv_resp(G.conn, q, r, fds, maxfds, &nfds) < 0)
		res = CUDA_ERROR_DEVICE_UNAVAILABLE;
	else
		res = conn_check_resp(r, fds, nfds);
	pthread_mutex_unlock(&G.conn_lock);
	return res;
}

/* Sends q (with sendfd) now, after what is queued; G.conn_lock held. */
static CUresult send_now_locked(const struct fkw_req *q, int sendfd)
{
	if (sendfd >= 0 && oq.nfd == FKW_MAX_FDS)
		flush_locked(G.conn, NULL, -1); /* a descriptor slot for sendfd */
	return flush_locked(G.conn, q, sendfd) ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
}

CUresult conn_send(const struct fkw_req *q, int sendfd)
{
	CUresult res;

	pthread_mutex_lock(&G.conn_lock);
	res = send_now_locked(q, sendfd);
	pthread_mutex_unlock(&G.conn_lock);
	return res;
}

CUresult conn_queue(const struct fkw_req *q, int fd)
{
	int kick = 0, dup_fd = -1;

	pthread_mutex_lock(&G.conn_lock);
	if (G.conn < 0) {
		pthread_mutex_unlock(&G.conn_lock);
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	}
	if (oq.nrec == FK_QMAX || (fd >= 0 && oq.nfd == FKW_MAX_FDS) || (oq.nrec && fk_now_ns() >= conn_flush_due()))
		flush_locked(G.conn, NULL, -1); /* full, or overdue while the worker is busy */
	if (fd >= 0) {
		dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (dup_fd < 0 && oq.nfd > 0) {
			flush_locked(G.conn, NULL, -1); /* gives our copies back */
			dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		}
		if (dup_fd < 0) {
			/* no descriptor to spare: send it now, as the application's copy is open */
			CUresult res = send_now_locked(q, fd);

			pthread_mutex_unlock(&G.conn_lock);
			return res;
		}
		oq.fd[oq.nfd++] = dup_fd;
	}
	oq.rec[oq.nrec++] = *q;
	if (oq.nrec == 1) {
		atomic_store(&oq_since, fk_now_ns());
		kick = 1;
	}
	pthread_mutex_unlock(&G.conn_lock);
	if (kick)
		stream_kick(); /* the worker flushes it within flush_ns */
	return CUDA_SUCCESS;
}

int64_t conn_flush_due(void)
{
	int64_t since = atomic_load(&oq_since);

	return since ? since + flush_ns : 0;
}

/*
 * The worker's timed flush.  It enters the API gate like a call, so that a
 * native lock waits for it and, once the gate is closed, no flush runs
 * behind the restore thread's back; a closed gate skips it (the lock flushed).
 */
int conn_flush_async(void)
{
	if (!gate_try_enter())
		return -1;
	pthread_mutex_lock(&G.conn_lock);
	if (oq.nrec)
		flush_locked(G.conn, NULL, -1);
	pthread_mutex_unlock(&G.conn_lock);
	gate_leave();
	return 0;
}

/* The restore thread, with the gate closed: nobody else is in the API and
 * the worker's flush enters the gate, but fork's prepare handler runs outside
 * it. Only a try: if that handler holds the lock, it is sending the queue
 * itself, and blocking here could wait on a thread CRIU has frozen. */
void conn_flush_gated(void)
{
	if (pthread_mutex_trylock(&G.conn_lock))
		return;
	if (oq.nrec || oq.nfd)
		flush_locked(G.conn, NULL, -1);
	pthread_mutex_unlock(&G.conn_lock);
}

/* Fork: the parent sends what is queued and keeps the lock across fork, so
 * that the child gets a consistent (empty) queue and a lock it can drop. */
void conn_fork_prepare(void)
{
	pthread_mutex_lock(&G.conn_lock);
	if (oq.nrec || oq.nfd)
		flush_locked(G.conn, NULL, -1); /* without a connection: only closes our copies */
}

void conn_fork_parent(void)
{
	pthread_mutex_unlock(&G.conn_lock);
}

/* The child: the prepare handler emptied the queue (no copy of an export
 * FD of ours is left to keep an export alive); only the lock remains. */
void conn_fork_child(void)
{
	pthread_mutex_unlock(&G.conn_lock);
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
	res = conn_rpc_unlocked(fd, &q, &r, afd, FKW_MAX_DEV);
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
	dev->cfg = r.u.cfg;
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

/* One-way, queued: the caller validated the reference against its own tables. */
void conn_drop(int kind, uint64_t id)
{
	struct fkw_req q;

	memset(&q, 0, sizeof(q));
	q.op = FKW_DROP;
	q.kind = (uint32_t)kind;
	q.id = id;
	conn_queue(&q, -1);
}
