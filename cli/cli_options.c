/*
 * cli_options.c - `cuinterpose options [--all] [--check]`: the table of
 * CUINTERPOSE_* settings (protocol/settings.h) with what this environment
 * gives each.
 *
 * Default: every user setting, its value here (or "(unset)"), its
 * default, what it accepts, who reads it and its meaning; --all adds the
 * test hooks. --check validates this environment's values against the
 * table instead: exit 1 naming each bad variable and what it accepts, as
 * its reader would refuse it (settings.h), and a note on stderr for a CUINTERPOSE_* variable that no
 * part of cuinterpose reads (a typo?). Reads only the environment.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "settings.h"

int cli_options(int argc, char **argv); /* dispatched by cli.c */

extern char **environ;

static void usage(FILE *f)
{
	fprintf(f, "usage: cuinterpose options [--all] [--check]\n"
		   "  print the CUINTERPOSE_* settings: the value this environment gives each, its\n"
		   "  default, what it accepts, who reads it (job: the job's processes, plugin: criu's\n"
		   "  plugin, cli: this command) and its meaning\n"
		   "  --all    include the test hooks\n"
		   "  --check  validate this environment's values instead; exit 1 naming each bad one\n");
}

static void print_one(const struct cuip_setting *s)
{
	const char *v = getenv(s->name);
	char range[160], readers[32];

	cuip_setting_range(s, range, sizeof(range));
	cuip_setting_readers(s->readers, readers, sizeof(readers));
	if (!v)
		printf("%s (unset)", s->name);
	else if (!*v && s->type != CUIP_SETTING_FLAG)
		printf("%s= (empty: the default)", s->name);
	else
		printf("%s=%s", s->name, v);
	printf("  [%s%s]\n", readers, s->kind == CUIP_SETTING_HOOK ? ", test hook" : "");
	printf("    default %s; accepts %s\n", s->dflt, range);
	printf("    %s\n", s->meaning);
}

static int check_env(void)
{
	char err[512];
	size_t bad = 0;

	for (size_t i = 0; i < cuip_settings_count; i++) {
		const struct cuip_setting *s = &cuip_settings[i];

		if (cuip_setting_check(s, getenv(s->name), err, sizeof(err))) {
			printf("cuinterpose options: %s\n", err);
			bad++;
		}
	}
	for (char **e = environ; e && *e; e++) {
		char name[128];
		size_t n = strcspn(*e, "=");

		if (strncmp(*e, "CUINTERPOSE_", 12) || n >= sizeof(name))
			continue;
		memcpy(name, *e, n);
		name[n] = 0;
		if (!cuip_setting_find(name))
			fprintf(stderr, "cuinterpose options: note: %s is set but no part of cuinterpose reads it\n",
				name);
	}
	if (bad) {
		printf("cuinterpose options: %zu bad value%s\n", bad, bad == 1 ? "" : "s");
		return 1;
	}
	printf("cuinterpose options: every CUINTERPOSE_* value set here is valid (%zu settings known)\n",
	       cuip_settings_count);
	return 0;
}

int cli_options(int argc, char **argv)
{
	static const struct option opts[] = {{"all", no_argument, NULL, 'a'},
					     {"check", no_argument, NULL, 'c'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *arg;
	int all = 0, check = 0, c;

	cli_opt_start();
	while ((c = cli_opt_next(argc, argv, opts, &arg)) != -1) {
		switch (c) {
		case 'a':
			all = 1;
			break;
		case 'c':
			check = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default: /* a positional, an unknown option, or one after "--" */
			fprintf(stderr, "cuinterpose options: unknown argument '%s'\n", arg);
			usage(stderr);
			return 2;
		}
	}
	if (cli_opt_dashdash()) {
		fprintf(stderr, "cuinterpose options: unknown argument '--'\n");
		usage(stderr);
		return 2;
	}
	if (check)
		return check_env();
	for (size_t i = 0; i < cuip_settings_count; i++)
		if (all || cuip_settings[i].kind == CUIP_SETTING_USER)
			print_one(&cuip_settings[i]);
	return 0;
}
