/*
 * cli_precopy.c - `cuinterpose precopy PID DIR`: a live copy of the carried
 * device memory of the job whose tree PID roots, while it runs, into DIR as
 * a checkpoint that a later `criu dump` names as its parent
 * (CUINTERPOSE_PARENT=DIR): that dump then writes only the chunks that
 * changed since, so the job is frozen for those bytes only.
 *
 * Each process of the tree with a control socket is asked for its state
 * (INSPECT) and, when it created carried memory, for a SAVE marked live:
 * the interposer copies its allocations with their CRCs and SHA-256s into
 * the carrier file this command opened, the job running on (its record
 * lock is held meanwhile: allocation calls wait, kernels and copies do
 * not). The copy may be fuzzy; every chunk's checksums are those of the
 * bytes in the file. The images are the plugin's (images.c): inventory,
 * topologies and carriers, so `cuinterpose show DIR` verifies them.
 * Nothing of the job changes; a failure leaves DIR without an inventory.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "cli.h"
#include "client.h"
#include "errfmt.h"
#include "images.h"
#include "proc.h"
#include "settings.h"

#define PRECOPY_TIMEOUT_MS 600000 /* one process's copy; --timeout changes it */

struct part {
	pid_t pid;
	Cuip__Response *state; /* INSPECT */
	Cuip__Response *save;  /* SAVE (live); NULL: nothing carried */
	char file[64];
};

static void usage(FILE *f)
{
	fprintf(f, "usage: cuinterpose precopy [--timeout SECONDS] PID DIR\n"
		   "  copy the carried device memory of PID's tree, running, into DIR: a parent for\n"
		   "  CUINTERPOSE_PARENT=DIR criu dump ..., which then writes only what changed\n");
}

/* One process: its state, and its carried bytes when it created any. */
static int copy_one(struct part *p, int dirfd, uint32_t chunk, unsigned timeout_ms, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Save save = CUIP__SAVE__INIT;
	const Cuip__ProcessState *st;
	Cuip__AllocId **ids;
	char path[512], why[512];
	size_t n = 0;
	int s, fd, ret;

	if (cli_find_socket(p->pid, path, sizeof(path)))
		return 1; /* no interposer: not a participant */
	s = cli_connect_proc(p->pid, path);
	if (s < 0) {
		errfmt(err, errlen, "pid %d: cannot connect to %s: %s", p->pid, path, strerror(-s));
		return s;
	}
	ret = cuip_client_handshake(s, "cli", timeout_ms, NULL, why, sizeof(why));
	if (!ret) {
		req.body_case = CUIP__REQUEST__BODY_INSPECT;
		req.inspect = 1;
		ret = cuip_client_request(s, &req, -1, timeout_ms, &p->state, why, sizeof(why));
	}
	if (!ret && p->state->body_case != CUIP__RESPONSE__BODY_STATE) {
		snprintf(why, sizeof(why), "INSPECT reply carries no process state");
		ret = -EPROTO;
	}
	if (ret) {
		errfmt(err, errlen, "pid %d: %s", p->pid, why);
		close(s);
		return ret;
	}
	st = p->state->state;
	ids = calloc(st->n_allocations ? st->n_allocations : 1, sizeof(*ids));
	if (!ids) {
		close(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < st->n_allocations; i++)
		if (cuip_alloc_carried_by(st->allocations[i], st->self->id))
			ids[n++] = st->allocations[i]->id;
	ret = 0;
	if (n) {
		cuip_carrier_name(st->self->pid, p->file, sizeof(p->file));
		fd = openat(dirfd, p->file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd < 0) {
			ret = -errno;
			errfmt(err, errlen, "cannot create %s: %s", p->file, strerror(errno));
		} else {
			save.allocs = ids;
			save.n_allocs = n;
			save.file = p->file;
			save.chunk_size = chunk;
			save.has_live = 1;
			save.live = 1;
			req.body_case = CUIP__REQUEST__BODY_SAVE;
			req.save = &save;
			ret = cuip_client_requestv(s, &req, &fd, 1, timeout_ms, &p->save, why, sizeof(why));
			if (!ret && p->save->body_case != CUIP__RESPONSE__BODY_SAVE) {
				snprintf(why, sizeof(why), "SAVE reply carries no carrier index");
				ret = -EPROTO;
			}
			if (ret)
				errfmt(err, errlen, "pid %d: %s", p->pid, why);
			if (close(fd) && !ret) {
				ret = -errno;
				errfmt(err, errlen, "closing %s: %s", p->file, strerror(errno));
			}
		}
	}
	free(ids);
	cuip_client_bye(s, timeout_ms);
	close(s);
	return ret;
}

static int write_images(int dirfd, struct part *v, size_t n, char *err, size_t errlen)
{
	struct cuip_img_proc *ip = calloc(n ? n : 1, sizeof(*ip));
	uint8_t id[16];
	uint64_t bytes = 0;
	size_t k = 0;
	int ret;

	if (!ip)
		return -ENOMEM;
	if (getrandom(id, sizeof(id), 0) != sizeof(id))
		for (size_t i = 0; i < sizeof(id); i++)
			id[i] = (uint8_t)rand();
	for (size_t i = 0; i < n; i++) {
		if (!v[i].state)
			continue;
		ip[k].st = v[i].state->state;
		if (v[i].save) {
			ip[k].carriers = v[i].save->save->entries;
			ip[k].n_carriers = v[i].save->save->n_entries;
			bytes += v[i].save->save->bytes;
		}
		k++;
	}
	ret = cuip_images_write(dirfd, id, ip, k, bytes, NULL, err, errlen);
	free(ip);
	return ret;
}

int cli_precopy(int argc, char **argv)
{
	const char *dir = NULL;
	struct part *v = NULL;
	pid_t root = 0, *tree = NULL;
	unsigned timeout_ms = PRECOPY_TIMEOUT_MS;
	uint32_t chunk;
	char err[1024] = "", *end;
	size_t parts = 0, carried = 0;
	uint64_t bytes = 0;
	struct timespec t0, t1;
	struct stat sb;
	int n = 0, dirfd = -1, ret = 1, o;
	static const struct option opts[] = {
		{"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	const char *arg;

	cli_opt_start();
	while ((o = cli_opt_next(argc, argv, opts, &arg)) != -1) {
		long t = 0, p;

		switch (o) {
		case 'h':
			usage(stdout);
			return 0;
		case 't':
		case ':':
			if (o == 't')
				t = strtol(optarg, &end, 10);
			if (o == ':' || *end || t <= 0 || t > 86400) {
				fprintf(stderr,
					"cuinterpose precopy: --timeout needs a number of seconds (1 .. 86400), got "
					"%s%s%s\n",
					o == 't' ? "'" : "", o == 't' ? optarg : "nothing", o == 't' ? "'" : "");
				return 2;
			}
			timeout_ms = (unsigned)t * 1000;
			break;
		case 1:
			if (!root) {
				p = strtol(optarg, &end, 10);
				if (*end || p <= 0) {
					fprintf(stderr, "cuinterpose precopy: '%s' is not a PID\n", optarg);
					return 2;
				}
				root = (pid_t)p;
			} else if (!dir) {
				dir = optarg;
			} else {
				fprintf(stderr, "cuinterpose precopy: unexpected argument '%s'\n", optarg);
				return 2;
			}
			break;
		default:
			fprintf(stderr, "cuinterpose precopy: unknown option '%s'\n", arg);
			return 2;
		}
	}
	if (cli_opt_dashdash()) {
		fprintf(stderr, "cuinterpose precopy: unknown option '--'\n");
		return 2;
	}
	if (!root || !dir) {
		fprintf(stderr, "cuinterpose precopy: no %s given\n", root ? "DIR" : "PID");
		return 2;
	}
	/* The chunk size must be the dump's for its chunks to match. */
	{
		uint64_t c = 0;

		if (cuip_setting_number("CUINTERPOSE_TEST_CHUNK_SIZE", &c, err, sizeof(err)) < 0) {
			fprintf(stderr, "cuinterpose precopy: %s\n", err);
			return 2;
		}
		chunk = (uint32_t)c;
	}
	snprintf(err, sizeof(err), "/proc/%d", (int)root);
	n = stat(err, &sb) ? 0 : cuip_proc_tree(root, &tree);
	if (n <= 0) {
		fprintf(stderr, "cuinterpose precopy: no such process: %d\n", root);
		free(tree);
		return 1;
	}
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "cuinterpose precopy: cannot create %s: %s\n", dir, strerror(errno));
		goto out;
	}
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		fprintf(stderr, "cuinterpose precopy: %s: %s\n", dir, strerror(errno));
		goto out;
	}
	/* A checkpoint already there may be another's parent: never over it. */
	if (!fstatat(dirfd, CUIP_INVENTORY_IMG, &sb, 0)) {
		fprintf(stderr, "cuinterpose precopy: %s already holds a checkpoint (%s); use an empty directory\n",
			dir, CUIP_INVENTORY_IMG);
		goto out;
	}
	v = calloc((size_t)n, sizeof(*v));
	if (!v)
		goto out;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < n; i++) {
		int r;

		v[i].pid = tree[i];
		r = copy_one(&v[i], dirfd, chunk, timeout_ms, err, sizeof(err));
		if (r < 0) {
			fprintf(stderr, "cuinterpose precopy: %s\n", err);
			goto out;
		}
		if (r == 0) {
			parts++;
			if (v[i].save) {
				carried++;
				bytes += v[i].save->save->bytes;
			}
		}
	}
	if (!parts) {
		fprintf(stderr, "cuinterpose precopy: no process of pid %d's tree (%d processes) runs the interposer\n",
			root, n);
		goto out;
	}
	if (write_images(dirfd, v, (size_t)n, err, sizeof(err))) {
		fprintf(stderr, "cuinterpose precopy: %s\n", err);
		goto out;
	}
	/* Read back as a dump will read its parent: a copy it would refuse
	 * (a slab whose pieces changed between INSPECT and the copy) is no
	 * parent, and is removed. */
	{
		struct cuip_ckpt ck;

		if (cuip_images_read(dirfd, &ck, err, sizeof(err))) {
			fprintf(stderr, "cuinterpose precopy: the copy does not read back (%s); removed, try again\n",
				err);
			unlinkat(dirfd, CUIP_INVENTORY_IMG, 0);
			goto out;
		}
		cuip_images_free(&ck);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("pre-copied %" PRIu64 " bytes of %zu processes (%zu participants) into %s in %.3f s; dump with "
	       "CUINTERPOSE_PARENT=%s\n",
	       bytes, carried, parts, dir, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
	       dir);
	ret = 0;
out:
	for (int i = 0; v && i < n; i++) {
		cuip_client_free(v[i].state);
		cuip_client_free(v[i].save);
	}
	free(v);
	free(tree);
	if (dirfd >= 0)
		close(dirfd);
	return ret;
}
