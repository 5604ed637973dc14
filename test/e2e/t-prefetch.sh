# With CUINTERPOSE_PREFETCH_MB, a restore reads its carriers ahead
# (plugin/prefetch.h): one reader reads the carrier files into the page
# cache while criu restores, data ranges only, what is cached not again,
# within the budget, and is stopped when LOAD starts. Five cycles of
# the same two-process job, each restore checked byte for byte:
#   1. the images pushed out of the page cache first: the reader looked at
#      exactly the data bytes of those files (SEEK_DATA/SEEK_HOLE, counted
#      here the same way) and found carrier bytes uncached;
#   2. a budget of 1 MiB: exactly 1 MiB looked at, none of it uncached (the
#      images were just written); before it, a malformed budget refuses the
#      restore naming the variable, and the next restore still works;
#   3. the default (off) and CUINTERPOSE_PREFETCH_MB=0: no reader;
#   4. the reader stopped (SIGSTOP) by fault injection: the restore finishes,
#      the reader is killed when LOAD starts and is gone after the restore;
#   5. the reader killed: the restore finishes, the log says how it ended.
. "$srcdir/lib.sh"

command -v python3 >/dev/null || skip "python3 not found"

# data FILE...: "files bytes" as the reader counts them: each data range
# from its first page to the hole after it.
data() {
	python3 - "$@" <<'EOF'
import errno, os, sys
page, tot = os.sysconf("SC_PAGE_SIZE"), 0
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    size, off = os.fstat(fd).st_size, 0
    while off < size:
        try:
            d = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            raise
        h = min(os.lseek(fd, d, os.SEEK_HOLE), size)
        tot += h - (d - d % page)
        off = h
    os.close(fd)
print(len(sys.argv) - 1, tot)
EOF
}

# evict FILE...: write back and drop their pages from the page cache
evict() {
	python3 - "$@" <<'EOF'
import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
}

# line LOG REGEX: the one prefetch line matching REGEX
line() { grep -E "cuinterpose: prefetch: $2" "$1" || fail "no 'prefetch: $2' line in $1: $(grep prefetch "$1")"; }

# reader_gone LOG: the reader the log names no longer exists
reader_gone() {
	local r
	r=$(grep -oE "prefetch: reader [0-9]+ reads ahead" "$1" | awk '{print $3}')
	[ -n "$r" ] || fail "no reader started in $1"
	# dead: gone, or a zombie its new parent (init) has not reaped yet
	[ ! -e "/proc/$r" ] || grep -q "^State:.*Z" "/proc/$r/status" 2>/dev/null ||
		[ "$(cat "/proc/$r/comm" 2>/dev/null)" != cuip-prefetch ] ||
		fail "reader $r still runs after the restore: $(head -n 3 "/proc/$r/status")"
}

start_job 2
cmd 2 verify 0
before=$(answers 2)

cycle() { # N: dump into $T/dN
	pids=$(job_pids)
	note "cycle $1: dump"
	criu_dump "$T/d$1" || fail "criu dump (cycle $1)"
	wait_gone $pids || fail "dumped processes still alive"
}
check_job() {
	cmd 2 verify 0
	[ "$(answers 2)" = "$before" ] || fail "cycle $1: answers differ: $(answers 2) vs $before"
}

cycle 1
set -- "$T"/d1/cuinterpose-carrier-*.img
read -r nfiles bytes <<<"$(data "$@")"
[ "$bytes" -gt $((1 << 20)) ] || fail "$bytes carrier bytes in $T/d1: too few for the budget's cycle"
evict "$@"
res=$(fincore -b -n -o RES "$@" | awk '{s += $1} END {print s + 0}')
note "cycle 1: restore ($nfiles carrier files, $bytes data bytes, $res resident)"
CUINTERPOSE_PREFETCH_MB=auto criu_restore "$T/d1" || fail "criu restore (cycle 1)"
check_job 1
l=$(line "$T/d1/restore.log" "read ahead [0-9]+ bytes of [0-9]+ files in [0-9.]+ s, [0-9]+ of them not cached when it came to them$")
read -r got files uncached <<<"$(sed -E 's/.*read ahead ([0-9]+) bytes of ([0-9]+) files .* s, ([0-9]+) of them.*/\1 \2 \3/' <<<"$l")"
[ "$got" = "$bytes" ] || fail "the reader looked at $got bytes, the images hold $bytes data bytes: $l"
[ "$files" = "$nfiles" ] || fail "the reader finished $files files, not $nfiles: $l"
if [ "$res" = 0 ]; then
	# (less than all: the kernel's own read-ahead behind each of the
	# reader's reads brings in part of its next block)
	[ "$uncached" -gt 0 ] && [ "$uncached" -le "$bytes" ] ||
		fail "with the carriers out of the page cache, $uncached of their $bytes bytes were found uncached"
else
	note "the page cache kept $res bytes of the images (file system: $(stat -f -c %T "$T")): not checking what was uncached"
fi
reader_gone "$T/d1/restore.log"

cycle 2
note "cycle 2: a malformed budget, then a budget of 1 MiB"
CUINTERPOSE_PREFETCH_MB=-5 criu_restore "$T/d2" && fail "a restore with CUINTERPOSE_PREFETCH_MB=-5 succeeded"
grep -q 'CUINTERPOSE_PREFETCH_MB=-5: want MiB, 0 .. 1099511627776, or auto' "$T/d2/restore.log" ||
	fail "the refusal does not name the variable: $(grep -i error "$T/d2/restore.log" | head -n 3)"
CUINTERPOSE_PREFETCH_MB=1 criu_restore "$T/d2" || fail "criu restore (cycle 2)"
check_job 2
line "$T/d2/restore.log" "reader [0-9]+ reads ahead [0-9]+ files, [0-9]+ bytes on disk \(budget 1 MiB" >/dev/null
line "$T/d2/restore.log" "read ahead 1048576 bytes of [0-9]+ files in [0-9.]+ s, 0 of them not cached when it came to them$" >/dev/null
reader_gone "$T/d2/restore.log"

for v in "" 0; do
	cycle 3
	CUINTERPOSE_PREFETCH_MB=$v criu_restore "$T/d3" || fail "criu restore (cycle 3, CUINTERPOSE_PREFETCH_MB='$v')"
	check_job 3
	line "$T/d3/restore.log" "off \(CUINTERPOSE_PREFETCH_MB unset or 0\)$" >/dev/null
	! grep -q "prefetch: reader" "$T/d3/restore.log" || fail "a reader ran with CUINTERPOSE_PREFETCH_MB='$v'"
	rm -rf "$T/d3"
done

cycle 4
CUINTERPOSE_PREFETCH_MB=auto CUINTERPOSE_TEST_FAULT=stop@prefetch criu_restore "$T/d4" || fail "criu restore with the reader stopped"
check_job 4
grep -q "fault injection (CUINTERPOSE_TEST_FAULT): stop at prefetch" "$T/d4/restore.log" || fail "the fault was not injected"
line "$T/d4/restore.log" "reader [0-9]+ still reading at LOAD after 0 of [0-9]+ bytes \([0-9.]+ s\): stopped$" >/dev/null
reader_gone "$T/d4/restore.log"

cycle 5
CUINTERPOSE_PREFETCH_MB=64 CUINTERPOSE_TEST_FAULT=kill@prefetch criu_restore "$T/d5" || fail "criu restore with the reader killed"
check_job 5
line "$T/d5/restore.log" "reader [0-9]+ ended before it was done, after 0 of [0-9]+ bytes; criu and LOAD read the rest themselves$" >/dev/null
reader_gone "$T/d5/restore.log"

cmd 2 exit
note done
