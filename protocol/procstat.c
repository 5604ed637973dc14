/*
 * procstat.c - parsing /proc/PID/stat; see procstat.h. Stateless.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "procstat.h"

/* The field after the one p is in (fields are separated by one space). */
static const char *next_field(const char *p)
{
	p = strchr(p, ' ');
	return p ? p + 1 : NULL;
}

int cuip_proc_stat_parse(const char *text, struct cuip_proc_stat *st)
{
	const char *open = strchr(text, '('), *close = strrchr(text, ')'), *p;
	unsigned long long start;
	size_t n;
	long ppid;
	char *end;

	/* comm may hold anything, ')' included: the last one ends it */
	if (!open || !close || close < open || close[1] != ' ' || !close[2] || close[3] != ' ')
		return -EINVAL;
	n = (size_t)(close - open - 1);
	if (n >= sizeof(st->comm))
		n = sizeof(st->comm) - 1;
	memcpy(st->comm, open + 1, n);
	st->comm[n] = 0;
	p = close + 2; /* field 3 */
	st->state = *p;
	p = next_field(p); /* field 4 */
	errno = 0;
	ppid = p ? strtol(p, &end, 10) : 0;
	if (!p || end == p || *end != ' ' || errno)
		return -EINVAL;
	st->ppid = (pid_t)ppid;
	for (int f = 4; f < 22 && p; f++)
		p = next_field(p);
	if (!p || *p < '0' || *p > '9')
		return -EINVAL;
	errno = 0;
	start = strtoull(p, &end, 10);
	if (errno || (*end != ' ' && *end != '\n' && *end))
		return -EINVAL;
	st->start = start;
	return 0;
}

int cuip_proc_stat_read(pid_t pid, struct cuip_proc_stat *st)
{
	char path[64], buf[2048];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 && errno != ESRCH ? -errno : -ESRCH;
	buf[n] = 0;
	return cuip_proc_stat_parse(buf, st);
}

int cuip_proc_stat_start(pid_t pid, uint64_t *start, char *state)
{
	struct cuip_proc_stat st;
	int ret = cuip_proc_stat_read(pid, &st);

	if (ret)
		return ret;
	*start = st.start;
	if (state)
		*state = st.state;
	return 0;
}
