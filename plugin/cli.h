/*
 * cli.h - the `cuinterpose` command: one file per subcommand, dispatched
 * by cli.c. Each returns the process exit status (0 ok, 1 failure, 2 usage).
 */
#ifndef CUIP_CLI_H
#define CUIP_CLI_H

int cli_run(int argc, char **argv);
int cli_inspect(int argc, char **argv);

#endif /* CUIP_CLI_H */
