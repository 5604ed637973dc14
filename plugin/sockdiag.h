/*
 * sockdiag.h - finding and connecting to a participant's control socket.
 *
 * The interposer listens on "<dir>/<pid>-<16 hex id>.sock", a path valid in
 * the participant's mount namespace, where <pid> is the pid the participant
 * sees for itself. Discovery does not trust a path guessed from outside:
 * it asks the kernel (netlink sock_diag, UNIX_DIAG with UDIAG_SHOW_NAME,
 * through libnl) for the listening unix sockets of the participant's
 * network namespace, keeps those whose inode is one of the participant's
 * open descriptors and whose name has the interposer's form, and connects
 * through /proc/PID/root so that mount namespaces do not matter. The peer's
 * SO_PEERCRED pid must be the participant. Stateless.
 */
#ifndef CUIP_PLUGIN_SOCKDIAG_H
#define CUIP_PLUGIN_SOCKDIAG_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One listening unix socket of a network namespace. */
struct cuip_unix_sk {
	unsigned long ino;
	char name[PATH_MAX]; /* bound path; empty for abstract/unnamed */
};

/* All listening, path-bound unix sockets visible in pid's network namespace.
 * Uses sock_diag, falls back to /proc/PID/net/unix. Returns count or -errno. */
int cuip_unix_listeners(pid_t pid, struct cuip_unix_sk **out, char *err, size_t errlen);

/* Parse "<vpid>-<16 hex>.sock" from a path's basename. Returns 0 or -EINVAL. */
int cuip_sock_name_parse(const char *path, pid_t *vpid, uint64_t *id);

/* The participant's control socket path (inside its mount namespace). */
int cuip_find_control_socket(pid_t pid, pid_t vpid, char *path, size_t len, char *err, size_t errlen);

/*
 * Connect to `path` (inside pid's mount namespace) through /proc/PID/root.
 * If expect_pid > 0 the peer's SO_PEERCRED pid must equal it. The socket
 * gets send/receive timeouts of timeout_ms (0 = none). Returns fd or -errno.
 */
int cuip_connect_control(pid_t pid, const char *path, pid_t expect_pid, unsigned timeout_ms, char *err, size_t errlen);

#endif /* CUIP_PLUGIN_SOCKDIAG_H */
