/*
 * wire.h - framing for everything cuinterpose writes: control messages on
 * the per-process sockets, image files in CRIU's image directory, and the
 * contents of tickets.
 *
 * Every blob is a 16-byte frame header followed by one protobuf-c message
 * from cuinterpose.proto. The header carries a magic, the format version,
 * the kind of message, the payload length and a CRC32C of the payload, so a
 * reader can refuse foreign, truncated, corrupt or wrong-version data before
 * unpacking anything. Used by the interposer, the plugin and the CLI; no
 * state, no locks.
 */
#ifndef CUIP_WIRE_H
#define CUIP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "cuinterpose.pb-c.h"

#define CUIP_FORMAT_VERSION 1
#define CUIP_MAGIC	    0x50495543u /* "CUIP" little-endian */
#define CUIP_FRAME_SIZE	    16
/* Largest control message or image accepted (10,000 allocations x 8
 * processes fit in a few MiB; anything near this bound is hostile). */
#define CUIP_MSG_MAX (64u << 20)

enum cuip_kind {
	CUIP_KIND_REQUEST = 1,
	CUIP_KIND_RESPONSE = 2,
	CUIP_KIND_TICKET = 3,
	CUIP_KIND_INVENTORY = 4,
	CUIP_KIND_TOPOLOGY = 5,
	CUIP_KIND_AGENT = 6,	/* criu <-> its native agent (AgentMessage) */
	CUIP_KIND_GUARDIAN = 7, /* criu <-> its guardian (GuardianMessage) */
};

struct cuip_frame {
	uint32_t magic;
	uint16_t version;
	uint16_t kind;
	uint32_t len;
	uint32_t crc;
};

_Static_assert(sizeof(struct cuip_frame) == CUIP_FRAME_SIZE, "frame header is 16 bytes on the wire");

/* CRC32C (Castagnoli); hardware instruction where the CPU has it. */
uint32_t cuip_crc32c(uint32_t crc, const void *buf, size_t len);

/* Human-readable name of a frame kind, for messages. */
const char *cuip_kind_name(unsigned kind);
/* The name of an interposer phase (Cuip__Phase) without its PHASE_ prefix,
 * from the protocol's own descriptor: "ACTIVE", "QUIESCED", ...; "unknown"
 * for a value the protocol does not define. */
const char *cuip_phase_name(int phase);

/*
 * Encode a frame + message into a freshly malloc'd buffer.
 * Returns the total length, or a negative errno.
 */
ssize_t cuip_encode(unsigned kind, const ProtobufCMessage *msg, uint8_t **out);

/*
 * Validate a frame header read from somewhere. Fills `err` with the reason
 * on failure. Returns 0 or -EPROTO (not ours), -EPROTONOSUPPORT (version),
 * -EMSGSIZE (length bound), -EBADMSG (wrong kind).
 */
int cuip_frame_check(const struct cuip_frame *f, unsigned kind, char *err, size_t errlen);

/*
 * Decode a complete frame held in memory (len bytes). On success *out holds
 * the unpacked message (free with protobuf_c_message_free_unpacked and the
 * same allocator). Errors as cuip_frame_check plus -ENODATA (truncated) and
 * -EBADMSG (checksum or protobuf failure).
 */
int cuip_decode(const void *buf, size_t len, unsigned kind, const ProtobufCMessageDescriptor *desc,
		ProtobufCAllocator *alloc, ProtobufCMessage **out, char *err, size_t errlen);

/*
 * Control messages over a connected SOCK_STREAM unix socket. `fd` (or -1)
 * travels with the message. Sending never raises SIGPIPE. Receiving marks a
 * received FD close-on-exec and closes it on any error, so a malformed
 * message leaks nothing; more than one FD is a protocol error.
 * Return 0 or a negative errno; -ECONNRESET means the peer closed cleanly
 * between messages. -ENOMEM from a send: nothing was sent (the message could
 * not be encoded); from a receive: the message was read past whole (the
 * stream stays framed) but could not be held or decoded, so the peer can
 * still be answered.
 */
int cuip_msg_send(int sock, unsigned kind, const ProtobufCMessage *msg, int fd);
int cuip_msg_recv(int sock, unsigned kind, const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
		  ProtobufCMessage **out, int *fd, char *err, size_t errlen);

/*
 * The same with up to CUIP_MSG_MAX_FDS descriptors on one message (a batched
 * FETCH reply). Receiving more than `maxfds` is a protocol error and closes
 * all of them; *nfds tells how many arrived (the caller checks that against
 * what the message says).
 */
#define CUIP_MSG_MAX_FDS 250 /* below the kernel's SCM_MAX_FD (253) */
/* Most carrier files of one participant: what a SAVE or LOAD carries, what a
 * topology image may name, what the carrier spreads one transfer over. */
#define CUIP_CARRIER_FILES_MAX 64
int cuip_msg_sendv(int sock, unsigned kind, const ProtobufCMessage *msg, const int *fds, size_t nfds);
int cuip_msg_recvv(int sock, unsigned kind, const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
		   ProtobufCMessage **out, int *fds, size_t maxfds, size_t *nfds, char *err, size_t errlen);

/* Write all of buf to fd (restarting on EINTR / short writes); read all. */
int cuip_write_all(int fd, const void *buf, size_t len);
int cuip_read_all(int fd, void *buf, size_t len);
/* Read len bytes at offset off (restarting on EINTR / short reads): 0,
 * -ENODATA where the file ends first, or -errno; *got the bytes read. */
int cuip_pread_all(int fd, void *buf, uint64_t len, uint64_t off, uint64_t *got);

/*
 * Image files: written to "<name>.tmp" then renamed, so a reader never sees
 * a half-written image. Read refuses with a message naming the file.
 */
int cuip_image_write(int dirfd, const char *name, unsigned kind, const ProtobufCMessage *msg);
int cuip_image_read(int dirfd, const char *name, unsigned kind, const ProtobufCMessageDescriptor *desc,
		    ProtobufCAllocator *alloc, ProtobufCMessage **out, char *err, size_t errlen);

/* Image file names inside CRIU's image directory. */
#define CUIP_INVENTORY_IMG "cuinterpose-inventory.img"
#define CUIP_TOPOLOGY_FMT  "cuinterpose-%d.img"
#define CUIP_CARRIER_FMT   "cuinterpose-carrier-%d.img"

#endif /* CUIP_WIRE_H */
