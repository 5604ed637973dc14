/*
 * cli.c - `cuinterpose`: main, help, and `run`.
 *
 * `cuinterpose run -- CMD [ARGS]` puts libcuinterpose.so into LD_PRELOAD
 * (after whatever is already there, so an ASan runtime stays first) and
 * execs CMD in place: same PID, same environment otherwise. The library is
 * --lib PATH, else what cli_lib.c finds. The other subcommands live in
 * cli_<name>.c (see cli.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "cli.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: cuinterpose COMMAND [ARGS]\n"
		   "\n"
		   "commands:\n"
		   "  run [--lib PATH] [--] CMD [ARGS...]\n"
		   "        run CMD with the interposer preloaded (LD_PRELOAD); CMD keeps this PID\n"
		   "  inspect PID [--json] [--wait SECONDS]\n"
		   "        print every record the interposer in process PID tracks; --wait: wait up to\n"
		   "        SECONDS for PID's interposer to answer (a job just started)\n"
		   "  show DIR [--json] [--no-verify]\n"
		   "        decode and verify the cuinterpose images of a checkpoint in DIR\n"
		   "  check [--json] [--libdir DIR] [--criu PATH] [--criu-check] [--pid PID]... [--no-processes]\n"
		   "        diagnose CRIU, the plugin, the driver, socket directory and running jobs\n"
		   "        (--pid: only these processes; --no-processes: none)\n"
		   "  checkpoint [--libdir DIR] [--criu PATH] [--timeout SECONDS] PID DIR [-- CRIU-ARGS...]\n"
		   "        criu dump of PID's tree into DIR with the flags it needs, progress and summary\n"
		   "  restore [--libdir DIR] [--criu PATH] [--timeout SECONDS] [--reap] DIR [-- CRIU-ARGS...]\n"
		   "        criu restore from DIR, detached; prints the restored pid (--reap: stay its reaper)\n"
		   "  precopy [--timeout SECONDS] PID DIR\n"
		   "        copy the carried device memory of PID's running tree into DIR, a parent for\n"
		   "        CUINTERPOSE_PARENT=DIR criu dump (which then writes only what changed)\n"
		   "  options [--all] [--check]\n"
		   "        the CUINTERPOSE_* settings, their values here and defaults; --check validates them\n"
		   "  help, --help   this text\n"
		   "  --version      the version\n"
		   "\n"
		   "environment: CUINTERPOSE_LIB (library for run), CUINTERPOSE_SOCKET_DIR (control sockets,\n"
		   "default /run/cuinterpose), CUINTERPOSE_LOG (0 quiet, 1 errors, 2 info, 3 debug)\n"
		   "\n"
		   "exit status: 0 ok, 1 a problem was found, 2 usage error; see cuinterpose(1)\n");
}

static int preload_has(const char *list, const char *lib)
{
	const char *base = strrchr(lib, '/');

	base = base ? base + 1 : lib;
	return list && strstr(list, base) != NULL;
}

int cli_run(int argc, char **argv)
{
	char lib[PATH_MAX], *pre = NULL;
	const char *old = getenv("LD_PRELOAD");
	const char *asan = NULL;
	static const struct option opts[] = {
		{"lib", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	const char *arg;
	int i = -1, c, given = 0;

#ifdef CUIP_ASAN_RUNTIME
	asan = CUIP_ASAN_RUNTIME;
#endif
	/* The options end at CMD, or after "--": CMD's own are never read. */
	cli_opt_start();
	while (i < 0 && (c = cli_opt_next(argc, argv, opts, &arg)) != -1) {
		switch (c) {
		case 'l':
			snprintf(lib, sizeof(lib), "%s", optarg);
			given = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case ':':
			fprintf(stderr, "cuinterpose run: --lib needs a PATH\n");
			return 2;
		case 1:
			if (strcmp(optarg, "-")) {
				i = optind - 1; /* CMD */
				break;
			}
			/* fall through - "-" is no command */
		default:
			fprintf(stderr, "cuinterpose run: unknown option '%s' (put the command after --)\n", arg);
			return 2;
		}
	}
	if (i < 0)
		i = optind;
	if (i >= argc) {
		fprintf(stderr, "cuinterpose run: no command given\n");
		usage(stderr);
		return 2;
	}
	if (given ? access(lib, R_OK) != 0 : cli_find_lib(lib, sizeof(lib)) != 0) {
		fprintf(stderr, "cuinterpose run: libcuinterpose.so not found (%s); %s\n", lib,
			given ? "check the --lib path" : "set CUINTERPOSE_LIB or use --lib PATH");
		return 1;
	}
	if (!preload_has(old, lib)) {
		/* An ASan-built interposer needs the ASan runtime loaded first. */
		int need_asan = asan && *asan == '/' && !preload_has(old, "libasan.so");
		if (asprintf(&pre, "%s%s%s%s%s", need_asan ? asan : "", need_asan ? ":" : "", old && *old ? old : "",
			     old && *old ? ":" : "", lib) < 0)
			return 1;
		setenv("LD_PRELOAD", pre, 1);
		free(pre);
	}
	execvp(argv[i], &argv[i]);
	fprintf(stderr, "cuinterpose run: cannot execute %s: %s\n", argv[i], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

int cli_options(int argc, char **argv); /* cli_options.c */

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "run"))
		return cli_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "inspect"))
		return cli_inspect(argc - 1, argv + 1);
	if (!strcmp(argv[1], "show"))
		return cli_show(argc - 1, argv + 1);
	if (!strcmp(argv[1], "check"))
		return cli_check(argc - 1, argv + 1);
	if (!strcmp(argv[1], "checkpoint"))
		return cli_checkpoint(argc - 1, argv + 1);
	if (!strcmp(argv[1], "restore"))
		return cli_restore(argc - 1, argv + 1);
	if (!strcmp(argv[1], "precopy"))
		return cli_precopy(argc - 1, argv + 1);
	if (!strcmp(argv[1], "options"))
		return cli_options(argc - 1, argv + 1);
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("cuinterpose %s\n", PACKAGE_VERSION);
		return 0;
	}
	fprintf(stderr,
		"cuinterpose: unknown %s '%s' (commands: run, inspect, show, check, checkpoint, restore, help)\n",
		argv[1][0] == '-' ? "option" : "command", argv[1]);
	usage(stderr);
	return 2;
}
