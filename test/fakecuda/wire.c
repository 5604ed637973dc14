/*
 * Transport helpers for the private lib <-> devd protocol (see wire.h):
 * full-length send/receive with SCM_RIGHTS and the socket path rule.
 * Called by devd.c, conn.c and restore_thread.c; stateless, so no lock.
 * Only system calls on the send/receive/connect paths: the restore thread
 * uses them while other threads of the process may be frozen.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

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
