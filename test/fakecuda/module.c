/*
 * Modules and kernels.  An image that is PTX text (it begins, after
 * whitespace and comments, with .version) is parsed as the real driver's JIT
 * would refuse it: .version (at most 9.0, CUDA 13.0's ISA, else
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION), .target sm_NN no newer than the
 * device (9.0; else CUDA_ERROR_INVALID_PTX, which is what the driver answers
 * when the JIT refuses a target above the GPU), each .entry with its .param
 * list, anything else malformed (no NUL within FK_PTX_MAX bytes, garbage,
 * unbalanced braces): CUDA_ERROR_INVALID_PTX.  Its functions are the entries
 * it declares that the fake runs in C (ptx_kernels below: cuip_chunkscan,
 * the carrier's chunk scan, and the test kernels), with the parameters the
 * PTX declares (a mismatch: not one the fake can run); any other name is
 * CUDA_ERROR_NOT_FOUND.  Any other image is accepted as before and offers
 * the builtin test kernels (fake_fill_u32, ...).  The kernels do checkable
 * work on device memory through devmem.c (with the launching context's
 * device as accessor, so VMM access rights matter).  Launches are queued on
 * a stream (stream.c); FAKECUDA_KERNEL_DELAY_US makes each one take that
 * long (FAKECUDA_KERNEL_HOLD=FILE: and then until FILE exists, at most
 * FK_HOLD_MAX_S).  Module table under G.lock; the kernel tables are
 * constant.
 *
 * The JIT and its compute cache (jit_compile below), as measured on the
 * H200: the first load of a PTX image on a machine compiles it (0.34 s for
 * the chunk scan) and stores the result in the driver's cache directory
 * ($CUDA_CACHE_PATH, else $HOME/.nv/ComputeCache); later loads of the same
 * text find it there (1 ms); CUDA_CACHE_DISABLE=1 compiles every time. The
 * fake keeps one file per image (fakecuda-jit-HASH) where CUDA_CACHE_PATH
 * names, and no cache without it (never in the tester's home: test runs
 * must not depend on one another), a compile takes FAKECUDA_JIT_MS
 * (default 0), and FAKECUDA_JIT_LOG=PATH gets one line per load: "pid P
 * jit HASH" (compiled) or "pid P cached HASH".
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "../../carrier/chunkscan.h"

#define CHUNK_U32 16384

static uint64_t arg_u64(const unsigned char *args, int i)
{
	uint64_t v;

	memcpy(&v, args + 8 * i, sizeof(v));
	return v;
}

static uint32_t arg_u32(const unsigned char *args, int i)
{
	uint32_t v;

	memcpy(&v, args + 8 * i, sizeof(v));
	return v;
}

/* fake_fill_u32(uint32_t *p, size_t n, uint32_t v): p[i] = v */
static CUresult k_fill(const struct fk_op *op)
{
	const unsigned char *args = op->args;
	int ord = op->ord;
	uint32_t v = arg_u32(args, 2);

	return devmem_fill(arg_u64(args, 0), &v, 4, arg_u64(args, 1), ord);
}

/* fake_add_u32(uint32_t *p, size_t n, uint32_t delta): p[i] += delta */
static CUresult k_add(const struct fk_op *op)
{
	const unsigned char *args = op->args;
	int ord = op->ord;
	uint32_t buf[CHUNK_U32], d = arg_u32(args, 2);
	uint64_t p = arg_u64(args, 0), n = arg_u64(args, 1);

	while (n > 0) {
		size_t k = n < CHUNK_U32 ? n : CHUNK_U32;
		CUresult r = devmem_read(buf, p, k * 4, ord);

		if (r)
			return r;
		for (size_t i = 0; i < k; i++)
			buf[i] += d;
		r = devmem_write(p, buf, k * 4, ord);
		if (r)
			return r;
		p += k * 4;
		n -= k;
	}
	return CUDA_SUCCESS;
}

/* fake_copy(void *dst, const void *src, size_t bytes) */
static CUresult k_copy(const struct fk_op *op)
{
	return devmem_copy(arg_u64(op->args, 0), arg_u64(op->args, 1), arg_u64(op->args, 2), op->ord);
}

/*
 * cuip_chunkscan(const unsigned char *base, unsigned long long size,
 * unsigned int chunk_size, unsigned long long key0, unsigned long long key1,
 * unsigned long long *out): carrier/chunkscan.h's contract, computed by its
 * own cuip_chunkscan_host, on the device bytes in place (the arena mapping:
 * nothing is copied out of device memory), a chunk that is a hole of the
 * arena file (never written since allocated) read as the zeros it is
 * without touching it.  Launches the kernel would get wrong are refused at
 * cuLaunchKernel with CUDA_ERROR_INVALID_VALUE (a GPU would run them and
 * compute garbage or write out of bounds): blockDim other than
 * (CUIP_CHUNKSCAN_THREADS, 1, 1), gridDim other than (ceil(size /
 * chunk_size), 1, 1), chunk_size 0.
 */
static CUresult k_chunkscan_check(const struct fk_op *op)
{
	uint64_t size = arg_u64(op->args, 1);
	uint32_t cs = arg_u32(op->args, 2);

	if (op->block[0] != CUIP_CHUNKSCAN_THREADS || op->block[1] != 1 || op->block[2] != 1)
		return CUDA_ERROR_INVALID_VALUE;
	if (!cs || op->grid[1] != 1 || op->grid[2] != 1 || op->grid[0] != (size + cs - 1) / cs)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

/* 1 if [off, off+len) of the file fd is one hole (reads as zeros). */
static int file_hole(int fd, uint64_t off, uint64_t len)
{
	off_t d = lseek(fd, (off_t)off, SEEK_DATA);

	if (d < 0)
		return errno == ENXIO; /* no data at or after off */
	return (uint64_t)d >= off + len;
}

#define CS_BATCH 256 /* chunks' results written to out at once */

static CUresult k_chunkscan(const struct fk_op *op)
{
	uint64_t base = arg_u64(op->args, 0), size = arg_u64(op->args, 1), out = arg_u64(op->args, 5);
	uint64_t key[2] = {arg_u64(op->args, 3), arg_u64(op->args, 4)}, res[3 * CS_BATCH];
	uint32_t cs = arg_u32(op->args, 2);
	unsigned char *buf = NULL;
	CUresult r = CUDA_SUCCESS;
	unsigned nb = 0;

	for (uint64_t c = 0; c < op->grid[0] && !r; c++) {
		uint64_t start = c * cs, len = size - start < cs ? size - start : cs, foff;
		const unsigned char *p;
		int fd;

		r = devmem_view(base + start, len, op->ord, &p, &fd, &foff);
		if (r)
			break;
		if (fd >= 0 && file_hole(fd, foff, len)) {
			res[3 * nb] = res[3 * nb + 1] = res[3 * nb + 2] = 0;
		} else {
			if (!p) { /* in pieces (several mappings, multicast): gathered */
				if (!buf && !(buf = malloc(cs))) {
					r = CUDA_ERROR_OUT_OF_MEMORY;
					break;
				}
				r = devmem_read(buf, base + start, len, op->ord);
				if (r)
					break;
				p = buf;
			}
			cuip_chunkscan_host(p, len, key, res + 3 * nb);
		}
		if (++nb == CS_BATCH || c + 1 == op->grid[0]) {
			r = devmem_write(out + 24 * (c + 1 - nb), res, 24 * (size_t)nb, op->ord);
			nb = 0;
		}
	}
	free(buf);
	return r;
}

/* What any image offers (none of them is parsed). */
static const struct fk_kernel kernels[] = {
	{"fake_fill_u32", {8, 8, 4}, 3, k_fill, NULL},
	{"fake_add_u32", {8, 8, 4}, 3, k_add, NULL},
	{"fake_copy", {8, 8, 8}, 3, k_copy, NULL},
};

/* What a PTX image may declare and the fake runs. */
static const struct fk_kernel ptx_kernels[] = {
	{CUIP_CHUNKSCAN_KERNEL, {8, 8, 4, 8, 8, 8}, 6, k_chunkscan, k_chunkscan_check},
	{"fake_fill_u32", {8, 8, 4}, 3, k_fill, NULL},
	{"fake_add_u32", {8, 8, 4}, 3, k_add, NULL},
	{"fake_copy", {8, 8, 8}, 3, k_copy, NULL},
};

/* --- PTX ------------------------------------------------------------------------ */

/* The most bytes of PTX text read looking for its NUL. */
#define FK_PTX_MAX (64u << 20)
/* The newest PTX ISA CUDA 13.0 reads, and the device's sm (9.0). */
#define FK_PTX_ISA_MAX 90
#define FK_SM	       90

struct ptx_lex {
	const char *p, *end;
	const char *tok; /* the current token: [tok, tok + len) */
	size_t len;
	int bad;
};

static int ident_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
	       c == '%' || c == '.';
}

/* The next token: a word (directive, name, number) or one other character;
 * len 0 at the end.  Comments and strings are skipped (a string is a token). */
static void lex_next(struct ptx_lex *l)
{
	const char *p = l->p;

	for (;;) {
		while (p < l->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
			p++;
		if (p + 1 < l->end && p[0] == '/' && p[1] == '/') {
			while (p < l->end && *p != '\n')
				p++;
			continue;
		}
		if (p + 1 < l->end && p[0] == '/' && p[1] == '*') {
			const char *e = p + 2;

			while (e + 1 < l->end && !(e[0] == '*' && e[1] == '/'))
				e++;
			if (e + 1 >= l->end) {
				l->bad = 1;
				p = l->end;
				break;
			}
			p = e + 2;
			continue;
		}
		break;
	}
	l->tok = p;
	if (p >= l->end) {
		l->len = 0;
	} else if (*p == '"') {
		const char *e = p + 1;

		while (e < l->end && *e != '"' && *e != '\n')
			e++;
		if (e >= l->end || *e != '"')
			l->bad = 1;
		else
			e++;
		l->len = (size_t)(e - p);
	} else if (ident_char(*p)) {
		const char *e = p;

		while (e < l->end && ident_char(*e))
			e++;
		l->len = (size_t)(e - p);
	} else {
		l->len = 1;
	}
	l->p = l->tok + l->len;
}

static int tok_is(const struct ptx_lex *l, const char *s)
{
	return l->len == strlen(s) && !memcmp(l->tok, s, l->len);
}

/* A decimal number token, -1 if it is none. */
static long tok_num(const struct ptx_lex *l)
{
	long v = 0;

	if (!l->len || l->len > 9)
		return -1;
	for (size_t i = 0; i < l->len; i++) {
		if (l->tok[i] < '0' || l->tok[i] > '9')
			return -1;
		v = v * 10 + (l->tok[i] - '0');
	}
	return v;
}

/* Skips a statement to its ';' or a balanced {...} (whichever ends it). */
static int skip_statement(struct ptx_lex *l)
{
	int depth = 0;

	for (; l->len && !l->bad; lex_next(l)) {
		if (tok_is(l, "{")) {
			depth++;
		} else if (tok_is(l, "}")) {
			if (--depth < 0)
				return -1;
			if (!depth) {
				lex_next(l);
				if (tok_is(l, ";")) /* an initializer's = {...}; */
					lex_next(l);
				return 0;
			}
		} else if (tok_is(l, ";") && !depth) {
			lex_next(l);
			return 0;
		}
	}
	return -1;
}

static int param_type_size(const struct ptx_lex *l)
{
	static const struct {
		const char *t;
		int size;
	} types[] = {{".u8", 1},  {".s8", 1},  {".b8", 1},  {".u16", 2}, {".s16", 2}, {".b16", 2},
		     {".f16", 2}, {".u32", 4}, {".s32", 4}, {".b32", 4}, {".f32", 4}, {".u64", 8},
		     {".s64", 8}, {".b64", 8}, {".f64", 8}, {".pred", 1}};

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (tok_is(l, types[i].t))
			return types[i].size;
	return 0;
}

/* .entry NAME ( .param ..., ... ) [performance directives] { body }: the
 * parameters' sizes and alignments; l is at NAME. */
static CUresult parse_entry(struct ptx_lex *l, struct fk_pfunc *fn, char *name, size_t namesz)
{
	int n = 0;

	if (!l->len || !ident_char(*l->tok) || *l->tok == '.' || l->len >= namesz)
		return CUDA_ERROR_INVALID_PTX;
	memcpy(name, l->tok, l->len);
	name[l->len] = 0;
	lex_next(l);
	if (tok_is(l, "(")) {
		lex_next(l);
		while (!tok_is(l, ")")) {
			long size = 0, align = 0, count = 1;

			if (!tok_is(l, ".param"))
				return CUDA_ERROR_INVALID_PTX;
			for (lex_next(l); l->len && *l->tok == '.'; lex_next(l)) {
				if (tok_is(l, ".align")) {
					lex_next(l);
					align = tok_num(l);
					if (align <= 0 || (align & (align - 1)))
						return CUDA_ERROR_INVALID_PTX;
				} else if (param_type_size(l)) {
					if (size)
						return CUDA_ERROR_INVALID_PTX;
					size = param_type_size(l);
				} else if (!tok_is(l, ".ptr") && !tok_is(l, ".global") && !tok_is(l, ".const") &&
					   !tok_is(l, ".local") && !tok_is(l, ".shared")) {
					return CUDA_ERROR_INVALID_PTX;
				}
			}
			if (!size || !l->len || !ident_char(*l->tok))
				return CUDA_ERROR_INVALID_PTX;
			lex_next(l); /* the name */
			if (tok_is(l, "[")) {
				lex_next(l);
				count = tok_num(l);
				lex_next(l);
				if (count <= 0 || !tok_is(l, "]"))
					return CUDA_ERROR_INVALID_PTX;
				lex_next(l);
			}
			if (n < FK_MAX_ARGS) {
				long bytes = size * count;

				fn->argsz[n] = (uint8_t)(bytes > 255 ? 255 : bytes);
				fn->argalign[n] = (uint8_t)(align ? align : size);
			}
			n++;
			if (tok_is(l, ","))
				lex_next(l);
			else if (!tok_is(l, ")"))
				return CUDA_ERROR_INVALID_PTX;
		}
		lex_next(l);
	}
	fn->nargs = n;
	/* .maxntid 256, 1, 1 and the like, then the body */
	while (l->len && !tok_is(l, "{") && !tok_is(l, ";") && !l->bad)
		lex_next(l);
	if (!tok_is(l, "{") || skip_statement(l))
		return CUDA_ERROR_INVALID_PTX;
	return CUDA_SUCCESS;
}

/* The kernel the fake runs for entry `name` declared with fn's parameters, or NULL. */
static const struct fk_kernel *ptx_kernel(const char *name, const struct fk_pfunc *fn)
{
	for (size_t i = 0; i < sizeof(ptx_kernels) / sizeof(ptx_kernels[0]); i++) {
		const struct fk_kernel *k = &ptx_kernels[i];
		int same = !strcmp(k->name, name) && k->nargs == fn->nargs;

		for (int a = 0; same && a < k->nargs; a++)
			same = k->argsz[a] == fn->argsz[a];
		if (same)
			return k;
	}
	return NULL;
}

/* 1 if the image is PTX text: .version first, after whitespace and comments. */
static int is_ptx(const char *image)
{
	struct ptx_lex l = {.p = image, .end = image + 4096};
	const char *nul = memchr(image, 0, 4096);

	/* only look at what may be text: a binary image has a NUL early */
	if (nul)
		l.end = nul;
	lex_next(&l);
	return tok_is(&l, ".version");
}

/*
 * Parses PTX text into m->fn (the entries the fake runs).  Errors as the
 * real driver's: CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
 */
static CUresult parse_ptx(const char *image, struct fk_module *m)
{
	const char *nul = memchr(image, 0, FK_PTX_MAX);
	struct ptx_lex l = {.p = image};
	int target = 0;
	long major, minor;

	if (!nul)
		return CUDA_ERROR_INVALID_PTX;
	l.end = nul;
	lex_next(&l);
	if (!tok_is(&l, ".version"))
		return CUDA_ERROR_INVALID_PTX;
	/* X.Y lexes as one word */
	lex_next(&l);
	{
		const char *dot = memchr(l.tok, '.', l.len);
		struct ptx_lex a = l, b = l;

		if (!dot)
			return CUDA_ERROR_INVALID_PTX;
		a.len = (size_t)(dot - l.tok);
		b.tok = dot + 1;
		b.len = l.len - a.len - 1;
		major = tok_num(&a);
		minor = tok_num(&b);
	}
	if (major < 1 || minor < 0 || minor > 9)
		return CUDA_ERROR_INVALID_PTX;
	if (major * 10 + minor > FK_PTX_ISA_MAX)
		return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
	for (lex_next(&l); l.len && !l.bad;) {
		if (tok_is(&l, ".target")) {
			long sm;

			if (target)
				return CUDA_ERROR_INVALID_PTX;
			lex_next(&l);
			if (l.len < 4 || memcmp(l.tok, "sm_", 3))
				return CUDA_ERROR_INVALID_PTX;
			{
				struct ptx_lex d = l;

				d.tok += 3;
				d.len -= 3;
				/* sm_90a, sm_100f: the suffix names features of one family */
				if (d.len > 2 && (d.tok[d.len - 1] == 'a' || d.tok[d.len - 1] == 'f'))
					d.len--;
				sm = tok_num(&d);
			}
			if (sm < 10)
				return CUDA_ERROR_INVALID_PTX;
			if (sm > FK_SM)
				return CUDA_ERROR_INVALID_PTX; /* the JIT refuses a newer target */
			target = 1;
			for (lex_next(&l); tok_is(&l, ",");) { /* , texmode_..., debug */
				lex_next(&l);
				if (!l.len || !ident_char(*l.tok))
					return CUDA_ERROR_INVALID_PTX;
				lex_next(&l);
			}
			continue;
		}
		if (!target)
			return CUDA_ERROR_INVALID_PTX; /* .target comes right after .version */
		if (tok_is(&l, ".address_size")) {
			lex_next(&l);
			if (tok_num(&l) != 64)
				return CUDA_ERROR_INVALID_PTX;
			lex_next(&l);
			continue;
		}
		/* linkage, then .entry, .func or a variable */
		while (tok_is(&l, ".visible") || tok_is(&l, ".extern") || tok_is(&l, ".weak") || tok_is(&l, ".common"))
			lex_next(&l);
		if (tok_is(&l, ".entry")) {
			struct fk_pfunc fn = {0};
			char name[128];
			CUresult r;

			lex_next(&l);
			r = parse_entry(&l, &fn, name, sizeof(name));
			if (r)
				return r;
			fn.k = ptx_kernel(name, &fn);
			if (fn.k && m->nfn < FK_MOD_FUNCS) {
				fn.magic = FK_MOD_MAGIC;
				m->fn[m->nfn++] = fn;
			}
			continue;
		}
		if (tok_is(&l, ".func") || tok_is(&l, ".global") || tok_is(&l, ".const") || tok_is(&l, ".shared") ||
		    tok_is(&l, ".file") || tok_is(&l, ".section") || tok_is(&l, ".pragma") || tok_is(&l, ".alias")) {
			if (skip_statement(&l))
				return CUDA_ERROR_INVALID_PTX;
			continue;
		}
		return CUDA_ERROR_INVALID_PTX; /* garbage */
	}
	return l.bad || !target ? CUDA_ERROR_INVALID_PTX : CUDA_SUCCESS;
}

static int module_valid(struct fk_module *m)
{
	uintptr_t p = (uintptr_t)m, b = (uintptr_t)G.mod;

	return p >= b && p < b + sizeof(G.mod) && (p - b) % sizeof(G.mod[0]) == 0 && m->magic == FK_MOD_MAGIC &&
	       m->used;
}

/* FAKECUDA_JIT_LOG: one line per PTX load, one O_APPEND write. */
static void jit_log(const char *what, uint64_t h)
{
	const char *path = getenv("FAKECUDA_JIT_LOG");
	char line[96];
	int fd, len;

	if (!path || !*path)
		return;
	len = snprintf(line, sizeof(line), "pid %d %s %016llx\n", (int)getpid(), what, (unsigned long long)h);
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)len) < 0) {
		/* nothing to do: the test sees no line */
	}
	close(fd);
}

/* The compute cache directory CUDA_CACHE_PATH names, made if missing
 * (mode 0700, as the driver's); false when there is none (unset, or it
 * cannot be made: the real driver then compiles every time). */
static bool jit_cache_dir(char *dir, size_t len)
{
	const char *p = getenv("CUDA_CACHE_PATH");
	char tmp[PATH_MAX];
	int n;

	if (!p || !*p)
		return false;
	n = snprintf(dir, len, "%s", p);
	if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(tmp))
		return false;
	memcpy(tmp, dir, (size_t)n + 1);
	for (char *s = tmp + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
			return false;
		*s = '/';
	}
	return mkdir(tmp, 0700) == 0 || errno == EEXIST;
}

/* A PTX image's compile: from the cache when it holds this text, else
 * compiled (FAKECUDA_JIT_MS) and stored there. */
static void jit_compile(const char *ptx)
{
	const char *v = getenv("CUDA_CACHE_DISABLE"), *ms = getenv("FAKECUDA_JIT_MS");
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 of the text */
	char dir[PATH_MAX - 64], path[PATH_MAX];
	bool cache = !(v && !strcmp(v, "1")) && jit_cache_dir(dir, sizeof(dir));
	long t = ms && *ms ? strtol(ms, NULL, 10) : 0;
	int fd;

	for (const unsigned char *c = (const unsigned char *)ptx; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	if (cache) {
		snprintf(path, sizeof(path), "%s/fakecuda-jit-%016llx", dir, (unsigned long long)h);
		if (access(path, F_OK) == 0) {
			jit_log("cached", h);
			return;
		}
	}
	if (t > 0) {
		struct timespec ts = {t / 1000, (t % 1000) * 1000000L};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	if (cache) {
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
	}
	jit_log("jit", h);
}

static CUresult module_load(CUmodule *module, const void *image, const char *fname)
{
	struct fk_module ptx = {0};
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if (!module || (!image && !fname))
		return CUDA_ERROR_INVALID_VALUE;
	if (fname && access(fname, R_OK) < 0)
		return CUDA_ERROR_FILE_NOT_FOUND;
	if (image && is_ptx(image)) {
		ptx.ptx = 1;
		r = parse_ptx(image, &ptx);
		if (r)
			return r;
		jit_compile(image);
	}
	LOCK();
	for (int i = 0; i < FK_MAX_MOD; i++) {
		struct fk_module *m = &G.mod[i];

		if (!m->used) {
			*m = ptx;
			m->used = 1;
			m->magic = FK_MOD_MAGIC;
			m->ctx = c;
			*module = (CUmodule)m;
			UNLOCK();
			return CUDA_SUCCESS;
		}
	}
	UNLOCK();
	return CUDA_ERROR_OUT_OF_MEMORY;
}

FK_API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
	FK_CALL("cuModuleLoadData", module_load(module, image, NULL));
}

FK_API CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
	FK_CALL("cuModuleLoad", module_load(module, NULL, fname));
}

static CUresult module_unload(CUmodule hmod)
{
	struct fk_module *m = (struct fk_module *)hmod;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	if (!module_valid(m))
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		m->used = 0, m->magic = 0;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
	FK_CALL("cuModuleUnload", module_unload(hmod));
}

static CUresult get_function(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	int ok;

	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	ok = module_valid((struct fk_module *)hmod);
	if (ok && ((struct fk_module *)hmod)->ptx) {
		struct fk_module *m = (struct fk_module *)hmod;

		for (int i = 0; i < m->nfn; i++)
			if (!strcmp(m->fn[i].k->name, name)) {
				*hfunc = (CUfunction)&m->fn[i];
				UNLOCK();
				return CUDA_SUCCESS;
			}
		UNLOCK();
		return CUDA_ERROR_NOT_FOUND;
	}
	UNLOCK();
	if (!ok)
		return CUDA_ERROR_INVALID_HANDLE;
	for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
		if (!strcmp(kernels[i].name, name)) {
			*hfunc = (CUfunction)&kernels[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}

FK_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	FK_CALL("cuModuleGetFunction", get_function(hfunc, hmod, name));
}

/* A launchable function: its kernel and parameter layout. */
struct launch_fn {
	const struct fk_kernel *k;
	int nargs;
	size_t argsz[FK_MAX_ARGS], argalign[FK_MAX_ARGS];
};

/* f as a builtin kernel or a function of a loaded PTX module (G.lock held). */
static CUresult resolve_fn(CUfunction f, struct launch_fn *out)
{
	const struct fk_kernel *k = (const struct fk_kernel *)f;
	uintptr_t p = (uintptr_t)f, b = (uintptr_t)G.mod;

	if (p >= (uintptr_t)kernels && p < (uintptr_t)(kernels + sizeof(kernels) / sizeof(kernels[0])) &&
	    (p - (uintptr_t)kernels) % sizeof(kernels[0]) == 0) {
		out->k = k;
		out->nargs = k->nargs;
		for (int i = 0; i < k->nargs; i++)
			out->argsz[i] = out->argalign[i] = k->argsz[i];
		return CUDA_SUCCESS;
	}
	if (p >= b && p < b + sizeof(G.mod)) {
		struct fk_module *m = &G.mod[(p - b) / sizeof(G.mod[0])];
		uintptr_t fb = (uintptr_t)m->fn;

		if (module_valid(m) && p >= fb && p < fb + sizeof(m->fn) && (p - fb) % sizeof(m->fn[0]) == 0) {
			const struct fk_pfunc *fn = (const struct fk_pfunc *)f;

			if ((int)((p - fb) / sizeof(m->fn[0])) < m->nfn && fn->magic == FK_MOD_MAGIC) {
				out->k = fn->k;
				out->nargs = fn->nargs;
				for (int i = 0; i < fn->nargs; i++)
					out->argsz[i] = fn->argsz[i], out->argalign[i] = fn->argalign[i];
				return CUDA_SUCCESS;
			}
		}
	}
	return CUDA_ERROR_INVALID_HANDLE;
}

/* Packs arguments into 8-byte slots from kernelParams or from an `extra`
 * buffer (each at its alignment: natural, or the PTX's .align). */
static CUresult pack_args(const struct launch_fn *k, void **params, void **extra, unsigned char *out)
{
	if (params && extra)
		return CUDA_ERROR_INVALID_VALUE;
	if (params) {
		for (int i = 0; i < k->nargs; i++)
			memcpy(out + 8 * i, params[i], k->argsz[i]);
		return CUDA_SUCCESS;
	}
	if (extra) {
		const unsigned char *buf = NULL;
		size_t size = 0, off = 0;

		for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				buf = extra[i + 1];
			else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				memcpy(&size, extra[i + 1], sizeof(size));
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (!buf)
			return CUDA_ERROR_INVALID_VALUE;
		for (int i = 0; i < k->nargs; i++) {
			off = (off + k->argalign[i] - 1) / k->argalign[i] * k->argalign[i];
			if (off + k->argsz[i] > size)
				return CUDA_ERROR_INVALID_VALUE;
			memcpy(out + 8 * i, buf + off, k->argsz[i]);
			off += k->argsz[i];
		}
		return CUDA_SUCCESS;
	}
	return k->nargs ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* FAKECUDA_KERNEL_HOLD's value for the queue (a launch may change it):
 * the last one kept, an earlier one leaked (tests set a few). */
static const char *hold_path(void)
{
	static char *last;
	const char *h = getenv("FAKECUDA_KERNEL_HOLD");

	if (!h || !*h)
		return NULL;
	if (!last || strcmp(last, h))
		last = strdup(h);
	return last;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		       CUstream hStream, void **params, void **extra)
{
	struct launch_fn k;
	struct fk_op op = {.type = OP_KERNEL, .grid = {gx, gy, gz}, .block = {bx, by, bz}};
	const char *delay = getenv("FAKECUDA_KERNEL_DELAY_US");
	struct fk_stream *s;
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	LOCK();
	r = resolve_fn(f, &k);
	UNLOCK();
	if (r)
		return r;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	r = pack_args(&k, params, extra, op.args);
	if (r)
		return r;
	op.kernel = k.k;
	if (k.k->check && (r = k.k->check(&op)))
		return r;
	op.ord = c->ord;
	c->launched = 1;
	op.delay_us = delay ? (uint32_t)strtoul(delay, NULL, 10) : 0;
	op.hold = hold_path();
	LOCK();
	r = stream_resolve(hStream, &s);
	if (!r)
		r = stream_enqueue(&op, s);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
				       unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
				       void **kernelParams, void **extra)
{
	FK_CALL("cuLaunchKernel",
		launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra));
}
