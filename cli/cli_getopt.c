/*
 * cli_getopt.c - the one option loop every subcommand's parser runs
 * (cli.c run, cli_inspect.c, cli_show.c, cli_check.c, cli_criu.c,
 * cli_precopy.c, cli_options.c): getopt_long with the subcommand's table of
 * long options and "-:h", so that
 *   - arguments come back in the order given (positionals as 1 with
 *     optarg), whatever POSIXLY_CORRECT says, and options may follow them;
 *   - "--" ends the options: what follows is argv[optind..], untouched
 *     (checkpoint and restore pass it to criu, run executes it);
 *   - a missing value is ':' (optopt: the option's val) and an unknown
 *     option '?', getopt itself printing nothing: each parser says what is
 *     wrong in its own words, naming the argument as it was typed (*arg).
 * State: getopt's globals (optind, optarg, optopt) and dashdash, one parse
 * per process;
 * single-threaded.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "cli.h"

void cli_opt_start(void)
{
	optind = 0; /* glibc: start over, reading the option string again */
	opterr = 0;
}

static bool dashdash; /* the last parse ended at "--" */

int cli_opt_next(int argc, char **argv, const struct option *longopts, const char **arg)
{
	int i = optind < 1 ? 1 : optind, c;

	/* In order and never in the middle of "-xy" (every parser stops at
	 * its first '?'), the argument getopt reads next is argv[optind]. */
	*arg = i < argc ? argv[i] : "";
	c = getopt_long(argc, argv, "-:h", longopts, NULL);
	dashdash = c == -1 && !strcmp(*arg, "--");
	return c;
}

bool cli_opt_dashdash(void)
{
	return dashdash;
}
