/*
 * cli.h - the `cuinterpose` command: one file per subcommand, dispatched
 * by cli.c (run), cli_inspect.c (inspect), cli_show.c (show), cli_check.c
 * (check). Each returns the process exit status, documented in
 * cuinterpose.1: 0 ok, 1 a problem was found, 2 usage; `show` adds 3 for a
 * directory without cuinterpose images. Single-threaded, no locks.
 */
#ifndef CUIP_CLI_H
#define CUIP_CLI_H

#include <stddef.h>
#include <sys/types.h>

#include "wire.h"

int cli_run(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_show(int argc, char **argv);
int cli_check(int argc, char **argv);

/* cli.c: the interposer library `run` would preload; 0 or -ENOENT. */
int cli_find_lib(char *buf, size_t len);

/* cli_inspect.c, shared with show and check. */
int cli_find_socket(pid_t pid, char *path, size_t len);
int cli_connect_proc(pid_t pid, const char *path);
const char *cli_phase_name(int p);
void cli_print_state(const Cuip__ProcessState *st);
void cli_print_state_json(const Cuip__ProcessState *st);
void cli_jstr(const char *s);

#endif /* CUIP_CLI_H */
