/*
 * cli_tcp.c - what `cuinterpose checkpoint` needs to know of a tree's TCP
 * connections (cli_criu.c picks --tcp-established and --network-lock from
 * it): whether a process of the tree holds a connected TCP socket (a
 * torch.distributed job's store and gloo/NCCL bootstrap sockets), and how
 * criu can lock the network on this machine while it dumps and restores
 * them.
 *
 * The sockets: the inodes of the tree's descriptors ("socket:[INODE]" in
 * /proc/PID/fd) looked up in /proc/PID/net/tcp and tcp6 of every network
 * namespace the tree uses. Connected: ESTABLISHED, or a state criu dumps
 * only with --tcp-established (SYN_SENT, FIN_WAIT1/2, CLOSE_WAIT,
 * LAST_ACK, CLOSING); listening sockets need no flag.
 * Single-threaded, no locks; every child it runs is bounded in time.
 */
#include "config.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "proc.h"

struct inodes {
	unsigned long *v;
	pid_t *pid; /* the process holding each */
	size_t n, cap;
};

static int inodes_add(struct inodes *s, unsigned long ino, pid_t pid)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		unsigned long *v = realloc(s->v, cap * sizeof(*v));
		pid_t *p;

		if (!v)
			return -ENOMEM;
		s->v = v;
		p = realloc(s->pid, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		s->pid = p;
		s->cap = cap;
	}
	s->v[s->n] = ino;
	s->pid[s->n++] = pid;
	return 0;
}

/* The socket inodes of pid's descriptors. */
static int socket_inodes(pid_t pid, struct inodes *s)
{
	char dir[64], path[PATH_MAX], link[64];
	struct dirent *de;
	unsigned long ino;
	DIR *d;
	int ret = 0;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
	d = opendir(dir);
	if (!d)
		return 0; /* gone, or not ours to read: nothing known */
	while (!ret && (de = readdir(d))) {
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (sscanf(link, "socket:[%lu]", &ino) == 1)
			ret = inodes_add(s, ino, pid);
	}
	closedir(d);
	return ret;
}

/* TCP states (include/net/tcp_states.h) criu dumps only with --tcp-established. */
static bool connected_state(unsigned st)
{
	switch (st) {
	case 0x01: /* ESTABLISHED */
	case 0x02: /* SYN_SENT */
	case 0x04: /* FIN_WAIT1 */
	case 0x05: /* FIN_WAIT2 */
	case 0x08: /* CLOSE_WAIT */
	case 0x09: /* LAST_ACK */
	case 0x0b: /* CLOSING */
		return true;
	}
	return false;
}

/* "0100007F:1F90" (tcp) or 32 hex digits:port (tcp6) as "127.0.0.1:8080". */
static void fmt_addr(const char *hex, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	const char *colon = strchr(hex, ':');
	unsigned port = colon ? (unsigned)strtoul(colon + 1, NULL, 16) : 0;
	size_t hl = colon ? (size_t)(colon - hex) : 0;
	uint32_t w[4];

	if (hl == 8 && sscanf(hex, "%8x", &w[0]) == 1) {
		inet_ntop(AF_INET, &w[0], ip, sizeof(ip)); /* /proc prints the address as a host-order word */
		snprintf(buf, len, "%s:%u", ip, port);
	} else if (hl == 32 && sscanf(hex, "%8x%8x%8x%8x", &w[0], &w[1], &w[2], &w[3]) == 4) {
		inet_ntop(AF_INET6, w, ip, sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, port);
	} else {
		snprintf(buf, len, "%s", hex);
	}
}

/* Count the connected sockets of /proc/PID/net/FILE whose inode the tree
 * holds; the first one found goes to out. */
static void scan_table(pid_t pid, const char *file, const struct inodes *s, struct cli_tcp *out)
{
	char path[64], line[512], local[80], remote[80];
	unsigned long ino;
	unsigned st;
	FILE *in;

	snprintf(path, sizeof(path), "/proc/%d/net/%s", pid, file);
	in = fopen(path, "re");
	if (!in)
		return;
	if (!fgets(line, sizeof(line), in)) { /* the header */
		fclose(in);
		return;
	}
	while (fgets(line, sizeof(line), in)) {
		if (sscanf(line, " %*s %79s %79s %x %*s %*s %*s %*s %*s %lu", local, remote, &st, &ino) != 4 ||
		    !connected_state(st) || !ino)
			continue;
		for (size_t i = 0; i < s->n; i++) {
			char a[96], b[96];

			if (s->v[i] != ino)
				continue;
			if (!out->n++) {
				out->pid = s->pid[i];
				fmt_addr(local, a, sizeof(a));
				fmt_addr(remote, b, sizeof(b));
				snprintf(out->first, sizeof(out->first), "%s <-> %s", a, b);
			}
			break;
		}
	}
	fclose(in);
}

int cli_tcp_connected(pid_t root, struct cli_tcp *out)
{
	struct inodes s = {0};
	pid_t *tree = NULL;
	ino_t *seen = NULL;
	size_t nseen = 0;
	int n = cuip_proc_tree(root, &tree), ret = 0;

	memset(out, 0, sizeof(*out));
	if (n < 0)
		return n;
	for (int i = 0; i < n && !ret; i++)
		ret = socket_inodes(tree[i], &s);
	seen = calloc(n ? (size_t)n : 1, sizeof(*seen));
	if (!ret && !seen)
		ret = -ENOMEM;
	/* one look at each network namespace of the tree */
	for (int i = 0; !ret && s.n && i < n; i++) {
		char ns[64];
		struct stat sb;
		bool dup = false;

		snprintf(ns, sizeof(ns), "/proc/%d/ns/net", tree[i]);
		if (stat(ns, &sb))
			continue;
		for (size_t k = 0; k < nseen && !dup; k++)
			dup = seen[k] == sb.st_ino;
		if (dup)
			continue;
		seen[nseen++] = sb.st_ino;
		scan_table(tree[i], "tcp", &s, out);
		scan_table(tree[i], "tcp6", &s, out);
	}
	free(seen);
	free(s.v);
	free(s.pid);
	free(tree);
	return ret;
}

/* Is an executable `name` in PATH? */
static bool in_path(const char *name)
{
	const char *path = getenv("PATH");
	char dirs[4096], f[PATH_MAX];

	snprintf(dirs, sizeof(dirs), "%s", path ? path : "/usr/bin:/bin");
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save))
		if (snprintf(f, sizeof(f), "%s/%s", *d ? d : ".", name) < (int)sizeof(f) && !access(f, X_OK))
			return true;
	return false;
}

/* `criu check --feature network_lock_nftables`, within 20 s: true when it
 * says criu was built with nftables. */
static bool criu_has_nftables(const char *criu)
{
	struct timespec ts = {0, 50 * 1000000L};
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return false;
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);

		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			dup2(null, STDERR_FILENO);
		}
		execl(criu, criu, "check", "--feature", "network_lock_nftables", (char *)NULL);
		_exit(127);
	}
	for (int waited = 0; waitpid(pid, &st, WNOHANG) == 0; waited += 50) {
		if (waited >= 20000) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return false;
		}
		nanosleep(&ts, NULL);
	}
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

const char *cli_network_lock(const char *criu, char *why, size_t len)
{
	if (in_path("iptables-restore") && in_path("ip6tables-restore")) {
		snprintf(why, len, "criu locks the network with iptables, its default");
		return "";
	}
	if (criu_has_nftables(criu)) {
		snprintf(why, len,
			 "iptables-restore or ip6tables-restore is not in PATH and criu was built with "
			 "nftables: it locks the network with nftables");
		return "nftables";
	}
	snprintf(why, len,
		 "warning: iptables-restore or ip6tables-restore is not in PATH and criu was built without "
		 "nftables: criu cannot lock the network and will fail; install iptables");
	return NULL;
}
