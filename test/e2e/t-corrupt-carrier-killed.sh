# A corrupted carrier image is refused at restore, naming the file, and
# the restored tree is killed instead of resuming half-built; the images
# stay usable. By default the corrupt chunk is found by LOAD, which checks
# each chunk as it reads it (each byte is read once); with
# CUINTERPOSE_VERIFY_BEFORE_RESTORE=1 by the plugin's full read before LOAD.
# With the byte put back, the same images restore the job.
. "$srcdir/lib.sh"

start_job 2
cmd 2 verify 0
before=$(answers 2)
pids=$(job_pids)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
car=$(ls "$T"/d/cuinterpose-carrier-*.img | head -1)
[ -n "$car" ] || fail "no carrier image"
name=$(basename "$car")
flip_byte "$car" 4099

refused() { # WHAT PATTERN
	criu_restore "$T/d" && fail "$1: criu restore exited 0 for a tree that was killed"
	grep -Eq "$2" "$T/d/restore.log" ||
		fail "$1: restore.log does not report the corruption: $(grep -E 'corrupt|crc32c' "$T/d/restore.log" | head -n 3)"
	grep -q "killing the restored tree" "$T/d/restore.log" || fail "$1: restored tree not killed"
	grep -q "cuinterpose: RESUME: " "$T/d/restore.log" && fail "$1: the job was resumed"
	wait_gone $pids || fail "$1: restored processes still alive"
}
note "restore, verification with LOAD (the default)"
refused LOAD "chunk 0 \(bytes 0-[0-9]+, file offset 0\) of $name has crc32c 0x[0-9a-f]+, the index says 0x[0-9a-f]+ \(corrupt carrier image\)"
grep -q "CARRIERS verified" "$T/d/restore.log" && fail "the carriers were read before LOAD by default"
note "restore, CUINTERPOSE_VERIFY_BEFORE_RESTORE=1"
CUINTERPOSE_VERIFY_BEFORE_RESTORE=1 refused "full read" "$name: corrupt: checksum mismatch in chunk 0 \(bytes 0\.\.[0-9]+\)"
grep -q "cuinterpose: LOAD: " "$T/d/restore.log" && fail "LOAD ran after the full read refused the images"

note "the byte put back: the same images restore"
flip_byte "$car" 4099
criu_restore "$T/d" || fail "criu restore of the repaired images: $(grep -E 'Error|refus|fail' "$T/d/restore.log" | tail -n 2)"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers after restore differ: $(answers 2) vs $before"
cmd 2 exit
note done
