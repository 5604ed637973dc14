/*
 * pstreeread.c - `pstreeread FILE`: what cli/cli_pstree.c (the reader
 * `cuinterpose restore` uses, on protocol/pstree.c) reads from a pstree.img, for
 * test_pstree.sh and test_pstree_criu.sh. Prints "root R sid S entries N"
 * and "ids I..." (the pids and thread ids a restore recreates), exit 0; or
 * "pstreeread: FILE: ERROR[: WHY]", exit 1. Single-threaded, no state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int main(int argc, char **argv)
{
	struct cli_ptree *t;
	char why[256];
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: pstreeread FILE\n");
		return 2;
	}
	t = malloc(sizeof(*t));
	if (!t)
		return 1;
	r = cli_pstree_read(argv[1], t, why, sizeof(why));
	if (r) {
		fprintf(stderr, "pstreeread: %s: %s%s%s\n", argv[1], strerror(-r), *why ? ": " : "", why);
		free(t);
		return 1;
	}
	printf("root %d sid %d entries %zu\nids", (int)t->root, (int)t->root_sid, t->entries);
	for (size_t i = 0; i < t->n; i++)
		printf(" %d", (int)t->ids[i]);
	printf("\n");
	free(t);
	return 0;
}
