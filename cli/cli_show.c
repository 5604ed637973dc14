/*
 * cli_show.c - `cuinterpose show DIR [--json] [--no-verify]`: decode the
 * cuinterpose images of a checkpoint the way `crit` decodes CRIU's, and
 * verify them.
 *
 * Prints the inventory, every participant's topology image (the records
 * `inspect` shows for a live process) and its carrier index (file, offset,
 * size, chunk size and count), then re-reads every carrier chunk and
 * recomputes its CRC32C. Every problem is reported with the file, the
 * allocation and the chunk, and makes the exit status 1; the plugin's own
 * restore-time validation (protocol/images.c) runs as well, so `show` refuses
 * exactly what `criu restore` would. A damaged inventory does not stop the
 * decoding: the topology images found in DIR are shown anyway.
 *
 * Called from cli.c's main; single-threaded, no locks.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "images.h"
#include "zchunk.h"

/* Corrupt chunks listed per carrier entry before "... and N more". */
#define SHOW_MAX_BAD 8

struct show {
	int json;
	int verify;
	int dirfd;
	char **problems;
	size_t n_problems;
	size_t n_lost; /* problems found but not described: out of memory */
	uint64_t chunks_checked;
	uint64_t bytes_checked;
	size_t shown; /* topology images printed (JSON commas) */
	/* The topology shown is flattened onto its parent chain (its files may
	 * be the ancestors', by a path from this directory); or its parent chain could not
	 * be read, and its inherited chunks are not checked. */
	bool flat, no_parent;
};

static void problem(struct show *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void problem(struct show *s, const char *fmt, ...)
{
	char **nv, *msg = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	va_end(ap);
	nv = realloc(s->problems, (s->n_problems + 1) * sizeof(*nv));
	if (!nv || !msg) {
		/* Still counted: the verdict must not read OK. */
		free(msg);
		s->n_lost++;
		fprintf(stderr, "cuinterpose show: out of memory describing a problem\n");
		return;
	}
	s->problems = nv;
	s->problems[s->n_problems++] = msg;
	if (!s->json)
		printf("  PROBLEM: %s\n", msg);
}

static void hex(const uint8_t *b, size_t n, char *out, size_t outlen)
{
	size_t o = 0;

	out[0] = 0;
	for (size_t i = 0; i < n && o + 3 <= outlen; i++)
		o += (size_t)snprintf(out + o, outlen - o, "%02x", b[i]);
}

static void when(uint64_t ns, char *out, size_t len)
{
	time_t t = (time_t)(ns / 1000000000ull);
	struct tm tm;

	if (!ns || !gmtime_r(&t, &tm) || !strftime(out, len, "%Y-%m-%d %H:%M:%S UTC", &tm))
		snprintf(out, len, "unknown");
}

/*
 * Verify one carrier entry chunk by chunk. Returns the number of corrupt
 * chunks (-1 when the file cannot be read); fills bad[] with up to
 * SHOW_MAX_BAD chunk numbers. Truncation is reported as a problem here.
 */
static long verify_entry(struct show *s, const Cuip__Topology *t, const Cuip__CarrierEntry *e, uint64_t *bad)
{
	const char *file = NULL, *f;
	uint8_t *buf;
	long nbad = 0;
	int fd = -1;

	if (!e->chunk_size || !e->file || strchr(e->file, '/'))
		return -1; /* already reported by the index checks */
	/* A compressed chunk's frame goes behind the chunk (less than it). */
	buf = malloc((size_t)e->chunk_size * (e->n_stored ? 2 : 1));
	if (!buf) {
		/* Not verified is not verified good. */
		problem(s, "allocation %016" PRIx64 ":%" PRIu64 ": not verified: out of memory for a %u-byte chunk",
			e->alloc->creator, e->alloc->serial, e->chunk_size);
		return -1;
	}
	for (size_t ch = 0; ch < e->n_crc32c; ch++) {
		uint64_t off = (uint64_t)ch * e->chunk_size, foff, run, got;
		size_t len;
		uint32_t crc;
		int ret;
		bool frame, undecodable;

		if (off >= e->size)
			break;
		len = (size_t)(e->size - off < e->chunk_size ? e->size - off : e->chunk_size);
		if (s->no_parent && e->has_inherited && ch / 8 < e->inherited.len &&
		    (e->inherited.data[ch / 8] >> (ch % 8)) & 1)
			continue;
		/* Striped entries: the chunk's extent names its file. */
		if (cuip_entry_locate(t, e, off, &f, &foff, &run) || !f || (strchr(f, '/') && !s->flat) || run < len) {
			problem(s, "allocation %016" PRIx64 ":%" PRIu64 ": chunk %zu lies in no extent of the index",
				e->alloc->creator, e->alloc->serial, ch);
			nbad = -1;
			break;
		}
		if (!file || strcmp(file, f)) {
			if (fd >= 0)
				close(fd);
			file = f;
			/* Not waiting in open for a FIFO's writer (in a carrier's
			 * place; its read then fails, ESPIPE, and is named). */
			fd = openat(s->dirfd, f, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
			if (fd < 0) {
				problem(s, "%s: %s (allocation %016" PRIx64 ":%" PRIu64 " chunk %zu)", f,
					errno == ENOENT ? "missing" : strerror(errno), e->alloc->creator,
					e->alloc->serial, ch);
				nbad = -1;
				break;
			}
		}
		frame = ch < e->n_stored && e->stored[ch];
		ret = cuip_zchunk_read(fd, foff, len, frame ? e->stored[ch] : 0, buf, buf + e->chunk_size, NULL, &got);
		undecodable = ret == -EBADMSG;
		if (ret && !undecodable && ret != -ENODATA) {
			problem(s, "%s: allocation %016" PRIx64 ":%" PRIu64 " chunk %zu cannot be read: %s", f,
				e->alloc->creator, e->alloc->serial, ch, strerror(-ret));
			nbad = -1;
			break;
		}
		if (ret == -ENODATA) {
			problem(s,
				"%s: truncated: allocation %016" PRIx64 ":%" PRIu64 " chunk %zu (bytes %" PRIu64
				"..%" PRIu64 ") is not there; the dump did not complete or the file was cut",
				f, e->alloc->creator, e->alloc->serial, ch, foff, foff + (frame ? e->stored[ch] : len));
			nbad = nbad ? nbad : 1;
			break;
		}
		crc = undecodable ? 0 : cuip_crc32c(0, buf, len);
		s->chunks_checked++;
		s->bytes_checked += len;
		if (undecodable || crc != e->crc32c[ch]) {
			if (nbad < SHOW_MAX_BAD && undecodable) {
				bad[nbad] = ch;
				problem(s,
					"%s: corrupt: allocation %016" PRIx64 ":%" PRIu64 " chunk %zu (bytes %" PRIu64
					"..%" PRIu64 "): its zstd frame does not decompress to the chunk's %zu bytes",
					f, e->alloc->creator, e->alloc->serial, ch, foff, foff + e->stored[ch], len);
			} else if (nbad < SHOW_MAX_BAD) {
				bad[nbad] = ch;
				problem(s,
					"%s: corrupt: allocation %016" PRIx64 ":%" PRIu64 " chunk %zu (bytes %" PRIu64
					"..%" PRIu64 "): crc32c %08x, index says %08x",
					f, e->alloc->creator, e->alloc->serial, ch, foff,
					foff + (frame ? e->stored[ch] : len), crc, e->crc32c[ch]);
			}
			nbad++;
		}
	}
	if (nbad > SHOW_MAX_BAD)
		problem(s, "%s: allocation %016" PRIx64 ":%" PRIu64 ": %ld more corrupt chunks", e->file,
			e->alloc->creator, e->alloc->serial, nbad - SHOW_MAX_BAD);
	free(buf);
	if (fd >= 0)
		close(fd);
	return nbad;
}

static void show_carriers(struct show *s, const Cuip__Topology *t)
{
	if (!s->json)
		printf("carriers (%zu):\n", t->n_carriers);
	if (!s->json && t->n_carrier_files) {
		printf("  striped over %zu files:", t->n_carrier_files);
		for (size_t k = 0; k < t->n_carrier_files; k++)
			printf(" %s", t->carrier_files[k]);
		printf("\n");
	}
	for (size_t i = 0; i < t->n_carriers; i++) {
		const Cuip__CarrierEntry *e = t->carriers[i];
		uint64_t chunks = e->chunk_size ? (e->size + e->chunk_size - 1) / e->chunk_size : 0;
		uint64_t bad[SHOW_MAX_BAD], inh = 0, zchunks = 0, zstored = 0, zraw = 0;
		long nbad = 0;
		const char *verdict = "not verified";
		char err[512];

		for (size_t k = 0; e->has_inherited && k < e->inherited.len; k++)
			inh += (uint64_t)__builtin_popcount(e->inherited.data[k]);
		for (size_t k = 0; k < e->n_stored && k < chunks; k++)
			if (e->stored[k]) {
				zchunks++;
				zstored += e->stored[k];
				zraw += e->size - k * (uint64_t)e->chunk_size < e->chunk_size
						? e->size - k * (uint64_t)e->chunk_size
						: e->chunk_size;
			}

		if (!e->alloc) {
			problem(s, "carrier entry %zu names no allocation", i);
			continue;
		}
		if (cuip_entry_check_stored("topology", e, i, err, sizeof(err))) {
			problem(s, "%s", err);
			verdict = "UNREADABLE";
		} else if (s->verify) {
			nbad = verify_entry(s, t, e, bad);
			verdict = nbad == 0 ? "OK" : nbad < 0 ? "UNREADABLE" : "CORRUPT";
		}
		if (s->json) {
			printf("%s{\"alloc\":\"%016" PRIx64 ":%" PRIu64 "\",\"file\":", i ? "," : "", e->alloc->creator,
			       e->alloc->serial);
			cli_jstr(e->file);
			printf(",\"offset\":%" PRIu64 ",\"size\":%" PRIu64 ",\"chunk_size\":%u,\"chunks\":%" PRIu64
			       ",\"checksums\":%zu,\"verified\":%s,\"status\":\"%s\",\"corrupt_chunks\":[",
			       e->offset, e->size, e->chunk_size, chunks, e->n_crc32c, s->verify ? "true" : "false",
			       verdict);
			for (long k = 0; k < nbad && k < SHOW_MAX_BAD; k++)
				printf("%s%" PRIu64, k ? "," : "", bad[k]);
			printf("]");
			if (e->has_alloc_offset)
				printf(",\"piece_offset\":%" PRIu64, e->alloc_offset);
			printf(",\"hashed\":%s,\"inherited_chunks\":%" PRIu64,
			       e->has_sha256 || e->has_dhash ? "true" : "false", inh);
			printf(",\"compressed_chunks\":%" PRIu64 ",\"compressed_bytes\":%" PRIu64
			       ",\"compressed_stored\":%" PRIu64,
			       zchunks, zraw, zstored);
			if (e->n_extents) {
				printf(",\"extents\":[");
				for (size_t k = 0; k < e->n_extents; k++)
					printf("%s{\"file\":%u,\"offset\":%" PRIu64 ",\"size\":%" PRIu64 "}",
					       k ? "," : "", e->extents[k]->file, e->extents[k]->offset,
					       e->extents[k]->size);
				printf("]");
			}
			printf("}");
		} else {
			printf("  %016" PRIx64 ":%" PRIu64, e->alloc->creator, e->alloc->serial);
			if (e->has_alloc_offset)
				printf(" piece +%#" PRIx64, e->alloc_offset);
			printf("  %s  offset %" PRIu64 "  size %" PRIu64 "  chunks %" PRIu64
			       " x %u  checksums %zu  %s\n",
			       e->file, e->offset, e->size, chunks, e->chunk_size, e->n_crc32c, verdict);
			if (inh)
				printf("    %" PRIu64 " of %" PRIu64 " chunks inherited from the parent checkpoint\n",
				       inh, chunks);
			if (zchunks)
				printf("    %" PRIu64 " of %" PRIu64 " chunks stored compressed (zstd): %" PRIu64
				       " bytes in %" PRIu64 "\n",
				       zchunks, chunks, zraw, zstored);
			if (e->n_extents > 1 || (e->n_extents == 1 && e->extents[0]->file))
				printf("    striped: %zu extents over %zu files\n", e->n_extents, t->n_carrier_files);
		}
	}
}

/* The parent chain of an incremental checkpoint, read whole; a problem
 * (and false) when it cannot be: its inherited chunks are then unreadable. */
static bool read_parent(struct show *s, const Cuip__Inventory *inv, struct cuip_ckpt *par, const char **via)
{
	char err[1024];

	if (cuip_images_read_parent(s->dirfd, inv, par, via, err, sizeof(err)) == 0)
		return true;
	problem(s, "%s: its inherited chunks cannot be read", err);
	return false;
}

/* One topology image: its records and carrier index. */
static void show_topology(struct show *s, const char *name, const Cuip__Topology *t)
{
	const Cuip__ProcessState *st = t->state;
	uint64_t bytes = 0;

	for (size_t i = 0; i < t->n_carriers; i++)
		bytes += t->carriers[i]->size;
	if (s->json) {
		printf("%s{\"image\":", s->shown++ ? "," : "");
		cli_jstr(name);
		printf(",\"carried_bytes\":%" PRIu64 ",\"state\":", bytes);
		cli_print_state_json(st);
		printf(",\"multicast_devices\":%zu,\"multicast_bindings\":%zu,\"carriers\":[", st->n_mc_devices,
		       st->n_mc_bindings);
		show_carriers(s, t);
		printf("]}");
		return;
	}
	printf("\n== %s: participant pid %d, %" PRIu64 " carried bytes\n", name, st->self->pid, bytes);
	cli_print_state(st);
	printf("multicast devices %zu  multicast bindings %zu  reservations %zu\n", st->n_mc_devices, st->n_mc_bindings,
	       st->n_reservations);
	show_carriers(s, t);
}

static Cuip__Topology *read_topology(struct show *s, const char *name)
{
	ProtobufCMessage *m = NULL;
	char err[512] = "";
	int ret;

	ret = cuip_image_read(s->dirfd, name, CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor, NULL, &m, err,
			      sizeof(err));
	if (ret) {
		problem(s, "%s", err[0] ? err : strerror(-ret));
		return NULL;
	}
	if (!((Cuip__Topology *)m)->state || !((Cuip__Topology *)m)->state->self) {
		problem(s, "%s: no process state", name);
		protobuf_c_message_free_unpacked(m, NULL);
		return NULL;
	}
	return (Cuip__Topology *)m;
}

static int topo_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Inventory unreadable: decode whatever topology images are there. */
static size_t show_orphans(struct show *s)
{
	char **names = NULL;
	size_t n = 0, shown = 0;
	struct dirent *de;
	DIR *d;
	int fd = dup(s->dirfd);

	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	rewinddir(d); /* the dup shares its offset with s->dirfd */
	while ((de = readdir(d))) {
		int pid, end = 0;
		char **nv;

		if (sscanf(de->d_name, "cuinterpose-%d.img%n", &pid, &end) != 1 || de->d_name[end])
			continue;
		nv = realloc(names, (n + 1) * sizeof(*nv));
		if (!nv)
			break;
		names = nv;
		names[n] = strdup(de->d_name);
		if (names[n])
			n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), topo_name_cmp);
	for (size_t i = 0; i < n; i++) {
		Cuip__Topology *t = read_topology(s, names[i]);
		if (t) {
			show_topology(s, names[i], t);
			shown++;
			protobuf_c_message_free_unpacked(&t->base, NULL);
		}
		free(names[i]);
	}
	free(names);
	return shown;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: cuinterpose show DIR [--json] [--no-verify]\n"
		   "  decode the cuinterpose images in a CRIU image directory and verify every carrier\n"
		   "  chunk checksum; exit 0 all good, 1 a problem (each one named), 2 usage,\n"
		   "  3 no cuinterpose images in DIR\n");
}

/* The options into s and *dir: -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, struct show *s, const char **dir)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
					     {"no-verify", no_argument, NULL, 'n'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *arg;
	int c;

	cli_opt_start();
	while ((c = cli_opt_next(argc, argv, opts, &arg)) != -1) {
		switch (c) {
		case 'j':
			s->json = 1;
			break;
		case 'n':
			s->verify = 0;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 1:
			if (!*dir && optarg[0] != '-') {
				*dir = optarg;
				break;
			}
			if (optarg[0] != '-') {
				fprintf(stderr, "cuinterpose show: one DIR at a time ('%s' after %s)\n", optarg, *dir);
				usage(stderr);
				return 2;
			}
			/* fall through - "-" */
		default:
			fprintf(stderr, "cuinterpose show: unknown option '%s'\n", arg);
			usage(stderr);
			return 2;
		}
	}
	if (cli_opt_dashdash()) {
		fprintf(stderr, "cuinterpose show: unknown option '--'\n");
		usage(stderr);
		return 2;
	}
	if (!*dir) {
		fprintf(stderr, "cuinterpose show: no DIR given\n");
		usage(stderr);
		return 2;
	}
	return -1;
}

/* How many topology or carrier images of ours dirfd holds (by name). */
static int own_images(int dirfd)
{
	int n = 0, fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		int pid, end = 0;

		if ((sscanf(de->d_name, "cuinterpose-%d.img%n", &pid, &end) == 1 ||
		     sscanf(de->d_name, "cuinterpose-carrier-%d.img%n", &pid, &end) == 1) &&
		    !de->d_name[end])
			n++;
	}
	closedir(d);
	return n;
}

/* The inventory's own lines (or JSON fields). */
static void show_inventory(const struct show *s, const Cuip__Inventory *inv)
{
	char idhex[40], created[512];

	hex(inv->checkpoint_id.data, inv->checkpoint_id.len, idhex, sizeof(idhex));
	when(inv->has_created_unix_ns ? inv->created_unix_ns : 0, created, sizeof(created));
	if (s->json) {
		printf(",\"inventory\":{\"checkpoint_id\":\"%s\",\"created_unix_ns\":%" PRIu64
		       ",\"created\":\"%s\",\"version\":",
		       idhex, inv->created_unix_ns, created);
		cli_jstr(inv->version ? inv->version : "");
		printf(",\"carried_bytes\":%" PRIu64 ",\"parent\":", inv->carried_bytes);
		if (inv->parent)
			cli_jstr(inv->parent);
		else
			printf("null");
		printf(",\"participants\":[");
		for (size_t i = 0; i < inv->n_participants; i++)
			printf("%s{\"pid\":%d,\"identity\":\"%016" PRIx64 "\"}", i ? "," : "",
			       inv->participants[i]->pid, inv->participants[i]->id);
		printf("]}");
		return;
	}
	printf("inventory: id %s  created %s  by cuinterpose %s\n", idhex, created, inv->version ? inv->version : "?");
	printf("           %zu participants, %" PRIu64 " carried bytes\n", inv->n_participants, inv->carried_bytes);
	if (inv->parent)
		printf("           incremental: parent checkpoint %s\n", inv->parent);
	for (size_t i = 0; i < inv->n_participants; i++)
		printf("  pid %d  identity %016" PRIx64 "\n", inv->participants[i]->pid, inv->participants[i]->id);
}

/* Each participant's topology, an incremental one's through its parent
 * chain (where its inherited chunks are read and verified). */
static void show_participants(struct show *s, const Cuip__Inventory *inv)
{
	struct cuip_ckpt par = {0};
	const char *via = inv->parent;
	bool have_par = inv->parent && read_parent(s, inv, &par, &via);
	char err[512];

	for (size_t i = 0; i < inv->n_participants; i++) {
		char name[64];
		Cuip__Topology *t, *flat = NULL;

		snprintf(name, sizeof(name), CUIP_TOPOLOGY_FMT, inv->participants[i]->pid);
		t = read_topology(s, name);
		if (!t)
			continue;
		if (have_par && cuip_images_flatten(t, via, &par, &flat, err, sizeof(err)))
			problem(s, "%s", err);
		s->flat = flat != NULL;
		s->no_parent = inv->parent && !flat;
		show_topology(s, name, flat ? flat : t);
		if (flat)
			protobuf_c_message_free_unpacked(&flat->base, NULL);
		protobuf_c_message_free_unpacked(&t->base, NULL);
	}
	if (have_par)
		cuip_images_free(&par);
}

/* The verdict and the problems; the exit status (0 or 1). */
static int show_verdict(const struct show *s)
{
	int status = s->n_problems || s->n_lost ? 1 : 0;

	if (s->json) {
		printf(",\"verified\":%s,\"chunks_checked\":%" PRIu64 ",\"bytes_checked\":%" PRIu64
		       ",\"ok\":%s,\"problems\":[",
		       s->verify ? "true" : "false", s->chunks_checked, s->bytes_checked, status ? "false" : "true");
		for (size_t i = 0; i < s->n_problems; i++) {
			printf("%s", i ? "," : "");
			cli_jstr(s->problems[i]);
		}
		printf("]}\n");
	} else if (status) {
		printf("\nFAIL: %zu problem(s); `criu restore` of this directory would be refused:\n",
		       s->n_problems + s->n_lost);
		for (size_t i = 0; i < s->n_problems; i++)
			printf("  %s\n", s->problems[i]);
	} else if (s->verify) {
		printf("\nOK: every image decodes and is consistent; %" PRIu64 " carrier bytes in %" PRIu64
		       " chunks match their checksums\n",
		       s->bytes_checked, s->chunks_checked);
	} else {
		printf("\nOK: every image decodes and is consistent (carrier checksums not verified)\n");
	}
	return status;
}

int cli_show(int argc, char **argv)
{
	struct show s = {.verify = 1, .dirfd = -1};
	ProtobufCMessage *m = NULL;
	const char *dir = NULL;
	char err[512] = "";
	struct cuip_ckpt ck;
	int ret, status;

	if ((ret = parse_args(argc, argv, &s, &dir)) >= 0)
		return ret;
	s.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s.dirfd < 0) {
		fprintf(stderr, "cuinterpose show: cannot open %s: %s\n", dir, strerror(errno));
		return 2;
	}
	/* Topology or carrier images without an inventory are a damaged
	 * checkpoint, not a foreign one. */
	if (faccessat(s.dirfd, CUIP_INVENTORY_IMG, F_OK, 0) && errno == ENOENT && !own_images(s.dirfd)) {
		fprintf(stderr,
			"cuinterpose show: %s holds no cuinterpose images (%s missing): not a checkpoint of a "
			"job running under cuinterpose, or not a CRIU image directory\n",
			dir, CUIP_INVENTORY_IMG);
		close(s.dirfd);
		return 3;
	}
	if (s.json) {
		printf("{\"dir\":");
		cli_jstr(dir);
	} else {
		printf("checkpoint %s\n", dir);
	}
	ret = cuip_image_read(s.dirfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor, NULL, &m,
			      err, sizeof(err));
	if (ret) {
		if (!s.json)
			printf("inventory: unreadable\n");
		problem(&s, "%s", err[0] ? err : strerror(-ret));
		if (s.json)
			printf(",\"inventory\":null,\"participants\":[");
		show_orphans(&s);
		if (s.json)
			printf("]");
	} else {
		show_inventory(&s, (Cuip__Inventory *)m);
		if (s.json)
			printf(",\"participants\":[");
		show_participants(&s, (Cuip__Inventory *)m);
		if (s.json)
			printf("]");
		/* The plugin's own cross-checks (identities, checkpoint ids,
		 * index against state, sizes): what `criu restore` refuses. */
		err[0] = 0;
		ret = cuip_images_read(s.dirfd, &ck, err, sizeof(err));
		if (ret)
			problem(&s, "restore would refuse: %s", err[0] ? err : strerror(-ret));
		else
			cuip_images_free(&ck);
		protobuf_c_message_free_unpacked(m, NULL);
	}
	status = show_verdict(&s);
	for (size_t i = 0; i < s.n_problems; i++)
		free(s.problems[i]);
	free(s.problems);
	close(s.dirfd);
	return status;
}
