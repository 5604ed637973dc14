/*
 * ticket.c - tickets: what the application holds instead of a driver export.
 *
 * A ticket is a memfd sealed against any change (F_SEAL_SEAL, SHRINK, GROW,
 * WRITE) holding one cuip.Ticket framed by wire.c: the allocation identity,
 * its creator (identity, pid, control socket), the kind, the allocation
 * properties and a random 16-byte token that authorizes a fetch from the
 * creator. Being an ordinary memfd, CRIU saves and restores it, and dup or
 * SCM_RIGHTS copies stay valid across a restore: identities do not change.
 *
 * Recognition needs the seals, the frame magic and a clean decode: an
 * unsealed memfd, a character device or any other FD is "not a ticket"
 * (the import passes through to the driver); a sealed memfd with our magic
 * that does not decode is a malformed ticket and is refused. No state.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuip.h"
#include "record.h"
#include "runtime.h"
#include "ticket.h"

#define TICKET_SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)
#define TICKET_MAX   4096

int cuip_ticket_mint(const struct cuip_alloc *a, Cuip__AllocKind kind, const Cuip__McProps *mc, bool cloexec)
{
	Cuip__Ticket t = CUIP__TICKET__INIT;
	Cuip__AllocId id = CUIP__ALLOC_ID__INIT;
	Cuip__ProcessId creator = CUIP__PROCESS_ID__INIT;
	Cuip__AllocProps props = CUIP__ALLOC_PROPS__INIT;
	const uint8_t *uuid = cuip_dev_uuid(a->prop.location.id);
	uint8_t *buf;
	ssize_t len;
	int fd, ret;

	id.creator = a->creator;
	id.serial = a->serial;
	creator.id = a->creator;
	creator.pid = a->creator_pid;
	props.type = a->prop.type;
	props.handle_types = a->prop.requestedHandleTypes;
	props.location_type = a->prop.location.type;
	props.location_id = a->prop.location.id;
	if (uuid && a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
		props.has_device_uuid = 1;
		props.device_uuid.data = (uint8_t *)uuid;
		props.device_uuid.len = 16;
	}
	props.size = a->size;
	t.alloc = &id;
	t.kind = kind;
	t.token.data = (uint8_t *)a->token;
	t.token.len = sizeof(a->token);
	t.creator = &creator;
	t.creator_socket = (char *)a->creator_sock;
	t.props = &props;
	if (mc) { /* the kind's own properties instead */
		t.mc = (Cuip__McProps *)mc;
		t.props = NULL;
	}

	len = cuip_encode(CUIP_KIND_TICKET, &t.base, &buf);
	if (len < 0)
		return (int)len;
	fd = memfd_create("cuinterpose-ticket", MFD_ALLOW_SEALING | (cloexec ? MFD_CLOEXEC : 0));
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	ret = cuip_write_all(fd, buf, (size_t)len);
	if (!ret && fcntl(fd, F_ADD_SEALS, TICKET_SEALS))
		ret = -errno;
	if (ret) {
		close(fd);
		goto out;
	}
	ret = fd;
out:
	free(buf);
	return ret;
}

int cuip_ticket_read(int fd, Cuip__Ticket **out)
{
	uint8_t buf[TICKET_MAX];
	struct stat st;
	uint32_t magic;
	ssize_t n;
	int seals, ret;
	char err[256];

	*out = NULL;
	if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode))
		return 0;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & TICKET_SEALS) != TICKET_SEALS)
		return 0;
	n = pread(fd, buf, sizeof(buf), 0);
	if (n < (ssize_t)sizeof(magic))
		return 0;
	memcpy(&magic, buf, sizeof(magic));
	if (magic != CUIP_MAGIC)
		return 0;
	if (st.st_size > TICKET_MAX)
		return -EMSGSIZE;
	ret = cuip_decode(buf, (size_t)n, CUIP_KIND_TICKET, &cuip__ticket__descriptor, NULL, (ProtobufCMessage **)out,
			  err, sizeof(err));
	if (ret) {
		pr_err("descriptor %d: %s", fd, err);
		return ret;
	}
	if ((*out)->token.len != 16 || (*out)->alloc->creator != (*out)->creator->id ||
	    ((*out)->kind != CUIP__ALLOC_KIND__KIND_UNICAST &&
	     ((*out)->kind != CUIP__ALLOC_KIND__KIND_MULTICAST || !(*out)->mc))) {
		pr_err("descriptor %d: ticket is inconsistent (token %zu bytes, kind %d)", fd, (*out)->token.len,
		       (*out)->kind);
		cuip__ticket__free_unpacked(*out, NULL);
		*out = NULL;
		return -EBADMSG;
	}
	return 1;
}
