/*
 * sockdiag.c - control socket discovery over netlink sock_diag; see
 * sockdiag.h. The netlink socket is created inside the participant's
 * network namespace by a short-lived helper thread (setns affects only the
 * calling thread), so criu's own namespaces never change.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "errfmt.h"
#include "criulog.h"
#include "proc.h"
#include "sockdiag.h"
#include "threads.h"

#define TCP_LISTEN_STATE 10

struct sk_list {
	struct cuip_unix_sk *v;
	size_t n, cap;
	int err;
};

static int sk_push(struct sk_list *l, unsigned long ino, const char *name, size_t nlen)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 32;
		struct cuip_unix_sk *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	if (nlen >= sizeof(l->v[0].name))
		nlen = sizeof(l->v[0].name) - 1;
	l->v[l->n].ino = ino;
	memcpy(l->v[l->n].name, name, nlen);
	l->v[l->n].name[nlen] = 0;
	l->n++;
	return 0;
}

static int diag_cb(struct nl_msg *msg, void *arg)
{
	struct sk_list *l = arg;
	struct nlmsghdr *h = nlmsg_hdr(msg);
	struct nlattr *tb[UNIX_DIAG_MAX + 1];
	struct unix_diag_msg *m;
	const char *name;
	int nlen;

	if (!nlmsg_valid_hdr(h, sizeof(*m)))
		return NL_SKIP;
	m = nlmsg_data(h);
	if (nlmsg_parse(h, sizeof(*m), tb, UNIX_DIAG_MAX, NULL) < 0 || !tb[UNIX_DIAG_NAME])
		return NL_OK;
	name = nla_data(tb[UNIX_DIAG_NAME]);
	nlen = nla_len(tb[UNIX_DIAG_NAME]);
	if (nlen <= 0 || name[0] == 0) /* abstract */
		return NL_OK;
	while (nlen > 0 && name[nlen - 1] == 0)
		nlen--;
	if (!l->err)
		l->err = sk_push(l, m->udiag_ino, name, (size_t)nlen);
	return NL_OK;
}

struct diag_job {
	pid_t pid;
	int netns_fd; /* -1: stay in criu's namespace */
	struct sk_list list;
	int ret;
	char err[256];
};

static void *diag_thread(void *arg)
{
	struct diag_job *j = arg;
	struct unix_diag_req req;
	struct nl_sock *sk;
	int ret;

	if (j->netns_fd >= 0 && setns(j->netns_fd, CLONE_NEWNET)) {
		j->ret = -errno;
		errfmt(j->err, sizeof(j->err), "cannot enter the network namespace of pid %d: %s", j->pid,
		       strerror(errno));
		return NULL;
	}
	sk = nl_socket_alloc();
	if (!sk) {
		j->ret = -ENOMEM;
		return NULL;
	}
	ret = nl_connect(sk, NETLINK_SOCK_DIAG);
	if (ret < 0) {
		j->ret = -EPROTONOSUPPORT;
		errfmt(j->err, sizeof(j->err), "netlink sock_diag unavailable: %s", nl_geterror(ret));
		goto out;
	}
	memset(&req, 0, sizeof(req));
	req.sdiag_family = AF_UNIX;
	req.udiag_states = 1u << TCP_LISTEN_STATE;
	req.udiag_show = UDIAG_SHOW_NAME;
	nl_socket_modify_cb(sk, NL_CB_VALID, NL_CB_CUSTOM, diag_cb, &j->list);
	ret = nl_send_simple(sk, SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, &req, sizeof(req));
	if (ret >= 0)
		ret = nl_recvmsgs_default(sk);
	if (ret < 0) {
		j->ret = -EIO;
		errfmt(j->err, sizeof(j->err), "sock_diag dump failed: %s", nl_geterror(ret));
	} else if (j->list.err) {
		j->ret = j->list.err;
	}
out:
	nl_socket_free(sk);
	return NULL;
}

/* /proc/PID/net/unix: "Num RefCount Protocol Flags Type St Inode Path". */
static int listeners_procfs(pid_t pid, struct sk_list *l)
{
	char path[64], line[PATH_MAX + 128];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/net/unix", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return -EIO;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long flags, ino;
		char name[PATH_MAX];
		int n = 0;

		name[0] = 0;
		if (sscanf(line, "%*x: %*x %*x %lx %*x %*x %lu %n", &flags, &ino, &n) < 2)
			continue;
		if (!(flags & 0x10000)) /* __SO_ACCEPTCON: listening */
			continue;
		if (sscanf(line + n, "%4095s", name) != 1 || name[0] != '/')
			continue;
		if (sk_push(l, ino, name, strlen(name))) {
			fclose(f);
			return -ENOMEM;
		}
	}
	fclose(f);
	return 0;
}

int cuip_unix_listeners(pid_t pid, struct cuip_unix_sk **out, char *err, size_t errlen)
{
	struct diag_job j = {.pid = pid, .netns_fd = -1};
	pthread_t th;
	int ret;

	*out = NULL;
	if (cuip_proc_ns_ino(pid, "net") != cuip_proc_ns_ino(getpid(), "net")) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/ns/net", pid);
		j.netns_fd = open(path, O_RDONLY | O_CLOEXEC);
		if (j.netns_fd < 0) {
			ret = -errno;
			errfmt(err, errlen, "cannot open %s: %s", path, strerror(errno));
			return ret;
		}
	}
	ret = cuip_thread_create(&th, NULL, diag_thread, &j);
	if (ret) {
		if (j.netns_fd >= 0)
			close(j.netns_fd);
		errfmt(err, errlen, "cannot start a sock_diag thread: %s", strerror(ret));
		return -ret;
	}
	pthread_join(th, NULL);
	if (j.netns_fd >= 0)
		close(j.netns_fd);
	if (j.ret) {
		pr_debug("pid %d: %s; falling back to /proc/%d/net/unix", pid, j.err[0] ? j.err : strerror(-j.ret),
			 pid);
		free(j.list.v);
		memset(&j.list, 0, sizeof(j.list));
		ret = listeners_procfs(pid, &j.list);
		if (ret) {
			free(j.list.v);
			errfmt(err, errlen, "cannot list unix sockets of pid %d: %s", pid, strerror(-ret));
			return ret;
		}
	}
	*out = j.list.v;
	return (int)j.list.n;
}

int cuip_sock_name_parse(const char *path, pid_t *vpid, uint64_t *id)
{
	const char *base = strrchr(path, '/');
	unsigned long long x;
	char hex[17];
	int p, n = 0;

	base = base ? base + 1 : path;
	if (sscanf(base, "%d-%16[0-9a-f].sock%n", &p, hex, &n) != 2 || base[n] != 0 || strlen(hex) != 16 || p <= 0)
		return -EINVAL;
	x = strtoull(hex, NULL, 16);
	*vpid = p;
	*id = x;
	return 0;
}

int cuip_find_control_socket(pid_t pid, pid_t vpid, char *path, size_t len, char *err, size_t errlen)
{
	struct cuip_unix_sk *sks = NULL;
	unsigned long *inos = NULL;
	int nsk, nino, found = 0;

	nsk = cuip_unix_listeners(pid, &sks, err, errlen);
	if (nsk < 0)
		return nsk;
	nino = cuip_proc_socket_inodes(pid, &inos);
	if (nino < 0) {
		free(sks);
		errfmt(err, errlen, "cannot read /proc/%d/fd: %s", pid, strerror(-nino));
		return nino;
	}
	for (int i = 0; i < nsk && !found; i++) {
		pid_t sp;
		uint64_t id;

		if (cuip_sock_name_parse(sks[i].name, &sp, &id) || sp != vpid)
			continue;
		for (int k = 0; k < nino; k++) {
			if (inos[k] == sks[i].ino) {
				snprintf(path, len, "%s", sks[i].name);
				found = 1;
				break;
			}
		}
	}
	free(sks);
	free(inos);
	if (!found) {
		errfmt(err, errlen,
		       "pid %d maps the interposer but holds no listening control socket named %d-<id>.sock "
		       "(is its control thread running? was it started with cuinterpose run?)",
		       pid, vpid);
		return -ENOENT;
	}
	return 0;
}

int cuip_connect_control(pid_t pid, const char *path, pid_t expect_pid, unsigned timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char full[PATH_MAX];
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	int fd, dirfd = -1, ret;

	snprintf(full, sizeof(full), "/proc/%d/root%s", pid, path);
	if (strlen(full) >= sizeof(sa.sun_path)) {
		/* Too long for sun_path: reach it through an O_PATH directory fd. */
		char dir[PATH_MAX], *slash;

		snprintf(dir, sizeof(dir), "%s", full);
		slash = strrchr(dir, '/');
		*slash = 0;
		dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (dirfd < 0) {
			ret = -errno;
			errfmt(err, errlen, "cannot open %s: %s", dir, strerror(errno));
			return ret;
		}
		snprintf(full, sizeof(full), "/proc/self/fd/%d/%s", dirfd, slash + 1);
		if (strlen(full) >= sizeof(sa.sun_path)) {
			close(dirfd);
			errfmt(err, errlen, "control socket name %s is too long", path);
			return -ENAMETOOLONG;
		}
	}
	memcpy(sa.sun_path, full, strlen(full) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	if (timeout_ms) {
		struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		errfmt(err, errlen, "cannot connect to the control socket %s of pid %d: %s", path, pid,
		       strerror(errno));
		close(fd);
		goto out;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen)) {
		ret = -errno;
		close(fd);
		goto out;
	}
	if (expect_pid > 0 && cred.pid != expect_pid) {
		errfmt(err, errlen, "control socket %s of pid %d is served by pid %d, not by the participant", path,
		       pid, cred.pid);
		close(fd);
		ret = -EPERM;
		goto out;
	}
	ret = fd;
out:
	if (dirfd >= 0)
		close(dirfd);
	return ret;
}
