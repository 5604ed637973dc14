/*
 * cli_pstree.c - CRIU's pstree.img, read for `cuinterpose restore`
 * (cli_criu.c: which ids the restore recreates, whether the root led its
 * session) and by test/cli/pstreeread.c, through the protocol library's
 * reader (protocol/pstree.h), which checks the image and says what is
 * wrong with it. Stateless; the caller owns the result.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "cli.h"
#include "pstree.h"

static void add_id(struct cli_ptree *t, pid_t id)
{
	if (t->n < sizeof(t->ids) / sizeof(t->ids[0]))
		t->ids[t->n++] = id;
}

int cli_pstree_read(const char *path, struct cli_ptree *t, char *why, size_t len)
{
	struct cuip_pstree pt;
	int ret;

	memset(t, 0, sizeof(*t));
	ret = cuip_pstree_read(AT_FDCWD, path, &pt, why, len);
	if (ret)
		return ret;
	t->root = pt.t[0].pid;
	t->root_sid = pt.t[0].sid;
	t->entries = pt.n;
	for (size_t i = 0; i < pt.n; i++) {
		add_id(t, pt.t[i].pid);
		for (size_t k = 0; k < pt.t[i].n_threads; k++)
			if (pt.t[i].threads[k] != pt.t[i].pid)
				add_id(t, pt.t[i].threads[k]);
	}
	cuip_pstree_free(&pt);
	return 0;
}
