/*
 * wire.c - frame encoding and decoding, socket transport with one optional
 * FD per message, and atomic image files. See wire.h for the contract.
 *
 * Stateless apart from the CRC table, built once under pthread_once.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "errfmt.h"
#include "wire.h"

/* ---- CRC32C ------------------------------------------------------------ */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_hw;

#if defined(__x86_64__)
#define CRC_LANE 4096
static uint32_t crc_shift1[4][256], crc_shift2[4][256]; /* by CRC_LANE, 2 * CRC_LANE bytes */
static void crc_shift_init(uint32_t tab[4][256], size_t n);
#endif

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__)
	__builtin_cpu_init();
	crc_hw = __builtin_cpu_supports("sse4.2");
	crc_shift_init(crc_shift1, CRC_LANE);
	crc_shift_init(crc_shift2, 2 * CRC_LANE);
#endif
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len && ((uintptr_t)p & 7)) {
		crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
		len--;
	}
	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		v ^= crc;
		crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^ crc_table[5][(v >> 16) & 0xff] ^
		      crc_table[4][(v >> 24) & 0xff] ^ crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
		      crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
	return crc;
}

#if defined(__x86_64__)
/*
 * The crc32 instruction has a latency of 3 cycles and a throughput of one
 * per cycle, so one dependency chain runs at a third of its speed. Long
 * buffers are cut into stripes of three lanes of CRC_LANE bytes, each lane
 * its own chain, and the lane CRCs are combined: for the raw (uninverted)
 * CRC, raw(c, A.B.C) = shift(raw(c, A), |B|+|C|) ^ shift(raw(0, B), |C|) ^
 * raw(0, C), where shift(x, n) feeds n zero bytes, a linear map on 32 bits
 * applied with byte tables.
 */
static uint32_t crc_zeros(uint32_t c, size_t n)
{
	while (n--)
		c = (c >> 8) ^ crc_table[0][c & 0xff];
	return c;
}

static void crc_shift_init(uint32_t tab[4][256], size_t n)
{
	uint32_t basis[32];

	for (int i = 0; i < 32; i++)
		basis[i] = crc_zeros(1u << i, n);
	for (int k = 0; k < 4; k++) {
		for (int b = 0; b < 256; b++) {
			uint32_t v = 0;
			for (int i = 0; i < 8; i++)
				if (b & (1 << i))
					v ^= basis[8 * k + i];
			tab[k][b] = v;
		}
	}
}

static inline uint32_t crc_shift(const uint32_t tab[4][256], uint32_t c)
{
	return tab[0][c & 0xff] ^ tab[1][(c >> 8) & 0xff] ^ tab[2][(c >> 16) & 0xff] ^ tab[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw_x86(uint32_t crc, const uint8_t *p, size_t len)
{
	uint64_t c = crc;

	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	while (len >= 3 * CRC_LANE) {
		uint64_t c1 = 0, c2 = 0;
		for (size_t i = 0; i < CRC_LANE; i += 8) {
			uint64_t a, b, d;
			memcpy(&a, p + i, 8);
			memcpy(&b, p + CRC_LANE + i, 8);
			memcpy(&d, p + 2 * CRC_LANE + i, 8);
			c = __builtin_ia32_crc32di(c, a);
			c1 = __builtin_ia32_crc32di(c1, b);
			c2 = __builtin_ia32_crc32di(c2, d);
		}
		c = crc_shift(crc_shift2, (uint32_t)c) ^ crc_shift(crc_shift1, (uint32_t)c1) ^ (uint32_t)c2;
		p += 3 * CRC_LANE;
		len -= 3 * CRC_LANE;
	}
	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
		p += 8;
		len -= 8;
	}
	while (len--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

uint32_t cuip_crc32c(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	crc = ~crc;
#if defined(__x86_64__)
	if (crc_hw)
		return ~crc_hw_x86(crc, buf, len);
#endif
	return ~crc_sw(crc, buf, len);
}

/* ---- frames ------------------------------------------------------------ */

const char *cuip_phase_name(int phase)
{
	const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&cuip__phase__descriptor, phase);

	if (!v || strncmp(v->name, "PHASE_", 6))
		return "unknown";
	return v->name + 6;
}

const char *cuip_kind_name(unsigned kind)
{
	switch (kind) {
	case CUIP_KIND_REQUEST:
		return "request";
	case CUIP_KIND_RESPONSE:
		return "response";
	case CUIP_KIND_TICKET:
		return "ticket";
	case CUIP_KIND_INVENTORY:
		return "inventory image";
	case CUIP_KIND_TOPOLOGY:
		return "topology image";
	case CUIP_KIND_AGENT:
		return "native agent message";
	case CUIP_KIND_GUARDIAN:
		return "guardian message";
	}
	return "unknown";
}

ssize_t cuip_encode(unsigned kind, const ProtobufCMessage *msg, uint8_t **out)
{
	size_t plen = protobuf_c_message_get_packed_size(msg), packed;
	struct cuip_frame f;
	uint8_t *buf;

	if (plen > CUIP_MSG_MAX)
		return -EMSGSIZE;
	buf = malloc(CUIP_FRAME_SIZE + plen + 1);
	if (!buf)
		return -ENOMEM;
	packed = protobuf_c_message_pack(msg, buf + CUIP_FRAME_SIZE);
	assert(packed == plen); /* protobuf-c packs exactly what it measured */
	(void)packed;
	f.magic = CUIP_MAGIC;
	f.version = CUIP_FORMAT_VERSION;
	f.kind = (uint16_t)kind;
	f.len = (uint32_t)plen;
	f.crc = cuip_crc32c(0, buf + CUIP_FRAME_SIZE, plen);
	memcpy(buf, &f, sizeof(f));
	*out = buf;
	return (ssize_t)(CUIP_FRAME_SIZE + plen);
}

int cuip_frame_check(const struct cuip_frame *f, unsigned kind, char *err, size_t errlen)
{
	if (f->magic != CUIP_MAGIC) {
		errfmt(err, errlen, "not a cuinterpose %s (magic %#x)", cuip_kind_name(kind), f->magic);
		return -EPROTO;
	}
	if (f->version != CUIP_FORMAT_VERSION) {
		errfmt(err, errlen, "%s has format version %u, this build reads version %u", cuip_kind_name(kind),
		       f->version, CUIP_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (f->kind != kind) {
		errfmt(err, errlen, "expected a %s, found a %s", cuip_kind_name(kind), cuip_kind_name(f->kind));
		return -EBADMSG;
	}
	if (f->len > CUIP_MSG_MAX) {
		errfmt(err, errlen, "%s claims %u bytes, more than the %u allowed", cuip_kind_name(kind), f->len,
		       CUIP_MSG_MAX);
		return -EMSGSIZE;
	}
	return 0;
}

/* The caller's allocator (NULL: malloc and free, as protobuf-c's own),
 * noting whether an allocation failed: protobuf-c answers NULL alike for
 * bytes that do not decode and for memory it could not get, and the two
 * must not be told apart wrongly (an image is not corrupt because memory
 * ran out). */
struct noting_alloc {
	ProtobufCAllocator *inner;
	bool failed;
};

static void *noting_malloc(void *data, size_t size)
{
	struct noting_alloc *n = data;
	void *p = n->inner ? n->inner->alloc(n->inner->allocator_data, size) : malloc(size);

	if (!p)
		n->failed = true;
	return p;
}

static void noting_free(void *data, void *p)
{
	struct noting_alloc *n = data;

	if (n->inner)
		n->inner->free(n->inner->allocator_data, p);
	else
		free(p);
}

static int unpack(const uint8_t *payload, const struct cuip_frame *f, unsigned kind,
		  const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc, ProtobufCMessage **out, char *err,
		  size_t errlen)
{
	struct noting_alloc n = {.inner = alloc};
	ProtobufCAllocator noting = {.alloc = noting_malloc, .free = noting_free, .allocator_data = &n};

	if (cuip_crc32c(0, payload, f->len) != f->crc) {
		errfmt(err, errlen, "%s checksum mismatch (corrupt)", cuip_kind_name(kind));
		return -EBADMSG;
	}
	/* Freed later with `alloc` itself: noting_free is the same. */
	*out = protobuf_c_message_unpack(desc, &noting, f->len, payload);
	if (!*out && n.failed) {
		errfmt(err, errlen, "out of memory decoding a %u-byte %s", f->len, cuip_kind_name(kind));
		return -ENOMEM;
	}
	if (!*out) {
		errfmt(err, errlen, "%s does not decode as %s", cuip_kind_name(kind), desc->name);
		return -EBADMSG;
	}
	return 0;
}

int cuip_decode(const void *buf, size_t len, unsigned kind, const ProtobufCMessageDescriptor *desc,
		ProtobufCAllocator *alloc, ProtobufCMessage **out, char *err, size_t errlen)
{
	struct cuip_frame f;
	int ret;

	*out = NULL;
	if (len < CUIP_FRAME_SIZE) {
		errfmt(err, errlen, "%s truncated: %zu bytes, header needs %d", cuip_kind_name(kind), len,
		       CUIP_FRAME_SIZE);
		return -ENODATA;
	}
	memcpy(&f, buf, sizeof(f));
	ret = cuip_frame_check(&f, kind, err, errlen);
	if (ret)
		return ret;
	if (len - CUIP_FRAME_SIZE < f.len) {
		errfmt(err, errlen, "%s truncated: %zu payload bytes of %u", cuip_kind_name(kind),
		       len - CUIP_FRAME_SIZE, f.len);
		return -ENODATA;
	}
	if (len - CUIP_FRAME_SIZE > f.len) {
		errfmt(err, errlen, "%s has %zu trailing bytes", cuip_kind_name(kind), len - CUIP_FRAME_SIZE - f.len);
		return -EBADMSG;
	}
	return unpack((const uint8_t *)buf + CUIP_FRAME_SIZE, &f, kind, desc, alloc, out, err, errlen);
}

/* ---- plain I/O --------------------------------------------------------- */

int cuip_write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int cuip_read_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ENODATA;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int cuip_pread_all(int fd, void *buf, uint64_t len, uint64_t off, uint64_t *got)
{
	uint8_t *p = buf;

	*got = 0;
	while (*got < len) {
		ssize_t n = pread(fd, p + *got, len - *got, (off_t)(off + *got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		*got += (uint64_t)n;
	}
	return 0;
}

/* ---- socket transport -------------------------------------------------- */

int cuip_msg_sendv(int sock, unsigned kind, const ProtobufCMessage *msg, const int *fds, size_t nfds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * CUIP_MSG_MAX_FDS)];
	} ctl;
	struct msghdr mh = {0};
	struct iovec iov;
	uint8_t *buf;
	ssize_t len, n;
	size_t off = 0;
	int ret = 0;

	if (nfds > CUIP_MSG_MAX_FDS)
		return -E2BIG;
	len = cuip_encode(kind, msg, &buf);
	if (len < 0)
		return (int)len;
	while (off < (size_t)len) {
		iov.iov_base = buf + off;
		iov.iov_len = (size_t)len - off;
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = NULL;
		mh.msg_controllen = 0;
		/* The descriptors ride on the first byte, hence on the header. */
		if (off == 0 && nfds) {
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			break;
		}
		off += (size_t)n;
	}
	free(buf);
	return ret;
}

int cuip_msg_send(int sock, unsigned kind, const ProtobufCMessage *msg, int fd)
{
	return cuip_msg_sendv(sock, kind, msg, &fd, fd >= 0);
}

/* Collect at most `max` FDs from a control message into fds[*n...]; with more,
 * or a truncated control buffer, every one (kept ones included) is closed. */
static int take_fds(struct msghdr *mh, int *fds, size_t max, size_t *n)
{
	int bad = (mh->msg_flags & MSG_CTRUNC) != 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int got;
			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*n < max && !bad)
				fds[(*n)++] = got;
			else {
				close(got);
				bad = 1;
			}
		}
	}
	if (bad)
		while (*n)
			close(fds[--*n]);
	return bad ? -EPROTO : 0;
}

/* Read past len bytes of a message that cannot be held: 0 or a negative errno. */
static int skip(int sock, size_t len)
{
	uint8_t sink[4096];
	int ret = 0;

	while (len && !ret) {
		size_t k = len < sizeof(sink) ? len : sizeof(sink);

		ret = cuip_read_all(sock, sink, k);
		len -= k;
	}
	return ret;
}

int cuip_msg_recvv(int sock, unsigned kind, const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
		   ProtobufCMessage **out, int *fds, size_t maxfds, size_t *nfds, char *err, size_t errlen)
{
	/* Room for one more than the most we send, so that a peer sending too
	 * many is detected (and every one closed) rather than truncated. */
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * (CUIP_MSG_MAX_FDS + 1))];
	} ctl;
	struct cuip_frame f;
	struct msghdr mh;
	struct iovec iov;
	uint8_t *payload = NULL;
	size_t got = 0, n_in = 0;
	int ret;

	*out = NULL;
	*nfds = 0;
	if (maxfds > CUIP_MSG_MAX_FDS)
		maxfds = CUIP_MSG_MAX_FDS;
	while (got < sizeof(f)) {
		memset(&mh, 0, sizeof(mh));
		iov.iov_base = (uint8_t *)&f + got;
		iov.iov_len = sizeof(f) - got;
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			errfmt(err, errlen, "receiving a %s: %s", cuip_kind_name(kind), strerror(errno));
			goto fail;
		}
		if (take_fds(&mh, fds, maxfds, &n_in)) {
			if (maxfds == 1)
				errfmt(err, errlen, "%s carried more than one file descriptor", cuip_kind_name(kind));
			else
				errfmt(err, errlen, "%s carried more than %zu file descriptors", cuip_kind_name(kind),
				       maxfds);
			ret = -EPROTO;
			goto fail;
		}
		if (n == 0) {
			ret = got ? -ENODATA : -ECONNRESET;
			errfmt(err, errlen, got ? "peer closed inside a %s header" : "peer closed the connection",
			       cuip_kind_name(kind));
			goto fail;
		}
		got += (size_t)n;
	}
	ret = cuip_frame_check(&f, kind, err, errlen);
	if (ret)
		goto fail;
	payload = malloc(f.len ? f.len : 1);
	if (!payload) {
		errfmt(err, errlen, "out of memory for a %u-byte %s", f.len, cuip_kind_name(kind));
		ret = skip(sock, f.len);
		if (!ret)
			ret = -ENOMEM; /* read past: the next message is framed */
		goto fail;
	}
	ret = cuip_read_all(sock, payload, f.len);
	if (ret) {
		errfmt(err, errlen, "%s payload cut short (%u bytes expected)", cuip_kind_name(kind), f.len);
		goto fail;
	}
	ret = unpack(payload, &f, kind, desc, alloc, out, err, errlen);
	if (ret)
		goto fail;
	free(payload);
	*nfds = n_in;
	return 0;
fail:
	free(payload);
	while (n_in)
		close(fds[--n_in]);
	return ret;
}

int cuip_msg_recv(int sock, unsigned kind, const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
		  ProtobufCMessage **out, int *fd, char *err, size_t errlen)
{
	int got = -1;
	size_t n;
	int ret = cuip_msg_recvv(sock, kind, desc, alloc, out, &got, 1, &n, err, errlen);

	if (fd)
		*fd = ret == 0 && n ? got : -1;
	else if (ret == 0 && n)
		close(got);
	return ret;
}

/* ---- image files ------------------------------------------------------- */

int cuip_image_write(int dirfd, const char *name, unsigned kind, const ProtobufCMessage *msg)
{
	char tmp[512];
	uint8_t *buf;
	ssize_t len;
	int fd, ret;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", name) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	len = cuip_encode(kind, msg, &buf);
	if (len < 0)
		return (int)len;
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	ret = cuip_write_all(fd, buf, (size_t)len);
	if (!ret && fsync(fd))
		ret = -errno;
	if (close(fd) && !ret)
		ret = -errno;
	if (!ret && renameat(dirfd, tmp, dirfd, name))
		ret = -errno;
	if (ret)
		unlinkat(dirfd, tmp, 0);
out:
	free(buf);
	return ret;
}

int cuip_image_read(int dirfd, const char *name, unsigned kind, const ProtobufCMessageDescriptor *desc,
		    ProtobufCAllocator *alloc, ProtobufCMessage **out, char *err, size_t errlen)
{
	char why[256] = "";
	struct stat st;
	uint8_t *buf = NULL;
	int fd, ret;

	*out = NULL;
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		errfmt(err, errlen, "%s: %s", name, errno == ENOENT ? "missing" : strerror(errno));
		return ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		errfmt(err, errlen, "%s: %s", name, strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size > (uint64_t)CUIP_MSG_MAX + CUIP_FRAME_SIZE) {
		ret = -EMSGSIZE;
		errfmt(err, errlen, "%s: %lld bytes is larger than any %s", name, (long long)st.st_size,
		       cuip_kind_name(kind));
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		errfmt(err, errlen, "%s: out of memory for its %lld bytes", name, (long long)st.st_size);
		ret = -ENOMEM;
		goto out;
	}
	ret = cuip_read_all(fd, buf, (size_t)st.st_size);
	if (ret) {
		errfmt(err, errlen, "%s: read failed: %s", name, strerror(-ret));
		goto out;
	}
	ret = cuip_decode(buf, (size_t)st.st_size, kind, desc, alloc, out, why, sizeof(why));
	if (ret)
		errfmt(err, errlen, "%s: %s", name, why);
out:
	free(buf);
	close(fd);
	return ret;
}
