/*
 * cli_inspect.c - `cuinterpose inspect PID [--json]`: find the process's
 * control socket, handshake, ask INSPECT, print every tracked record.
 *
 * Finding the socket: the inodes of the process's socket FDs
 * (/proc/PID/fd) are matched against its network namespace's unix socket
 * table (/proc/PID/net/unix) for a name "<pid>-<16 hex>.sock"; the socket is
 * reached through /proc/PID/root so that a process in another mount
 * namespace works too. Without access to /proc/PID/fd, the socket
 * directories are scanned for "PID-*.sock".
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cuda.h> /* the CUmem* values a record carries */

#include "cli.h"
#include "client.h"
#include "errfmt.h"

static int sock_name_ok(const char *path)
{
	const char *base = strrchr(path, '/');
	char hex[17];
	int pid, n = 0;

	base = base ? base + 1 : path;
	return sscanf(base, "%d-%16[0-9a-f].sock%n", &pid, hex, &n) == 2 && base[n] == 0 && strlen(hex) == 16;
}

static int inode_of_fds(pid_t pid, unsigned long **out, size_t *nout)
{
	char dir[64], link[512], target[128];
	struct dirent *de;
	DIR *d;

	*out = NULL;
	*nout = 0;
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		unsigned long ino;
		ssize_t n;
		if (de->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", dir, de->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (sscanf(target, "socket:[%lu]", &ino) != 1)
			continue;
		unsigned long *nv = realloc(*out, (*nout + 1) * sizeof(**out));
		if (!nv)
			break;
		*out = nv;
		(*out)[(*nout)++] = ino;
	}
	closedir(d);
	return 0;
}

/* The socket path as the process sees it. */
int cli_find_socket(pid_t pid, char *path, size_t len)
{
	unsigned long *inos;
	size_t nino;
	char file[64], line[512];
	FILE *f;
	int found = 0;

	if (inode_of_fds(pid, &inos, &nino) == 0 && nino) {
		snprintf(file, sizeof(file), "/proc/%d/net/unix", (int)pid);
		f = fopen(file, "re");
		while (f && !found && fgets(line, sizeof(line), f)) {
			unsigned long ino;
			char p[256] = "";
			if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %255s", &ino, p) < 2 || !p[0])
				continue;
			for (size_t i = 0; i < nino; i++) {
				if (inos[i] == ino && sock_name_ok(p)) {
					snprintf(path, len, "%s", p);
					found = 1;
					break;
				}
			}
		}
		if (f)
			fclose(f);
	}
	free(inos);
	if (found)
		return 0;
	/* Fall back to the socket directories. */
	const char *env = getenv("CUINTERPOSE_SOCKET_DIR");
	char tmpdir[64], prefix[32];
	const char *dirs[3] = {env && *env ? env : "/run/cuinterpose", tmpdir, NULL};
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/cuinterpose-%u", (unsigned)getuid());
	snprintf(prefix, sizeof(prefix), "%d-", (int)pid);
	for (int i = 0; dirs[i] && !found; i++) {
		DIR *d = opendir(dirs[i]);
		struct dirent *de;
		while (d && (de = readdir(d))) {
			if (!strncmp(de->d_name, prefix, strlen(prefix)) && sock_name_ok(de->d_name)) {
				if (snprintf(path, len, "%s/%s", dirs[i], de->d_name) >= (int)len)
					continue;
				found = 1;
				break;
			}
		}
		if (d)
			closedir(d);
	}
	return found ? 0 : -ENOENT;
}

int cli_connect_proc(pid_t pid, const char *path)
{
	char via[600];
	int s = -ENOENT;

	if (snprintf(via, sizeof(via), "/proc/%d/root%s", (int)pid, path) <
	    (int)sizeof(((struct sockaddr_un *)0)->sun_path))
		s = cuip_client_connect(via);
	if (s < 0)
		s = cuip_client_connect(path);
	return s;
}

static const char *owner_name(int o)
{
	static const char *const n[] = {"?", "native", "shared", "unsupported"};
	return o >= 1 && o <= 3 ? n[o] : "?";
}

static const char *origin_name(int o)
{
	static const char *const n[] = {"?",	    "vmm-create", "vmm-import", "malloc",
					"ipc-open", "mc-create",  "mc-import"};
	return o >= 1 && o <= 6 ? n[o] : "?";
}

static void flags_str(unsigned f, char *b, size_t n)
{
	snprintf(b, n, "%s",
		 f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "rw"
		 : f == CU_MEM_ACCESS_FLAGS_PROT_READ	 ? "r"
							 : "none");
}

static void uuid_str(const ProtobufCBinaryData *u, char *b, size_t n)
{
	size_t o = 0;

	b[0] = 0;
	for (size_t i = 0; i < u->len && o + 3 < n; i++)
		o += (size_t)snprintf(b + o, n - o, "%02x%s", u->data[i],
				      i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
}

static unsigned mappings_of(const Cuip__ProcessState *st, const Cuip__AllocId *id)
{
	unsigned n = 0;

	for (size_t i = 0; i < st->n_mappings; i++)
		if (st->mappings[i]->alloc->creator == id->creator && st->mappings[i]->alloc->serial == id->serial)
			n++;
	return n;
}

static bool same_id(const Cuip__AllocId *a, const Cuip__AllocId *b)
{
	return a && b && a->creator == b->creator && a->serial == b->serial;
}

/* The devices and live bindings of multicast object `a`, under its line. */
static void print_mc(const Cuip__ProcessState *st, const Cuip__Allocation *a)
{
	char b[64];

	printf("    multicast  requested %" PRIu64 "  effective %" PRIu64 "  handle types %#" PRIx64
	       "  num_devices %u\n",
	       a->mc->requested_size, a->mc->has_effective_size ? a->mc->effective_size : a->mc->requested_size,
	       a->mc->handle_types, a->mc->num_devices);
	for (size_t i = 0; i < st->n_mc_devices; i++) {
		const Cuip__McDevice *d = st->mc_devices[i];

		if (!same_id(d->mc, a->id))
			continue;
		uuid_str(&d->device_uuid, b, sizeof(b));
		printf("    mc device %d  GPU-%s  participant %016" PRIx64 "\n", d->device, b, d->participant);
	}
	for (size_t i = 0; i < st->n_mc_bindings; i++) {
		const Cuip__McBinding *m = st->mc_bindings[i];

		if (!same_id(m->mc, a->id))
			continue;
		printf("    mc binding device %d  mc offset %" PRIu64 "  member %016" PRIx64 ":%" PRIu64
		       "  member offset %" PRIu64 "  size %" PRIu64 "  %s  %s\n",
		       m->device, m->mc_offset, m->member->creator, m->member->serial, m->member_offset, m->size,
		       m->by_addr ? "BindAddr" : "BindMem", m->abi == 2 ? "v2" : "v1");
	}
}

static void print_mc_json(const Cuip__ProcessState *st, const Cuip__Allocation *a)
{
	char b[64];
	bool first = true;

	printf(",\"multicast\":{\"requested_size\":%" PRIu64 ",\"effective_size\":%" PRIu64 ",\"handle_types\":%" PRIu64
	       ",\"num_devices\":%u,\"devices\":[",
	       a->mc->requested_size, a->mc->has_effective_size ? a->mc->effective_size : a->mc->requested_size,
	       a->mc->handle_types, a->mc->num_devices);
	for (size_t i = 0; i < st->n_mc_devices; i++) {
		const Cuip__McDevice *d = st->mc_devices[i];

		if (!same_id(d->mc, a->id))
			continue;
		uuid_str(&d->device_uuid, b, sizeof(b));
		printf("%s{\"ordinal\":%d,\"uuid\":\"GPU-%s\",\"participant\":\"%016" PRIx64 "\"}", first ? "" : ",",
		       d->device, b, d->participant);
		first = false;
	}
	printf("],\"bindings\":[");
	first = true;
	for (size_t i = 0; i < st->n_mc_bindings; i++) {
		const Cuip__McBinding *m = st->mc_bindings[i];

		if (!same_id(m->mc, a->id))
			continue;
		printf("%s{\"device\":%d,\"mc_offset\":%" PRIu64 ",\"member\":\"%016" PRIx64 ":%" PRIu64
		       "\",\"member_offset\":%" PRIu64 ",\"size\":%" PRIu64 ",\"bind\":\"%s\",\"abi\":\"%s\"}",
		       first ? "" : ",", m->device, m->mc_offset, m->member->creator, m->member->serial,
		       m->member_offset, m->size, m->by_addr ? "BindAddr" : "BindMem", m->abi == 2 ? "v2" : "v1");
		first = false;
	}
	printf("]}");
}

static uint64_t alloc_size(const Cuip__Allocation *a)
{
	if (a->props)
		return a->props->size;
	if (a->mc)
		return a->mc->has_effective_size ? a->mc->effective_size : a->mc->requested_size;
	return 0;
}

void cli_print_state(const Cuip__ProcessState *st)
{
	char b[64];

	printf("process %d  identity %016" PRIx64 "  phase %s  version %s\n", st->self->pid, st->self->id,
	       cuip_phase_name(st->phase), st->version ? st->version : "?");
	printf("socket %s\n", st->socket ? st->socket : "-");
	if (st->failure)
		printf("failure: %s\n", st->failure);
	printf("devices (%zu):\n", st->n_devices);
	for (size_t i = 0; i < st->n_devices; i++) {
		uuid_str(&st->devices[i]->uuid, b, sizeof(b));
		printf("  %d  GPU-%s\n", st->devices[i]->ordinal, b);
	}
	printf("allocations (%zu):\n", st->n_allocations);
	for (size_t i = 0; i < st->n_allocations; i++) {
		const Cuip__Allocation *a = st->allocations[i];
		bool mine = a->id->creator == st->self->id;
		printf("  %016" PRIx64 ":%" PRIu64 "  size %" PRIu64 "  owner %s  origin %s  creator %s",
		       a->id->creator, a->id->serial, alloc_size(a), owner_name(a->owner), origin_name(a->origin),
		       mine ? "this process" : "pid");
		if (!mine)
			printf(" %d", a->has_creator_pid ? a->creator_pid : -1);
		printf("  device %d  handles %u  mappings %u%s", a->props ? a->props->location_id : -1, a->app_handles,
		       mappings_of(st, a->id), a->exported ? "  exported" : "");
		if (a->has_logical_handle)
			printf("  handle %#" PRIx64, a->logical_handle);
		if (a->unsupported_reason)
			printf("  (%s)", a->unsupported_reason);
		if (a->has_carried)
			printf("  %s", a->carried ? "carried" : "native");
		printf("\n");
		if (a->mc)
			print_mc(st, a);
		if (a->slab) {
			uint64_t live = 0;
			for (size_t k = 0; k < a->n_pieces; k++)
				live += a->pieces[k]->size;
			printf("    slab  %zu pieces  %" PRIu64 " bytes in them\n", a->n_pieces, live);
			for (size_t k = 0; k < a->n_pieces; k++) {
				printf("      piece +%#" PRIx64 "  size %" PRIu64, a->pieces[k]->offset,
				       a->pieces[k]->size);
				if (a->pieces[k]->has_opens)
					printf("  opens %u", a->pieces[k]->opens);
				printf("\n");
			}
		}
	}
	printf("mappings (%zu):\n", st->n_mappings);
	for (size_t i = 0; i < st->n_mappings; i++) {
		const Cuip__Mapping *m = st->mappings[i];
		printf("  %#" PRIx64 "-%#" PRIx64 "  size %" PRIu64 "  offset %" PRIu64 "  alloc %016" PRIx64
		       ":%" PRIu64 "\n",
		       m->va, m->va + m->size, m->size, m->offset, m->alloc->creator, m->alloc->serial);
		for (size_t k = 0; k < m->n_access; k++) {
			const Cuip__Access *ac = m->access[k];
			flags_str(ac->flags, b, sizeof(b));
			printf("    access %#" PRIx64 "-%#" PRIx64 "  %s %d  %s\n", ac->va, ac->va + ac->size,
			       ac->location_type == CU_MEM_LOCATION_TYPE_DEVICE ? "device" : "location",
			       ac->location_id, b);
		}
	}
	printf("tickets (%zu):\n", st->n_tickets);
	for (size_t i = 0; i < st->n_tickets; i++) {
		const Cuip__Ticket *t = st->tickets[i];
		printf("  alloc %016" PRIx64 ":%" PRIu64 "  creator pid %d  socket %s\n", t->alloc->creator,
		       t->alloc->serial, t->creator->pid, t->creator_socket ? t->creator_socket : "-");
	}
	if (st->counters)
		printf("counters: raw_imports %u  unsupported %u  exports_served %" PRIu64 "  gate_waits %" PRIu64 "\n",
		       st->counters->raw_imports, st->counters->unsupported, st->counters->exports_served,
		       st->counters->gate_waits);
}

void cli_jstr(const char *s)
{
	putchar('"');
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

void cli_print_state_json(const Cuip__ProcessState *st)
{
	char b[64];

	printf("{\"pid\":%d,\"identity\":\"%016" PRIx64 "\",\"phase\":\"%s\",\"version\":", st->self->pid, st->self->id,
	       cuip_phase_name(st->phase));
	cli_jstr(st->version);
	printf(",\"socket\":");
	cli_jstr(st->socket);
	if (st->failure) {
		printf(",\"failure\":");
		cli_jstr(st->failure);
	}
	printf(",\"devices\":[");
	for (size_t i = 0; i < st->n_devices; i++) {
		uuid_str(&st->devices[i]->uuid, b, sizeof(b));
		printf("%s{\"ordinal\":%d,\"uuid\":\"GPU-%s\"}", i ? "," : "", st->devices[i]->ordinal, b);
	}
	printf("],\"allocations\":[");
	for (size_t i = 0; i < st->n_allocations; i++) {
		const Cuip__Allocation *a = st->allocations[i];
		printf("%s{\"id\":\"%016" PRIx64 ":%" PRIu64 "\",\"creator\":\"%016" PRIx64 "\",\"creator_pid\":%d,"
		       "\"serial\":%" PRIu64 ",\"size\":%" PRIu64 ",\"device\":%d,\"owner\":\"%s\",\"origin\":\"%s\","
		       "\"app_handles\":%u,\"mappings\":%u,\"exported\":%s",
		       i ? "," : "", a->id->creator, a->id->serial, a->id->creator,
		       a->has_creator_pid ? a->creator_pid : -1, a->id->serial, alloc_size(a),
		       a->props ? a->props->location_id : -1, owner_name(a->owner), origin_name(a->origin),
		       a->app_handles, mappings_of(st, a->id), a->exported ? "true" : "false");
		if (a->has_carried)
			printf(",\"carried\":%s", a->carried ? "true" : "false");
		if (a->unsupported_reason) {
			printf(",\"unsupported_reason\":");
			cli_jstr(a->unsupported_reason);
		}
		if (a->mc)
			print_mc_json(st, a);
		if (a->slab) {
			printf(",\"slab\":true,\"pieces\":[");
			for (size_t k = 0; k < a->n_pieces; k++) {
				printf("%s{\"offset\":%" PRIu64 ",\"size\":%" PRIu64, k ? "," : "",
				       a->pieces[k]->offset, a->pieces[k]->size);
				if (a->pieces[k]->has_opens)
					printf(",\"opens\":%u", a->pieces[k]->opens);
				printf("}");
			}
			printf("]");
		}
		printf("}");
	}
	printf("],\"mappings\":[");
	for (size_t i = 0; i < st->n_mappings; i++) {
		const Cuip__Mapping *m = st->mappings[i];
		printf("%s{\"va\":%" PRIu64 ",\"size\":%" PRIu64 ",\"offset\":%" PRIu64 ",\"alloc\":\"%016" PRIx64
		       ":%" PRIu64 "\",\"access\":[",
		       i ? "," : "", m->va, m->size, m->offset, m->alloc->creator, m->alloc->serial);
		for (size_t k = 0; k < m->n_access; k++) {
			const Cuip__Access *ac = m->access[k];
			flags_str(ac->flags, b, sizeof(b));
			printf("%s{\"va\":%" PRIu64 ",\"size\":%" PRIu64 ",\"location_type\":%u,\"location_id\":%d,"
			       "\"flags\":\"%s\"}",
			       k ? "," : "", ac->va, ac->size, ac->location_type, ac->location_id, b);
		}
		printf("]}");
	}
	printf("],\"tickets\":[");
	for (size_t i = 0; i < st->n_tickets; i++) {
		const Cuip__Ticket *t = st->tickets[i];
		printf("%s{\"alloc\":\"%016" PRIx64 ":%" PRIu64 "\",\"creator_pid\":%d,\"creator_socket\":",
		       i ? "," : "", t->alloc->creator, t->alloc->serial, t->creator->pid);
		cli_jstr(t->creator_socket);
		printf("}");
	}
	printf("]");
	if (st->counters)
		printf(",\"counters\":{\"raw_imports\":%u,\"unsupported\":%u,\"exports_served\":%" PRIu64
		       ",\"gate_waits\":%" PRIu64 "}",
		       st->counters->raw_imports, st->counters->unsupported, st->counters->exports_served,
		       st->counters->gate_waits);
	printf("}\n");
}

/* A PID: decimal digits only, 1..INT_MAX. 0 or -EINVAL. */
static int parse_pid(const char *a, pid_t *pid)
{
	char *end;
	long v;

	if (!isdigit((unsigned char)a[0]))
		return -EINVAL;
	errno = 0;
	v = strtol(a, &end, 10);
	if (errno || *end || v < 1 || v > INT_MAX)
		return -EINVAL;
	*pid = (pid_t)v;
	return 0;
}

static int parse_seconds(const char *a, long *s)
{
	char *end;
	long v;

	if (!isdigit((unsigned char)a[0]))
		return -EINVAL;
	errno = 0;
	v = strtol(a, &end, 10);
	if (errno || *end || v > 3600)
		return -EINVAL;
	*s = v;
	return 0;
}

int cli_ask_state(int s, const char *client, unsigned timeout_ms, Cuip__Response **resp, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	int ret = cuip_client_handshake(s, client, timeout_ms, NULL, err, errlen);

	*resp = NULL;
	if (!ret) {
		req.body_case = CUIP__REQUEST__BODY_INSPECT;
		req.inspect = 1;
		ret = cuip_client_request(s, &req, -1, timeout_ms, resp, err, errlen);
	}
	if (!ret && (*resp)->body_case != CUIP__RESPONSE__BODY_STATE) {
		errfmt(err, errlen, "INSPECT reply carries no process state");
		ret = -EPROTO;
	}
	if (ret) {
		cuip_client_free(*resp);
		*resp = NULL;
		close(s);
		return ret;
	}
	cuip_client_bye(s, timeout_ms); /* the state is ours whatever the goodbye says */
	return 0;
}

int cli_inspect(int argc, char **argv)
{
	Cuip__Response *resp = NULL;
	char path[512], err[256] = "";
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
					     {"wait", required_argument, NULL, 'w'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *arg;
	int json = 0, s, ret, c;
	long wait_s = 0;
	pid_t pid = 0;

	cli_opt_start();
	while ((c = cli_opt_next(argc, argv, opts, &arg)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: cuinterpose inspect PID [--json] [--wait SECONDS]\n");
			return 0;
		case 'w':
		case ':':
			if (c == ':' || parse_seconds(optarg, &wait_s)) {
				fprintf(stderr,
					"cuinterpose inspect: --wait needs a number of seconds (0..3600), got %s%s%s\n",
					c == 'w' ? "'" : "nothing", c == 'w' ? optarg : "", c == 'w' ? "'" : "");
				return 2;
			}
			break;
		case '?': /* "-5" reads as an option: say it is no PID */
			if (arg[0] != '-' || !isdigit((unsigned char)arg[1])) {
				fprintf(stderr, "cuinterpose inspect: unknown option '%s'\n", arg);
				return 2;
			}
			/* fall through */
		default:
			if (pid) {
				fprintf(stderr, "cuinterpose inspect: one PID at a time ('%s' after %d)\n", arg,
					(int)pid);
				return 2;
			}
			if (parse_pid(arg, &pid)) {
				fprintf(stderr, "cuinterpose inspect: '%s' is not a PID (a process id, 1..%d)\n", arg,
					INT_MAX);
				return 2;
			}
		}
	}
	if (cli_opt_dashdash()) {
		fprintf(stderr, "cuinterpose inspect: unknown option '--'\n");
		return 2;
	}
	if (!pid) {
		fprintf(stderr, "cuinterpose inspect: no PID given\nusage: cuinterpose inspect PID [--json] [--wait "
				"SECONDS]\n");
		return 2;
	}
	/* --wait: a job started a moment ago has no socket until its first CUDA
	 * call; poll every 50 ms, giving up early if the process goes away. */
	for (long waited_ms = 0;; waited_ms += 50) {
		if (kill(pid, 0) && errno == ESRCH) {
			fprintf(stderr, "cuinterpose inspect: no such process: %d\n", (int)pid);
			return 1;
		}
		if (!cli_find_socket(pid, path, sizeof(path)))
			break;
		if (waited_ms >= wait_s * 1000L) {
			fprintf(stderr,
				"cuinterpose inspect: process %d has no cuinterpose control socket (not running under "
				"`cuinterpose run`, no CUDA initialized yet, or no permission to read /proc/%d)%s\n",
				(int)pid, (int)pid, wait_s ? " after --wait" : "; --wait SECONDS waits for it");
			return 1;
		}
		usleep(50 * 1000);
	}
	s = cli_connect_proc(pid, path);
	if (s < 0) {
		fprintf(stderr, "cuinterpose inspect: cannot connect to %s: %s\n", path, strerror(-s));
		return 1;
	}
	ret = cli_ask_state(s, "cli", 0, &resp, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "cuinterpose inspect: process %d: %s\n", (int)pid, err);
	} else {
		if (json)
			cli_print_state_json(resp->state);
		else
			cli_print_state(resp->state);
	}
	cuip_client_free(resp);
	return ret ? 1 : 0;
}
