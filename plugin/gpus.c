/*
 * gpus.c - the GPUs of the images and of this machine, and the pairs a
 * restore onto other GPUs needs (gpus.h). Stateless; the machine's GPUs
 * are asked of the driver in a child process that exits right after.
 */
#include "gpus.h"

#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "settings.h"

#define ASK_TIMEOUT_MS 20000 /* cuInit on a machine with 8 GPUs takes seconds */

static void add_gpu(struct cuip_gpu *v, size_t *n, size_t max, int ordinal, const uint8_t *uuid, const char *name)
{
	size_t i;

	for (i = 0; i < *n; i++)
		if (!memcmp(v[i].uuid, uuid, 16))
			return;
	if (*n == max)
		return;
	/* keep ordinal order: insertion */
	for (i = *n; i > 0 && v[i - 1].ordinal > ordinal; i--)
		v[i] = v[i - 1];
	memset(&v[i], 0, sizeof(v[i]));
	v[i].ordinal = ordinal;
	memcpy(v[i].uuid, uuid, 16);
	snprintf(v[i].name, sizeof(v[i].name), "%s", name ? name : "");
	(*n)++;
}

size_t cuip_gpus_of_images(const struct cuip_ckpt *c, struct cuip_gpu *v, size_t max)
{
	size_t n = 0;

	for (size_t p = 0; p < c->n; p++) {
		const Cuip__ProcessState *st = c->topo[p]->state;

		for (size_t d = 0; st && d < st->n_devices; d++)
			if (st->devices[d]->uuid.len == 16)
				add_gpu(v, &n, max, st->devices[d]->ordinal, st->devices[d]->uuid.data,
					st->devices[d]->name);
	}
	return n;
}

/* ---- this machine ---- */

struct answer {
	int cu; /* 0, or the CUresult of the call that failed */
	char call[32];
	int n;
	struct cuip_gpu gpu[CUIP_MAX_GPUS];
};

static void ask_driver(const char *lib, struct answer *a)
{
	CUresult (*init)(unsigned), (*count)(int *), (*get)(CUdevice *, int), (*uuid)(CUuuid *, CUdevice),
		(*name)(char *, int, CUdevice);
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	int n = 0;

	memset(a, 0, sizeof(*a));
	if (!h) {
		a->cu = -1;
		snprintf(a->call, sizeof(a->call), "dlopen");
		return;
	}
	*(void **)&init = dlsym(h, "cuInit");
	*(void **)&count = dlsym(h, "cuDeviceGetCount");
	*(void **)&get = dlsym(h, "cuDeviceGet");
	*(void **)&uuid = dlsym(h, "cuDeviceGetUuid_v2");
	if (!uuid)
		*(void **)&uuid = dlsym(h, "cuDeviceGetUuid");
	*(void **)&name = dlsym(h, "cuDeviceGetName");
#define CALL(what, expr)                                                  \
	do {                                                              \
		CUresult r_ = (expr);                                     \
		if (r_ != CUDA_SUCCESS) {                                 \
			a->cu = (int)r_;                                  \
			snprintf(a->call, sizeof(a->call), "%s", (what)); \
			return;                                           \
		}                                                         \
	} while (0)
	if (!init || !count || !get || !uuid) {
		a->cu = -1;
		snprintf(a->call, sizeof(a->call), "dlsym");
		return;
	}
	CALL("cuInit", init(0));
	CALL("cuDeviceGetCount", count(&n));
	for (int i = 0; i < n && i < CUIP_MAX_GPUS; i++) {
		CUdevice d;
		CUuuid u;

		CALL("cuDeviceGet", get(&d, i));
		CALL("cuDeviceGetUuid", uuid(&u, d));
		a->gpu[i].ordinal = i;
		memcpy(a->gpu[i].uuid, u.bytes, 16);
		if (!name || name(a->gpu[i].name, (int)sizeof(a->gpu[i].name), d) != CUDA_SUCCESS)
			a->gpu[i].name[0] = 0;
		a->gpu[i].name[sizeof(a->gpu[i].name) - 1] = 0;
		a->n = i + 1;
	}
#undef CALL
}

static int read_answer(int fd, pid_t child, struct answer *a, char *err, size_t errlen)
{
	size_t got = 0;

	while (got < sizeof(*a)) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t k;
		int r = poll(&p, 1, ASK_TIMEOUT_MS);

		if (r == 0) {
			snprintf(err, errlen, "the driver did not list the GPUs within %d ms (pid %d killed)",
				 ASK_TIMEOUT_MS, (int)child);
			return -ETIMEDOUT;
		}
		if (r < 0 && errno == EINTR)
			continue;
		k = r < 0 ? -1 : read(fd, (char *)a + got, sizeof(*a) - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			snprintf(err, errlen, "the process listing the GPUs died before it answered");
			return -EPIPE;
		}
		got += (size_t)k;
	}
	return 0;
}

int cuip_gpus_present(const char *lib, struct cuip_gpu *v, size_t max, char *err, size_t errlen)
{
	struct answer *a = calloc(1, sizeof(*a));
	int pfd[2], ret, st;
	pid_t child;

	if (!a) {
		snprintf(err, errlen, "out of memory asking the driver for this machine's GPUs");
		return -ENOMEM;
	}
	if (pipe2(pfd, O_CLOEXEC)) {
		ret = -errno;
		snprintf(err, errlen, "cannot create a pipe to ask the driver for this machine's GPUs: %s",
			 strerror(errno));
		free(a);
		return ret;
	}
	child = fork();
	if (child < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot fork a child to ask the driver for this machine's GPUs: %s",
			 strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		free(a);
		return ret;
	}
	if (child == 0) {
		size_t off = 0;

		close(pfd[0]);
		ask_driver(lib, a);
		while (off < sizeof(*a)) {
			ssize_t k = write(pfd[1], (char *)a + off, sizeof(*a) - off);
			if (k <= 0)
				_exit(1);
			off += (size_t)k;
		}
		_exit(0);
	}
	close(pfd[1]);
	ret = read_answer(pfd[0], child, a, err, errlen);
	close(pfd[0]);
	if (ret)
		kill(child, SIGKILL);
	while (waitpid(child, &st, 0) < 0 && errno == EINTR)
		;
	if (!ret && a->cu) {
		if (a->cu < 0)
			snprintf(err, errlen, "cannot load %s (%s) to list this machine's GPUs", lib, a->call);
		else
			snprintf(err, errlen, "%s failed (CUresult %d) listing this machine's GPUs", a->call, a->cu);
		ret = -EIO;
	}
	if (!ret) {
		ret = a->n < (int)max ? a->n : (int)max;
		memcpy(v, a->gpu, (size_t)ret * sizeof(*v));
	}
	free(a);
	return ret;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

int cuip_gpus_listed(const char *dir, struct cuip_gpu *v, size_t max)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, by_name), k = 0;

	for (int i = 0; i < n; i++) {
		char path[PATH_MAX], line[256];
		bool have_uuid = false;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s/information", dir, ents[i]->d_name);
		f = ents[i]->d_name[0] != '.' && (size_t)k < max ? fopen(path, "re") : NULL;
		if (f) {
			memset(&v[k], 0, sizeof(v[k]));
			v[k].ordinal = k;
			while (fgets(line, sizeof(line), f)) {
				char *val = strchr(line, ':');

				if (!val)
					continue;
				*val++ = 0;
				val += strspn(val, " \t");
				val[strcspn(val, "\n")] = 0;
				if (!strcmp(line, "Model"))
					snprintf(v[k].name, sizeof(v[k].name), "%s", val);
				else if (!strcmp(line, "GPU UUID"))
					have_uuid = !cuip_parse_uuid(val, strlen(val), v[k].uuid);
			}
			fclose(f);
			k += have_uuid;
		}
		free(ents[i]);
	}
	if (n > 0)
		free(ents);
	return k;
}

/* ---- the plan ---- */

static bool here_has(const struct cuip_gpu *here, size_t n, const uint8_t *uuid)
{
	for (size_t i = 0; i < n; i++)
		if (!memcmp(here[i].uuid, uuid, 16))
			return true;
	return false;
}

static const struct cuip_gpu_pair *pair_of(const struct cuip_gpu_pair *p, unsigned n, const uint8_t *old)
{
	for (unsigned i = 0; i < n; i++)
		if (!memcmp(p[i].old_uuid, old, 16))
			return &p[i];
	return NULL;
}

/* "0 GPU-... (NAME), 1 GPU-..." into buf. */
static void list(const struct cuip_gpu *v, size_t n, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = 0;
	for (size_t i = 0; i < n && o < len; i++) {
		char u[48];

		cuip_format_uuid(v[i].uuid, u, sizeof(u));
		o += (size_t)snprintf(buf + o, len - o, "%s%d %s%s%s%s", i ? ", " : "", v[i].ordinal, u,
				      v[i].name[0] ? " (" : "", v[i].name, v[i].name[0] ? ")" : "");
	}
	if (!n)
		snprintf(buf, len, "none");
}

/* Image GPU i onto machine GPU i, for every i: what `auto` does, and what
 * the refusal suggests. Needs the same count; `why` says what differs. */
static bool by_ordinal(const struct cuip_gpu *img, size_t n_img, const struct cuip_gpu *here, size_t n_here, char *why,
		       size_t len)
{
	if (n_img != n_here) {
		snprintf(why, len, "the images saw %zu GPU(s), this machine has %zu", n_img, n_here);
		return false;
	}
	for (size_t i = 0; i < n_img; i++) {
		if (strcmp(img[i].name, here[i].name)) {
			snprintf(why, len, "GPU %d of the images is a %s, GPU %d here a %s", img[i].ordinal,
				 img[i].name[0] ? img[i].name : "(unknown model)", here[i].ordinal,
				 here[i].name[0] ? here[i].name : "(unknown model)");
			return false;
		}
	}
	return true;
}

static void suggest(const struct cuip_gpu *img, const struct cuip_gpu *here, size_t n, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = 0;
	for (size_t i = 0; i < n && o < len; i++) {
		char a[48], b[48];

		cuip_format_uuid(img[i].uuid, a, sizeof(a));
		cuip_format_uuid(here[i].uuid, b, sizeof(b));
		o += (size_t)snprintf(buf + o, len - o, "%s%s=%s", i ? "," : "", a, b);
	}
}

int cuip_gpus_plan(const struct cuip_gpu *img, size_t n_img, const struct cuip_gpu *here, size_t n_here, bool auto_,
		   struct cuip_gpu_pair *pairs, unsigned *n_pairs, unsigned max, char *err, size_t errlen)
{
	char li[1024], lh[1024], reason[256] = "", sug[2048];
	size_t missing = 0, present = 0;
	bool ord;

	for (unsigned i = 0; i < *n_pairs; i++) {
		if (!here_has(here, n_here, pairs[i].new_uuid)) {
			char u[48];

			cuip_format_uuid(pairs[i].new_uuid, u, sizeof(u));
			list(here, n_here, lh, sizeof(lh));
			snprintf(err, errlen,
				 "CUINTERPOSE_GPU_REMAP maps a GPU onto %s, which this machine does not have (it has "
				 "%s)",
				 u, lh);
			return -ENODEV;
		}
	}
	for (size_t i = 0; i < n_img; i++) {
		if (here_has(here, n_here, img[i].uuid))
			present++;
		else if (!pair_of(pairs, *n_pairs, img[i].uuid))
			missing++;
	}
	if (!missing)
		return 0;
	list(img, n_img, li, sizeof(li));
	list(here, n_here, lh, sizeof(lh));
	ord = by_ordinal(img, n_img, here, n_here, reason, sizeof(reason));
	if (auto_ && ord && !present && !*n_pairs && n_img <= max) {
		for (size_t i = 0; i < n_img; i++) {
			memcpy(pairs[i].old_uuid, img[i].uuid, 16);
			memcpy(pairs[i].new_uuid, here[i].uuid, 16);
		}
		*n_pairs = (unsigned)n_img;
		return 0;
	}
	if (!ord) {
		snprintf(err, errlen,
			 "the images were made on GPU(s) %s; this machine has %s; %zu of the images' GPUs %s neither "
			 "here "
			 "nor paired, and no pairing is clear (%s): set CUINTERPOSE_GPU_REMAP=OLDUUID=NEWUUID,... for "
			 "each",
			 li, lh, missing, missing == 1 ? "is" : "are", reason);
		return -ENODEV;
	}
	suggest(img, here, n_img, sug, sizeof(sug));
	snprintf(err, errlen,
		 "the images were made on GPU(s) %s; this machine has %s; %zu of the images' GPUs %s neither here nor "
		 "paired%s: restore with CUINTERPOSE_GPU_REMAP=%s%s",
		 li, lh, missing, missing == 1 ? "is" : "are",
		 !auto_	   ? ""
		 : present ? " (auto pairs only when no GPU of the images is here)"
			   : " (auto does not combine with explicit pairs)",
		 sug, auto_ ? "" : " (or =auto)");
	return -ENODEV;
}
