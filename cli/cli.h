/*
 * cli.h - the `cuinterpose` command: one file per subcommand, dispatched
 * by cli.c (run), cli_inspect.c (inspect), cli_show.c (show), cli_check.c
 * (check), cli_criu.c (checkpoint, restore: a front end over criu);
 * cli_lib.c finds the interposer library for run and check;
 * cli_getopt.c runs every subcommand's option loop; cli_pstree.c reads
 * CRIU's pstree.img for restore.
 * Layers: cli.c calls the subcommands; show and check call inspect's and
 * cli_lib.c's helpers; all of them call only the libraries (protocol/ and
 * plugin/, through their public headers). Each subcommand returns the
 * process exit status, documented in cuinterpose.1: 0 ok, 1 a problem
 * was found, 2 usage; `show` adds 3 for a directory without cuinterpose
 * images. Single-threaded, no locks.
 */
#ifndef CUIP_CLI_H
#define CUIP_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "wire.h"

int cli_run(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_show(int argc, char **argv);
int cli_check(int argc, char **argv);
/* cli_criu.c: criu's exit status (124: killed past --timeout), 1, 2. */
int cli_checkpoint(int argc, char **argv);
int cli_restore(int argc, char **argv);
int cli_precopy(int argc, char **argv);

/* cli_tcp.c: the connected TCP sockets (ESTABLISHED and the states criu
 * dumps only with --tcp-established) that the tree of root holds: their
 * count, the process holding the first and its addresses. 0 or -errno. */
struct cli_tcp {
	int n;
	pid_t pid;
	char first[200];
};
int cli_tcp_connected(pid_t root, struct cli_tcp *out);
/* How criu can lock the network here: "" (its default, iptables),
 * "nftables" (--network-lock nftables), or NULL (neither); why says it. */
const char *cli_network_lock(const char *criu, char *why, size_t len);

/* cli_getopt.c: every subcommand's option loop (getopt_long, "-:h").
 * cli_opt_start() once, then cli_opt_next() until -1: 'h' (-h, and --help
 * when the table maps it to 'h'), a table's val, 1 for a positional
 * (optarg), ':' for a missing value (optopt: which option), '?' for an
 * unknown option; *arg is the argument as typed. After -1, argv[optind..]
 * is what followed "--". */
void cli_opt_start(void);
int cli_opt_next(int argc, char **argv, const struct option *longopts, const char **arg);
/* After -1: whether the loop stopped at "--" (a subcommand without
 * pass-through arguments refuses it as an unknown option). */
bool cli_opt_dashdash(void);

/* cli_pstree.c: CRIU's pstree.img at path (criu_pstree.proto). ids: the
 * pids and thread ids a restore recreates (the first 4096). 0, or -errno
 * with why saying what is wrong ("" when strerror says it all). */
struct cli_ptree {
	pid_t root, root_sid;
	pid_t ids[4096];
	size_t n, entries;
};
int cli_pstree_read(const char *path, struct cli_ptree *t, char *why, size_t len);

/* cli_lib.c: the interposer library `run` would preload; 0 or -ENOENT. */
int cli_find_lib(char *buf, size_t len);

/* cli_inspect.c, shared with show and check. */
int cli_find_socket(pid_t pid, char *path, size_t len);
int cli_connect_proc(pid_t pid, const char *path);
/* HANDSHAKE as client, INSPECT, BYE on connected socket s (closed in every
 * case), each reply within timeout_ms (0: no limit): 0 and the state in
 * *resp (free with cuip_client_free), or -errno and err. */
int cli_ask_state(int s, const char *client, unsigned timeout_ms, Cuip__Response **resp, char *err, size_t errlen);
void cli_print_state(const Cuip__ProcessState *st);
void cli_print_state_json(const Cuip__ProcessState *st);
void cli_jstr(const char *s);

#endif /* CUIP_CLI_H */
