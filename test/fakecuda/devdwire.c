/*
 * Transport helpers for the private lib <-> devd protocol (see devdwire.h):
 * full-length send/receive with SCM_RIGHTS, the socket path rule and the
 * device configuration read from the environment (fkw_config).
 * Called by devd.c, conn.c and restore_thread.c; stateless, so no lock.
 * Only system calls on the send/receive/connect paths: the restore thread
 * uses them while other threads of the process may be frozen.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "devdwire.h"

int fkw_sendv(int fd, struct iovec *iov, int niov, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FKW_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	int first = 1;

	if (nfds > FKW_MAX_FDS)
		return -EINVAL;
	while (niov > 0) {
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
		ssize_t n;

		if (iov->iov_len == 0) {
			iov++;
			niov--;
			continue;
		}
		if (first && nfds > 0) {
			struct cmsghdr *c;

			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		first = 0; /* the descriptors travel with the first byte */
		while (niov > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			niov--;
		}
		if (niov > 0) {
			iov->iov_base = (char *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

int fkw_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

	return fkw_sendv(fd, &iov, 1, fds, nfds);
}

int fkw_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FKW_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	char *p = buf;
	int got = 0;

	while (len > 0) {
		struct iovec iov = {.iov_base = p, .iov_len = len};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		struct cmsghdr *c;
		ssize_t n;

		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			goto err;
		}
		if (n == 0) {
			errno = ECONNRESET;
			goto err;
		}
		for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			int k, cnt;
			int *in;

			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			in = (int *)CMSG_DATA(c);
			for (k = 0; k < cnt; k++) {
				int v;

				memcpy(&v, in + k, sizeof(v));
				if (got < maxfds)
					fds[got++] = v;
				else
					close(v);
			}
		}
		p += n;
		len -= n;
	}
	if (nfds)
		*nfds = got;
	return 0;
err:;
	int e = errno;

	while (got > 0)
		close(fds[--got]);
	if (nfds)
		*nfds = 0;
	return -e;
}

static const struct {
	const char *name;
	size_t off;
} cfg_vars[] = {
	{"FAKECUDA_DEVICES", offsetof(struct fkw_config, devices)},
	{"FAKECUDA_MEM_MB", offsetof(struct fkw_config, mem_mb)},
	{"FAKECUDA_UUID_SEED", offsetof(struct fkw_config, uuid_seed)},
	{"FAKECUDA_MC_GRANULARITY_MB", offsetof(struct fkw_config, mc_gran_mb)},
	{"FAKECUDA_MC_REC_GRANULARITY_MB", offsetof(struct fkw_config, mc_rec_gran_mb)},
	{"FAKECUDA_MC_ROUND_MB", offsetof(struct fkw_config, mc_round_mb)},
};

static uint64_t *cfg_field(struct fkw_config *c, size_t i)
{
	return (uint64_t *)((char *)c + cfg_vars[i].off);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

void fkw_config_from_env(struct fkw_config *c)
{
	c->devices = env_u64("FAKECUDA_DEVICES", 1);
	if (c->devices < 1)
		c->devices = 1;
	if (c->devices > FKW_MAX_DEV)
		c->devices = FKW_MAX_DEV;
	c->mem_mb = env_u64("FAKECUDA_MEM_MB", 4096);
	c->uuid_seed = env_u64("FAKECUDA_UUID_SEED", 0);
	c->mc_gran_mb = env_u64("FAKECUDA_MC_GRANULARITY_MB", 2);
	c->mc_rec_gran_mb = env_u64("FAKECUDA_MC_REC_GRANULARITY_MB", c->mc_gran_mb);
	c->mc_round_mb = env_u64("FAKECUDA_MC_ROUND_MB", 0);
}

void fkw_config_str(const struct fkw_config *c, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = 0;
	for (size_t i = 0; i < sizeof(cfg_vars) / sizeof(cfg_vars[0]) && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s=%llu", i ? " " : "", cfg_vars[i].name,
				      (unsigned long long)*cfg_field((struct fkw_config *)c, i));
}

int fkw_config_mismatch(const struct fkw_config *c, char *want, size_t len)
{
	struct fkw_config mine;

	fkw_config_from_env(&mine);
	for (size_t i = 0; i < sizeof(cfg_vars) / sizeof(cfg_vars[0]); i++) {
		const char *v = getenv(cfg_vars[i].name);

		if (!v || !*v || *cfg_field(&mine, i) == *cfg_field((struct fkw_config *)c, i))
			continue;
		snprintf(want, len, "%s=%s", cfg_vars[i].name, v);
		return 1;
	}
	return 0;
}

const char *fkw_socket_path(char *buf, size_t len)
{
	const char *env = getenv("FAKECUDA_SOCKET");

	if (env && *env)
		snprintf(buf, len, "%s", env);
	else if (geteuid() == 0)
		snprintf(buf, len, "/run/fakecuda/devd.sock");
	else
		snprintf(buf, len, "/tmp/fakecuda-%u/devd.sock", (unsigned)geteuid());
	return buf;
}

int fkw_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t l = strlen(path);
	int fd;

	if (l >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, l + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}
